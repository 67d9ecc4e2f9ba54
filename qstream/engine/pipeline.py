"""Run a job's blocks: ``work(block)`` on worker threads, ``merge(block, result)`` in order.

Each worker takes a whole block through read -> kernels -> write, with its own share of
Numba's threads; there is no hand-off between an I/O pool and a compute thread, so on few
cores no kernel waits for a thread that a read or a write holds. Results are merged in block
order in the calling thread, so floating-point merges give the same bits whatever the number
of workers or the order in which blocks finish. At most ``inflight`` blocks are started and
not yet merged; a block's data lives only inside ``work``, so memory is bounded by
``workers`` x one block, never by the array.

This is the local executor; ``work`` is a function of the block alone (it opens nothing it
was not given), so another executor (Dask) can run the same work elsewhere.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .plan import Block


def default_workers() -> int:
    """Workers a job runs by default: two per kernel thread of the calling thread, so that
    while one waits on the disk (a write, an uncached read) another computes."""
    from ..kernels.runtime import kernel_threads

    return 2 * kernel_threads()


def run(
    blocks: Iterable[Block],
    work: Callable[[Block], Any],
    merge: Callable[[Block, Any], None] | None = None,
    *,
    workers: int | None = None,
    inflight: int | None = None,
    progress: Callable[[Block], None] | None = None,
) -> None:
    """Run ``work`` on every block and ``merge`` the results in block order.

    ``workers`` defaults to :func:`default_workers`, capped by the number of blocks; each
    worker runs kernels on ``max(1, threads // workers)`` of the calling thread's
    ``numba.get_num_threads()`` threads.
    ``progress(block)`` is called after each merge. The first error stops the job: blocks not
    started are dropped, running ones finish (their output stays valid for a resume).
    """
    from ..kernels.runtime import kernel_threads, limit_threads

    blocks = list(blocks)
    if not blocks:
        return
    threads = kernel_threads()
    workers = max(1, min(workers or default_workers(), len(blocks)))
    per_worker = max(1, threads // workers)
    inflight = max(workers, inflight or 2 * workers)
    pending: deque[tuple[Block, Future]] = deque()
    todo = iter(blocks)
    with ThreadPoolExecutor(
        max_workers=workers,
        thread_name_prefix="qstream-worker",
        initializer=limit_threads,
        initargs=(per_worker,),
    ) as pool:
        try:
            while True:
                while len(pending) < inflight:
                    b = next(todo, None)
                    if b is None:
                        break
                    pending.append((b, pool.submit(work, b)))
                if not pending:
                    break
                block, fut = pending.popleft()
                result = fut.result()
                if merge is not None:
                    merge(block, result)
                if progress is not None:
                    progress(block)
        except BaseException:
            for _, f in pending:
                f.cancel()
            raise
