"""Reading a pack (:mod:`qstream.io.outputs.pack_layout`): its tensors as ordinary quantized arrays.

A :class:`PackReader` opens one published pack from its document and reads each member array
whole, once (a pack is one chunk); tensor ``slot`` is a
:class:`~qstream.io.outputs.quantized.QuantizedArray` over a stand-in group whose members are the
slot's rows of the pack's arrays.
"""

from __future__ import annotations

import contextlib
import math
import threading
from types import SimpleNamespace
from typing import Any

import numpy as np

from ...errors import StoreError
from ...spec import QuantSpec
from ..storage import LocalGroup, read_all
from .pack_layout import MEMBERS, VERSION, decoded_columns, error_summary, read_pack_doc
from .quantized import QuantizedArray


class _SlotArray:
    """Tensor ``slot`` of a pack's member array, read whole (a pack is one chunk) once."""

    store_path = None  # (no chunk files of its own: see qstream.io.storage.chunks.chunk_files)

    def __init__(self, reader: PackReader, member: str, slot: int) -> None:
        self._reader, self._member, self._slot = reader, member, slot
        self.shape, self.dtype, self.compressors, self.metadata = reader.slot_form(member)
        self.chunks = self.shape
        self.attrs: dict[str, Any] = {}

    @property
    def ndim(self) -> int:
        """Number of dimensions (the tensor's, without the pack's axis)."""
        return len(self.shape)

    def __getitem__(self, key: Any) -> Any:
        return self._reader.values(self._member)[self._slot][key]


class _SlotGroup:
    """What :class:`~qstream.io.outputs.quantized.QuantizedArray` reads of a packed tensor: its
    members
    (``group["data"]``...) and where it is."""

    def __init__(self, reader: PackReader, slot: int, name: str) -> None:
        self._reader, self._slot = reader, slot
        self.attrs: dict[str, Any] = {}
        self.store_path = f"{reader.path}[{slot}] ({name})"

    def __getitem__(self, member: str) -> _SlotArray:
        if member not in MEMBERS:
            raise KeyError(member)
        return _SlotArray(self._reader, member, self._slot)


class PackReader:
    """One published pack, opened from its document; its arrays are read whole, once.
    ``max_memory``: the memory bound of whoever reads it (None: the default bound); a member
    array larger than half of it is refused when it is opened (:meth:`array`), before a
    byte of it is read."""

    def __init__(self, path: str, max_memory: int | None = None) -> None:
        self.path = path
        self.max_memory = max_memory
        meta = read_pack_doc(path)
        if meta is None:
            raise StoreError(
                f"{path}: the pack is missing or damaged; convert the checkpoint again (with"
                " overwrite=True if that conversion finished)"
            )
        tensors = meta.get("tensors")
        tensors = tensors if isinstance(tensors, dict) else {}
        names = tensors.get("name")
        if not isinstance(names, list) or not isinstance(tensors.get("error"), dict):
            raise StoreError(f"{path}: the pack's metadata is damaged or crafted")
        version = meta.get("version", 1)
        if not isinstance(version, int) or version > VERSION:
            raise StoreError(
                f"{path}: the pack is of version {version!r}, newer than this qstream reads"
                f" ({VERSION}); upgrade qstream"
            )
        try:
            tensors = decoded_columns(tensors)
        except ValueError as e:
            raise StoreError(f"{path}: the pack's metadata is damaged or crafted ({e})") from None
        self.count = len(names)
        self.meta = {**meta, "tensors": tensors}
        self._arrays: dict[str, Any] = {}  # member -> its zarr.Array
        self._forms: dict[str, tuple[tuple[int, ...], Any, Any, SimpleNamespace]] = {}
        self._spec: QuantSpec | None = None
        self._values: dict[str, np.ndarray[Any, Any]] = {}
        self._lock = threading.Lock()  # (tensors of one pack may be read by several threads)

    def array(self, member: str) -> Any:
        """The pack's ``member`` array (a ``zarr.Array``), checked to hold its tensors."""
        if member not in self._arrays:
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
            self._check_size(member, a)
            self._arrays[member] = a
        return self._arrays[member]

    def _check_size(self, member: str, a: Any) -> None:
        """Refuse the member array ``a`` when reading it whole (:meth:`values`: a pack is one
        chunk), or one tensor of it dequantized whole as float32, needs more than half the
        memory bound: its shape is declared by a document, which a crafted or damaged output
        can make any size (a conversion writes packs of at most one block budget,
        :func:`~qstream.budget.block_budget`, a 32nd of the bound's)."""
        from ...budget import memory_limit, mib

        shape = tuple(int(d) for d in a.shape)
        whole = math.prod(shape) * np.dtype(a.dtype).itemsize
        one = math.prod(shape[1:]) * 4 if member == "data" else 0
        limit = memory_limit(self.max_memory)
        need = 2 * max(whole, one)
        if need > limit:
            raise StoreError(
                f"{self.path}: its {member} array ({list(shape)} {a.dtype}, {mib(whole)}) is"
                f" read whole, and one tensor of it dequantized as float32 takes {mib(one)}:"
                f" the memory bound max_memory ({mib(limit)}) must be at least {mib(need)};"
                " the output is damaged or crafted, or raise max_memory"
            )

    def slot_form(self, member: str) -> tuple[tuple[int, ...], Any, Any, SimpleNamespace]:
        """``(shape, dtype, compressors, metadata)`` of one tensor's slot of ``member``: the
        array's without the pack's axis (what readers take of an array's metadata: its
        dimensions), made once per member."""
        form = self._forms.get(member)
        if form is None:
            arr = self.array(member)
            names = getattr(arr.metadata, "dimension_names", None)
            meta = SimpleNamespace(dimension_names=tuple(names[1:]) if names else None)
            form = self._forms[member] = (tuple(arr.shape[1:]), arr.dtype, arr.compressors, meta)
        return form

    def values(self, member: str) -> np.ndarray[Any, Any]:
        """All of the pack's ``member`` array, read once."""
        with self._lock:
            if member not in self._values:
                # (a pack is published whole: its codes and scales are all there, or it is
                # damaged; its all-zero zero points are never written)
                required = member != "zero_point"
                self._values[member] = read_all(self.array(member), required=required)
            return self._values[member]

    def tensor_meta(self, slot: int) -> dict[str, Any]:
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

    def tensor(self, slot: object, name: str) -> QuantizedArray:
        """The pack's tensor ``slot`` (read from an index row: checked) as a
        :class:`~qstream.io.outputs.quantized.QuantizedArray`."""
        n = self.count
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < n:
            raise StoreError(f"{self.path}: no tensor at slot {slot!r}; the output is damaged")
        if self._spec is None:  # (parsed once per pack; damage is named by QuantizedArray)
            with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
                self._spec = QuantSpec.from_dict(self.meta["spec"])
        meta = self.tensor_meta(slot)
        group = _SlotGroup(self, slot, name)
        return QuantizedArray(group, meta, spec=self._spec, max_memory=self.max_memory)
