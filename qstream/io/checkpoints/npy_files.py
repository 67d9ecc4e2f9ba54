"""NumPy checkpoints: ``.npy`` files (memory-mapped) and ``.npz`` archives.

An ``.npz`` member stored as it is is memory-mapped at its offset in the zip; a compressed
member is decompressed (that member only, whole) on its first access. bfloat16 and
float8_e5m2 arrays that ``np.save`` wrote read as those types, although NumPy itself reads
them as raw bytes or not at all (:func:`npy_ml_dtypes`).
"""

from __future__ import annotations

import ast
import functools
import io
import math
import os
import struct
import zipfile
from typing import IO, Any

import ml_dtypes
import numpy as np

from ...errors import StoreError
from ...input_files import open_regular
from ..storage import one_line
from .dtypes import BF16, FLOAT8_DTYPES, native
from .mapped_files import FileMap, memmap_tensor
from .tensor import CheckpointTensor

NPY_MAX_HEADER = 10_000  # the longest .npy header NumPy parses (np.lib.format's limit)


def open_npy(path: str) -> dict[str, CheckpointTensor]:
    """A single ``.npy`` file, memory-mapped; its tensor is named after the file."""
    name = os.path.splitext(os.path.basename(path))[0]
    dtype: np.dtype[Any] | None
    try:
        with open_regular(path, "npy file") as f:
            dtype, shape, fortran = npy_header(f, f"npy file {path}")
            offset = f.tell()
    except (StoreError, OSError, EOFError):
        dtype = None  # NumPy's own reading below says what is wrong
    if dtype is not None and dtype in npy_ml_dtypes().values():
        if offset + math.prod(shape) * dtype.itemsize > os.path.getsize(path):
            raise StoreError(f"npy file {path} is truncated")
        return {name: memmap_tensor(name, FileMap(path), offset, dtype, shape, fortran)}
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise StoreError(f"npy file {path}: cannot read ({one_line(e)})") from None
    return {name: CheckpointTensor(name, tuple(a.shape), native(a.dtype), a.nbytes, a)}


def open_npz(path: str) -> dict[str, CheckpointTensor]:
    """An ``.npz`` archive: stored members are memory-mapped at their offset in the zip;
    a compressed member is decompressed (that member only, whole) on its first access."""
    fmap = FileMap(path)
    out: dict[str, CheckpointTensor] = {}
    try:
        with zipfile.ZipFile(path) as zf, open(path, "rb") as raw:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                name = info.filename[: -len(".npy")]
                where = f"npz file {path}: member {name!r}"
                if info.compress_type == zipfile.ZIP_STORED:
                    raw.seek(info.header_offset)
                    local = raw.read(30)
                    if local[:4] != b"PK\x03\x04":
                        raise StoreError(f"npz file {path}: member {name!r}: bad local header")
                    fn_len, extra_len = struct.unpack("<HH", local[26:30])
                    raw.seek(info.header_offset + 30 + fn_len + extra_len)
                    dtype, shape, fortran = npy_header(raw, where)
                    offset = raw.tell()
                    if offset + math.prod(shape) * dtype.itemsize > os.path.getsize(path):
                        raise StoreError(f"npz file {path}: member {name!r} is truncated")
                    out[name] = memmap_tensor(name, fmap, offset, dtype, shape, fortran)
                else:
                    with zf.open(info) as member:
                        dtype, shape, _ = npy_header(member, where)
                    nbytes = math.prod(shape) * dtype.itemsize
                    src = CompressedMember(path, name, dtype)
                    out[name] = CheckpointTensor(
                        name, shape, native(dtype), nbytes, src, chunks=tuple(shape) or None
                    )
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        if isinstance(e, StoreError):
            raise
        raise StoreError(f"npz file {path}: cannot read ({one_line(e)})") from None
    return out


def npy_header(f: IO[bytes], where: str) -> tuple[np.dtype[Any], tuple[int, ...], bool]:
    """Parse an .npy header from ``f`` (left positioned at the data): NumPy's parser, except
    for a descriptor that ``np.save`` writes for an ml_dtypes type NumPy cannot name
    (:func:`npy_ml_dtypes`), which gives that type."""
    fmt = np.lib.format
    try:
        major, _ = fmt.read_magic(f)
        width = 2 if major == 1 else 4
        head = f.read(width)
        if len(head) == width and int.from_bytes(head, "little") <= NPY_MAX_HEADER:
            head += f.read(int.from_bytes(head, "little"))
        mine = _ml_dtypes_header(head[width:])
        if mine is not None:
            return mine
        read = fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0
        shape, fortran, dtype = read(io.BytesIO(head))
    except ValueError as e:
        raise StoreError(f"{where}: bad .npy header ({e})") from None
    if dtype.hasobject or dtype.names is not None:
        raise StoreError(f"{where}: unsupported dtype {dtype}")
    return dtype, tuple(shape), fortran


def _ml_dtypes_header(text: bytes) -> tuple[np.dtype[Any], tuple[int, ...], bool] | None:
    """``(dtype, shape, fortran)`` of the .npy header ``text`` when its descriptor is one of
    :func:`npy_ml_dtypes`, else None (NumPy parses it). The header is a literal, read as
    NumPy reads it (``ast.literal_eval``: never evaluated as code), checked as NumPy checks
    it."""
    known = npy_ml_dtypes()
    if not any(repr(d).encode() in text for d in known):
        return None
    try:
        d = ast.literal_eval(text.decode("latin1"))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if not isinstance(d, dict) or not isinstance(d.get("descr"), str) or d["descr"] not in known:
        return None
    shape, fortran = d.get("shape"), d.get("fortran_order")
    if (
        d.keys() != {"descr", "fortran_order", "shape"}
        or not isinstance(fortran, bool)
        or not isinstance(shape, tuple)
        or not all(isinstance(n, int) and n >= 0 for n in shape)
    ):
        raise ValueError(f"header does not describe an array: {text[:200]!r}")
    return known[d["descr"]], tuple(int(n) for n in shape), fortran


@functools.cache
def npy_ml_dtypes() -> dict[str, np.dtype[Any]]:
    """The .npy descriptors that ``np.save`` writes for the ml_dtypes types checkpoints hold
    (bfloat16, float8) and that NumPy does not read as a type of its own, each written by
    that one ml_dtypes type only: bfloat16's ``'<V2'`` (NumPy: raw bytes; a void array of
    NumPy's own is ``'|V2'``) and float8_e5m2's ``'<f1'`` (NumPy: refused). The other float8
    types write ``'<V1'``, as every 1-byte ml_dtypes type does (int4, float4_e2m1fn, ...):
    nothing says which, and such members stay raw bytes."""
    writers: dict[str, set[np.dtype[Any]]] = {}
    for name in ml_dtypes.__all__:
        t = getattr(ml_dtypes, name, None)
        if isinstance(t, type) and issubclass(t, np.generic):
            dt = np.dtype(t)
            written = np.lib.format.dtype_to_descr(dt)
            if isinstance(written, str):
                writers.setdefault(written, set()).add(dt)
    out = {}
    for descr, types in writers.items():
        if len(types) != 1:
            continue
        (dt,) = types
        if dt != BF16 and dt not in FLOAT8_DTYPES:
            continue
        try:
            numpy_kind = np.dtype(descr).kind
        except TypeError:
            numpy_kind = None
        if numpy_kind in (None, "V"):
            out[descr] = dt
    return out


class CompressedMember:
    """A compressed ``.npz`` member (``dtype`` as its header says): decompressed whole on
    first indexing, then cached."""

    def __init__(self, path: str, name: str, dtype: np.dtype[Any]) -> None:
        self.path, self.name, self.dtype = path, name, dtype
        self._array: np.ndarray | None = None

    def __getitem__(self, key: Any) -> np.ndarray:
        if self._array is None:
            if self.dtype in npy_ml_dtypes().values():
                self._array = self._read()
            else:
                with np.load(self.path, allow_pickle=False) as z:
                    self._array = z[self.name]
        return self._array[key]

    def _read(self) -> np.ndarray:
        """The member's values, read here (NumPy would read them as another type)."""
        where = f"npz file {self.path}: member {self.name!r}"
        with zipfile.ZipFile(self.path) as zf, zf.open(f"{self.name}.npy") as member:
            dtype, shape, fortran = npy_header(member, where)
            nbytes = math.prod(shape) * dtype.itemsize
            data = member.read(nbytes)
        if len(data) != nbytes:
            raise StoreError(f"{where} is truncated")
        a = np.frombuffer(data, np.uint8).view(dtype)  # (bf16: the words reinterpreted)
        return a.reshape(shape[::-1]).T if fortran else a.reshape(shape)
