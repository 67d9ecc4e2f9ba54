"""Run blocks through read -> compute -> write with a bounded number in flight.

Reads and writes run on a small thread pool (Zarr releases the GIL in its codecs and I/O);
compute runs in the calling thread, where the Numba kernels use every core. At most
``inflight`` blocks are held at once, so memory is bounded by the plan, never by the array.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .plan import Block


def run(
    blocks: Iterable[Block],
    read: Callable[[Block], Any],
    compute: Callable[[Block, Any], Any],
    write: Callable[[Block, Any], None] | None = None,
    *,
    inflight: int = 3,
    progress: Callable[[Block], None] | None = None,
) -> None:
    """Read blocks ahead, compute each in order, write behind; propagate the first error."""
    inflight = max(1, inflight)
    pending_reads: deque[tuple[Block, Future]] = deque()
    pending_writes: deque[tuple[Block, Future]] = deque()
    todo = iter(blocks)
    with ThreadPoolExecutor(max_workers=inflight + 1, thread_name_prefix="qstream-io") as pool:
        try:

            def refill() -> None:
                while len(pending_reads) + len(pending_writes) < inflight + 1:
                    b = next(todo, None)
                    if b is None:
                        return
                    pending_reads.append((b, pool.submit(read, b)))

            refill()
            while pending_reads:
                block, fut = pending_reads.popleft()
                result = compute(block, fut.result())
                if write is not None:
                    pending_writes.append((block, pool.submit(write, block, result)))
                elif progress:
                    progress(block)
                while pending_writes and (
                    pending_writes[0][1].done() or len(pending_writes) >= inflight
                ):
                    b, w = pending_writes.popleft()
                    w.result()
                    if progress:
                        progress(b)
                refill()
            while pending_writes:
                b, w = pending_writes.popleft()
                w.result()
                if progress:
                    progress(b)
        except BaseException:
            # blocks already computed still land (a resume then skips them); reads are dropped
            for _, f in pending_reads:
                f.cancel()
            raise
