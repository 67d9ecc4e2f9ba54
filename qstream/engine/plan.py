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
    """One block per chunk of ``chunks`` over ``shape``, in C order of the chunk grid (none
    for an array with no elements)."""
    shape = tuple(int(d) for d in shape)
    if not shape:
        return [Block(0, ())]
    if not math.prod(shape):
        return []
    grid = [range(0, max(d, 1), c) for d, c in zip(shape, chunks, strict=True)]
    return [
        Block(
            i, tuple(slice(s, min(s + c, d)) for s, c, d in zip(start, chunks, shape, strict=True))
        )
        for i, start in enumerate(itertools.product(*grid))
    ]


DEFAULT_BLOCK_BYTES = 16 << 20
DEFAULT_MAX_MEMORY = 1 << 30  # working-memory bound when max_memory is not given
# bytes of working memory per float32 byte of a block held by one worker (the source block,
# its float32 widening, the quantized block, a chunk's compressed bytes), used to turn
# max_memory into a block size
WORK_FACTOR = 4
BUDGET_WORKERS = 4  # max_memory is shared by up to this many blocks in flight


def block_budget(max_memory: int | None) -> int:
    """Source bytes of one block. It does not depend on the number of workers, so neither do
    the blocks, nor the order in which float error sums are merged."""
    if max_memory is None:
        return DEFAULT_BLOCK_BYTES
    if max_memory < 1 << 20:
        from ..errors import InvalidParameterError

        raise InvalidParameterError(f"max_memory must be at least 1 MiB, got {max_memory}")
    return max(1 << 16, int(max_memory) // (WORK_FACTOR * BUDGET_WORKERS))


def memory_limit(max_memory: int | None) -> int:
    """The working-memory bound in force."""
    return DEFAULT_MAX_MEMORY if max_memory is None else int(max_memory)


def fit_workers(max_memory: int | None, blocks: list[Block], itemsize: int, default: int) -> int:
    """Workers that fit in the memory bound, one block each, at most ``default`` (a source
    with huge chunks gets fewer workers)."""
    workers = default
    if blocks:
        block = max(math.prod(b.shape) for b in blocks) * itemsize
        workers = min(workers, max(1, memory_limit(max_memory) // (WORK_FACTOR * max(block, 1))))
    return workers
