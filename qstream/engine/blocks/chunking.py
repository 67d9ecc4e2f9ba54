"""The output's chunks when the user chooses them (``quantize_store(..., chunks=...)``)."""

from __future__ import annotations

import math

import numpy as np

from ...budget import MAX_SOURCE_CHUNKS, WORK_FACTOR, memory_limit, mib
from ...errors import InvalidParameterError

# bytes the job holds per chunk of its output at once: a resume lists the output's chunk
# files to find the blocks that landed (measured: ~150 a chunk at the listing's peak)
PER_CHUNK = 256


def check_chunks(chunks, shape, block_size, axis, dtype, max_memory) -> tuple[int, ...]:
    """``chunks`` (one positive integer per axis; -1 or larger than the axis: the whole
    axis) checked against the array and the memory bound: one chunk is one block of the job,
    and one worker's block (``WORK_FACTOR`` times its source bytes) must fit in the bound,
    which stays what it is. Along a blocked axis, a multiple of ``block_size``.

    The plan itself costs nothing a block (:class:`~qstream.budget.BlockGrid`), but
    each chunk is a file or an object, listed when a run resumes (:data:`PER_CHUNK` bytes
    each): chunks that many would overflow the bound, or more than a source may have
    (:data:`~qstream.budget.MAX_SOURCE_CHUNKS`), are refused before any work."""
    shape = tuple(int(d) for d in shape)
    if isinstance(chunks, int | np.integer) and not isinstance(chunks, bool):
        chunks = (int(chunks),) * len(shape)
    if not isinstance(chunks, list | tuple) or len(chunks) != len(shape):
        raise InvalidParameterError(
            f"chunks must give one size per axis of the array {list(shape)}, got {chunks!r}"
        )
    out = []
    for c, d in zip(chunks, shape, strict=True):
        if isinstance(c, bool) or not isinstance(c, int | np.integer) or (c <= 0 and c != -1):
            raise InvalidParameterError(f"chunks must be positive integers (or -1), got {chunks!r}")
        out.append(max(1, d) if c == -1 or c > d else int(c))
    if block_size and axis is not None and out[axis] % block_size and out[axis] < shape[axis]:
        raise InvalidParameterError(
            f"chunks along axis {axis} ({out[axis]}) must be a multiple of block_size {block_size}"
        )
    block = math.prod(out) * max(4, np.dtype(dtype).itemsize)
    limit = memory_limit(max_memory)
    count = math.prod(-(-d // c) for d, c in zip(shape, out, strict=True)) if all(shape) else 0
    if count * PER_CHUNK > limit or count > MAX_SOURCE_CHUNKS:
        why = (
            f"each is a file, listed when a run resumes (~{PER_CHUNK} bytes a chunk:"
            f" {mib(count * PER_CHUNK)}), more than the memory bound max_memory ({mib(limit)})"
            if count * PER_CHUNK > limit
            else f"more than qstream writes one by one ({MAX_SOURCE_CHUNKS:,})"
        )
        raise InvalidParameterError(
            f"chunks of {out} cut the array {list(shape)} into {count:,} chunks; {why}:"
            " choose larger chunks (a few MiB each)"
        )
    if WORK_FACTOR * block > limit:
        raise InvalidParameterError(
            f"chunks of {out} make blocks of {mib(block)}; a block needs {WORK_FACTOR}x that of"
            f" working memory, more than the memory bound max_memory ({mib(limit)}): choose"
            " smaller chunks or raise max_memory"
        )
    return tuple(out)
