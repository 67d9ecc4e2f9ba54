"""Export quantized outputs as safetensors, streaming, for loaders outside qstream.

Two layouts (``format``):

- ``compressed-tensors`` (the default): what transformers (through ``compressed-tensors``) and
  vLLM load, with a ``config.json`` beside the files that carries the ``quantization_config``
  they need (merged into the model's ``config.json``: ``config``, or the one kept inside the
  output; never one found where an output's metadata says its source was); see
  :mod:`qstream.exports.compressed_tensors`. A tensor that layout cannot express is refused,
  naming it, before anything is written: an export never loads silently wrong.
- ``qstream``: every quantized type qstream has, read by qstream (and by hand): a quantized
  tensor ``N`` is written as

  - ``N``: the stored values (``I8``/``U8``/``I16``/``U16``/``I32``; int4/uint4/int2/uint2 one
    value per byte in ``I8``/``U8``; float8_e4m3fn/e5m2 as ``F8_E4M3``/``F8_E5M2``; the other
    float types as ``U8`` bit patterns),
  - ``N_scale``: float32 (float16 when stored so, ``scale_dtype="float16"``), shaped to
    broadcast against ``N``: ``[1]`` per tensor, the channel axis kept and every other axis 1
    per axis (``[out, 1]`` for axis 0 of a matrix), the group layout ``[out, in / group]``
    blocked,
  - ``N_zero_point``: the zero point in the values' integer type, same shape as ``N_scale``
    (omitted when every zero point is 0, i.e. symmetric),

  so ``(N - N_zero_point) * N_scale`` in float32 is ``qstream.dequantize`` bit for bit. No
  ``config.json`` is written: transformers would read the codes as weights.

Kept tensors are written in their original dtype (bfloat16 included). ``__metadata__``
records the layout (``qstream_format``) and each quantized tensor's type, axis and block size
(``qstream``, JSON). Above ``max_shard_size`` the tensors are split over
``stem-0000K-of-0000N.safetensors`` with a ``stem.safetensors.index.json`` (``weight_map``),
as Hugging Face sharded checkpoints are. Memory stays bounded: tensors are read and written in
slabs of ~16 MiB.

An export locks the folder it writes (``.qstream-lock``, as a conversion locks its
destination; :func:`~qstream.exports.targets.export_lock`): a second export into it while
one runs is refused with :class:`~qstream.errors.DestinationBusyError` (the CLI's exit 75).
The finished marker it replaces (the index, or the only file) is removed before anything else,
so that wherever an export stops, no index names shards that are not there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
import struct
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidParameterError, StoreError
from ..input_files import kind_of, open_regular
from ..io.checkpoints import CONFIG, export_metadata, read_json
from ..io.checkpoints import source_config as source_config
from ..io.outputs import QuantizedArray, QuantizedCheckpoint, check_writable, open_quantized
from ..io.storage import location
from ..qtypes import did_you_mean
from . import compressed_tensors as ct
from .entries import (
    FLOAT_TYPES,
    Tensors,
    ct_entries,
    entries,
    float_entry,
    quantized_entries,
    recorded_db,
    recorded_sqnr,
    tensor_bytes,
)
from .files import (
    Entry,
    byte_ticks,
    remove_stale_partials,
    split_shards,
    write_json,
    write_safetensors,
)
from .model_files import copy_files, manifest, plan_copies, recorded_files, same_config
from .targets import check_targets, export_lock, finished_export, job_digest, other_forms
from .targets import shard_pattern as shard_pattern

FORMATS = ("compressed-tensors", "qstream", "dequantized")
LOADERS = {
    "compressed-tensors": "transformers / vLLM (compressed-tensors)",
    "qstream": "qstream (open_quantized-style layout; not for transformers)",
    "dequantized": "any safetensors reader (float values)",
}


def export_safetensors(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    format: str = "compressed-tensors",
    config: str | os.PathLike[str] | dict[str, Any] | None = None,
    max_shard_size: int = 5 * 10**9,
    overwrite: bool = False,
    name: str = "weight",
    storage_options: dict[str, Any] | None = None,
    replace_own: bool = False,
    job: str | None = None,
    dtype: str = "float32",
    max_memory: int | None = None,
    files: Sequence[str] = (),
    dry_run: bool = False,
    progress: Any = None,
) -> dict[str, Any]:
    """Write the quantized output ``src`` (a converted checkpoint's root, or one quantized
    group, exported as the tensor ``name``) to the safetensors file ``out`` (or shards beside
    it, with an index, above ``max_shard_size`` bytes); see the module docstring for the two
    layouts (``format``). Returns the files, the entries' names, ``tensor_bytes`` (each
    tensor's entries' bytes, as inspect counts them), ``quantized``, ``untied`` (an added
    ``lm_head.weight`` -> the embedding), ``bytes`` (their sum), the format and loader.

    ``config`` (compressed-tensors only): the model's ``config.json`` (a path or a dict) into
    which the ``quantization_config`` is merged; None: the ``config.json`` inside ``src``
    itself, if it keeps one (see :func:`own_config`). The source an output's metadata
    records is never opened: it is provenance, and may name any folder. A conversion passes
    its checkpoint's config (:func:`source_config`). The result is written as
    ``config.json`` beside ``out`` (a ``config.json`` qstream did not write is never
    replaced); without a model config it holds the ``quantization_config`` alone, to merge
    into the model's (``qstream export`` says so and names ``--config``).

    Existing files are refused unless ``overwrite``, except shards of an interrupted export
    (they carry qstream's metadata and no index was written); ``replace_own`` also replaces a
    finished export's files qstream wrote (a resumed ``convert ... out.safetensors``).
    ``job``: an identity recorded in the files (see :func:`finished_export`).

    ``format="dequantized"``: every quantized tensor written as its dequantized values in
    ``dtype`` (float32, float16 or bfloat16; what ``qstream dequantize ... OUT.safetensors``
    writes), kept tensors as stored.

    ``max_memory``: the memory bound (bytes; None: the default, 1 GiB) ``src`` is opened
    under (see :func:`qstream.open_quantized`). ``dry_run``: everything decided and refused
    as for the export, nothing written; returns the files it would write and its ``entries``
    (name, safetensors dtype, shape, bytes).

    ``files`` (compressed-tensors only): the model's non-weight files (tokenizer, chat
    template, generation config; :func:`qstream.exports.find_model_files` finds them
    beside a checkpoint) copied beside ``out``, so that the folder deploys as it is; a file
    there that qstream did not write is refused, never replaced. Every identity and name
    written is free of local paths: the job is recorded as its SHA-256. ``progress``:
    called ``(done, total)`` with the bytes written (a ``write`` stage)."""
    if dtype not in FLOAT_TYPES:
        raise InvalidParameterError(f"dtype must be one of {', '.join(FLOAT_TYPES)}, got {dtype!r}")
    if format not in FORMATS:
        raise InvalidParameterError(
            f"unknown export format {format!r}{did_you_mean(format, FORMATS)};"
            f" expected one of: {', '.join(FORMATS)} (GGUF:"
            " an output path ending in .gguf, see qstream.export_gguf)"
        )
    out = os.fspath(out)
    if not out.endswith(".safetensors"):
        raise InvalidParameterError(f"{out}: the export target must end in .safetensors")
    if job is None:  # a plain export: the same call on the same output is the same job
        job = _export_job(src, format, name, dtype, config, max_shard_size)
        done = None if overwrite or replace_own else finished_export(out, job)
        if done is not None:
            return {"files": done, "already_complete": True, "format": format,
                    "loader": LOADERS[format], "tensors": [], "bytes": 0}  # fmt: skip
    opened = open_quantized(src, storage_options=storage_options, max_memory=max_memory)
    if not isinstance(opened, QuantizedArray | QuantizedCheckpoint):
        raise InvalidParameterError(
            f"{src} is not a qstream output (a converted checkpoint or a quantized group);"
            " an export is made from one (convert a checkpoint first)"
        )
    folder = os.path.dirname(out) or "."
    check_writable(out)  # (missing folders are made once the export is decided)
    tensors = Tensors(opened, name)
    found: list[Entry] = []
    described: dict[str, dict[str, Any]] = {}
    layouts: list[ct.Layout] = []
    kept: list[str] = []
    owned: dict[str, int] = {}  # tensor -> the bytes of its entries
    untied: dict[str, str] = {}  # a tensor the export adds -> the tensor it copies
    for n in tensors.names():
        first = len(found)
        t = tensors(n)
        if isinstance(t, QuantizedArray) and t.spec.float_offset and format != "dequantized":
            raise InvalidParameterError(
                f"{n}: a float offset (x = q * scale + offset) has no place in the {format}"
                " layout, whose loaders compute (q - zero_point) * scale; export it with"
                " format='dequantized' or keep its integer zero point"
            )
        if isinstance(t, QuantizedArray):
            if format == "compressed-tensors":
                lay = ct.layout(n, t.shape, t.spec)
                layouts.append(lay)
                found += ct_entries(n, t, lay, tensors)
            elif format == "dequantized":
                found.append(float_entry(n, t, tensors, dtype))
                owned[n] = found[-1].nbytes
                continue
            else:
                found += quantized_entries(n, t, tensors)
            described[n] = {"dtype": t.spec.dtype, "axis": t.axis, "block_size": t.spec.block_size}
            sqnr = recorded_sqnr(opened, n)
            if sqnr is not None:  # (what convert measured: inspect of the file shows it)
                described[n]["sqnr_db"] = sqnr
        else:
            found += entries(n, t, tensors)
            if len(t.shape) == 2 and n.endswith("weight"):
                kept.append(n[: -len("weight")])
        owned[n] = sum(e.nbytes for e in found[first:])
    model_config: dict[str, Any] | None = None
    if format == "compressed-tensors":
        model_config = _model_config(config, src)
        tied = ct.tied_embedding(
            [lay.module + "weight" for lay in layouts], tensors.names(), model_config
        )
        if tied is not None:  # lm_head written with the embedding's codes and scales
            lay = next(x for x in layouts if x.module + "weight" == tied)
            head = dataclasses.replace(lay, module=ct.HEAD[: -len("weight")])
            layouts.append(head)
            first = len(found)
            found += ct_entries(tied, tensors(tied), head, tensors)
            owned[ct.HEAD] = sum(e.nbytes for e in found[first:])
            untied[ct.HEAD] = tied
            if tied in described:  # (so that qstream's own reader decodes it too)
                described[ct.HEAD] = described[tied]
            model_config["tie_word_embeddings"] = False
    names = [e.name for e in found]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})[:3]
        raise InvalidParameterError(
            f"tensor names collide with the export's parameter names: {', '.join(dup)}"
        )
    shards = split_shards(found, int(max_shard_size))
    stem = out[: -len(".safetensors")]
    paths = (
        [out]
        if len(shards) == 1
        else [f"{stem}-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    index = f"{stem}.safetensors.index.json"
    config_path = os.path.join(os.path.dirname(out), CONFIG)
    copied: dict[str, str] = {}
    if model_config is not None:
        model_config["quantization_config"] = ct.quantization_config(layouts, kept)
        copied = manifest(files)
    replace = overwrite or replace_own

    def plan() -> tuple[bool, list[str], list[str], dict[str, str]]:
        """Whether config.json is written, the files written, an earlier export's other
        form to remove, and the model files to copy; refused here, before the lock and again
        under it."""
        write = model_config is not None and not same_config(config_path, model_config, copied)
        written = paths + ([config_path] if write else [])
        written += [index] if len(shards) > 1 else []
        check_targets(written, replace, last or index, out if write else None)
        todo = plan_copies(files, folder, recorded_files(config_path)) if copied else {}
        return write, written, other_forms(out, index, written, replace), todo

    last = None if len(shards) > 1 else paths[0]  # the file that marks a finished export
    _, written, _, _ = plan()  # refusals before anything is written (the lock file included)
    if dry_run:  # (decided and checked as the export is; nothing written)
        return {"files": written, "already_complete": False, "format": format,
                "loader": LOADERS[format], "tensors": names,
                "entries": [{"name": e.name, "dtype": e.tag, "shape": list(e.shape),
                             "bytes": e.nbytes} for e in found], "tensor_bytes": owned,
                "quantized": list(described), "untied": untied,
                "bytes": sum(owned.values())}  # fmt: skip
    os.makedirs(folder, exist_ok=True)  # (every command makes DST's missing folders)
    meta = {
        "format": "pt",
        "qstream": json.dumps(described, sort_keys=True),
        "qstream_format": format,
    }
    if job is not None:
        job = job_digest(job)  # (the identity names the source: only its digest is written)
        meta["qstream_job"] = job
    with export_lock(out):  # one export at a time into a folder (see export_lock)
        tick = byte_ticks(progress, sum(e.nbytes for e in found))
        write_config, targets, stale, todo = plan()  # (another export may have written meanwhile)
        for f in targets:
            remove_stale_partials(f)
        # the finished marker this export replaces goes first, then the earlier export's other
        # form (its index before its shards): wherever it stops, the folder holds no index or
        # file that stands for files that are not there, or not its own
        marker = last or index
        if kind_of(marker) == "file":  # (ours: check_targets refused anything else)
            os.unlink(marker)
        for f in stale:  # an earlier export's other form (one file vs shards): never left
            os.unlink(f)
        for path, shard in zip(paths, shards, strict=True):
            if path != last:
                write_safetensors(path, shard, meta, tick)
        copy_files(todo, folder)
        targets += [os.path.join(folder, n) for n in todo]
        if write_config and model_config is not None:
            own = {"format": format, "weights": os.path.basename(out)}  # (what it describes)
            model_config["qstream_export"] = {**own, **({"job": job} if job else {})}
            if copied:
                model_config["qstream_export"]["files"] = copied
            write_json(config_path, model_config)
        if last is not None:
            try:
                write_safetensors(last, shards[0], meta, tick)
            except BaseException:  # (no config.json of this export left without its weights)
                if write_config:
                    with contextlib.suppress(OSError):
                        os.unlink(config_path)
                raise
        else:
            weight_map = {
                e.name: os.path.basename(f) for f, s in zip(paths, shards, strict=True) for e in s
            }
            index_meta: dict[str, Any] = {
                "total_size": sum(e.nbytes for e in found),
                "qstream": "export",
                "qstream_format": format,
            }
            if job is not None:
                index_meta["qstream_job"] = job
            write_json(index, {"metadata": index_meta, "weight_map": weight_map})
    return {
        "already_complete": False,
        "files": targets,
        "tensors": names,
        "tensor_bytes": owned,
        "quantized": list(described),
        "untied": untied,
        "bytes": sum(e.nbytes for e in found),
        "file_bytes": sum(os.path.getsize(f) for f in targets if os.path.isfile(f)),
        "format": format,
        "loader": LOADERS[format],
        "config": config_path if model_config is not None else None,
    }


def _export_job(
    src: str | os.PathLike[str],
    format: str,
    name: str,
    dtype: str,
    config: str | os.PathLike[str] | dict[str, Any] | None,
    shard: int,
) -> str:
    """The identity of a plain export: what it reads (the output's root document, whose
    time changes when the output is written again), how and into what layout."""
    where = location(src) or str(src)
    try:
        stamp = os.stat(os.path.join(os.fspath(src), "zarr.json")).st_mtime_ns
    except (OSError, TypeError):
        stamp = None
    conf: dict[str, Any] | str | list[Any] | None
    if isinstance(config, dict):
        conf = config
    elif config is not None:
        conf = os.path.abspath(os.fspath(config))
    else:  # the config kept inside the output, if any: a changed one is another export
        try:
            kept = own_config(src)
            st = os.stat(kept) if kept is not None else None
        except (OSError, StoreError):
            st = None
        conf = None if st is None else ["own", st.st_size, st.st_mtime_ns]
    ident = {"export": where, "stamp": stamp, "format": format, "name": name, "dtype": dtype}
    ident["max_shard_size"] = int(shard)
    return json.dumps({**ident, "config": conf}, sort_keys=True, default=str)


def _model_config(
    config: str | os.PathLike[str] | dict[str, Any] | None, src: str | os.PathLike[str]
) -> dict[str, Any]:
    """The model configuration the quantization config is merged into: ``config`` (a dict or
    the path of a JSON file), or the ``config.json`` kept inside the output ``src`` (see
    :func:`own_config`), or an empty one. Never one found where the output's metadata says
    its source was: that string is provenance, not a path to open."""
    if isinstance(config, dict):
        copy: dict[str, Any] = json.loads(json.dumps(config))  # a copy; JSON only
        return copy
    path = os.fspath(config) if config is not None else own_config(src)
    if path is None:
        return {}
    doc = read_json(path)
    if doc is None:
        raise InvalidParameterError(f"{path}: not a readable JSON object (a model config.json)")
    if "qstream_export" in doc:  # one qstream wrote: the model's config, and its own part
        doc.pop("qstream_export")
        doc.pop("quantization_config", None)
    elif "quantization_config" in doc:
        raise InvalidParameterError(
            f"{path} already has a quantization_config: its checkpoint is quantized already;"
            " pass config= a plain model config"
        )
    return doc


def own_config(src: str | os.PathLike[str]) -> str | None:
    """The ``config.json`` inside the local output ``src`` itself (a copy of its model's
    config kept with it), or None: a regular file, never a link (an output qstream writes
    holds none; one that does is refused rather than read wherever it points)."""
    if not isinstance(src, str | os.PathLike):
        return None
    path = os.fspath(src)
    if "://" in path and not path.startswith("file://"):
        return None
    path = os.path.join(os.path.expanduser(path.removeprefix("file://")), CONFIG)
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise StoreError(f"cannot read {path}: {e.strerror or e}") from None
    if stat.S_ISLNK(mode):
        raise StoreError(
            f"{path} is a link; the config.json kept in a qstream output never is, and qstream"
            " does not read where it points: pass --config (config=) with the model's own"
        )
    return path if stat.S_ISREG(mode) else None


def describe_export(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What a file qstream exported holds and which loader it targets: a ``.safetensors``
    (or its index) or a ``.gguf`` (:func:`qstream.exports.gguf.describe`, or for another
    tool's GGUF :func:`qstream.io.checkpoints.gguf_metadata.describe_gguf`). Of a safetensors
    export,
    ``tensor_list``: every entry (over all shards, in file order) with its stored ``dtype``,
    ``shape``, ``bytes``, and for a quantized tensor its ``target`` (the quantized type, then
    ``axis A``, ``block B`` or ``per tensor``) and ``sqnr_db`` where the metadata records
    them (else None). Raises :class:`StoreError` for a file qstream did not export."""
    path = os.fspath(path)
    if path.endswith(".gguf"):
        from .gguf import describe, written_by_qstream  # (loaded when a GGUF is described)

        if written_by_qstream(path):
            return describe(path)
        from ..io.checkpoints.gguf_metadata import describe_gguf

        return describe_gguf(path)  # (llama.cpp's or another tool's: what its header says)
    meta = export_metadata(path)
    if meta is None:
        raise StoreError(f"{path} is not a qstream export (no qstream metadata)")

    def header_of(file: str) -> dict[str, Any]:
        try:
            with open_regular(file) as f:
                (n,) = struct.unpack("<Q", f.read(8))
                found: dict[str, Any] = json.loads(f.read(min(n, 100 << 20)))
        except (OSError, struct.error, ValueError) as e:
            raise StoreError(f"cannot read the safetensors header of {file}: {e}") from None
        return found

    if path.endswith(".json"):
        doc = read_json(path) or {}
        weight_map = doc.get("weight_map") or {}
        total = (doc.get("metadata") or {}).get("total_size")
        total = int(total) if isinstance(total, (int, str)) and str(total).isdigit() else None
        folder = os.path.dirname(path)
        shards = list(dict.fromkeys(str(v) for v in weight_map.values()))
        headers = [header_of(os.path.join(folder, s)) for s in shards]
    else:
        headers = [header_of(path)]
        total = None
    entries: list[tuple[str, Any]] = []
    for h in headers:  # shard after shard, each in file order
        found = [(k, v) for k, v in h.items() if k != "__metadata__"]
        entries += sorted(found, key=lambda e: tuple(e[1]["data_offsets"]))
    if total is None:
        total = max((v["data_offsets"][1] for _, v in entries), default=0)
    fmt = meta.get("qstream_format", "qstream")
    quantized: dict[str, Any] = {}  # (each shard's own: an index's metadata says "export")
    for h in headers:
        described = (h.get("__metadata__") or {}).get("qstream")
        try:
            said = json.loads(described) if isinstance(described, str) else None
        except ValueError:
            said = None
        quantized.update(said if isinstance(said, dict) else {})
    listed = []
    for name, v in entries:
        start, stop = v["data_offsets"]
        listed.append({"name": name, "dtype": v["dtype"], "shape": list(v["shape"]),
                       "bytes": stop - start, "target": None, "sqnr_db": None})  # fmt: skip
    config = os.path.join(os.path.dirname(path), CONFIG)
    owned = tensor_bytes(listed, quantized)  # (and each entry's "tensor": the one it is of)
    seen: set[str] = set()
    for e in listed:  # a quantized tensor's target and SQNR: on its first entry (its codes)
        q = quantized.get(e["tensor"])
        if not isinstance(q, dict) or e["tensor"] in seen:
            continue
        seen.add(e["tensor"])
        axis, block = q.get("axis"), q.get("block_size")
        where = f"block {block}" if block else f"axis {axis}" if axis is not None else "per tensor"
        e["target"] = f"{q.get('dtype')} {where}"
        e["sqnr_db"] = recorded_db(q.get("sqnr_db", (q.get("error") or {}).get("sqnr_db")))
    return {
        "file": path,
        "format": fmt,
        "loader": LOADERS.get(fmt, LOADERS["qstream"]),
        "tensors": len(owned),
        "entries": len(listed),
        "quantized": quantized,
        "bytes": total,
        "config": config if fmt == "compressed-tensors" and os.path.isfile(config) else None,
        "tensor_bytes": owned,
        "tensor_list": listed,
    }
