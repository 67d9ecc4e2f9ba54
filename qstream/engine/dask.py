"""Run a job's passes on a Dask cluster (``distributed``).

A task is a run of consecutive blocks (at least ~64 MiB of source by default) and carries
only the pass's small work object (scattered to the workers once per pass) and the blocks'
slices. Workers open the source and destination once per process, write their blocks' chunks
straight to the destination (one block is whole destination chunks, so no two tasks touch the
same stored object and no lock is needed) and return the blocks' statistics. The client merges
them in block order, so float sums fold exactly as in a local run, and it alone writes the
progress snapshot. Tasks are idempotent: a retried or duplicated task rewrites the same bytes.

This module imports ``distributed``; ``qstream.DaskExecutor`` loads it on first use. Like
:mod:`qstream.engine.executors`, it is a leaf: it runs the work it is handed.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import distributed
from distributed import Client, Future

from ..errors import InvalidParameterError, StoreError
from .executors import Item, ItemT, in_order
from .handles import forget

TASK_BYTES = 64 << 20  # source bytes a task reads at least (when there are blocks enough)
LOST_RETRIES = 3  # times a pass's lost work object is scattered again before the job fails
# what a task's future raises when the data it needs died with its workers
LOST = (distributed.client.FutureCancelledError, distributed.KilledWorker)


class ClusterLost(StoreError):
    """The cluster kept losing a pass's work; the job stays resumable."""


_WARMED: set[str] = set()  # clients (by id) whose workers have the plugin


def _run_blocks(work: Callable[[Any], Any], blocks: list[Any], kernel_threads: int) -> list[Any]:
    """A task: ``work`` on each block, with ``kernel_threads`` Numba threads (the setting is
    per thread, so it is made in every task). Exact statistics of the blocks are combined
    here, so only one partial per task travels back."""
    from ..kernels.runtime import limit_threads

    limit_threads(kernel_threads)
    results = [work(b) for b in blocks]
    combine: Callable[[list[Any]], list[Any]] | None = getattr(work, "combine", None)
    return results if combine is None else combine(results)


class _Task:
    """A submitted batch: its future, ``(index, blocks)`` and which copy of the work object
    it uses; cancelled with the future."""

    def __init__(
        self, future: Future[list[Any]], batch: tuple[int, list[Any]], scatter: int
    ) -> None:
        self.future, self.batch, self.scatter = future, batch, scatter

    def cancel(self) -> None:
        self.future.cancel()


class QstreamWorkerPlugin(distributed.WorkerPlugin):
    """Imports qstream and compiles (or loads from ``NUMBA_CACHE_DIR``) its common kernels
    when a worker starts, so the first task does not stall; register it with
    ``client.register_plugin(QstreamWorkerPlugin())`` (:class:`DaskExecutor` does)."""

    name = "qstream"
    #: what a worker runs at start-up, as ``module:function``. It runs whole jobs, which sit
    #: above the executors, so it is named here and imported on the worker, as unpickling a
    #: function sent to a worker would (the executors never import the job).
    warm = "qstream.engine.warmup:warm_kernels"

    def setup(self, worker: distributed.Worker) -> None:
        """Compile the kernels in the worker's process, and import what its task threads
        may (:mod:`qstream.engine.worker_imports`)."""
        from .worker_imports import ready_for_workers

        ready_for_workers(zarr=True, zstd=True)
        module, _, function = self.warm.partition(":")
        getattr(importlib.import_module(module), function)()


@contextlib.contextmanager
def local_client(
    n_workers: int, *, threads_per_worker: int = 2, trim_malloc: bool = False
) -> Iterator[Client]:
    """A ``LocalCluster`` of ``n_workers`` worker processes and its client, for one run
    (``--scheduler local:N``). Two threads per worker by default, each task's kernels on one
    Numba thread: while one task waits on the store the other computes, as the local
    executor's two workers per kernel thread do. The nanny's ``MALLOC_TRIM_THRESHOLD_`` is
    unset in the workers unless ``trim_malloc`` (big temporaries are then not each a fresh
    mmap; see the README)."""
    import dask

    env = (
        {} if trim_malloc else {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}
    )
    with (
        dask.config.set(env),
        distributed.LocalCluster(
            n_workers=n_workers,
            threads_per_worker=threads_per_worker,
            processes=True,
            dashboard_address=None,
            silence_logs=40,
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


class DaskExecutor:
    """Run blocks on the Dask cluster of ``client`` (default: the current client,
    ``distributed.get_client()``).

    ``kernel_threads``: Numba threads per task (default 1; a worker runs as many tasks at
    once as it has threads, so more oversubscribes the cores). ``blocks_per_task``: blocks a
    task runs (default: enough for ~64 MiB of source, while every worker thread still gets
    two tasks or more).
    """

    distributed = True

    def __init__(
        self,
        client: Client | None = None,
        kernel_threads: int = 1,
        blocks_per_task: int | None = None,
    ) -> None:
        if int(kernel_threads) < 1:
            raise InvalidParameterError(f"kernel_threads must be >= 1, got {kernel_threads}")
        if blocks_per_task is not None and int(blocks_per_task) < 1:
            raise InvalidParameterError(f"blocks_per_task must be >= 1, got {blocks_per_task}")
        self._client = client
        self.kernel_threads = int(kernel_threads)
        self.blocks_per_task = None if blocks_per_task is None else int(blocks_per_task)
        self.last_blocks_per_task: int | None = None  # what the last pass chose
        self.rescattered = 0  # times a pass's work object was lost with its workers

    @classmethod
    @contextlib.contextmanager
    def local(cls, n_workers: int, **kwargs: Any) -> Iterator[DaskExecutor]:
        """An executor on a fresh ``LocalCluster`` of ``n_workers`` worker processes (see
        :func:`local_client`), closed on exit: ``with qstream.DaskExecutor.local(2) as ex:``."""
        with local_client(n_workers) as client:
            yield cls(client, **kwargs)

    @property
    def client(self) -> Client:
        """The client blocks run through."""
        if self._client is not None:
            return self._client
        try:
            return distributed.get_client()
        except ValueError:
            raise InvalidParameterError(
                "executor='dask' needs a running Dask client: create one with"
                " distributed.Client(...) first, or pass qstream.DaskExecutor(client=...)"
            ) from None

    def threads(self) -> int:
        """Worker threads in the cluster now."""
        nthreads: dict[str, int] = self.client.nthreads()
        return max(1, sum(nthreads.values()))

    def per_task(self, blocks: Sequence[Item], itemsize: int = 4) -> int:
        """Blocks per task for ``blocks``."""
        if self.blocks_per_task:
            return self.blocks_per_task
        if not blocks:
            return 1
        block_bytes = max(1, math.prod(blocks[0].shape) * itemsize)
        k = math.ceil(TASK_BYTES / block_bytes)
        return max(1, min(k, math.ceil(len(blocks) / (2 * self.threads()))))

    def _prepare(self, client: Client) -> None:
        if client.id not in _WARMED:
            client.register_plugin(QstreamWorkerPlugin(), name="qstream")
            _WARMED.add(client.id)

    def map_ordered(
        self,
        blocks: Sequence[ItemT],
        work: Callable[[ItemT], Any],
        *,
        workers: int = 0,
        inflight: int | None = None,
    ) -> Generator[tuple[ItemT, Any], None, None]:
        """See :class:`qstream.engine.executors.Executor`; ``inflight`` counts tasks here
        (default: two per worker thread)."""
        if not len(blocks):
            return
        client = self.client
        self._prepare(client)
        k = self.per_task(blocks)
        self.last_blocks_per_task = k
        batches = ((i, list(blocks[i * k : (i + 1) * k])) for i in range(-(-len(blocks) // k)))
        window = max(1, inflight or 2 * self.threads())
        run_id = uuid.uuid4().hex[:12]
        name = type(work).__name__.lower()
        # the work object goes to every worker once; if the workers holding it all die, it
        # is scattered again and the tasks that needed it are submitted again
        shared = [client.scatter([work], broadcast=True, hash=False)[0]]
        scatters = [0]  # times it was scattered again

        def submit(batch_i: tuple[int, list[ItemT]]) -> _Task:
            i, batch = batch_i
            fut = client.submit(
                _run_blocks,
                shared[0],
                batch,
                self.kernel_threads,
                key=f"qstream-{name}-{run_id}-{i}-{scatters[0]}",
                pure=False,
                retries=2,
            )
            return _Task(fut, batch_i, scatters[0])

        def fetch(task: _Task) -> list[Any]:
            while True:
                try:
                    results: list[Any] = task.future.result()
                    task.future.release()
                    return results
                except LOST as e:
                    if task.scatter == scatters[0]:  # lost with the current copy: a new one
                        if scatters[0] >= LOST_RETRIES:
                            raise ClusterLost(
                                f"the cluster lost this pass's work ({type(e).__name__}: {e})"
                                f" {LOST_RETRIES + 1} times (workers dying); the job is"
                                " resumable: run it again once the cluster is stable"
                            ) from None
                        with contextlib.suppress(Exception):
                            shared[0].release()
                        shared[0] = client.scatter([work], broadcast=True, hash=False)[0]
                        scatters[0] += 1
                        self.rescattered += 1
                    task = submit(task.batch)

        tasks = in_order(batches, submit, window, fetch)
        try:
            for (_, batch), results in tasks:
                yield from zip(batch, results, strict=True)
        finally:
            tasks.close()
            shared[0].release()

    def release(self, token: str) -> None:
        """Forget the run's handles here and on every worker."""
        forget(token)  # the client's own handles
        with contextlib.suppress(Exception):  # workers gone: nothing of theirs to forget
            self.client.run(forget, token)

    def __repr__(self) -> str:
        return (
            f"DaskExecutor(client={self._client!r}, kernel_threads={self.kernel_threads},"
            f" blocks_per_task={self.blocks_per_task})"
        )
