"""The driver of a checkpoint's conversion: its tensors in order, the root's index kept.

Runs of packs and small tensors go to the executor as units of work
(:mod:`qstream.engine.convert.units`); larger tensors are jobs of their own, two at once on a local
run. Every result is listed in the root's index (:class:`~qstream.io.outputs.rootindex.RootIndex`)
in batches; a failure or Ctrl-C stops the other running job at its next block and lists
what finished, so the conversion resumes.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ...budget import budget_units
from ...io.checkpoints import dtype_facts
from ...io.outputs import ERROR_KEYS, Destination, RootIndex, compact, destination, qarray
from ...io.outputs import pack_layout as packs
from ...io.storage import is_plain_dtype
from ...kernels.numpy_twins import carried, numpy_kernels
from ...spec import QuantSpec, Recipe
from ..jobs import QuantizeJob, report_stage
from ..run import Executor, InlineExecutor, pipeline, ready_for_workers
from .events import TensorEvent, describe_target
from .kept import keep_tensor
from .one_block import SmallTensorWork
from .pack_plan import PackItem
from .units import (
    Todo,
    UnitWork,
    clear_of_listed,
    gathered,
    pack_runs,
    unit_items,
    unit_kind,
)

if TYPE_CHECKING:
    from .pack_writer import PackResult

ROWS_PER_BATCH = 128  # finished tensors listed in one new document of the root's index


class Conversion:
    """The tensors of one conversion, in checkpoint order: runs of small tensors (one block
    of their job each) handed to the executor as units of work
    (``qstream.engine.convert.one_block``),
    larger tensors as jobs of their own (``in_flight`` at once, each within that share of
    the memory bound, their passes on the same workers). Results are listed in the root's
    index ``ROWS_PER_BATCH`` at a time (a count, so that a run writes the same documents
    whatever its speed), each batch a new document: a tensor finished but not listed when a
    run is killed is found complete by its own job on the re-run (a cheap look at its
    metadata)."""

    def __init__(
        self,
        tensors: dict[str, Any],
        keys: dict[str, str],
        index: RootIndex,
        dest: Destination,
        source: str,
        on_tensor: Callable[[TensorEvent], None] | None,
        progress: Callable[[int, int], None] | None,
        executor: Executor,
        *,
        max_memory: int | None,
        overwrite: bool,
        compression: str,
        checkpoint: Any,
        in_flight: int,
        packed: bool = False,
    ) -> None:
        self.tensors, self.keys, self.index, self.dest = tensors, keys, index, dest
        self.source, self.on_tensor, self.progress = source, on_tensor, progress
        self.executor = executor
        self.max_memory, self.overwrite, self.compression = max_memory, overwrite, compression
        self.checkpoint = checkpoint  # a CheckpointSource (workers open it themselves)
        self.results: dict[str, dict] = index.rows(whole=True)
        self.resumed = bool(self.results)  # (then the index is settled once all are listed)
        self.pending: list[dict] = []
        self.keep_dtypes: dict[str, str | None] = {}
        self.positions = {n: i for i, n in enumerate(tensors)}
        self.stop = threading.Event()
        self.in_flight = in_flight
        local_dst = destination.local_path(dest.target) is not None
        self.small_work = None
        if local_dst or executor.distributed:
            self.small_work = SmallTensorWork(
                uuid.uuid4().hex,
                path_of(checkpoint),
                source,
                path_of(dest.target),
                compression,
                max_memory,
                overwrite,
            )
            self.small_work.register(tensors)
        self.pack_work = None
        if packed:
            from .pack_writer import PackWork  # (a conversion with no pack never loads it)

            assert self.small_work is not None  # (packs are written to a local directory)
            self.pack_work = PackWork(
                self.small_work.token,
                self.small_work.checkpoint,
                source,
                path_of(dest.target),
                compression,
                max_memory,
            )

    def run(self, recipe: Recipe) -> None:
        """Convert every tensor not listed in the index yet, in order, listing each."""
        todo: list[Todo] = []
        n = len(self.tensors)
        specs = [recipe.spec_for(name, t.shape, t.dtype) for name, t in self.tensors.items()]
        pack_of: dict[int, int] = {}  # tensor -> its pack's number
        if self.pack_work is not None:  # planned over every tensor: the same packs on a re-run
            pack_of = pack_runs(list(self.tensors.values()), specs, self.max_memory)
            pack_of = clear_of_listed(pack_of, list(self.tensors), self.results)
        for i, (name, t) in enumerate(self.tensors.items()):
            spec = specs[i]
            keep_as = recipe.keep_dtype(name, t.shape, t.dtype) if spec is None else None
            self.keep_dtypes[name] = keep_as
            target = (
                ("keep" if not keep_as else f"keep/{keep_as}")
                if spec is None
                else describe_target(spec)
            )
            shown = dtype_facts(getattr(t, "source_dtype", t.dtype)).name  # (FP8: as stored)
            event = TensorEvent(i, n, name, tuple(t.shape), shown, target)
            if name in self.results:
                if self.on_tensor:
                    self.on_tensor(TensorEvent(**{**event.__dict__, "result": self.results[name]}))
                continue
            small = self.small_work is not None
            todo.append((event, t, spec, unit_kind(i, t, spec, pack_of, small, self.max_memory)))
        ready_for_workers(zarr=self._needs_zarr(todo))
        try:
            runs = itertools.groupby(gathered(todo), key=lambda item: item[3][0] == "job")
            for job, run in runs:
                (self._jobs if job else self._units)(list(run))
        except BaseException:  # a failure or Ctrl-C: what finished is listed, then re-raised
            self.stop.set()
            with contextlib.suppress(Exception):
                self.index.append(self.pending)
            raise
        self.index.append(self.pending)
        if self.resumed:  # the index's batches as an uninterrupted run writes them
            self.index.settle(list(self.results.values()), ROWS_PER_BATCH)

    def _needs_zarr(self, todo: list[Todo]) -> bool:
        """Whether block work may reach zarr-python: sub-byte codes (qstream's data types),
        a kept tensor of a dtype qstream writes without it only when plain, an output that
        is not a local folder."""
        if destination.local_path(self.dest.target) is None:
            return True
        for event, t, spec, _ in todo:
            if spec is not None:
                if spec.qtype.bits < 8:
                    return True
                continue
            kept = self.keep_dtypes.get(event.name)
            stored = getattr(t, "source_dtype", t.dtype)
            if not all(is_plain_dtype(d) for d in (kept or t.dtype, stored)):
                return True
        return False

    def _units(self, run: list[Todo]) -> None:
        """A run of small tensors and packs, a unit of work each on the executor's workers
        (one pipeline: packs and the small tensors between them overlap); a pack's tensors
        are listed in the index as one batch once it is published."""
        items, rows = unit_items(run, self.keys, self.positions, self.keep_dtypes)
        packed = self.pack_work is not None and any(isinstance(i, PackItem) for i in items)
        if packed:
            assert self.dest.local is not None  # (packs are written to a local directory)
            packs.ensure_folder(self.dest.local)
        # (each unit is at most a block budget: as many as the memory bound holds. A small
        # tensor is mostly Python, which one thread runs at a time: more workers than cores
        # only take turns; a pack is mostly kernels and a write, which do not hold it)
        workers = min(pipeline.default_workers(), budget_units(self.max_memory))
        if not packed:
            workers = min(workers, os.cpu_count() or 1)
        inflight = None if self.executor.distributed else workers  # (as many as run at once)
        work = UnitWork(self.small_work, self.pack_work)
        executor = self.executor
        if numpy_kernels() and not (packed or executor.distributed):
            # a small job's small tensors (NumPy twins on small arrays: Python, which holds the
            # lock) run faster in this thread than in threads taking turns (~20% of the run)
            executor = InlineExecutor()
        results = executor.map_ordered(items, work, workers=workers, inflight=inflight)
        try:
            for item, result in results:
                if isinstance(item, PackItem):
                    self._flush()  # (a pack's rows are a batch of their own)
                    self._pack_finished(item, result, rows)
                    continue
                ev, t, spec = rows[item.name]
                if self.on_tensor:
                    self.on_tensor(ev)
                if result is None:  # more than one block after all: a job of its own
                    result = self._one(t, spec, item.name)
                self._finished(ev, t, result)
        finally:
            results.close()

    def _pack_finished(self, item: PackItem, result: PackResult, rows: dict[str, Any]) -> None:
        """List the tensors of a finished pack, as a batch of the index of its own: their
        rows as :meth:`_finished` makes them (``compact``'s keys, in its order), the figures
        its tensors share made once, the batch written from columns."""
        ev0, t0, _ = rows[item.names[0]]
        n = len(item.names)
        shared: dict[str, Any] = {
            "dtype": dtype_facts(t0.dtype).name,
            "target": ev0.target,
            "kept": False,
            "bytes_before": int(t0.nbytes),
            "bytes_after": result.bytes_after,
            "params": result.params,
        }
        errors = {k: result.errors[k] for k in ERROR_KEYS}  # (n each: see packs.results)
        columns: dict[str, list[Any]] = {
            "name": list(item.names),
            "key": list(item.keys),
            "pos": list(item.positions),
            "shape": [list(t0.shape) for _ in range(n)],
            **{k: [v] * n for k, v in shared.items()},
            "pack": [result.pack] * n,
            "slot": list(range(n)),
        }
        figures = zip(*errors.values(), strict=True)
        for slot, (name, values) in enumerate(zip(item.names, figures, strict=True)):
            event = rows[name][0]
            if self.on_tensor:
                self.on_tensor(event)
            row = {
                "name": name,
                "key": item.keys[slot],
                "pos": item.positions[slot],
                "shape": columns["shape"][slot],
                **shared,
                "error": dict(zip(ERROR_KEYS, values, strict=True)),
                "pack": result.pack,
                "slot": slot,
            }
            self.results[name] = row
            if self.on_tensor:
                self.on_tensor(TensorEvent(**{**event.__dict__, "result": row}))
        self.index.append_columns(columns, errors)

    def _flush(self) -> None:
        self.index.append(self.pending)
        self.pending = []

    def _jobs(self, run: list[Todo]) -> None:
        """A run of larger tensors, each a job of its own (``in_flight`` at once)."""
        with ThreadPoolExecutor(self.in_flight, thread_name_prefix="qstream-tensor") as pool:
            running: deque = deque()
            try:
                for event, t, spec, _ in run:
                    if len(running) == self.in_flight:
                        self._finished(*running.popleft(), wait=True)
                    if self.on_tensor:
                        self.on_tensor(event)
                    one = carried(self._one)  # (under this job's kernel choice)
                    running.append((event, t, pool.submit(one, t, spec, event.name)))
                while running:
                    self._finished(*running.popleft(), wait=True)
            except BaseException:  # stop the other tensor's job at its next block (it stays
                self.stop.set()  # resumable), list what finished
                for event, t, fut in running:
                    with contextlib.suppress(Exception):
                        self._finished(event, t, fut, wait=True)
                raise

    def _one(self, t: Any, spec: QuantSpec | None, name: str) -> dict[str, Any]:
        path = self.dest.child(self.keys[name])
        if spec is None:
            return keep_tensor(
                t,
                path,
                self.compression,
                self.max_memory,
                self.keep_dtypes.get(name),
                storage_options=self.dest.storage_options,
            )
        job = QuantizeJob(
            t,
            spec,
            max_memory=self.max_memory,
            executor=self.executor,
            storage_options=self.dest.storage_options,
            checkpoint=(self.source, name, self.checkpoint),
            memory_share=self.in_flight,
            compression=self.compression,
        )
        report = job.run(
            path, progress=Stoppable(self.progress, self.stop), overwrite=self.overwrite
        )
        params = report.calibration.get("params") if report.calibration else None
        return {
            "kept": False,
            "error": report.error,
            "bytes_after": qarray.quantized_nbytes(t.shape, spec),  # (codes and parameters)
            "passes": report.passes,
            "params": bool(params),
        }

    def _finished(
        self,
        event: TensorEvent,
        t: Any,
        result: Any,  # the tensor's result, or (``wait``) the future of it
        *,
        wait: bool = False,
    ) -> None:
        if wait:
            result = result.result()
        result = {
            **result,
            "name": event.name,
            "key": self.keys[event.name],
            "pos": self.positions[event.name],
            "shape": list(t.shape),
            "dtype": dtype_facts(t.dtype).name,
            "target": event.target,
            "bytes_before": int(t.nbytes),
        }
        row = compact(result)
        self.results[event.name] = row
        self.pending.append(row)
        if len(self.pending) >= ROWS_PER_BATCH:
            self._flush()
        if self.on_tensor:
            self.on_tensor(TensorEvent(**{**event.__dict__, "result": row}))


def path_of(target: Any) -> Any:
    """``target`` as a path string when it is one (``os.fspath``), else as it is."""
    return os.fspath(target) if isinstance(target, (str, os.PathLike)) else target


class Stopped(Exception):
    """A tensor's job stopped between blocks because the conversion is stopping."""


class Stoppable:
    """A job's progress reporter that forwards to ``progress`` (if any) and raises
    :class:`Stopped` at the job's next block or pass once ``stop`` is set: the job then ends
    as a killed one would, resumable."""

    def __init__(self, progress: Callable[[int, int], None] | None, stop: threading.Event) -> None:
        self.progress = progress
        self.stop = stop

    def __call__(self, done: int, total: int) -> None:
        if self.stop.is_set():
            raise Stopped("the conversion is stopping")
        if self.progress is not None:
            self.progress(done, total)

    def stage(self, name: str, total: int, done: int) -> None:
        """Report the start of a stage (see :func:`qstream.engine.jobs.job.report_stage`)."""
        if self.stop.is_set():
            raise Stopped("the conversion is stopping")
        report_stage(self.progress, name, total, done)
