"""Run a pass: ``work(block)`` through an executor, ``merge(block, result)`` in block order.

The executor (:mod:`qstream.engine.run.executors`: this process's threads, or a Dask cluster)
runs the blocks; results are merged in block order in the calling thread, so floating-point
merges give the same bits whatever the number of workers, the executor, or the order in which
blocks finish. At most ``inflight`` blocks are started and not yet merged; a block's data
lives only inside ``work``, so memory is bounded by the blocks in flight, never by the array.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ...budget import Block
from .executors import Executor, LocalExecutor, default_workers

__all__ = ["default_workers", "run"]


def run(
    blocks: Iterable[Block],
    work: Callable[[Block], Any],
    merge: Callable[[Block, Any], None] | None = None,
    *,
    workers: int | None = None,
    inflight: int | None = None,
    progress: Callable[[Block], None] | None = None,
    executor: Executor | None = None,
) -> None:
    """Run ``work`` on every block and ``merge`` the results in block order.

    ``workers`` (local threads) defaults to :func:`default_workers`, capped by the number of
    blocks; each runs kernels on its share of the calling thread's Numba threads.
    ``progress(block)`` is called after each merge. The first error stops the pass: blocks not
    started are dropped, running ones finish (their output stays valid for a resume).
    """
    executor = executor or LocalExecutor()
    # (a plan's BlockGrid is a sequence made as it is read: listing it cost ~200 bytes a block)
    items = blocks if isinstance(blocks, Sequence) else list(blocks)
    results = executor.map_ordered(
        items, work, workers=workers or default_workers(), inflight=inflight
    )
    try:
        for block, result in results:
            if merge is not None:
                merge(block, result)
            if progress is not None:
                progress(block)
    finally:
        results.close()
