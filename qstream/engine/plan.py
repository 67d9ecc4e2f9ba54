"""Planning: destination chunks and the blocks a job is cut into.

A block is a hyper-rectangle made of whole destination chunks, so no two blocks ever touch the
same stored chunk and blocks can run in any order, on any worker.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

TARGET_CHUNK_BYTES = 4 << 20


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


def default_chunks(shape, itemsize: int, source_chunks=None, *, axis=None, block_size=None):
    """Destination chunks: the source's (if any) or ~4 MiB row slabs; along a blocked axis a
    multiple of ``block_size``."""
    shape = tuple(int(d) for d in shape)
    if not shape:
        return ()
    if source_chunks and len(source_chunks) == len(shape):
        chunks = [
            max(1, min(int(c), d)) if d else 1 for c, d in zip(source_chunks, shape, strict=True)
        ]
    else:
        row = max(1, math.prod(shape[1:]) * itemsize)
        chunks = [max(1, min(shape[0], TARGET_CHUNK_BYTES // row)), *[max(1, d) for d in shape[1:]]]
    if block_size and axis is not None:
        c = chunks[axis]
        chunks[axis] = max(block_size, -(-c // block_size) * block_size)
    return tuple(chunks)


def plan_blocks(shape, chunks, itemsize: int, budget: int) -> list[Block]:
    """Cut ``shape`` into blocks of whole chunks, each at most ``budget`` bytes where a single
    chunk allows it; blocks grow along the last axes first (contiguous reads)."""
    shape = tuple(int(d) for d in shape)
    if not shape:
        return [Block(0, ())]
    bshape = [min(c, d) if d else 1 for c, d in zip(chunks, shape, strict=True)]
    for d in reversed(range(len(shape))):
        other = math.prod(bshape[:d] + bshape[d + 1 :]) * itemsize
        fit = max(1, budget // max(other, 1) // max(chunks[d], 1))
        bshape[d] = max(1, min(shape[d], fit * chunks[d]))
        if bshape[d] < shape[d]:
            break
    grid = [range(0, max(d, 1), b) for d, b in zip(shape, bshape, strict=True)]
    blocks = []
    for i, start in enumerate(itertools.product(*grid)):
        key = tuple(slice(s, min(s + b, d)) for s, b, d in zip(start, bshape, shape, strict=True))
        blocks.append(Block(i, key))
    return blocks
