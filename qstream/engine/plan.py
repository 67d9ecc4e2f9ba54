"""Planning: destination chunks and the blocks a job is cut into.

A block is one destination chunk, so no two blocks ever touch the same stored chunk and blocks
can run in any order, on any worker.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Block:
    index: int
    key: tuple[slice, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s.stop - s.start for s in self.key)

    @property
    def start(self) -> tuple[int, ...]:
        return tuple(s.start for s in self.key)


def default_chunks(
    shape, itemsize: int, source_chunks=None, *, axis=None, block_size=None, budget: int
) -> tuple[int, ...]:
    """Destination chunks: whole multiples of the source's chunks (or of one row), grown along
    the outer axes first to about ``budget`` bytes of ``itemsize`` elements; along a blocked
    axis a multiple of ``block_size``.

    Every chunk is one block of the job, so few large chunks mean few files to create (on some
    file systems creating a file costs as much as writing a MiB into it).
    """
    shape = tuple(int(d) for d in shape)
    if not shape:
        return ()
    if source_chunks and len(source_chunks) == len(shape):
        chunks = [
            max(1, min(int(c), d)) if d else 1 for c, d in zip(source_chunks, shape, strict=True)
        ]
    else:
        chunks = [1, *[max(1, d) for d in shape[1:]]]
    for d in range(len(shape)):
        k = budget // max(1, math.prod(chunks) * itemsize)
        if k <= 1:
            break
        if chunks[d] * k < shape[d]:
            chunks[d] *= k
            break
        chunks[d] = max(1, shape[d])
    if block_size and axis is not None:
        c = chunks[axis]
        chunks[axis] = max(block_size, -(-c // block_size) * block_size)
    return tuple(chunks)


def plan_blocks(shape, chunks) -> list[Block]:
    """One block per chunk of ``chunks`` over ``shape``, in C order of the chunk grid."""
    shape = tuple(int(d) for d in shape)
    if not shape:
        return [Block(0, ())]
    grid = [range(0, max(d, 1), c) for d, c in zip(shape, chunks, strict=True)]
    return [
        Block(
            i, tuple(slice(s, min(s + c, d)) for s, c, d in zip(start, chunks, shape, strict=True))
        )
        for i, start in enumerate(itertools.product(*grid))
    ]
