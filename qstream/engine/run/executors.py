"""Where a pass's blocks run: this process's threads (or the calling thread alone).

An executor takes a pass's items (blocks, or units of work such as a checkpoint's small
tensors) and its picklable work object (``qstream.engine.blocks.work``) and yields ``(item,
result)`` in order, with a bounded number of items started and not yet yielded. The job
merges what it yields in the calling thread, so float sums fold in block order whatever
executor ran the blocks: a local run and a cluster run give the same bits.

Executors are leaves: they run what they are handed and import nothing of the job above
them. ``executor=`` of the public functions accepts None or ``"local"`` (this process's
threads), ``"dask"`` (the current ``distributed`` client, :mod:`qstream.engine.run.dask`) or an
executor object; :func:`qstream.engine.run.scheduling.resolve` turns those into an executor.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from ...errors import InvalidParameterError
from ...kernels.numpy_twins import carried, numpy_kernels
from .handles import forget
from .worker_imports import ready_for_workers


class Item(Protocol):
    """What an executor runs work on: a block, or a unit of work sized by its ``shape``."""

    @property
    def shape(self) -> tuple[int, ...]:
        """The item's extent (its elements are what a task's size is counted in)."""
        ...


ItemT = TypeVar("ItemT", bound=Item)


class Executor(Protocol):
    """What the engine needs from an executor."""

    #: whether blocks run in other processes (sources and destinations must be shared)
    distributed: bool

    def map_ordered(
        self,
        blocks: Sequence[ItemT],
        work: Callable[[ItemT], Any],
        *,
        workers: int,
        inflight: int | None = None,
    ) -> Generator[tuple[ItemT, Any], None, None]:
        """``(block, work(block))`` for every block, in block order. ``workers`` is what the
        local memory bound allows; ``inflight`` bounds the blocks started and not yet yielded
        (default ``2 * workers``). A work object with a ``combine(results)`` method returns
        exact (order-free) statistics: an executor may pass it the results of consecutive
        blocks and yield what it returns (e.g. the combined result with the first block and
        None with the rest).
        """
        ...

    def release(self, token: str) -> None:
        """Forget the handles a run opened (``token`` is the run's)."""
        ...


class Cancellable(Protocol):
    """A submitted piece of work that can be dropped before it runs."""

    def cancel(self) -> object:
        """Drop the work if it has not started (what it returns is ignored)."""
        ...


S = TypeVar("S")
F = TypeVar("F", bound=Cancellable)
R = TypeVar("R")


def in_order(
    items: Iterable[S], submit: Callable[[S], F], window: int, result: Callable[[F], R]
) -> Generator[tuple[S, R], None, None]:
    """``(item, result(submit(item)))`` for each item, in order, with at most ``window`` items
    submitted and not yet yielded; what was submitted and not yielded is cancelled when the
    consumer stops or an error is raised."""
    pending: deque[tuple[S, F]] = deque()
    todo: Iterator[S] = iter(items)
    try:
        while True:
            while len(pending) < window:
                item = next(todo, None)
                if item is None:
                    break
                pending.append((item, submit(item)))
            if not pending:
                return
            item, fut = pending.popleft()
            yield item, result(fut)
    finally:
        for _, f in pending:
            f.cancel()


def _future_result(fut: Future[Any]) -> Any:
    """What a thread pool's future returns (or raises)."""
    return fut.result()


def default_workers() -> int:
    """Workers a job runs by default: two per kernel thread of the calling thread, so that
    while one waits on the disk (a write, an uncached read) another computes."""
    from ...kernels.numpy_twins import kernel_threads

    return 2 * kernel_threads()


def _pool(n: int) -> ThreadPoolExecutor:
    """``n`` worker threads sharing the calling thread's kernel threads (Numba's setting is
    per thread); their work runs under the calling job's kernel choice (:func:`carried`)."""
    if numpy_kernels():  # (no Numba: nothing to share)
        return ThreadPoolExecutor(max_workers=n, thread_name_prefix="qstream-worker")
    from ...kernels.runtime import kernel_threads, limit_threads

    return ThreadPoolExecutor(
        max_workers=n,
        thread_name_prefix="qstream-worker",
        initializer=limit_threads,
        initargs=(max(1, kernel_threads() // n),),
    )


class LocalExecutor:
    """Worker threads of this process; each takes a whole block through read -> kernels ->
    write with its share of Numba's threads, so no kernel waits for a thread that a read or
    a write holds. Each pass starts its own threads, except inside :meth:`session`, where
    every pass (of every job) shares one pool."""

    distributed = False

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pool_workers = 0

    @contextlib.contextmanager
    def session(self, workers: int | None = None) -> Iterator[LocalExecutor]:
        """One pool of ``workers`` threads (default: :func:`default_workers`) for every pass
        run inside, as a conversion of many tensors runs many small jobs; nested sessions use
        the outer one."""
        if self._pool is not None:
            yield self
            return
        n = workers or default_workers()
        ready_for_workers()
        pool = _pool(n)
        self._pool, self._pool_workers = pool, n
        try:
            yield self
        finally:
            self._pool, self._pool_workers = None, 0
            pool.shutdown(wait=True)

    def submit(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        """Run ``fn(*args)`` on the session's pool (a future)."""
        if self._pool is None:
            raise RuntimeError("LocalExecutor.submit needs an open session()")
        return self._pool.submit(carried(fn), *args)

    def map_ordered(
        self,
        blocks: Sequence[ItemT],
        work: Callable[[ItemT], Any],
        *,
        workers: int,
        inflight: int | None = None,
    ) -> Generator[tuple[ItemT, Any], None, None]:
        """See :class:`Executor`."""
        if not len(blocks):
            return
        pool = self._pool
        if pool is not None:
            workers = max(1, min(workers, len(blocks), self._pool_workers))
            results = in_order(
                blocks,
                lambda b: pool.submit(carried(work), b),
                max(workers, inflight or 2 * workers),
                _future_result,
            )
            try:
                yield from results
            finally:
                results.close()
            return
        workers = max(1, min(workers, len(blocks)))
        inflight = max(workers, inflight or 2 * workers)
        ready_for_workers()
        with _pool(workers) as own:
            results = in_order(
                blocks, lambda b: own.submit(carried(work), b), inflight, _future_result
            )
            try:
                yield from results
            finally:
                results.close()  # drop what has not started before the pool waits

    def release(self, token: str) -> None:
        """See :class:`Executor`."""
        forget(token)

    def __repr__(self) -> str:
        return "LocalExecutor()"


class InlineExecutor:
    """Blocks run one after another in the calling thread: for a job that is one unit of
    work of a larger run (a small tensor of a conversion, on a worker of its own)."""

    distributed = False

    def map_ordered(
        self,
        blocks: Sequence[ItemT],
        work: Callable[[ItemT], Any],
        *,
        workers: int = 1,
        inflight: int | None = None,
    ) -> Generator[tuple[ItemT, Any], None, None]:
        """See :class:`Executor`."""
        for b in blocks:
            yield b, work(b)

    def release(self, token: str) -> None:
        """See :class:`Executor`."""
        forget(token)


def check_shared(what: str, target: Any, *, executor: Executor) -> None:
    """Refuse ``target`` (a source or destination) that processes on other machines cannot
    reach: in-process objects, ``memory://`` stores and ``.zip`` files."""
    import numpy as np

    if not executor.distributed:
        return
    reason = None
    if isinstance(target, np.ndarray):
        reason = "a NumPy array lives in this process only"
    elif isinstance(target, (str, os.PathLike)):
        p = os.fspath(target)
        if p.startswith("memory://"):
            reason = "an in-memory store lives in this process only"
        elif p.endswith(".zip"):
            reason = "a .zip store cannot be written by several processes at once"
    else:
        import zarr

        store = target.store_path.store if isinstance(target, zarr.Array) else target
        if isinstance(store, zarr.storage.MemoryStore):
            reason = "an in-memory store lives in this process only"
        elif isinstance(store, zarr.storage.ZipStore):
            reason = "a .zip store cannot be written by several processes at once"
        elif isinstance(target, zarr.Array):
            reason = "an open zarr.Array is an object of this process"
        elif not hasattr(store, "get"):  # not a zarr store: a tensor or array-like object
            reason = f"a {type(target).__name__} object lives in this process only"
    if reason:
        name = os.fspath(target) if isinstance(target, (str, os.PathLike)) else None
        named = f"{what} {name}" if name else f"a {type(target).__name__} {what}"
        raise InvalidParameterError(
            f"{named} cannot be used with a distributed executor: {reason}; "
            "pass a path on a filesystem every worker shares, or an object-store URL (s3://...)"
        )
