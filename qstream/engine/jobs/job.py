"""A store conversion from start to end: plan -> passes over blocks -> merges -> output.

:class:`QuantizeJob` plans the blocks (one destination chunk each,
:mod:`~qstream.engine.jobs.job_plan`) and drives the passes, which live in their own modules: the
statistics passes the spec needs and the parameters they
give (:mod:`~qstream.engine.jobs.calibration_passes`, :mod:`~qstream.engine.jobs.job_params`), the
output's creation (:mod:`~qstream.engine.jobs.job_output`), the quantize pass
(:mod:`~qstream.engine.jobs.quantize_pass`) and the report (:mod:`~qstream.engine.jobs.job_report`);
:func:`~qstream.engine.jobs.dequantize_job.dequantize` runs the one pass back. Each pass hands its
per-block work (a picklable object from :mod:`qstream.engine.blocks.work`) to the executor and
merges
the results in block order in this thread, so every float sum has the same bits whatever the
number of workers. The driver alone writes the output's metadata and the progress snapshot;
workers write only their blocks' chunks. See :mod:`qstream.io.outputs.qarray` for the on-disk format
and the destination rules, and :mod:`qstream.io.outputs.progress_log` for how an interrupted job
resumes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ...budget import Block, check_fits, fit_workers, memory_limit, plan_blocks
from ...core import dimension_names
from ...errors import InvalidDTypeError, InvalidParameterError, StoreError
from ...input_files import check_tree
from ...io.outputs import Action, Destination, Existing, Lease, destination, qarray
from ...io.storage import compression as compressions
from ...io.storage import display, imported_zarr, open_group, open_source
from ...qtypes import is_float_dtype
from ...spec import Calibration, QuantReport, QuantSpec, RangeStats
from ..run import SourceRef, check_shared, pipeline, resolve
from . import calibration_passes
from . import job_output as output
from . import job_report as report
from .dequantize_job import dequantize, dequantized_array, dequantized_fingerprint
from .job_params import stored_calibration
from .job_plan import plan_job
from .job_report import Found
from .kernel_choice import small_array_job
from .passes import Progress, counter, fspath, report_stage
from .quantize_pass import quantize_pass

# (taken from here by the checkpoint conversion and the API)
__all__ = [
    "QuantizeJob",
    "dequantize",
    "dequantized_array",
    "dequantized_fingerprint",
    "report_stage",
]


class QuantizeJob:
    """One quantization of one source under one spec (see module docstring)."""

    def __init__(
        self,
        src: Any,
        spec: QuantSpec,
        *,
        max_memory: int | None = None,
        storage_options: dict[str, Any] | None = None,
        executor: Any = None,
        checkpoint: tuple[Any, ...] | None = None,
        view_histogram: bool = False,
        views: bool = True,
        memory_share: int = 1,
        compression: str | None = compressions.AUTO,
        layout: str = "group",
        chunks: Any = None,
    ) -> None:
        """``executor``: a name or an executor (see :func:`~qstream.engine.run.scheduling.resolve`).
        ``checkpoint``: ``(path, name)`` of the checkpoint tensor ``src`` is (and the
        ``CheckpointSource`` that opens it), so that workers in other processes can open the
        tensor themselves. ``view_histogram``: a per-tensor minmax calibration makes one
        histogram pass for the views (histogram methods keep theirs anyway); ``views``: False
        when nothing reads the calibration's views (a pack's job), which are then not drawn.
        ``memory_share``: this many jobs run at once within ``max_memory``; each fits its
        workers in its share, while its blocks (and so its report, bit for bit) stay those of
        ``max_memory``. ``compression``: how the output's chunks are compressed (see
        :mod:`qstream.io.storage.compression`). ``layout``: ``group`` (default) or ``codec`` (see
        :mod:`qstream.io.outputs.codec`); ``chunks``: the output's chunks (default: multiples of the
        source's, see :func:`~qstream.budget.default_chunks`)."""
        from ...io.outputs import codec

        self.layout = codec.check_layout(layout, spec, spec.qtype)
        if checkpoint is not None and (spec.float_offset or layout != "group"):
            raise InvalidParameterError(
                "float offsets and the codec layout are for quantize_store outputs, not"
                " checkpoint conversions"
            )
        self.spec = spec
        self.compression = compressions.canonical(compression)
        self.memory_share = max(1, int(memory_share))
        self.view_histogram = view_histogram
        self.views = views
        self.token = uuid.uuid4().hex
        self.executor = resolve(executor)
        if checkpoint is None:
            check_shared("source", src, executor=self.executor)
        source = open_source(src, storage_options=storage_options)
        self.source = source
        self.storage_options = storage_options  # for the destination too
        if checkpoint is not None:
            opener = checkpoint[2] if len(checkpoint) > 2 else None  # a CheckpointSource
            self.ref = SourceRef(self.token, checkpoint[0], tensor=checkpoint[1], opener=opener)
        elif isinstance(src, (str, os.PathLike)) or _is_zarr_store(src):
            self.ref = SourceRef(self.token, fspath(src), storage_options)
        else:
            self.ref = SourceRef(self.token, None, storage_options, obj=src)
        self.ref.register(source)
        self.name = str(source.description.get("path", "array"))
        if not is_float_dtype(source.dtype):
            raise InvalidDTypeError(
                f"{self.name}: source dtype {source.dtype} is not floating point"
                " (float16, bfloat16, float32, float64)"
            )
        shape = source.shape
        self.spec = spec = spec.for_source(source.dtype)  # (scale_dtype "source": its dtype)
        self.max_memory = max_memory
        self.chunks_given = chunks is not None
        self.plan = plan_job(spec, source, chunks, max_memory)
        from ...io.outputs import source_dims

        self.dims = source_dims(source, len(shape)) or dimension_names(len(shape))
        self.blocks = plan_blocks(shape, self.plan.chunks)
        self.bytes_read = 0
        self.passes = 0
        check_fits(max_memory, source.chunks, source.dtype, self.plan.channels, shape)

    # ---- identity

    def fingerprint(self) -> str:
        """What makes two runs the same job: the format, the spec, the source (its resolved
        location and metadata, however its path was spelled) and the output's compression."""
        h = hashlib.sha256()
        h.update(f"qstream-format-{qarray.FORMAT_VERSION}".encode())
        h.update(json.dumps(self.spec.to_dict(), sort_keys=True).encode())
        h.update(json.dumps(self.source.description, sort_keys=True, default=str).encode())
        if self.compression != compressions.AUTO:  # (outputs made before the option keep theirs)
            h.update(f"compression-{self.compression}".encode())
        if self.layout != "group":
            h.update(f"layout-{self.layout}".encode())
        if self.chunks_given:
            h.update(f"chunks-{list(self.plan.chunks)}".encode())
        return h.hexdigest()[:32]

    # ---- passes

    def worker_count(self, cap: int | None = None) -> int:
        """Workers a pass runs: what the machine and the memory bound allow (``cap``: at
        most two, for passes that keep a partial per worker)."""
        # jobs that share the memory bound share the machine's workers too
        default = (
            max(1, pipeline.default_workers() // self.memory_share) if cap is None else min(cap, 2)
        )
        return fit_workers(self.memory, self.blocks, max(4, self.source.dtype.itemsize), default)

    @property
    def memory(self) -> int:
        """The working memory this job may use: its share of ``max_memory``."""
        return memory_limit(self.max_memory) // self.memory_share

    @property
    def numpy_kernels(self) -> bool:
        """Whether this job, run on its own (a store job), runs the NumPy twins of the
        kernels and never loads Numba (:func:`~.kernel_choice.small_array_job`; a
        conversion chooses once for all its tensors instead)."""
        return small_array_job(tuple(self.source.shape), self.source.dtype, self.spec)

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
        """One pass over ``blocks``: ``work`` on the executor, ``merge`` in block order in
        this thread; counted (``new_pass``) with the bytes it read."""
        if stage:
            report_stage(progress, stage, len(blocks))
        pipeline.run(
            blocks,
            work,
            merge,
            workers=workers or self.worker_count(),
            inflight=inflight,
            progress=counter(progress, len(blocks)),
            executor=self.executor,
        )
        self.passes += new_pass
        self.bytes_read += sum(math.prod(b.shape) for b in blocks) * self.source.dtype.itemsize

    def ranges(self, progress: Progress | None = None) -> RangeStats:
        """The ranges pass (see :func:`~qstream.engine.jobs.calibration_passes.ranges`)."""
        return calibration_passes.ranges(self, progress)

    def check_nonfinite(self, st: RangeStats) -> None:
        """Refuse non-finite values under ``nan_policy="error"`` (see
        :func:`~qstream.engine.jobs.calibration_passes.check_nonfinite`)."""
        calibration_passes.check_nonfinite(self, st)

    def calibration(self, progress: Progress | None = None) -> Calibration:
        """The statistics passes the spec needs, and the parameters they give."""
        return calibration_passes.calibration(self, progress)

    def _whole_channels(self) -> bool:
        # (tests ask it of a job)
        return calibration_passes.whole_channels(self.plan)

    def keeps_worst_groups(self) -> bool:
        """Whether the report lists the worst parameter groups (blocked integer specs)."""
        return report.keeps_worst_groups(self.plan)

    # ---- the output

    def new_meta(self, fp: str, dst: Any) -> dict[str, Any]:
        """The metadata of a new output of this job (see :func:`~qstream.engine.jobs.job_output.
        new_meta`)."""
        return output.new_meta(self, fp, dst)

    def member_arrays(self, *, progress_log: bool = True) -> dict[str, dict[str, Any]]:
        """The ``create_array`` keywords of the output's members (see
        :func:`~qstream.engine.jobs.job_output.member_arrays`)."""
        return output.member_arrays(self, progress_log=progress_log)

    def finished(
        self,
        meta: dict[str, Any],
        calibration: dict[str, Any],
        found: Found,
        dst: Any,
        t0: float,
        resumed: int,
        scale: Any,
        zero_point: Any,
        offset: Any = None,
    ) -> tuple[dict[str, Any], QuantReport, dict[str, Any]]:
        """The output's complete metadata, the report and ``data``'s attributes (see
        :func:`~qstream.engine.jobs.job_report.finished`)."""
        return report.finished(
            self, meta, calibration, found, dst, t0, resumed, scale, zero_point, offset
        )

    # ---- the whole job

    def run(
        self,
        dst: Any,
        *,
        progress: Progress | None = None,
        overwrite: bool = False,
        resume: bool = True,
    ) -> QuantReport:
        """Quantize into ``dst`` (see :func:`qstream.quantize_store`)."""
        t0 = time.perf_counter()
        self._check_destination(dst)
        try:
            if output.is_zip(dst):
                return self._run_zip(dst, t0, progress, overwrite)
            return self._run(dst, t0, progress, overwrite, resume)
        finally:
            self.close()

    def look(self, dst: Any, *, overwrite: bool = False, resume: bool = True) -> str:
        """What :meth:`run` would do with ``dst``: ``"create"``, ``"resume"``, ``"complete"``
        or ``"replace"``, deciding as it decides and refusing what it refuses before a value
        of the source is read (the same exceptions and messages); writes nothing."""
        self._check_destination(dst)
        try:
            if output.is_zip(dst):  # (built whole, never resumed)
                action, _ = Destination(dst, "quantized", self.fingerprint()).look(
                    overwrite=overwrite
                )
                return Action.CREATE.value if action is Action.RESUME else action.value
            dest = Destination(
                dst, "quantized", self.fingerprint(), storage_options=self.storage_options
            )
            action, _ = dest.look(overwrite=overwrite)
            if action is Action.COMPLETE and output.damaged(dst, self.storage_options):
                return Action.REPLACE.value  # (made again, as run makes it)
            _check_resume(action, resume, dst)
            return action.value
        finally:
            self.close()

    def _check_destination(self, dst: Any) -> None:
        if self.source.description.get("kind") == "zarr":  # (others have no address here)
            destination.check_separate(self.source.description.get("path"), dst)
        check_shared("destination", dst, executor=self.executor)
        destination.check_writable(dst)

    def close(self) -> None:
        """Forget what this job opened (here and on the executor's workers)."""
        self.executor.release(self.token)

    def _run(
        self, dst: Any, t0: float, progress: Progress | None, overwrite: bool, resume: bool
    ) -> QuantReport:
        dest = Destination(
            dst, "quantized", self.fingerprint(), storage_options=self.storage_options
        )
        action, existing = dest.look(overwrite=overwrite)
        repair = False
        if action is Action.COMPLETE:
            if not output.damaged(dst, self.storage_options):
                dest.clear_stale_lock()
                return self._already_complete(dst, _meta(existing))
            # its own finished output, since damaged (parts deleted): made again, with the
            # same bytes and the same report (if it is still this job's once locked)
            repair, action = True, Action.REPLACE
        _check_resume(action, resume, dst)
        cal = None
        if action is not Action.RESUME or not _meta(existing).get("ready"):
            cal = self.calibration(progress)  # before anything is written
        with dest.claim(overwrite=overwrite, repair=repair) as (action, existing):
            # (what another process may have done meanwhile decides now)
            if action is Action.COMPLETE:
                return self._already_complete(dst, _meta(existing))
            if action is Action.RESUME and (
                not _meta(existing).get("ready") or output.members_lost(dst, self.storage_options)
            ):
                # interrupted while it was being created, or damaged since: made again
                destination.remove_output(dst, existing, self.storage_options)
                action = Action.CREATE
            if action is Action.RESUME:
                if dest.local is not None:  # nothing in it may lead elsewhere
                    check_tree(dest.local, "the output")
                destination.clean_partials(dst)
                group = open_group(dst, mode="a", storage_options=self.storage_options)
                if self.layout == "codec":  # killed after the swap: codes are written plain
                    from ...io.outputs import codec

                    codec.to_plain(group, dst)
                arrays = None
                cal, summary = stored_calibration(group, self.plan)
                Lease(group, self.token, dst).take()  # a resumed run of this job
            else:
                if cal is None:
                    cal = self.calibration(progress)
                group, arrays = output.create(self, dst, cal, dest.fingerprint)
                summary = cal.summary()
            found, resumed = quantize_pass(self, dst, group, cal, progress, arrays)
            done = report.finish(self, group, summary, found, dst, t0, resumed)
            destination.clean_partials(dst)
            return done

    def _run_zip(
        self, dst: Any, t0: float, progress: Progress | None, overwrite: bool
    ) -> QuantReport:
        """A ``.zip`` output is built in a temporary directory and packed at the end (a zip
        cannot be updated in place), so it does not resume."""
        fp = self.fingerprint()
        action, existing = Destination(dst, "quantized", fp).look(overwrite=overwrite)
        if action is Action.COMPLETE:
            return self._already_complete(dst, _meta(existing))
        import tempfile  # (zip outputs only)

        cal = self.calibration(progress)
        work = tempfile.mkdtemp(prefix="qstream-", suffix=".zarr")
        try:
            group, arrays = output.create(self, work, cal, fp)
            found, resumed = quantize_pass(self, work, group, cal, progress, arrays)
            done = report.finish(self, group, cal.summary(), found, dst, t0, resumed)
            output.pack_zip(work, os.fspath(dst))
            return done
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _already_complete(self, dst: Any, meta: dict[str, Any]) -> QuantReport:
        done = QuantReport.from_dict(meta["report"])
        return replace(done, destination=display(dst), already_complete=True, seconds=0.0)


def _is_zarr_store(obj: Any) -> bool:
    if imported_zarr() is None:  # (no store exists before zarr is imported)
        return False
    from zarr.abc.store import Store

    return isinstance(obj, Store)


def _check_resume(action: Action, resume: bool, dst: Any) -> None:
    if action is Action.RESUME and not resume:
        raise StoreError(f"{dst} holds an unfinished run of this job; pass overwrite=True")


def _meta(existing: Existing) -> dict[str, Any]:
    # (a dict whenever this job's own output is there: its kind comes from it)
    return existing.meta or {}
