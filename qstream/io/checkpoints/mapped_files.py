"""Checkpoint tensors whose values lie in a local file as they are, memory-mapped on use.

One read-only map per file (:class:`FileMap`) is shared by all its tensors and created when
one of them is first indexed; a tensor keeps only where its values are (:class:`Mapped`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from .dtypes import BF16, dtype_facts, native
from .tensor import CheckpointTensor


class FileMap:
    """One read-only memory map per file (shared by all its tensors), created on first use."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._map: np.memmap[Any, np.dtype[np.uint8]] | None = None

    def view(
        self, offset: int, dtype: np.dtype[Any], shape: tuple[int, ...], fortran: bool = False
    ) -> np.ndarray:
        """The bytes at ``offset`` as an array of ``dtype`` and ``shape`` (a memmap view)."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0:
            return np.empty(shape, dtype)
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        raw = self._map[offset : offset + nbytes]
        # bf16: the raw uint16 words reinterpreted
        a = raw.view(np.uint16).view(BF16) if dtype == BF16 else raw.view(dtype)
        return a.reshape(shape[::-1]).T if fortran else a.reshape(shape)


class Mapped:
    """A tensor's values in a mapped file, viewed when indexed (a checkpoint of a million
    tensors holds a million of these, not a million NumPy views)."""

    __slots__ = ("dtype", "fmap", "fortran", "offset", "shape")

    def __init__(
        self,
        fmap: FileMap,
        offset: int,
        dtype: np.dtype[Any],
        shape: tuple[int, ...],
        fortran: bool,
    ) -> None:
        self.fmap, self.offset, self.dtype, self.shape = fmap, offset, dtype, shape
        self.fortran = fortran

    def __getitem__(self, key: Any) -> np.ndarray:
        return self.fmap.view(self.offset, self.dtype, self.shape, self.fortran)[key]


def memmap_tensor(
    name: str,
    fmap: FileMap,
    offset: int,
    dtype: DTypeLike,
    shape: Iterable[int],
    fortran: bool = False,
) -> CheckpointTensor:
    """The tensor ``name`` whose values are at ``offset`` of the mapped file ``fmap``."""
    dt, _, as_is = dtype_facts(dtype)
    dims = tuple(map(int, shape))
    src = Mapped(fmap, offset, dt, dims, fortran)
    nbytes = math.prod(dims) * dt.itemsize
    file = (fmap.path, offset) if as_is and not fortran else None
    return CheckpointTensor(name, dims, native(dt), nbytes, src, file=file)
