"""A job's plan as its block work sees it, and a block read region by region.

:class:`JobPlan` is what every pass needs to know about the array and the spec. A block is
read piece by piece (:func:`read_pieces`), a piece lying in one stored source chunk, so that it
is read (or mapped) once and stays in the CPU's cache between the kernels that use it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...budget import Block
from ...core import scratch
from ...qtypes import QType, qtype
from ...spec import QuantSpec
from .blockmath import channel_view

if TYPE_CHECKING:
    from ...io.storage import Source

Key = tuple[slice, ...]


@dataclass(frozen=True)
class JobPlan:
    """The shape of a job: what every pass needs to know about the array and the spec."""

    spec: QuantSpec
    shape: tuple[int, ...]
    chunks: tuple[int, ...]  # destination chunks; one block each
    axis: int | None  # normalised
    stat_axis: int | None  # statistics per channel along this axis (None: per tensor)
    channels: int
    param_shape: tuple[int, ...]
    dynamic: bool  # blocked, each parameter block takes its own range

    @property
    def qt(self) -> QType:
        """The quantized type of the spec."""
        return qtype(self.spec.dtype)

    def block_channels(self, b: Block) -> int:
        """How many channels of statistics the block ``b`` holds."""
        return 1 if self.stat_axis is None else b.shape[self.stat_axis]

    def channels_of(self, b: Block, lo: int, hi: int) -> tuple[int, int]:
        """The channels ``[c0, c1)`` of block ``b`` within ``[lo, hi)`` (``c1 <= c0``: none)."""
        first = self.offset(b.key)
        return max(lo, first), min(hi, first + self.block_channels(b))

    def groups(self) -> tuple[int, int]:
        """``(axis, block size)`` of a blocked spec's parameter groups (a blocked spec always
        has an axis)."""
        if self.axis is None or not self.spec.block_size:
            raise TypeError("the spec is not blocked: its parameters are not in groups")
        return self.axis, self.spec.block_size

    def offset(self, key: Key) -> int:
        """The first channel of the region ``key``."""
        return key[self.stat_axis].start if self.stat_axis is not None else 0


def read_region(source: Source, key: Key) -> np.ndarray:
    """The region ``key`` of the source as a C-contiguous float32/float64 array: a view of
    the mapped chunk file where possible, else a buffer of the calling thread."""
    x = source.view(key)
    if x is None or not x.flags.c_contiguous:
        shape = tuple(k.stop - k.start for k in key)
        x = source.read(key, out=scratch("source", shape, source.dtype))
    if x.dtype.itemsize < 4:  # float16 / bfloat16: widen exactly for the kernels
        wide = scratch("source-f32", x.shape, np.float32)
        wide[...] = x
        return wide
    return x


def read_pieces(source: Source, key: Key) -> Iterator[tuple[Key, np.ndarray]]:
    """``(region, x)`` for the pieces of ``key`` that lie in one stored source chunk each, in
    order: a block is processed piece by piece, so a piece is read (or mapped) once and stays
    in the CPU's cache between the kernels that use it."""
    for region in source.pieces(key):
        yield region, read_region(source, region)


def relative_key(region: Key, key: Key) -> Key:
    """The region ``region`` (inside ``key``) relative to the start of ``key``."""
    return tuple(
        slice(r.start - k.start, r.stop - k.start) for r, k in zip(region, key, strict=True)
    )


def channel_pieces(
    plan: JobPlan, source: Source, key: Key, c0: int, c1: int
) -> Iterator[tuple[np.ndarray, int, int]]:
    """The pieces of the block ``key`` as ``[O, C, I]`` channel views restricted to channels
    ``c0 .. c1``: ``(view, first channel, end channel)`` for each piece holding some."""
    for region, x in read_pieces(source, key):
        v = channel_view(x, plan.stat_axis)
        r0 = plan.offset(region)
        p0, p1 = max(c0, r0), min(c1, r0 + v.shape[1])
        if p1 <= p0:
            continue
        if (p0, p1) != (r0, r0 + v.shape[1]):  # part of the piece's channels
            v = np.ascontiguousarray(v[:, p0 - r0 : p1 - r0])
        yield v, p0, p1
