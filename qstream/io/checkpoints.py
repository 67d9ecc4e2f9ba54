"""Read model checkpoints tensor by tensor, by slices, without loading whole files.

:func:`open_checkpoint` maps every tensor of a checkpoint to a :class:`CheckpointTensor` whose
``t[key]`` reads just that region. Supported inputs:

- safetensors: one ``.safetensors`` file, a ``*.safetensors.index.json`` (sharded), or a
  directory holding either (the header is parsed here; data is memory-mapped, bf16 included);
- ``.npy`` (memory-mapped) and ``.npz`` (stored members memory-mapped inside the zip;
  compressed members are decompressed whole on first access); bfloat16 and float8_e5m2
  arrays that ``np.save`` wrote (NumPy itself reads them as raw bytes, or not at all) read
  as those types;
- a Zarr group (directory or ``.zip``): every floating-point array, recursively;
- torch ``.pt`` / ``.pth`` / ``.bin`` state dicts (``torch.load(..., mmap=True)``).
"""

from __future__ import annotations

import ast
import functools
import io
import json
import math
import mmap
import os
import struct
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from ..core.indexing import expand_key
from ..errors import StoreError
from .paths import check_tree, is_inside, kind_of, open_regular, refuse_special

SUPPORTED_FORMATS = (
    ".safetensors, *.safetensors.index.json, a safetensors directory, .npy, .npz, "
    "a Zarr group (directory or .zip), torch .pt/.pth/.bin"
)

_SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
    # 8-bit floats (as the format and torch name them; the bytes are ml_dtypes' own)
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "F8_E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
}
FLOAT8_DTYPES = frozenset(_SAFETENSORS_DTYPES[k] for k in _SAFETENSORS_DTYPES if k[:3] == "F8_")
_BF16 = np.dtype(ml_dtypes.bfloat16)
MAX_HEADER = 100_000_000  # bytes of a safetensors header (the format's own limit)
MAX_TENSORS = 1 << 18  # tensors of one safetensors file (a whole 90k-tensor model fits)
_TORCH_EXTS = (".pt", ".pth", ".bin")


_PRIVATE_MAPS = hasattr(mmap, "MAP_PRIVATE")  # POSIX


@dataclass
class CheckpointTensor:
    """One tensor of a checkpoint; ``t[key]`` reads just the region ``key`` selects.

    ``dtype`` is the element type stored in the file (native byte order). ``source`` is the lazy
    backing object (an ``np.memmap`` view, a ``zarr.Array``, a ``torch.Tensor`` or a loader);
    nothing is read until the tensor is indexed.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    nbytes: int
    source: Any = field(repr=False, compare=False)
    _convert: Callable[[Any], np.ndarray] | None = field(default=None, repr=False, compare=False)
    # (path, byte offset) of values stored as they are, in C order: regions can be mapped
    file: tuple[str, int] | None = field(default=None, repr=False, compare=False)
    # the pieces it is stored in, each read (and decoded) whole: a Zarr array's chunks, a
    # compressed .npz member's whole shape; None: any region is read by itself
    chunks: tuple[int, ...] | None = field(default=None, compare=False)
    # values stored as they are, in C order, in an object store (a ``RangedTensor``): regions
    # are read by byte ranges
    remote: Any = field(default=None, repr=False, compare=False)

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    def __getitem__(self, key: Any) -> np.ndarray:
        """Read the region selected by basic indexing (ints, slices, ``...``) as a new
        C-contiguous array of ``dtype``."""
        key, flip = forward_key(expand_key(key, self.shape), self.shape)
        part = self._convert(key) if self._convert is not None else self.source[key]
        if flip:
            part = np.flip(part, axis=flip)
        return np.array(part, dtype=self.dtype, order="C", copy=True)

    def _run(self, key) -> tuple[tuple[slice, ...], int, int] | None:
        """``(key, first byte, byte count)`` of the region ``key`` when it is one run of bytes
        of the tensor's file (values stored as they are, a range along the first axis, every
        other axis whole), else None."""
        if (self.file is None and self.remote is None) or self.source.dtype != self.dtype:
            return None
        key, flip = forward_key(expand_key(key, self.shape), self.shape)
        if flip or any(not isinstance(k, slice) or k.step not in (None, 1) for k in key):
            return None
        if any((k.start, k.stop) != (0, n) for k, n in zip(key[1:], self.shape[1:], strict=True)):
            return None
        row = math.prod(self.shape[1:]) * self.dtype.itemsize
        base = self.file[1] if self.file is not None else 0  # (an object's: the tensor's)
        first = base + key[0].start * row if key else base
        nbytes = (key[0].stop - key[0].start) * row if key else self.nbytes
        return key, first, nbytes

    def read_into(self, key: tuple[slice, ...], out: np.ndarray) -> bool:
        """Read the region ``key`` into ``out`` (C-contiguous, the region's shape and
        ``dtype``) with positioned reads of the file, without mapping it (mapped pages count
        as the process's memory); False when the region is not one run of bytes."""
        run = self._run(key)
        if run is None or not out.flags.c_contiguous or out.dtype != self.dtype:
            return False
        _, first, nbytes = run
        if out.nbytes != nbytes:
            return False
        if self.file is None:  # in an object store: one ranged request
            self.remote.read_run(first, out)
            return True
        read_file_run(self.file[0], first, out, f"tensor {self.name!r}")
        return True

    def view(self, key: tuple[slice, ...]) -> np.ndarray | None:
        """The region ``key`` without a copy where the tensor's values lie in a file as they
        are (safetensors, ``.npy``, C order, native byte order) and the region is one run of
        bytes (a range along the first axis, every other axis whole): a private, writable
        mapping of just those bytes (never written; writable so that kernels see ordinary
        arrays). None otherwise: then index the tensor."""
        run = self._run(key) if _PRIVATE_MAPS and self.file is not None else None
        if run is None:
            return None
        key, first, nbytes = run
        path = self.file[0]
        if nbytes == 0:
            return None
        base = first // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
        try:
            with open_regular(path, "checkpoint file") as f:
                m = mmap.mmap(
                    f.fileno(),
                    first + nbytes - base,
                    flags=mmap.MAP_PRIVATE,
                    prot=mmap.PROT_READ | mmap.PROT_WRITE,
                    offset=base,
                )
        except (OSError, ValueError):
            return None
        shape = tuple(k.stop - k.start for k in key)
        return np.frombuffer(m, self.dtype, nbytes // self.dtype.itemsize, first - base).reshape(
            shape
        )


def open_checkpoint(
    path: str | os.PathLike, *, storage_options: dict | None = None, store: str | None = None
) -> dict[str, CheckpointTensor]:
    """Open a checkpoint and return its tensors by name, in the order of the file(s).

    Nothing but headers is read here. Raises :class:`~qstream.errors.StoreError` for missing,
    truncated, corrupt or unsupported inputs. ``path`` may be an object-store URL of a
    safetensors file, a folder or a ``*.safetensors.index.json``: its tensors are then read by
    byte ranges through ``store`` (``"fsspec"`` or ``"obstore"``, with ``storage_options``).
    """
    from .remote import is_url

    p = os.fspath(path)
    if is_url(p):
        return _open_remote(p, storage_options, store)
    kind = kind_of(p)
    if kind is None:
        raise StoreError(f"no such file or directory: {p}")
    if kind == "special":
        refuse_special(p, "checkpoint")
    if kind == "dir":
        return _open_directory(p)
    low = p.lower()
    if low.endswith((".index.json", ".safetensors")):
        from .exported import maybe_dequantizing  # qstream's own exports: their values

        opened = _open_safetensors_index(p) if low.endswith(".json") else _open_safetensors(p)
        return maybe_dequantizing(p, opened)
    if low.endswith(".npy"):
        return _open_npy(p)
    if low.endswith(".npz"):
        return _open_npz(p)
    if low.endswith(".zip"):
        return _open_zarr(p)
    if low.endswith(_TORCH_EXTS):
        return _open_torch(p)
    raise StoreError(f"unsupported checkpoint {p}: supported formats are {SUPPORTED_FORMATS}")


@dataclass(frozen=True)
class CheckpointSource:
    """How any process opens a checkpoint for a conversion: its path or URL, the store
    options of a URL, and the recipe's FP8 scale pairing (``ScaleRule.to_dict()``). Picklable:
    a Dask worker opens the checkpoint itself (headers only) and reads its own regions."""

    path: str
    storage_options: dict | None = field(default=None, compare=False)
    store: str | None = None
    scales: dict | None = None

    def open_raw(self) -> dict[str, CheckpointTensor]:
        """The checkpoint's tensors as stored."""
        return open_checkpoint(self.path, storage_options=self.storage_options, store=self.store)

    def pair(self, tensors: dict) -> dict:
        """``tensors`` with FP8 weights paired with their scales (see ``qstream.io.fp8``)."""
        from .fp8 import ScaleRule, pair_scales

        return pair_scales(tensors, ScaleRule.from_dict(self.scales))

    def open(self) -> dict:
        """The tensors a conversion converts (FP8 ones as float32, scales consumed)."""
        return self.pair(self.open_raw())


def read_rows(t, key: tuple[slice, ...], dtype: np.dtype) -> np.ndarray:
    """The rows ``key`` of the checkpoint tensor ``t``, read with positioned reads where it
    can (a file-backed mapping's pages count as the process's memory until it exits: a
    keep-all conversion of a large checkpoint would otherwise hold all of it)."""
    read_into = getattr(t, "read_into", None)
    if read_into is not None and key:
        whole = (key[0], *(slice(0, n) for n in t.shape[1:]))
        out = np.empty((key[0].stop - key[0].start, *t.shape[1:]), dtype)
        if read_into(whole, out):
            return out
    return np.asarray(t[key])


def source_locations(path, tensors: dict[str, CheckpointTensor]) -> list[str]:
    """Where the checkpoint ``path`` (opened as ``tensors``) lives: its own location and
    every file its tensors are mapped from (a sharded index's shards), links resolved."""
    from .stores import location

    files = {t.file[0] for t in tensors.values() if getattr(t, "file", None) is not None}
    return sorted({location(path)} | {os.path.realpath(f) for f in files})


# -- indexing ------------------------------------------------------------------------------------


def forward_key(key: tuple[int | slice, ...], shape: tuple[int, ...]):
    """Rewrite negative-step slices (torch and Zarr reject them) as forward ones; return the
    new key and the output axes to flip afterwards."""
    fwd: list[int | slice] = []
    flip: list[int] = []
    for k, n in zip(key, shape, strict=True):
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            if step < 0:
                r = range(start, stop, step)
                k = slice(r[-1], r[0] + 1, -step) if r else slice(0, 0)
                flip.append(sum(isinstance(f, slice) for f in fwd))
        fwd.append(k)
    return tuple(fwd), flip


# -- memory maps ---------------------------------------------------------------------------------


_READERS: dict[
    str, tuple[tuple, int]
] = {}  # path -> (file version, descriptor) positioned reads share
_READERS_LOCK = threading.Lock()


def _reader(path: str) -> int:
    """A read-only descriptor of the (regular) file ``path``, opened once per process for
    each version of the file (a file written again, e.g. by a notebook between two
    conversions, gets a new descriptor: the old one would read the old bytes)."""
    st = os.stat(path)
    version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _READERS_LOCK:
        known = _READERS.get(path)
        if known is not None and known[0] == version:
            return known[1]
        f = open_regular(path, "checkpoint file")
        fd = os.dup(f.fileno())
        f.close()
        if known is not None:
            os.close(known[1])
        _READERS[path] = (version, fd)
        return fd


def read_file_run(path: str, first: int, out: np.ndarray, what: str = "tensors") -> None:
    """Fill ``out`` (C-contiguous) with the bytes of the file ``path`` from ``first`` on, by
    positioned reads (no mapping: mapped pages count as the process's memory)."""
    fd = _reader(path)
    view = memoryview(out.reshape(-1).view(np.uint8))
    while view:
        n = os.preadv(fd, [view], first)
        if n <= 0:
            raise StoreError(f"{path}: the file ended early ({what})")
        view, first = view[n:], first + n


class _FileMap:
    """One read-only memory map per file (shared by all its tensors), created on first use."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._map: np.ndarray | None = None

    def view(self, offset: int, dtype: np.dtype, shape: tuple[int, ...], fortran: bool = False):
        """The bytes at ``offset`` as an array of ``dtype`` and ``shape`` (a memmap view)."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0:
            return np.empty(shape, dtype)
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        raw = self._map[offset : offset + nbytes]
        # bf16: the raw uint16 words reinterpreted
        a = raw.view(np.uint16).view(_BF16) if dtype == _BF16 else raw.view(dtype)
        return a.reshape(shape[::-1]).T if fortran else a.reshape(shape)


class _Mapped:
    """A tensor's values in a mapped file, viewed when indexed (a checkpoint of a million
    tensors holds a million of these, not a million NumPy views)."""

    __slots__ = ("dtype", "fmap", "fortran", "offset", "shape")

    def __init__(self, fmap: _FileMap, offset: int, dtype, shape, fortran: bool) -> None:
        self.fmap, self.offset, self.dtype, self.shape = fmap, offset, dtype, shape
        self.fortran = fortran

    def __getitem__(self, key):
        return self.fmap.view(self.offset, self.dtype, self.shape, self.fortran)[key]


def _memmap_tensor(name: str, fmap: _FileMap, offset: int, dtype, shape, fortran=False):
    dtype = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    src = _Mapped(fmap, offset, dtype, shape, fortran)
    nbytes = math.prod(shape) * dtype.itemsize
    file = (fmap.path, offset) if not fortran and _native(dtype) == dtype else None
    return CheckpointTensor(name, shape, _native(dtype), nbytes, src, file=file)


def _native(dtype: np.dtype) -> np.dtype:
    """``dtype`` in native byte order (file arrays may be big-endian)."""
    return dtype.newbyteorder("=") if dtype.byteorder not in ("=", "|") else dtype


# -- safetensors ---------------------------------------------------------------------------------


def _open_safetensors(path: str, only: set[str] | None = None) -> dict[str, CheckpointTensor]:
    """Parse and validate a safetensors header; map the tensors (all, or those in ``only``)."""
    where = f"safetensors file {path}"
    try:
        with open_regular(path, "safetensors file") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise StoreError(f"{where} is truncated: {size} bytes, no header length")
            (n,) = struct.unpack("<Q", head)
            if 8 + n > size:
                raise StoreError(f"{where}: header length {n} is beyond the file size {size}")
            if n > MAX_HEADER:
                raise StoreError(
                    f"{where}: header of {n} bytes is above the format's limit of {MAX_HEADER}"
                )
            raw = f.read(n)
    except FileNotFoundError:
        raise StoreError(f"no such file: {path}") from None
    fmap = _FileMap(path)
    return _header_tensors(
        where,
        raw,
        n,
        size,
        only,
        lambda name, dtype, shape, at: _memmap_tensor(name, fmap, at, dtype, shape),
    )


def _header_tensors(where: str, raw: bytes, n: int, size: int, only, make):
    """The tensors of the safetensors header ``raw`` (``n`` bytes of a file of ``size``):
    each validated entry made by ``make(name, dtype, shape, offset in the file)``."""
    entries = raw.count(b'"data_offsets"')  # (counted before a parse makes objects of them)
    if entries > MAX_TENSORS:
        raise StoreError(
            f"{where}: its header lists {entries:,} tensors, more than qstream opens from one"
            f" file ({MAX_TENSORS:,}); split the checkpoint into shards with an index"
        )
    header = _json_object(raw, f"{where}: invalid JSON header")
    data_start, data_size = 8 + n, size - 8 - n
    out: dict[str, CheckpointTensor] = {}
    for name, info in header.items():
        if name == "__metadata__" or (only is not None and name not in only):
            continue
        dtype, shape, start = _check_safetensors_entry(where, name, info, data_size)
        out[name] = make(name, dtype, shape, data_start + start)
    return out


def _check_safetensors_entry(where: str, name: str, info: Any, data_size: int):
    """Validate one header entry; return (dtype, shape, start offset within the data region)."""
    try:  # the common case, checked in a few steps (a header may list 100,000 tensors)
        dtype = _SAFETENSORS_DTYPES[info["dtype"]]
        shape, (start, end) = info["shape"], info["data_offsets"]
        if (
            type(shape) is list
            and type(start) is int
            and type(end) is int
            and set(map(type, shape)) <= _INT
            and min(shape, default=0) >= 0
            and 0 <= start <= end <= data_size
            and end - start == math.prod(shape) * dtype.itemsize
        ):
            return dtype, shape, start
    except (TypeError, KeyError, ValueError):
        pass
    return _check_entry_slowly(where, name, info, data_size)


_INT = {int}


def _check_entry_slowly(where: str, name: str, info: Any, data_size: int):
    """:func:`_check_safetensors_entry`, each rule in turn, the first one broken named."""
    at = f"{where}: tensor {name!r}"
    if not isinstance(info, dict):
        raise StoreError(f"{at}: header entry is not an object")
    code, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if code not in _SAFETENSORS_DTYPES:
        raise StoreError(f"{at}: unknown dtype {code!r}")
    if not isinstance(shape, list) or not all(_is_uint(s) for s in shape):
        raise StoreError(f"{at}: invalid shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_uint, offsets))):
        raise StoreError(f"{at}: invalid data_offsets {offsets!r}")
    start, end = offsets
    dtype = _SAFETENSORS_DTYPES[code]
    expected = math.prod(shape) * dtype.itemsize
    if start > end:
        raise StoreError(f"{at}: data_offsets {offsets} are out of range (start > end)")
    if end - start != expected:
        raise StoreError(
            f"{at}: data_offsets {offsets} span {end - start} bytes, "
            f"but shape {shape} of {code} needs {expected}"
        )
    if end > data_size:
        raise StoreError(
            f"{at}: data_offsets {offsets} are out of range: the file is truncated "
            f"(data region holds {data_size} bytes)"
        )
    return dtype, shape, start


def _is_uint(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _open_safetensors_index(path: str) -> dict[str, CheckpointTensor]:
    """A sharded safetensors checkpoint: ``weight_map`` maps tensor names to shard files,
    which must lie in the index's folder (see :func:`_check_shard`)."""
    with open_regular(path, "safetensors index") as f:
        raw = f.read(MAX_HEADER + 1)
    if len(raw) > MAX_HEADER:
        raise StoreError(f"safetensors index {path} is larger than {MAX_HEADER} bytes")
    index = _json_object(raw, f"safetensors index {path}: invalid JSON")
    wmap = index.get("weight_map")
    if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
        raise StoreError(f"safetensors index {path}: no valid 'weight_map' object")
    base = os.path.dirname(path)
    shards: dict[str, dict[str, CheckpointTensor]] = {}
    for shard in dict.fromkeys(wmap.values()):
        shard_path = _check_shard(path, base, shard)
        if kind_of(shard_path) != "file":
            what = "names a missing shard" if kind_of(shard_path) is None else "names a shard that"
            tail = "" if kind_of(shard_path) is None else " is not a regular file"
            raise StoreError(f"safetensors index {path} {what}: {shard!r}{tail}")
        shards[shard] = _open_safetensors(shard_path, {k for k, v in wmap.items() if v == shard})
    out: dict[str, CheckpointTensor] = {}
    for name, shard in wmap.items():
        if name not in shards[shard]:
            raise StoreError(f"safetensors index {path}: tensor {name!r} is not in shard {shard!r}")
        out[name] = shards[shard][name]
    return out


def _check_shard(index: str, base: str, shard: str) -> str:
    """The path of the shard file ``shard`` named by ``index``: a plain relative path inside
    the index's folder ``base`` (no ``..``, no absolute path, no link that leads out of the
    folder; a Hugging Face cache snapshot's links into its repository's ``blobs`` are in)."""
    parts = shard.replace("\\", "/").split("/")
    if (
        not shard
        or os.path.isabs(shard)
        or "\\" in shard
        or "\x00" in shard
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise StoreError(
            f"safetensors index {index} names a shard outside its folder: {shard!r}; shards"
            " must be files beside the index"
        )
    path = os.path.join(base, *parts)
    if not any(is_inside(path, root) for root in _checkpoint_roots(base)):
        raise StoreError(
            f"safetensors index {index}: shard {shard!r} is a link to a file outside the"
            " checkpoint's folder; copy the shards into it (or pass the folder they are in)"
        )
    return path


def _checkpoint_roots(base: str) -> list[str]:
    """Where the files of the checkpoint folder ``base`` may lie: the folder, and for a
    Hugging Face cache snapshot (``.../snapshots/<revision>``) its repository's ``blobs``."""
    roots = [base]
    parent = os.path.dirname(os.path.abspath(base))
    if os.path.basename(parent) == "snapshots":
        roots.append(os.path.join(os.path.dirname(parent), "blobs"))
    return roots


def _json_object(raw: bytes, where: str) -> dict:
    """``raw`` parsed as a JSON object, or a :class:`StoreError` starting with ``where``."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StoreError(f"{where} ({e})") from None
    except RecursionError:
        raise StoreError(f"{where} (nested too deeply)") from None
    if not isinstance(doc, dict):
        raise StoreError(f"{where} (a JSON object is expected)")
    return doc


def _open_directory(path: str) -> dict[str, CheckpointTensor]:
    names = os.listdir(path)
    if any(n in names for n in ("zarr.json", ".zgroup", ".zarray")):
        return _open_zarr(path)
    from .exported import maybe_dequantizing  # qstream's own exports: their values

    if "model.safetensors.index.json" in names:
        index = os.path.join(path, "model.safetensors.index.json")
        return maybe_dequantizing(index, _open_safetensors_index(index))
    indexes = sorted(n for n in names if n.endswith(".safetensors.index.json"))
    if len(indexes) == 1:
        index = os.path.join(path, indexes[0])
        return maybe_dequantizing(index, _open_safetensors_index(index))
    files = sorted(n for n in names if n.endswith(".safetensors"))
    if not files or indexes:
        raise StoreError(
            f"directory {path} is neither a Zarr group nor a safetensors checkpoint with "
            f"one index (supported formats: {SUPPORTED_FORMATS})"
        )
    out: dict[str, CheckpointTensor] = {}
    for fname in files:
        full = os.path.join(path, fname)
        if not any(is_inside(full, root) for root in _checkpoint_roots(path)):
            raise StoreError(
                f"{full} is a link to a file outside the checkpoint's folder; copy the file"
                " into it (or pass the file itself)"
            )
        for name, t in maybe_dequantizing(full, _open_safetensors(full)).items():
            if name in out:
                raise StoreError(f"tensor {name!r} is in two files of the folder {path}")
            out[name] = t
    return out


# -- object stores -------------------------------------------------------------------------------

HEADER_PREFIX = 64 << 10  # bytes of a remote safetensors file read first (most headers fit)


def _open_remote(url: str, storage_options, store) -> dict[str, CheckpointTensor]:
    """A safetensors checkpoint at an object-store URL: a file, an index or a folder."""
    from .remote import RemoteFolder, split_url

    low = url.lower().rstrip("/")
    if low.endswith((".safetensors", ".index.json")):
        base, name = split_url(url)
        folder = RemoteFolder(base, store, storage_options)
        if low.endswith(".index.json"):
            return _open_remote_index(folder, name)
        return _open_remote_safetensors(folder, name)
    folder = RemoteFolder(url.rstrip("/"), store, storage_options)
    names = folder.names()
    indexes = [n for n in names if n.endswith(".safetensors.index.json")]
    if "model.safetensors.index.json" in names:
        return _open_remote_index(folder, "model.safetensors.index.json")
    if len(indexes) == 1:
        return _open_remote_index(folder, indexes[0])
    files = [n for n in names if n.endswith(".safetensors")]
    if not files or indexes:
        what = "is empty or missing" if not names else "is not a safetensors checkpoint"
        raise StoreError(
            f"{url} {what}: a checkpoint URL names a .safetensors file, a"
            " *.safetensors.index.json, or a folder holding either (one index)"
        )
    out: dict[str, CheckpointTensor] = {}
    for fname in files:
        for name, t in _open_remote_safetensors(folder, fname).items():
            if name in out:
                raise StoreError(f"tensor {name!r} is in two files of the folder {url}")
            out[name] = t
    return out


def _open_remote_safetensors(folder, fname: str, only: set[str] | None = None):
    """A safetensors object's header, read with one ranged request (two for a header of
    more than :data:`HEADER_PREFIX` bytes) after a HEAD for its size; its tensors read by
    ranges (:class:`~qstream.io.remote.RangedTensor`)."""
    from .remote import RangedTensor

    where = f"safetensors file {folder.where(fname)}"
    size = folder.size(fname)
    if size is None:
        raise StoreError(f"no such object: {folder.where(fname)}")
    head = folder.read(fname, 0, min(size, HEADER_PREFIX))
    if len(head) < 8:
        raise StoreError(f"{where} is truncated: {size} bytes, no header length")
    (n,) = struct.unpack("<Q", head[:8])
    if 8 + n > size:
        raise StoreError(f"{where}: header length {n} is beyond the file size {size}")
    if n > MAX_HEADER:
        raise StoreError(
            f"{where}: header of {n} bytes is above the format's limit of {MAX_HEADER}"
        )
    raw = head[8 : 8 + n]
    if len(raw) < n:
        raw += folder.read(fname, len(head), 8 + n)
    if len(raw) != n:
        raise StoreError(f"{where}: the header ended early ({len(raw)} of {n} bytes)")

    def make(name, dtype, shape, at):
        dtype, shape = np.dtype(dtype), tuple(int(s) for s in shape)
        src = RangedTensor(folder, fname, at, dtype, shape)
        nbytes = math.prod(shape) * dtype.itemsize
        return CheckpointTensor(name, shape, _native(dtype), nbytes, src, remote=src)

    return _header_tensors(where, raw, n, size, only, make)


def _open_remote_index(folder, fname: str) -> dict[str, CheckpointTensor]:
    """A sharded checkpoint in an object store: its shards are objects of the index's folder
    (plain relative names, as :func:`_check_shard` requires of local shards)."""
    where = f"safetensors index {folder.where(fname)}"
    size = folder.size(fname)
    if size is None:
        raise StoreError(f"no such object: {folder.where(fname)}")
    if size > MAX_HEADER:
        raise StoreError(f"{where} is larger than {MAX_HEADER} bytes")
    index = _json_object(folder.read(fname, 0, size), f"{where}: invalid JSON")
    wmap = index.get("weight_map")
    if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
        raise StoreError(f"{where}: no valid 'weight_map' object")
    prefix = fname.rpartition("/")[0]
    shards: dict[str, dict[str, CheckpointTensor]] = {}
    for shard in dict.fromkeys(wmap.values()):
        parts = shard.split("/")
        if (
            not shard
            or shard.startswith("/")
            or "\\" in shard
            or "\x00" in shard
            or "://" in shard
            or any(p in ("", ".", "..") for p in parts)
        ):
            raise StoreError(
                f"{where} names a shard outside its folder: {shard!r}; shards must be objects"
                " beside the index"
            )
        key = f"{prefix}/{shard}" if prefix else shard
        names = {k for k, v in wmap.items() if v == shard}
        try:
            shards[shard] = _open_remote_safetensors(folder, key, names)
        except StoreError as e:
            if str(e).startswith("no such object"):
                raise StoreError(f"{where} names a missing shard: {shard!r}") from None
            raise
    out: dict[str, CheckpointTensor] = {}
    for name, shard in wmap.items():
        if name not in shards[shard]:
            raise StoreError(f"{where}: tensor {name!r} is not in shard {shard!r}")
        out[name] = shards[shard][name]
    return out


# -- NumPy ---------------------------------------------------------------------------------------


def _open_npy(path: str) -> dict[str, CheckpointTensor]:
    """A single ``.npy`` file, memory-mapped; its tensor is named after the file."""
    name = os.path.splitext(os.path.basename(path))[0]
    try:
        with open_regular(path, "npy file") as f:
            dtype, shape, fortran = _npy_header(f, f"npy file {path}")
            offset = f.tell()
    except (StoreError, OSError, EOFError):
        dtype = None  # NumPy's own reading below says what is wrong
    if dtype is not None and dtype in _npy_ml_dtypes().values():
        if offset + math.prod(shape) * dtype.itemsize > os.path.getsize(path):
            raise StoreError(f"npy file {path} is truncated")
        return {name: _memmap_tensor(name, _FileMap(path), offset, dtype, shape, fortran)}
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise StoreError(f"npy file {path}: cannot read ({_one_line(e)})") from None
    return {name: CheckpointTensor(name, tuple(a.shape), _native(a.dtype), a.nbytes, a)}


def _open_npz(path: str) -> dict[str, CheckpointTensor]:
    """An ``.npz`` archive: stored members are memory-mapped at their offset in the zip;
    a compressed member is decompressed (that member only, whole) on its first access."""
    fmap = _FileMap(path)
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
                    dtype, shape, fortran = _npy_header(raw, where)
                    offset = raw.tell()
                    if offset + math.prod(shape) * dtype.itemsize > os.path.getsize(path):
                        raise StoreError(f"npz file {path}: member {name!r} is truncated")
                    out[name] = _memmap_tensor(name, fmap, offset, dtype, shape, fortran)
                else:
                    with zf.open(info) as member:
                        dtype, shape, _ = _npy_header(member, where)
                    nbytes = math.prod(shape) * dtype.itemsize
                    src = _CompressedMember(path, name, dtype)
                    out[name] = CheckpointTensor(
                        name, shape, _native(dtype), nbytes, src, chunks=tuple(shape) or None
                    )
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        if isinstance(e, StoreError):
            raise
        raise StoreError(f"npz file {path}: cannot read ({_one_line(e)})") from None
    return out


_NPY_MAX_HEADER = 10_000  # the longest .npy header NumPy parses (np.lib.format's limit)


def _npy_header(f, where: str) -> tuple[np.dtype, tuple[int, ...], bool]:
    """Parse an .npy header from ``f`` (left positioned at the data): NumPy's parser, except
    for a descriptor that ``np.save`` writes for an ml_dtypes type NumPy cannot name
    (:func:`_npy_ml_dtypes`), which gives that type."""
    fmt = np.lib.format
    try:
        major, _ = fmt.read_magic(f)
        width = 2 if major == 1 else 4
        head = f.read(width)
        if len(head) == width and int.from_bytes(head, "little") <= _NPY_MAX_HEADER:
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


def _ml_dtypes_header(text: bytes) -> tuple[np.dtype, tuple[int, ...], bool] | None:
    """``(dtype, shape, fortran)`` of the .npy header ``text`` when its descriptor is one of
    :func:`_npy_ml_dtypes`, else None (NumPy parses it). The header is a literal, read as
    NumPy reads it (``ast.literal_eval``: never evaluated as code), checked as NumPy checks
    it."""
    known = _npy_ml_dtypes()
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
def _npy_ml_dtypes() -> dict[str, np.dtype]:
    """The .npy descriptors that ``np.save`` writes for the ml_dtypes types checkpoints hold
    (bfloat16, float8) and that NumPy does not read as a type of its own, each written by
    that one ml_dtypes type only: bfloat16's ``'<V2'`` (NumPy: raw bytes; a void array of
    NumPy's own is ``'|V2'``) and float8_e5m2's ``'<f1'`` (NumPy: refused). The other float8
    types write ``'<V1'``, as every 1-byte ml_dtypes type does (int4, float4_e2m1fn, ...):
    nothing says which, and such members stay raw bytes."""
    writers: dict[str, set[np.dtype]] = {}
    for name in ml_dtypes.__all__:
        t = getattr(ml_dtypes, name, None)
        if isinstance(t, type) and issubclass(t, np.generic):
            dt = np.dtype(t)
            writers.setdefault(np.lib.format.dtype_to_descr(dt), set()).add(dt)
    out = {}
    for descr, types in writers.items():
        if not isinstance(descr, str) or len(types) != 1:
            continue
        (dt,) = types
        if dt != _BF16 and dt not in FLOAT8_DTYPES:
            continue
        try:
            numpy_kind = np.dtype(descr).kind
        except TypeError:
            numpy_kind = None
        if numpy_kind in (None, "V"):
            out[descr] = dt
    return out


class _CompressedMember:
    """A compressed ``.npz`` member (``dtype`` as its header says): decompressed whole on
    first indexing, then cached."""

    def __init__(self, path: str, name: str, dtype: np.dtype) -> None:
        self.path, self.name, self.dtype = path, name, dtype
        self._array: np.ndarray | None = None

    def __getitem__(self, key: Any) -> np.ndarray:
        if self._array is None:
            if self.dtype in _npy_ml_dtypes().values():
                self._array = self._read()
            else:
                with np.load(self.path, allow_pickle=False) as z:
                    self._array = z[self.name]
        return self._array[key]

    def _read(self) -> np.ndarray:
        """The member's values, read here (NumPy would read them as another type)."""
        where = f"npz file {self.path}: member {self.name!r}"
        with zipfile.ZipFile(self.path) as zf, zf.open(f"{self.name}.npy") as member:
            dtype, shape, fortran = _npy_header(member, where)
            nbytes = math.prod(shape) * dtype.itemsize
            data = member.read(nbytes)
        if len(data) != nbytes:
            raise StoreError(f"{where} is truncated")
        a = np.frombuffer(data, np.uint8).view(dtype)  # (bf16: the words reinterpreted)
        return a.reshape(shape[::-1]).T if fortran else a.reshape(shape)


# -- Zarr ----------------------------------------------------------------------------------------


def _open_zarr(path: str) -> dict[str, CheckpointTensor]:
    """Every floating-point array of a Zarr group (names relative to it, joined by '/')."""
    import zarr

    if not path.endswith(".zip"):  # no FIFO in it, and no link out of it
        check_tree(path, "Zarr checkpoint", links="inside")
    try:
        store = zarr.storage.ZipStore(path, mode="r") if path.endswith(".zip") else path
        node = zarr.open(store, mode="r")
        if isinstance(node, zarr.Array):
            members = [(os.path.splitext(os.path.basename(path.rstrip("/")))[0], node)]
        else:
            members = sorted(
                (n, a) for n, a in node.members(max_depth=None) if isinstance(a, zarr.Array)
            )
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise StoreError(f"Zarr store {path}: cannot open ({_one_line(e)})") from None
    out: dict[str, CheckpointTensor] = {}
    for name, a in members:
        dtype = np.dtype(a.dtype)
        if dtype.kind == "f" or dtype == _BF16:
            shape = tuple(a.shape)
            stored = tuple(getattr(a, "shards", None) or a.chunks) if shape else None
            out[name] = CheckpointTensor(
                name, shape, dtype, math.prod(shape) * dtype.itemsize, a, chunks=stored
            )
    return out


# -- torch ---------------------------------------------------------------------------------------


def _open_torch(path: str) -> dict[str, CheckpointTensor]:
    """A torch state dict (nested dicts flattened with '.'; non-tensor values skipped)."""
    try:
        import torch
    except ImportError:
        raise StoreError(
            "reading .pt/.bin needs torch: pip install 'qstream-zarr[torch]'"
        ) from None
    # a zip (torch >= 1.6) file is memory-mapped; an older, legacy file cannot be, and is read
    # whole (still with weights_only: no code in it runs)
    legacy = not zipfile.is_zipfile(path)
    try:
        obj = torch.load(path, weights_only=True, mmap=not legacy, map_location="cpu")
    except Exception as e:  # torch raises many types (RuntimeError, UnpicklingError, ...)
        raise StoreError(f"torch checkpoint {path}: cannot load ({_one_line(e)})") from None
    dtypes = {
        torch.float64: np.dtype("f8"),
        torch.float32: np.dtype("f4"),
        torch.float16: np.dtype("f2"),
        torch.bfloat16: _BF16,
        torch.int64: np.dtype("i8"),
        torch.int32: np.dtype("i4"),
        torch.int16: np.dtype("i2"),
        torch.int8: np.dtype("i1"),
        torch.uint8: np.dtype("u1"),
        torch.bool: np.dtype("?"),
    }
    if isinstance(obj, torch.Tensor):
        obj = {os.path.splitext(os.path.basename(path))[0]: obj}
    if not isinstance(obj, dict):
        raise StoreError(f"torch checkpoint {path}: not a state dict ({type(obj).__name__})")
    out: dict[str, CheckpointTensor] = {}
    for name, t in _flatten(obj):
        if not isinstance(t, torch.Tensor):
            continue
        if t.dtype not in dtypes:
            raise StoreError(f"torch checkpoint {path}: tensor {name!r}: unsupported {t.dtype}")
        dtype = dtypes[t.dtype]
        shape = tuple(t.shape)
        nbytes = math.prod(shape) * dtype.itemsize
        out[name] = CheckpointTensor(
            name, shape, dtype, nbytes, t, lambda key, t=t: _torch_read(t, key)
        )
    return out


def _flatten(d: dict, prefix: str = ""):
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _flatten(v, name + ".")
        else:
            yield name, v


def _torch_read(t: Any, key: tuple[int | slice, ...]) -> np.ndarray:
    """Slice a tensor (a view of the memory-mapped storage) and view it as NumPy."""
    import torch

    part = t[key]
    if part.dtype == torch.bfloat16:
        return part.view(torch.int16).numpy().view(_BF16)
    return part.numpy()


def _one_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__
