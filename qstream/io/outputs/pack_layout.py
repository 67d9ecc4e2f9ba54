"""Packs: many small tensors of a converted checkpoint stored as one Zarr group.

A mixture-of-experts checkpoint holds tens of thousands of tensors of the same shape. Stored
one group per tensor, each costs a folder, three arrays and their documents: the file
system's round trips, not the bytes, set the time. A *pack* holds tensors that share their
shape, dtype and quantization spec (a run of consecutive ones, or ones left alone between
others and gathered, see :func:`~qstream.engine.convert.pack_plan.plan_packs`), stacked along a
new
first axis::

    DST/_packs/p000003/zarr.json     attrs["qstream_pack"]: the pack's identity, spec and
                                     a column per figure, a value per tensor (name, key,
                                     position, calibration range, error summary)
    DST/_packs/p000003/data          codes, shape [n, *tensor shape], one chunk
    DST/_packs/p000003/scale         parameters, shape [n, *parameter shape]
    DST/_packs/p000003/zero_point    (absent values: 0, the fill value)

A column of floating-point figures is stored as float64 bytes
(:func:`~qstream.io.storage.columns.float_column`); spelled out in JSON, they were the largest share
of a small pack's own time (256 tensors: 4,600 values, 2.4 ms, holding the interpreter's
lock). :func:`decoded_columns` gives the columns as lists again. Packs of version 1 hold
lists and still read.

Tensor ``i`` of the pack is ``data[i]``, ``scale[i]``, ``zero_point[i]``: plain Zarr (or
xarray) reads it with no qstream code. A pack is built in a hidden folder and renamed into
place (:func:`qstream.io.outputs.publish.write_group`), so it is whole or absent; the root's index
lists its tensors (their rows name the pack and the slot) once it is published.
:class:`~qstream.io.outputs.packreader.PackReader` opens one for
:class:`~qstream.io.outputs.reader.QuantizedCheckpoint`, whose packed tensors are ordinary
:class:`~qstream.io.outputs.quantized.QuantizedArray` objects.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Container, Iterable
from typing import Any

from ...errors import StoreError
from ...input_files import check_tree
from ...paths import confined, remove_child, walk_below
from ..storage import (
    entry_kind,
    float_values,
    group_doc,
    is_plain_dir,
    read_local_doc,
    remove_array_files,
    remove_if_empty,
    tensor_key,
    write_doc,
)
from .ondisk import TMP_PREFIX
from .rootindex import ERROR_KEYS

PACKS = "_packs"
KEY = "qstream_pack"
VERSION = 2  # 2: floating-point columns as float64 bytes (float_column)
MEMBERS = ("data", "scale", "zero_point")
ERROR_COLUMNS = ERROR_KEYS  # the error figures an index row keeps, first of a pack's columns
PACK_NAME = re.compile(r"p\d{6,}")  # a pack folder's name


def pack_name(seq: int) -> str:
    """The folder name of the pack numbered ``seq`` (its place among the conversion's)."""
    return f"p{seq:06d}"


def pack_number(name: object) -> int | None:
    """The number of the pack ``name`` (:func:`pack_name`), or None if it names none."""
    return int(name[1:]) if isinstance(name, str) and PACK_NAME.fullmatch(name) else None


def check_pack_name(name: object, root: object) -> str:
    """``name`` if it can name a pack (read back from an index row), else refused."""
    if not isinstance(name, str) or not PACK_NAME.fullmatch(name):
        raise StoreError(f"{root}: an index row names no valid pack ({name!r}); it is damaged")
    return name


def pack_path(root: str, name: str) -> str:
    """The local path of the pack ``name`` in the converted checkpoint at ``root``, walked
    from ``root`` (:func:`~qstream.paths.walk_below`): a link at ``_packs`` or at the
    pack's place, or anything else on the way that is not a folder, is refused, naming it."""
    return walk_below(root, [PACKS, name], "the converted checkpoint")


def read_pack_doc(path: str) -> dict[str, Any] | None:
    """The ``qstream_pack`` attributes of the pack at ``path``, or None (absent, or not a
    pack qstream wrote). A pack found holding a link, a FIFO, device or socket is refused,
    naming it: a resumed run that keeps the pack would finish an output holding it."""
    meta = _pack_doc(path)
    if meta is not None:
        check_tree(path, "the pack")
    return meta


def _pack_doc(path: str) -> dict[str, Any] | None:
    """:func:`read_pack_doc` without looking below the pack's document."""
    doc = read_local_doc(os.path.join(path, "zarr.json"))
    if doc is None or doc.get("node_type") != "group":
        return None
    attrs = doc.get("attributes") or {}
    meta = attrs.get(KEY) if isinstance(attrs, dict) else None
    return meta if isinstance(meta, dict) else None


def remove_packs(local: str) -> None:
    """Remove every pack qstream wrote below the converted checkpoint ``local`` (a pack's own
    document says so), the partial packs of killed writers, and ``_packs`` if left empty."""
    folder = os.path.join(local, PACKS)
    if not is_plain_dir(local, PACKS):  # (a link there: removed itself, never followed)
        return
    clean_partial_packs(local)
    for entry in os.scandir(folder):
        if PACK_NAME.fullmatch(entry.name) and is_plain_dir(folder, entry.name):
            remove_pack(entry.path)
    with contextlib.suppress(FileNotFoundError):
        remove_child(folder, "zarr.json")
    remove_if_empty(folder)


def remove_pack(path: str) -> None:
    """Remove the pack at the local ``path`` if qstream wrote it (its own document says so):
    its member arrays' files, its document, its folder if left empty; else nothing."""
    if os.path.islink(path) or _pack_doc(path) is None:
        return  # not qstream's
    for m in MEMBERS:
        member = os.path.join(path, m)
        if is_plain_dir(path, m):  # (a link there: removed itself, never followed)
            remove_array_files(member)
            remove_if_empty(member)
    remove_child(path, "zarr.json")
    remove_if_empty(path)


def clean_partial_packs(local: str) -> None:
    """Remove the packs killed writers were building (never published)."""
    folder = os.path.join(confined(local), PACKS)
    if not os.path.isdir(folder) or os.path.islink(folder):
        return
    for entry in os.scandir(folder):
        if entry.name.startswith(TMP_PREFIX) and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)


def ensure_folder(local: str) -> None:
    """Create ``DST/_packs`` (a plain Zarr group) if it is not there (a link there, or at
    its document, is refused: see :func:`pack_path`)."""
    folder = walk_below(local, [PACKS, "zarr.json"], "the converted checkpoint")
    folder = os.path.dirname(folder)
    if os.path.lexists(os.path.join(folder, "zarr.json")):
        return
    with contextlib.suppress(FileExistsError):
        write_doc(folder, group_doc({}), new=True)


def decoded_columns(cols: dict[str, Any]) -> dict[str, Any]:
    """A pack's ``tensors`` columns (and their ``error`` columns) with every column a list,
    a value per tensor: float64 columns decoded, the worst channels' figures (stored flat)
    split as ``worst_channel`` lists them. Raises ValueError for a damaged column."""
    out: dict[str, Any] = {}
    for name, value in cols.items():
        if name == "error" and isinstance(value, dict):
            out[name] = decoded_columns(value)
        elif isinstance(value, dict):
            out[name] = float_values(value, name)
        else:
            out[name] = value
    worst = out.get("worst_channel")
    for name in ("worst_sqnr_db", "worst_max_abs"):
        if name in cols and isinstance(cols[name], dict):
            if not isinstance(worst, list):
                raise ValueError(f"column {name!r} without its worst_channel column")
            flat, rows, at = out[name], [], 0
            for channels in worst:
                if not isinstance(channels, list):
                    raise ValueError(f"column 'worst_channel' holds {channels!r}, not a list")
                rows.append(flat[at : at + len(channels)])
                at += len(channels)
            if at != len(flat):
                raise ValueError(f"column {name!r} does not match worst_channel")
            out[name] = rows
    return out


def error_summary(cols: dict[str, Any], i: int) -> dict[str, Any]:
    """Tensor ``i``'s error summary (as :meth:`~qstream.spec.ErrorStats.summary` words it)
    from the (decoded: :func:`decoded_columns`) columns of
    :func:`~qstream.engine.convert.pack_figures.brief_errors`."""
    out = {k: cols[k][i] for k in (*ERROR_COLUMNS, "count", "nan", "posinf", "neginf")}
    if "worst_channel" in cols:
        out["worst_channels"] = [
            {"channel": c, "sqnr_db": s, "max_abs": m}
            for c, s, m in zip(
                cols["worst_channel"][i],
                cols["worst_sqnr_db"][i],
                cols["worst_max_abs"][i],
                strict=True,
            )
        ]
    return out


def unlisted_tensors(root: str, listed: Container[str]) -> set[str]:
    """The tensors the interrupted conversion in the local folder ``root`` finished but had
    not listed in its index (:func:`finished_unlisted`), found without the checkpoint: those
    whose own group (under its name's key) says it is complete, naming its source tensor, and
    those its complete packs list. One read of each folder's document."""
    done: set[str] = set()
    with os.scandir(confined(root)) as it:
        folders = sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
    for entry in folders:
        if entry.startswith("_"):
            continue
        try:
            doc = read_local_doc(os.path.join(root, entry, "zarr.json")) or {}
        except StoreError:  # (a link or a FIFO: not a tensor qstream wrote; its reads refuse it)
            continue
        attrs = doc.get("attributes")
        meta = attrs.get("qstream") if isinstance(attrs, dict) else None
        if doc.get("node_type") != "group" or not isinstance(meta, dict):
            continue
        source = meta.get("source")
        name = source.get("path") if isinstance(source, dict) else None
        if not isinstance(name, str) or tensor_key(name) != entry:
            continue
        if meta.get("complete") and name not in listed:
            done.add(name)
    return done | finished_unlisted(root, (), listed)  # (and the packs')


def finished_unlisted(root: str, names: Iterable[str], listed: Container[str]) -> set[str]:
    """The tensors of ``names`` not ``listed`` in the index of the converted checkpoint in the
    local folder ``root`` whose own group, or pack, says it is complete: a run killed before
    it listed them had finished them, and a re-run finds them so (each reused after its job
    checks it is this job's)."""
    done: set[str] = set()
    for name in names:
        if name in listed:
            continue
        doc = read_local_doc(os.path.join(root, tensor_key(name), "zarr.json")) or {}
        attrs = doc.get("attributes")
        meta = attrs.get("qstream") if isinstance(attrs, dict) else None
        if doc.get("node_type") == "group" and isinstance(meta, dict) and meta.get("complete"):
            done.add(name)
    folder = os.path.join(root, PACKS)
    plain = entry_kind(folder) == "dir"  # (a link there, or to a pack, is never followed)
    for entry in sorted(os.listdir(folder)) if plain else ():
        pack = os.path.join(folder, entry)
        meta = None
        if pack_number(entry) is not None and entry_kind(pack) == "dir":
            meta = _pack_doc(pack)
        if not meta or meta.get("complete") is not True:
            continue
        packed = (meta.get("tensors") or {}).get("name")
        if isinstance(packed, list):
            done.update(n for n in packed if isinstance(n, str) and n not in listed)
    return done
