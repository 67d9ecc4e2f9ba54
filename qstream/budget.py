"""Planning: destination chunks and the blocks a job is cut into.

A block is one destination chunk, so no two blocks ever touch the same stored chunk and blocks
can run in any order, on any worker.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Block:
    index: int
    key: tuple[slice, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s.stop - s.start for s in self.key)


def default_chunks(
    shape,
    itemsize: int,
    source_chunks=None,
    *,
    axis=None,
    block_size=None,
    budget: int,
    limit: int | None = None,
) -> tuple[int, ...]:
    """Destination chunks: whole multiples of the source's chunks (or of one row), grown along
    the outer axes first to about ``budget`` bytes of ``itemsize`` elements; along a blocked
    axis a multiple of ``block_size``, or the whole axis where that multiple, past the axis,
    makes a chunk larger than the memory bound ``limit``: a chunk is stored (and written)
    whole, padded, so a block size of 50M on an axis of 512 had declared (and allocated)
    chunks of 50M. Both cover the axis in one block: the same blocks, values and report;
    only the padding goes (chunks within the bound stay as they were). A block that growing
    along the blocked axis makes larger than half of ``limit`` (what it holds, not its
    padding) is refused, as a source's chunk is (:func:`check_fits`).

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
        grown = max(block_size, -(-c // block_size) * block_size)
        others = math.prod(chunks) // c
        if limit is not None and grown > c:
            if grown > shape[axis] and others * grown * itemsize > limit:
                grown = max(1, shape[axis])
            held = [min(g, max(1, n)) for g, n in zip(chunks, shape, strict=True)]
            held[axis] = min(grown, max(1, shape[axis]))
            block = math.prod(held) * itemsize
            if 2 * block > limit:
                from .errors import InvalidParameterError

                raise InvalidParameterError(
                    f"block_size {block_size} along axis {axis} of an array of shape"
                    f" {list(shape)} makes blocks of {held} ({mib(block)} of values): the"
                    f" memory bound max_memory ({mib(limit)}) must be at least twice that"
                    f" ({mib(2 * block)}); raise it or choose a smaller block_size"
                )
        chunks[axis] = grown
    return tuple(chunks)


# a parameter group's elements (a block_size past an axis is one group along it, whatever
# it is; the kernels take sizes as int64)
MAX_BLOCK_SIZE = 1 << 40


def check_block_size(block_size: int | None) -> None:
    """Refuse a ``block_size`` above :data:`MAX_BLOCK_SIZE` (no axis is that long)."""
    if block_size is not None and int(block_size) > MAX_BLOCK_SIZE:
        from .errors import InvalidParameterError

        raise InvalidParameterError(
            f"block_size must be at most {MAX_BLOCK_SIZE:,} (2^40), got {block_size}; a block"
            " as long as its axis or longer is one group along that axis: give the axis's"
            " length"
        )


MAX_BLOCKS = 1 << 31  # blocks of one job (a larger plan comes from a declared shape, not data)


class BlockGrid(Sequence):
    """The blocks of a job, one per chunk of ``chunks`` over ``shape`` in C order of the chunk
    grid (none for an array with no elements; one for a 0-d array), made as they are asked
    for: a plan of billions of blocks costs no memory. ``grid[i]``, ``grid[a:b]`` (a grid of
    those blocks), ``len``, iteration; :meth:`only` restricts one axis."""

    def __init__(self, shape, chunks, ranges=None, flat: range | None = None) -> None:
        self.shape = tuple(int(d) for d in shape)
        self.chunks = tuple(int(c) for c in chunks)
        counts = [-(-d // c) for d, c in zip(self.shape, self.chunks, strict=True)]
        if self.shape and not math.prod(self.shape):
            counts = [0] * len(counts)
        self.ranges = tuple(range(n) for n in counts) if ranges is None else tuple(ranges)
        self._strides = [math.prod(counts[d + 1 :]) for d in range(len(counts))]
        self.flat = range(math.prod(len(r) for r in self.ranges)) if flat is None else flat

    def __len__(self) -> int:
        return len(self.flat)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return BlockGrid(self.shape, self.chunks, self.ranges, self.flat[i])
        n = self.flat[i]
        coords = []
        for r in reversed(self.ranges):
            n, c = divmod(n, len(r))
            coords.append(r[c])
        coords.reverse()
        key = tuple(
            slice(k * c, min((k + 1) * c, d))
            for k, c, d in zip(coords, self.chunks, self.shape, strict=True)
        )
        index = sum(k * s for k, s in zip(coords, self._strides, strict=True))
        return Block(index, key)

    def __iter__(self):
        for i in range(len(self.flat)):
            yield self[i]

    def only(self, axis: int | None, lo: int, hi: int) -> BlockGrid:
        """The blocks whose span along ``axis`` meets ``[lo, hi)``, in order (all of them
        when ``axis`` is None: statistics per tensor)."""
        if axis is None:
            return self
        c = self.chunks[axis]
        r = self.ranges[axis]
        keep = range(max(r.start, lo // c), min(r.stop, -(-hi // c)))
        ranges = (*self.ranges[:axis], keep, *self.ranges[axis + 1 :])
        return BlockGrid(self.shape, self.chunks, ranges)


def plan_blocks(shape, chunks) -> BlockGrid:
    """The blocks of ``shape`` cut by ``chunks`` (see :class:`BlockGrid`), refused when they
    are more than :data:`MAX_BLOCKS` (a declared shape no real array has)."""
    grid = BlockGrid(shape, chunks)
    if len(grid) > MAX_BLOCKS:
        from .errors import InvalidParameterError

        elements = math.prod(grid.shape)
        raise InvalidParameterError(
            f"an array of shape {list(grid.shape)} ({elements:.3g} elements) makes"
            f" {len(grid):,} blocks of {list(grid.chunks)}, more than qstream's limit of"
            f" {MAX_BLOCKS:,}; check the source's declared shape"
        )
    return grid


#: inner elements of a kernel's unit of work: each row of an ``[O, C, I]`` view is cut in tiles
#: of at most this many, each tile summed on its own (results never depend on the thread
#: count; the NumPy twins cut rows the same way)
TILE = 16384
#: elements below which a kernel call runs its serial twin (``kernels.runtime.run``) and a
#: small per-tensor call takes the direct path; ``QSTREAM_SERIAL_BELOW`` sets it (tests)
SERIAL_BELOW = int(os.environ.get("QSTREAM_SERIAL_BELOW", 1 << 18))
#: quantized elements up to which a conversion runs the NumPy twins of the kernels and never
#: loads Numba (``engine.convert.convert_checkpoint.small_job``); ``QSTREAM_NUMPY_JOB`` sets it
#: (0: never; tests)
NUMPY_JOB = int(os.environ.get("QSTREAM_NUMPY_JOB", 1 << 22))
#: values of a piece from which its rows (when they are its channels) are quantized and
#: error-summed by one fused kernel (``engine.blocks.fused_rows.quantize_rows_with_errors``);
#: a smaller piece runs the two kernels, whose serial twins compile faster. Warm-up sets it
#: to 0 while it runs its tiny jobs, so that they compile the fused kernel too.
FUSED_FROM = 1 << 19
#: bytes of one group of channels' histograms that a block searched in place counts at once
#: (``engine.blocks.stats_work.HistogramWork``): 64 channels at 2048 bins
HISTOGRAM_GROUP_BYTES = 1 << 20
DEFAULT_BLOCK_BYTES = 16 << 20
DEFAULT_MAX_MEMORY = 1 << 30  # working-memory bound when max_memory is not given
# bytes of working memory per float32 byte of a block held by one worker (the source block,
# its float32 widening, the quantized block, a chunk's compressed bytes), used to turn
# max_memory into a block size
WORK_FACTOR = 4
BUDGET_WORKERS = 4  # max_memory is shared by up to this many blocks in flight


MIN_MEMORY = 1 << 20  # the smallest memory bound a job takes


def check_max_memory(max_memory: int | None) -> None:
    """Refuse a memory bound below :data:`MIN_MEMORY` (or not a number of bytes): every
    entry point calls it first, so a refused bound writes nothing."""
    import numbers

    from .errors import InvalidParameterError

    if max_memory is None:
        return
    if (
        isinstance(max_memory, bool)
        or not isinstance(max_memory, numbers.Real)
        or not math.isfinite(max_memory)
    ):
        raise InvalidParameterError(f"max_memory must be a number of bytes, got {max_memory!r}")
    if max_memory < MIN_MEMORY:
        raise InvalidParameterError(f"max_memory must be at least 1 MiB, got {max_memory}")


def block_budget(max_memory: int | None) -> int:
    """Source bytes of one block. It does not depend on the number of workers, so neither do
    the blocks, nor the order in which float error sums are merged."""
    if max_memory is None:
        return DEFAULT_BLOCK_BYTES
    check_max_memory(max_memory)
    return max(1 << 16, int(max_memory) // (WORK_FACTOR * BUDGET_WORKERS))


def memory_limit(max_memory: int | None) -> int:
    """The working-memory bound in force."""
    return DEFAULT_MAX_MEMORY if max_memory is None else int(max_memory)


def budget_units(max_memory: int | None) -> int:
    """How many units of work of at most one block budget each (a block, a pack, a small
    tensor) fit in the memory bound at once."""
    return max(1, memory_limit(max_memory) // (WORK_FACTOR * block_budget(max_memory)))


def fit_workers(max_memory: int | None, blocks, itemsize: int, default: int) -> int:
    """Workers that fit in the memory bound, one block each, at most ``default`` (a source
    with huge chunks gets fewer workers)."""
    workers = default
    if len(blocks):
        block = math.prod(blocks[0].shape) * itemsize  # (the first block is the largest)
        workers = min(workers, max(1, memory_limit(max_memory) // (WORK_FACTOR * max(block, 1))))
    return workers


# bytes a job holds per channel of a per-axis spec: range and error statistics, the progress
# snapshot, the thresholds and the parameters (measured: ~300 at 4M channels)
PER_CHANNEL = 256


def mib(n: float) -> str:
    """Bytes as a short text (``12.5 MiB``, ``3.1 GiB``)."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


MAX_SOURCE_CHUNKS = 1 << 22  # stored chunks of a source (each is a file or an object)


def check_fits(max_memory, source_chunks, dtype, channels: int, shape=()) -> None:
    """Refuse, before any work, a job whose fixed needs exceed the memory bound or sane
    limits: a source of ``shape`` stored in more than :data:`MAX_SOURCE_CHUNKS` chunks, a
    stored chunk (read and decoded whole) larger than half the bound, or the statistics of
    ``channels`` channels (:data:`PER_CHANNEL` bytes each)."""
    from .errors import InvalidParameterError

    limit = memory_limit(max_memory)
    if source_chunks and shape:
        stored = math.prod(-(-d // c) for d, c in zip(shape, source_chunks, strict=True))
        if stored > MAX_SOURCE_CHUNKS:
            raise InvalidParameterError(
                f"the source is stored in {stored:,} chunks of {list(source_chunks)}, more than"
                f" qstream reads one by one ({MAX_SOURCE_CHUNKS:,}); rechunk it into larger"
                " chunks (a few MiB each)"
            )
    if source_chunks:
        chunk = math.prod(source_chunks) * dtype.itemsize
        if 2 * chunk > limit:
            raise InvalidParameterError(
                f"the source's chunks of {list(source_chunks)} hold {mib(chunk)} each, and a"
                f" chunk is read whole: the memory bound max_memory ({mib(limit)}) must be at"
                f" least twice that ({mib(2 * chunk)}); raise it or rechunk the source"
            )
    need = channels * PER_CHANNEL
    if channels > 1 and need > limit:
        raise InvalidParameterError(
            f"per-channel statistics of {channels:,} channels need about {mib(need)}, more"
            f" than the memory bound max_memory ({mib(limit)}); raise it to at least"
            f" {mib(need * 1.25)}, or quantize per tensor or in blocks (block_size)"
        )
