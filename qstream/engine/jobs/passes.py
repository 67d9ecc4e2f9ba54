"""What the passes of a store job share: the job as they see it, progress, targets.

A job (:class:`~qstream.engine.jobs.job.QuantizeJob`) drives its passes, which live in modules of
their own (:mod:`~qstream.engine.jobs.calibration_passes`,
:mod:`~qstream.engine.jobs.quantize_pass`,
:mod:`~qstream.engine.jobs.job_output`, :mod:`~qstream.engine.jobs.job_report`). They take the job
as a
:class:`JobView`, what they read of it, rather than importing the job.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ...budget import Block, BlockGrid
from ...io.storage import Source
from ...spec import QuantSpec
from ..blocks import JobPlan
from ..run import Executor, SourceRef

#: a progress reporter: ``progress(done, total)`` per block; one with a ``stage(name, total,
#: done)`` method also hears which pass starts
Progress = Callable[[int, int], Any]


class JobView(Protocol):
    """What the passes, the output and the report read of a job (``QuantizeJob`` is one)."""

    spec: QuantSpec
    plan: JobPlan
    blocks: BlockGrid
    source: Source
    ref: SourceRef
    executor: Executor
    token: str  # the run's: its handles, its lease on the output
    name: str  # the source's, for messages
    max_memory: int | None
    storage_options: dict[str, Any] | None
    compression: str
    layout: str
    dims: list[str]  # the output's dimension names
    view_histogram: bool
    views: bool  # False: the calibration draws no views (nothing reads them)
    passes: int
    bytes_read: int

    @property
    def memory(self) -> int:
        """The working memory the job may use."""
        ...

    def worker_count(self, cap: int | None = None) -> int:
        """Workers a pass runs (``cap``: at most that many, for passes that keep a partial
        per worker)."""
        ...

    def scan(
        self,
        blocks: Sequence[Block],
        work: Callable[[Block], Any],
        merge: Callable[[Block, Any], None] | None,
        progress: Progress | None,
        *,
        stage: str | None = None,
        workers: int | None = None,
        inflight: int | None = None,
        new_pass: bool = True,
    ) -> None:
        """One pass over ``blocks``: ``work`` on the executor, ``merge`` in block order."""
        ...


def report_stage(progress: Progress | None, name: str, total: int, done: int = 0) -> None:
    """Tell a progress reporter which pass starts, when it has a ``stage(name, total, done)``
    method (plain ``(done, total)`` callables are only called per block)."""
    stage = getattr(progress, "stage", None)
    if stage is not None:
        stage(name, total, done)


def counter(progress: Progress | None, total: int) -> Callable[[Block], None] | None:
    """A per-block tick that calls ``progress(done, total)`` (None without a reporter)."""
    if progress is None:
        return None
    n = [0]

    def tick(_b: Block) -> None:
        n[0] += 1
        progress(n[0], total)

    return tick


def fspath(target: Any) -> Any:
    """A path as a string; a store object as it is."""
    return os.fspath(target) if isinstance(target, (str, os.PathLike)) else target
