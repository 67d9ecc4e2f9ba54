"""Packs: many small tensors of a converted checkpoint stored as one Zarr group.

A mixture-of-experts checkpoint holds tens of thousands of tensors of the same shape. Stored
one group per tensor, each costs a folder, three arrays and their documents: the file
system's round trips, not the bytes, set the time. A *pack* holds a run of consecutive
tensors that share their shape, dtype and quantization spec, stacked along a new first axis::

    DST/_packs/p000003/zarr.json     attrs["qstream_pack"]: the pack's identity, spec and
                                     one entry per tensor (name, key, position, calibration
                                     range, error summary)
    DST/_packs/p000003/data          codes, shape [n, *tensor shape], one chunk
    DST/_packs/p000003/scale         parameters, shape [n, *parameter shape]
    DST/_packs/p000003/zero_point    (absent values: 0, the fill value)

Tensor ``i`` of the pack is ``data[i]``, ``scale[i]``, ``zero_point[i]``: plain Zarr (or
xarray) reads it with no qstream code. A pack is built in a hidden folder and renamed into
place (:func:`qstream.io.qarray.write_group`), so it is whole or absent; the root's index
lists its tensors (their rows name the pack and the slot) once it is published.
:class:`PackReader` opens one for :class:`~qstream.io.qarray.QuantizedCheckpoint`, whose
packed tensors are ordinary :class:`~qstream.io.qarray.QuantizedArray` objects.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from types import SimpleNamespace

import numpy as np

from ..errors import StoreError

PACKS = "_packs"
KEY = "qstream_pack"
VERSION = 1
MEMBERS = ("data", "scale", "zero_point")
# the error figures an index row keeps (qstream.io.rootindex), first of a pack's columns
ERROR_COLUMNS = ("sqnr_db", "mse", "max_abs", "cosine", "clipped", "clip_fraction", "nonfinite")
_NAME = re.compile(r"p\d{6,}")


def pack_name(seq: int) -> str:
    """The folder name of the pack numbered ``seq`` (its place among the conversion's)."""
    return f"p{seq:06d}"


def check_pack_name(name, root) -> str:
    """``name`` if it can name a pack (read back from an index row), else refused."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise StoreError(f"{root}: an index row names no valid pack ({name!r}); it is damaged")
    return name


def pack_path(root: str, name: str) -> str:
    """The local path of the pack ``name`` in the converted checkpoint at ``root``."""
    return os.path.join(root, PACKS, name)


def read_pack_doc(path: str) -> dict | None:
    """The ``qstream_pack`` attributes of the pack at ``path``, or None (absent, or not a
    pack qstream wrote)."""
    from .destination import read_local_doc

    doc = read_local_doc(os.path.join(path, "zarr.json"))
    if doc is None or doc.get("node_type") != "group":
        return None
    attrs = doc.get("attributes") or {}
    meta = attrs.get(KEY) if isinstance(attrs, dict) else None
    return meta if isinstance(meta, dict) else None


def remove_packs(local: str) -> None:
    """Remove every pack qstream wrote below the converted checkpoint ``local`` (a pack's own
    document says so), the partial packs of killed writers, and ``_packs`` if left empty."""
    from .destination import remove_if_empty
    from .paths import remove_child

    folder = os.path.join(local, PACKS)
    if not os.path.isdir(folder) or os.path.islink(folder):
        return
    clean_partial_packs(local)
    for entry in os.scandir(folder):
        if _NAME.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
            remove_pack(entry.path)
    with contextlib.suppress(FileNotFoundError):
        remove_child(folder, "zarr.json")
    remove_if_empty(folder)


def remove_pack(path: str) -> None:
    """Remove the pack at the local ``path`` if qstream wrote it (its own document says so):
    its member arrays' files, its document, its folder if left empty; else nothing."""
    from .destination import remove_array_files, remove_if_empty
    from .paths import remove_child

    if os.path.islink(path) or read_pack_doc(path) is None:
        return  # not qstream's
    for m in MEMBERS:
        member = os.path.join(path, m)
        if os.path.isdir(member) and not os.path.islink(member):
            remove_array_files(member)
            remove_if_empty(member)
    remove_child(path, "zarr.json")
    remove_if_empty(path)


def clean_partial_packs(local: str) -> None:
    """Remove the packs killed writers were building (never published)."""
    import shutil

    from .destination import TMP_PREFIX

    folder = os.path.join(local, PACKS)
    if not os.path.isdir(folder) or os.path.islink(folder):
        return
    for entry in os.scandir(folder):
        if entry.name.startswith(TMP_PREFIX) and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)


def ensure_folder(local: str) -> None:
    """Create ``DST/_packs`` (a plain Zarr group) if it is not there."""
    from zarr.core.group import GroupMetadata

    from .localmeta import write_doc

    folder = os.path.join(local, PACKS)
    if os.path.exists(os.path.join(folder, "zarr.json")):
        return
    with contextlib.suppress(FileExistsError):
        write_doc(folder, GroupMetadata(attributes={}, zarr_format=3), new=True)


def error_summary(cols: dict, i: int) -> dict:
    """Tensor ``i``'s error summary (as :meth:`~qstream.spec.ErrorStats.summary` words it)
    from the columns of :func:`brief_errors`."""
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


class _SlotArray:
    """Tensor ``slot`` of a pack's member array, read whole (a pack is one chunk) once."""

    store_path = None  # (no chunk files of its own: see qstream.io.chunks.chunk_files)

    def __init__(self, reader: PackReader, member: str, slot: int) -> None:
        arr = reader.array(member)
        self._reader, self._member, self._slot = reader, member, slot
        self.shape = tuple(arr.shape[1:])
        self.dtype = arr.dtype
        self.chunks = self.shape
        self.compressors = arr.compressors
        names = getattr(arr.metadata, "dimension_names", None)
        # (what readers take of an array's metadata: its dimensions, without the pack's)
        self.metadata = SimpleNamespace(dimension_names=tuple(names[1:]) if names else None)
        self.attrs: dict = {}

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, key):
        return self._reader.values(self._member)[self._slot][key]


class _SlotGroup:
    """What :class:`~qstream.io.qarray.QuantizedArray` reads of a packed tensor: its members
    (``group["data"]``...) and where it is."""

    def __init__(self, reader: PackReader, slot: int, name: str) -> None:
        self._reader, self._slot = reader, slot
        self.attrs: dict = {}
        self.store_path = f"{reader.path}[{slot}] ({name})"

    def __getitem__(self, member: str) -> _SlotArray:
        if member not in MEMBERS:
            raise KeyError(member)
        return _SlotArray(self._reader, member, self._slot)


class PackReader:
    """One published pack, opened from its document; its arrays are read whole, once."""

    def __init__(self, path: str) -> None:
        self.path = path
        meta = read_pack_doc(path)
        if meta is None:
            raise StoreError(f"{path}: the pack is missing or damaged; re-run the conversion")
        tensors = meta.get("tensors")
        names = tensors.get("name") if isinstance(tensors, dict) else None
        if not isinstance(names, list) or not isinstance(tensors.get("error"), dict):
            raise StoreError(f"{path}: the pack's metadata is damaged or crafted")
        self.count = len(names)
        self.meta = meta
        self._arrays: dict = {}
        self._values: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()  # (tensors of one pack may be read by several threads)

    def array(self, member: str):
        if member not in self._arrays:
            from .qarray import LocalGroup

            try:  # (the group's document is read already: its members are opened alone)
                a = LocalGroup(self.path, {})[member]
            except KeyError:
                raise StoreError(f"{self.path}: the pack has no {member} array") from None
            n = self.count
            if not a.shape or a.shape[0] != n:
                raise StoreError(
                    f"{self.path}: its {member} array ({list(a.shape)}) does not hold the"
                    f" pack's {n} tensors; the output is damaged or crafted"
                )
            self._arrays[member] = a
        return self._arrays[member]

    def values(self, member: str) -> np.ndarray:
        with self._lock:
            if member not in self._values:
                from .qarray import read_all

                self._values[member] = read_all(self.array(member))
            return self._values[member]

    def tensor_meta(self, slot: int) -> dict:
        """The metadata of the pack's tensor ``slot``, as a quantized group's would be."""
        m = self.meta
        cols = m["tensors"]
        try:
            calibration = {"method": "per-block ranges"}
            if "min" in cols:
                calibration = {
                    "method": "minmax",
                    "min": cols["min"][slot],
                    "max": cols["max"][slot],
                }
            return {
                "version": m.get("format"),
                "fingerprint": f"{m.get('fingerprint')}/{slot}",
                "complete": True,
                "spec": m["spec"],
                "dtype": m["dtype"],
                "axis": m["axis"],
                "storage": m.get("storage"),
                "source": {**(m.get("source") or {}), "tensor": cols["name"][slot]},
                "calibration": calibration,
                "error": error_summary(cols["error"], slot),
                "pack": {"path": self.path, "slot": slot},
            }
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise StoreError(
                f"{self.path}: the pack's metadata is damaged or crafted ({e})"
            ) from None

    def tensor(self, slot: int, name: str):
        """The pack's tensor ``slot`` as a :class:`~qstream.io.qarray.QuantizedArray`."""
        from .qarray import QuantizedArray

        n = self.count
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < n:
            raise StoreError(f"{self.path}: no tensor at slot {slot!r}; the output is damaged")
        return QuantizedArray(_SlotGroup(self, slot, name), self.tensor_meta(slot))
