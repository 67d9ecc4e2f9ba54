"""Run a job's passes on a Dask cluster (``distributed``).

A task is a run of consecutive blocks (at least ~64 MiB of source by default) and carries
only the blocks' slices and a reference to the pass's small work object, which is a task of
its own (computed once, fetched by each worker that needs it). Workers open the source and
destination once per process, write their blocks' chunks straight to the destination (one
block is whole destination chunks, so no two tasks touch the same stored object and no lock is
needed) and return the blocks' statistics. The client merges them in block order, so float
sums fold exactly as in a local run, and it alone writes the progress snapshot. Tasks are
idempotent: a retried or duplicated task rewrites the same bytes.

Lost workers: nothing a pass needs lives only on a worker (the work object is a task, not
scattered data), so the scheduler runs a dead worker's tasks again elsewhere, the work
object's too; a task the scheduler gives up on (``KilledWorker``) is submitted again, a few
times. A pass in which no task finishes for ``stall_timeout`` seconds (default 300,
``QSTREAM_DASK_STALL``), or whose cluster connection closes, fails with
:class:`ClusterLost`: one line saying the job is resumable (what finished stays; the same
command resumes).

This module imports ``distributed``; ``qstream.DaskExecutor`` loads it on first use. Like
:mod:`qstream.engine.run.executors`, it is a leaf: it runs the work it is handed.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import distributed
from distributed import Client, Future

from ...errors import InvalidParameterError, StoreError
from ...kernels.numpy_twins import numpy_kernels
from .executors import Item, ItemT, in_order
from .handles import forget

TASK_BYTES = 64 << 20  # source bytes a task reads at least (when there are blocks enough)
LOST_RETRIES = 3  # times a pass's lost tasks are submitted again before the job fails
# what a task's future raises when the scheduler gave it up (its workers kept dying) or
# cancelled it
LOST = (distributed.client.FutureCancelledError, distributed.KilledWorker)
# the client's connection to the cluster failed (the scheduler gone, a comm closed under a
# call); a task's own errors come through its future as what it raised
COMM = (distributed.comm.CommClosedError,)
STALL_TIMEOUT = 300.0  # seconds a pass may go without a task finishing (QSTREAM_DASK_STALL)
POLL = 1.0  # seconds between looks at the deadline while a task is awaited
RESUMABLE = "the job is resumable: run the same command again (what finished is kept)"
# how long after a worker left a local cluster checks, once, whether one of its name is back,
# and else closes its nanny for good (Dask: 15 s). The nanny restarts a killed worker itself;
# a check that falls while the worker is down (killed again, or still starting) dropped
# workers that were coming back, so a local cluster makes it once a day
RESTART_GRACE = "86400s"


class ClusterLost(StoreError):
    """The cluster lost a pass's work, made no progress before the deadline, or its
    connection closed; the job stays resumable (the same command resumes)."""


def stall_timeout_from_env() -> float:
    """The default ``stall_timeout``: ``QSTREAM_DASK_STALL`` (seconds), else 300."""
    raw = os.environ.get("QSTREAM_DASK_STALL", "")
    if not raw:
        return STALL_TIMEOUT
    try:
        value = float(raw)
        if not math.isfinite(value) or value <= 0:
            raise ValueError
    except ValueError:
        raise InvalidParameterError(
            f"QSTREAM_DASK_STALL must be a number of seconds > 0, got {raw!r}"
        ) from None
    return value


# what a pass is called in messages, by its work object's class (else the class's name)
PASS_NAMES = {
    "RangesWork": "statistics",
    "HistogramWork": "histogram",
    "DualHistogramWork": "histogram",
    "QuantizeWork": "quantize",
    "DequantizeWork": "dequantize",
    "UnitWork": "small-tensor",
}


def _one_line(e: BaseException, limit: int = 200) -> str:
    """``Type: message`` on one line, cut at ``limit`` characters."""
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _identity(x: Any) -> Any:
    """The work-object task: the object itself (recomputed from the graph if lost)."""
    return x


class _Clock:
    """When a pass last made progress (a task of it finished, or its result was taken)."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.last = time.monotonic()

    def tick(self, future: Future[Any] | None = None) -> None:
        """A task finished (a future's done callback: only a result counts)."""
        if future is None or future.status == "finished":
            self.last = time.monotonic()

    def left(self) -> float:
        """Seconds until the deadline (<= 0: passed)."""
        return self.limit - (time.monotonic() - self.last)


_WARMED: set[str] = set()  # clients (by id) whose workers have the plugin


def _run_blocks(
    work: Callable[[Any], Any], blocks: list[Any], kernel_threads: int, twins: bool = False
) -> list[Any]:
    """A task: ``work`` on each block, with ``kernel_threads`` Numba threads (the setting is
    per thread, so it is made in every task), or with the kernels' NumPy twins where the job
    runs them (``twins``: the submitting job's choice). Exact statistics of the blocks are
    combined here, so only one partial per task travels back."""
    from ...kernels.numpy_twins import using_numpy_kernels

    if not twins:
        from ...kernels.runtime import limit_threads

        limit_threads(kernel_threads)
    with using_numpy_kernels(twins):
        results = [work(b) for b in blocks]
    combine: Callable[[list[Any]], list[Any]] | None = getattr(work, "combine", None)
    return results if combine is None else combine(results)


class _Task:
    """A submitted batch: its future and ``(index, blocks)``."""

    def __init__(self, future: Future[list[Any]], batch: tuple[int, list[Any]]) -> None:
        self.future, self.batch = future, batch

    def cancel(self) -> None:
        """Drop the batch: its future is released, so the scheduler forgets a task no client
        wants (one not started never runs). A message, not a call: it does not wait on a
        scheduler that may be gone."""
        with contextlib.suppress(Exception):
            self.future.release()


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
        may (:mod:`qstream.engine.run.worker_imports`)."""
        from .worker_imports import ready_for_workers

        ready_for_workers(zarr=True)
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
    mmap; see the README). A killed worker's nanny starts it again, and the cluster keeps
    it (:data:`RESTART_GRACE`: with Dask's default, a cluster whose workers were killed a few
    times, or restarted slowly on a busy machine, shrank to one worker, or none)."""
    import dask

    env: dict[str, Any] = {"distributed.deploy.lost-worker-timeout": RESTART_GRACE}
    if not trim_malloc:
        env["distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"] = None
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
    two tasks or more). ``stall_timeout``: seconds a pass may go without any of its tasks
    finishing before the job fails with :class:`ClusterLost` (resumable; default
    ``QSTREAM_DASK_STALL``, else 300). A lost worker's tasks run again on the others.
    """

    distributed = True

    def __init__(
        self,
        client: Client | None = None,
        kernel_threads: int = 1,
        blocks_per_task: int | None = None,
        stall_timeout: float | None = None,
    ) -> None:
        if int(kernel_threads) < 1:
            raise InvalidParameterError(f"kernel_threads must be >= 1, got {kernel_threads}")
        if blocks_per_task is not None and int(blocks_per_task) < 1:
            raise InvalidParameterError(f"blocks_per_task must be >= 1, got {blocks_per_task}")
        if stall_timeout is None:
            stall_timeout = stall_timeout_from_env()
        elif not (math.isfinite(stall_timeout) and stall_timeout > 0):
            raise InvalidParameterError(f"stall_timeout must be > 0 seconds, got {stall_timeout}")
        self._client = client
        self.kernel_threads = int(kernel_threads)
        self.blocks_per_task = None if blocks_per_task is None else int(blocks_per_task)
        self.stall_timeout = float(stall_timeout)
        self.last_blocks_per_task: int | None = None  # what the last pass chose
        self.resubmitted = 0  # tasks submitted again after the scheduler gave them up

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
            # a worker dying meanwhile fails the broadcast (after the connect timeout); the
            # scheduler keeps the plugin for the workers that start later all the same
            with contextlib.suppress(*COMM, OSError):
                client.register_plugin(QstreamWorkerPlugin(), name="qstream")
            _WARMED.add(client.id)

    def _stalled(self, client: Client, label: str) -> ClusterLost:
        """The error of a pass that made no progress before the deadline."""
        try:
            workers = f"{len(client.nthreads())} workers now"
        except Exception:  # (the scheduler gone too)
            workers = "scheduler unreachable"
        return ClusterLost(
            f"the Dask cluster finished no task of the {label} pass in"
            f" {self.stall_timeout:g} s ({workers}; QSTREAM_DASK_STALL sets this deadline);"
            f" {RESUMABLE}"
        )

    def map_ordered(
        self,
        blocks: Sequence[ItemT],
        work: Callable[[ItemT], Any],
        *,
        workers: int = 0,
        inflight: int | None = None,
    ) -> Generator[tuple[ItemT, Any], None, None]:
        """See :class:`qstream.engine.run.executors.Executor`; ``inflight`` counts tasks here
        (default: two per worker thread)."""
        if not len(blocks):
            return
        client = self.client
        kind = type(work).__name__
        label = PASS_NAMES.get(kind, kind)
        try:
            yield from self._map(client, blocks, work, kind.lower(), label, inflight)
        except COMM as e:
            raise ClusterLost(
                f"the connection to the Dask cluster closed in the {label} pass"
                f" ({_one_line(e)}); {RESUMABLE}"
            ) from None

    def _map(
        self,
        client: Client,
        blocks: Sequence[ItemT],
        work: Callable[[ItemT], Any],
        name: str,
        label: str,
        inflight: int | None,
    ) -> Generator[tuple[ItemT, Any], None, None]:
        self._prepare(client)
        k = self.per_task(blocks)
        self.last_blocks_per_task = k
        batches = ((i, list(blocks[i * k : (i + 1) * k])) for i in range(-(-len(blocks) // k)))
        window = max(1, inflight or 2 * self.threads())
        run_id = uuid.uuid4().hex[:12]
        clock = _Clock(self.stall_timeout)
        # the work object is a task of its own, not scattered data: if every worker holding
        # it dies, the scheduler computes it again (a scattered copy would be gone for good)
        shared: list[Future[Any]] = []
        lost = [0]  # times the scheduler gave up tasks of this pass

        def work_future() -> Future[Any]:
            if not shared or shared[0].status in ("error", "cancelled", "lost"):
                if shared:
                    with contextlib.suppress(Exception):
                        shared[0].release()
                    shared.clear()
                key = f"qstream-{name}-{run_id}-work-{lost[0]}"
                shared.append(client.submit(_identity, work, key=key, pure=False))
            return shared[0]

        twins = numpy_kernels()  # (the job's kernel choice, made in the tasks too)

        def submit(batch_i: tuple[int, list[ItemT]]) -> _Task:
            i, batch = batch_i
            fut = client.submit(
                _run_blocks,
                work_future(),
                batch,
                self.kernel_threads,
                twins,
                key=f"qstream-{name}-{run_id}-{i}-{lost[0]}",
                pure=False,
                retries=2,
            )
            fut.add_done_callback(clock.tick)
            return _Task(fut, batch_i)

        def fetch(task: _Task) -> list[Any]:
            while True:
                while not task.future.done():
                    left = clock.left()
                    if left <= 0:
                        raise self._stalled(client, label)
                    with contextlib.suppress(TimeoutError):
                        distributed.wait([task.future], timeout=min(POLL, left))
                try:
                    results: list[Any] = task.future.result()
                except LOST as e:
                    task.cancel()
                    lost[0] += 1
                    if lost[0] > LOST_RETRIES:
                        raise ClusterLost(
                            f"the Dask cluster gave up tasks of the {label} pass"
                            f" {lost[0]} times, its workers dying ({_one_line(e)});"
                            f" {RESUMABLE}"
                        ) from None
                    self.resubmitted += 1
                    task = submit(task.batch)  # (a new key: a given-up key stays erred)
                    continue
                task.future.release()
                clock.tick()  # (the deadline counts time waited on the cluster, not merging)
                return results

        tasks = in_order(batches, submit, window, fetch)
        try:
            for (_, batch), results in tasks:
                yield from zip(batch, results, strict=True)
        finally:
            tasks.close()
            for f in shared:
                with contextlib.suppress(Exception):
                    f.release()

    def release(self, token: str) -> None:
        """Forget the run's handles here and on every worker."""
        forget(token)  # the client's own handles
        with contextlib.suppress(Exception):  # workers gone: nothing of theirs to forget
            self.client.run(forget, token)

    def __repr__(self) -> str:
        return (
            f"DaskExecutor(client={self._client!r}, kernel_threads={self.kernel_threads},"
            f" blocks_per_task={self.blocks_per_task}, stall_timeout={self.stall_timeout:g})"
        )
