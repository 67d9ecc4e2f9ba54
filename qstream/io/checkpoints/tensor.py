"""One tensor of a checkpoint, read region by region without loading its file.

:class:`CheckpointTensor` is what every checkpoint reader (:mod:`qstream.io.checkpoints.open`)
returns for a tensor: ``t[key]`` reads just that region; a region that is one run of bytes
of its file is also read by positioned reads (:meth:`CheckpointTensor.read_into`, no mapping)
or viewed without a copy (:meth:`CheckpointTensor.view`). :class:`TensorLike` is what the
engine needs of any checkpoint tensor (FP8 and exported tensors read as float32 included).
"""

from __future__ import annotations

import math
import mmap
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ...core import expand_key
from ...errors import StoreError
from ...input_files import open_regular
from ..storage import map_bytes

_PRIVATE_MAPS = hasattr(mmap, "MAP_PRIVATE")  # POSIX


class TensorLike(Protocol):
    """What readers of a checkpoint need of one of its tensors: a :class:`CheckpointTensor`,
    an FP8 tensor read as float32 (:mod:`qstream.io.checkpoints.fp8`), an exported tensor read
    dequantized (:mod:`qstream.io.checkpoints.exported`)."""

    @property
    def shape(self) -> tuple[int, ...]:
        """The tensor's shape."""
        ...

    @property
    def dtype(self) -> np.dtype[Any]:
        """The type of the values ``t[key]`` returns."""
        ...

    @property
    def nbytes(self) -> int:
        """The bytes it is stored in."""
        ...

    def __getitem__(self, key: Any) -> np.ndarray:
        """The region ``key`` selects (basic indexing) as a new array."""
        ...


class Shaped:
    """``ndim`` and ``size`` of a tensor-like object from its ``shape``."""

    shape: tuple[int, ...]

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)


@dataclass
class CheckpointTensor(Shaped):
    """One tensor of a checkpoint; ``t[key]`` reads just the region ``key`` selects.

    ``dtype`` is the element type stored in the file (native byte order). ``source`` is the lazy
    backing object (an ``np.memmap`` view, a ``zarr.Array``, a ``torch.Tensor`` or a loader);
    nothing is read until the tensor is indexed.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
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

    def __getitem__(self, key: Any) -> np.ndarray:
        """Read the region selected by basic indexing (ints, slices, ``...``) as a new
        C-contiguous array of ``dtype``."""
        key, flip = forward_key(expand_key(key, self.shape), self.shape)
        part = self._convert(key) if self._convert is not None else self.source[key]
        if flip:
            part = np.flip(part, axis=flip)
        return np.array(part, dtype=self.dtype, order="C", copy=True)

    def _run(self, key: Any) -> tuple[tuple[slice, ...], int, int] | None:
        """``(key, first byte, byte count)`` of the region ``key`` when it is one run of bytes
        of the tensor's file (values stored as they are, a range along the first axis, every
        other axis whole), else None."""
        if (self.file is None and self.remote is None) or self.source.dtype != self.dtype:
            return None
        fwd, flip = forward_key(expand_key(key, self.shape), self.shape)
        if flip:
            return None
        slices = tuple(k for k in fwd if isinstance(k, slice) and k.step in (None, 1))
        if len(slices) != len(fwd):
            return None
        if any(
            (k.start, k.stop) != (0, n) for k, n in zip(slices[1:], self.shape[1:], strict=True)
        ):
            return None
        row = math.prod(self.shape[1:]) * self.dtype.itemsize
        base = self.file[1] if self.file is not None else 0  # (an object's: the tensor's)
        first = base + slices[0].start * row if slices else base
        nbytes = (slices[0].stop - slices[0].start) * row if slices else self.nbytes
        return slices, first, nbytes

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
        bytes (a range along the first axis, every other axis whole): those bytes read in
        place (:func:`map_file_run`). None otherwise: then index the tensor."""
        if self.file is None:
            return None
        run = self._run(key)
        if run is None:
            return None
        slices, first, _ = run
        shape = tuple(k.stop - k.start for k in slices)
        return map_file_run(self.file[0], first, shape, self.dtype)


def read_rows(t: TensorLike, key: tuple[slice, ...], dtype: np.dtype[Any]) -> np.ndarray:
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


# -- indexing ------------------------------------------------------------------------------------


def forward_key(
    key: tuple[int | slice, ...], shape: tuple[int, ...]
) -> tuple[tuple[int | slice, ...], tuple[int, ...]]:
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
    return tuple(fwd), tuple(flip)


# -- positioned reads ----------------------------------------------------------------------------


# path -> (file version, descriptor) positioned reads share
_READERS: dict[str, tuple[tuple[int, int, int, int], int]] = {}
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


def map_file_run(
    path: str, first: int, shape: tuple[int, ...], dtype: np.dtype[Any]
) -> np.ndarray | None:
    """The bytes of the file ``path`` from ``first`` on as a new C-contiguous array of
    ``shape`` and ``dtype``, read in place (:mod:`qstream.io.storage.inplace`), after the file is
    seen
    long enough. None when a map cannot serve: no bytes, a start not aligned for ``dtype`` (a
    kernel would then meet an array type it was not compiled for), a file system that
    cannot map the file, or a system without private maps (POSIX has them); read those with
    :func:`read_file_run`."""
    nbytes = math.prod(shape) * dtype.itemsize
    if not _PRIVATE_MAPS or nbytes == 0 or first % dtype.alignment:
        return None
    fd = _reader(path)
    if os.fstat(fd).st_size < first + nbytes:
        raise StoreError(f"{path}: the file ended early (tensors)")
    try:
        raw = map_bytes(fd, first, nbytes)
    except OSError:  # a file system that cannot map files: read instead
        return None
    return raw.view(dtype).reshape(shape)


def read_file_run(path: str, first: int, out: np.ndarray, what: str = "tensors") -> None:
    """Fill ``out`` (C-contiguous) with the bytes of the file ``path`` from ``first`` on, by
    positioned reads: the blocks of streamed tensors, into reused buffers (a map of a whole
    large tensor would count its pages as the process's memory), and the runs
    :func:`map_file_run` cannot serve."""
    fd = _reader(path)
    view = out.reshape(-1).view(np.uint8).data
    while view:
        n = os.preadv(fd, [view], first)
        if n <= 0:
            raise StoreError(f"{path}: the file ended early ({what})")
        view, first = view[n:], first + n


class RowDecoded(Shaped):
    """A quantized tensor read as its decoded values, rows at a time: ``t[key]`` decodes just
    the rows ``key`` selects (widened to whole blocks of ``align`` rows, as block scales
    need) with ``decode(first, stop)``, which returns them as ``dtype``."""

    chunks = None
    file = None

    def __init__(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        nbytes: int,
        decode: Callable[[int, int], np.ndarray],
        align: int = 1,
    ) -> None:
        self.name, self.shape, self.dtype, self.nbytes = name, tuple(shape), dtype, nbytes
        self._decode, self.align = decode, max(1, align)

    def __repr__(self) -> str:
        return f"RowDecoded({self.name!r}, {self.shape}, {self.dtype.name})"

    def __getitem__(self, key: Any) -> np.ndarray:
        """The region ``key`` (basic indexing) of the decoded values."""
        fwd, flip = forward_key(expand_key(key, self.shape), self.shape)
        k0 = fwd[0]
        if isinstance(k0, slice):
            start, stop, step = k0.indices(self.shape[0])
            stop = max(start, stop)
        else:
            start, stop, step = k0, k0 + 1, 1
        lo = start // self.align * self.align
        hi = min(self.shape[0], -(-stop // self.align) * self.align)
        rows = self._rows(lo, hi)
        first: int | slice = (
            slice(start - lo, stop - lo, step) if isinstance(k0, slice) else k0 - lo
        )
        part = rows[(first, *fwd[1:])]
        if flip:
            part = np.flip(part, axis=flip)
        return np.array(part, dtype=self.dtype, order="C", copy=True)

    def _rows(self, lo: int, hi: int) -> np.ndarray:
        if hi <= lo:
            return np.empty((0, *self.shape[1:]), self.dtype)
        out = np.asarray(self._decode(lo, hi))
        if out.shape != (hi - lo, *self.shape[1:]) or out.dtype != self.dtype:
            raise StoreError(f"tensor {self.name!r}: rows {lo}:{hi} decoded to {out.shape}")
        return out

    def read_into(self, key: tuple[slice, ...], out: np.ndarray) -> bool:
        """The region ``key`` (forward slices of step 1) into ``out`` (``dtype``, the
        region's shape)."""
        if out.dtype != self.dtype or len(key) != len(self.shape):
            return False
        if any(not isinstance(k, slice) or k.step not in (None, 1) for k in key):
            return False
        part = self[key]
        if part.shape != out.shape:
            return False
        out[...] = part
        return True
