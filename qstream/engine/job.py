"""A store conversion from start to end: plan -> passes over blocks -> merges -> output.

:class:`QuantizeJob` plans the blocks (one destination chunk each), runs the statistics
passes the spec needs (ranges, then histograms), derives the parameters, and runs the quantize
pass; :func:`dequantize` runs the one pass back. Each pass hands its per-block work (a
picklable object from :mod:`qstream.engine.work`) to the executor and merges the results in
block order in this thread, so every float sum has the same bits whatever the number of
workers. The driver alone writes the output's metadata and the progress snapshot; workers
write only their blocks' chunks. See :mod:`qstream.io.qarray` for the on-disk format and the
destination rules, and :mod:`qstream.io.progress` for how an interrupted job resumes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import replace

import numpy as np

from ..core import checks
from ..core.layout import (
    blocked_param_shape,
    dimension_names,
    normalize_axis,
    param_dimension_names,
)
from ..errors import InvalidDTypeError, InvalidParameterError, StoreError
from ..io import compression as compressions
from ..io import destination, qarray
from ..io.destination import Action, Destination, Lease
from ..io.paths import check_tree
from ..io.progress import ProgressLog
from ..io.stores import ArrayWriter, display, location, open_group, open_source
from ..qtypes import float_dtype, is_float_dtype
from ..spec import (
    HISTOGRAM_METHODS,
    Calibration,
    ErrorStats,
    GroupSQNR,
    QuantParams,
    QuantReport,
    QuantSpec,
    RangeStats,
    WorstGroups,
    merge_into,
)
from . import executors, pipeline
from .plan import (
    block_budget,
    check_fits,
    default_chunks,
    fit_workers,
    memory_limit,
    plan_blocks,
)
from .plan import mib as _mib
from .work import (
    DequantizeWork,
    DestRef,
    HistogramWork,
    JobPlan,
    NonFiniteBlock,
    QuantizeWork,
    RangesWork,
    SourceRef,
)

_PARAM_CHUNK = 1 << 18  # parameters per chunk of a per-axis scale/zero_point (at least)
HIST_SHARE = 2  # histograms may take 1/HIST_SHARE of the memory bound


class QuantizeJob:
    """One quantization of one source under one spec (see module docstring)."""

    def __init__(
        self,
        src,
        spec: QuantSpec,
        *,
        max_memory=None,
        storage_options=None,
        executor=None,
        checkpoint: tuple[str, str] | None = None,
        view_histogram: bool = False,
        memory_share: int = 1,
        compression: str | None = compressions.AUTO,
        layout: str = "group",
        chunks=None,
    ):
        """``checkpoint``: ``(path, name)`` of the checkpoint tensor ``src`` is, so that
        workers in other processes can open the tensor themselves. ``view_histogram``: a
        per-tensor minmax calibration makes one histogram pass for the views (histogram
        methods keep theirs anyway). ``memory_share``: this many jobs run at once within
        ``max_memory``; each fits its workers in its share, while its blocks (and so its
        report, bit for bit) stay those of ``max_memory``. ``compression``: how the output's
        chunks are compressed (see :mod:`qstream.io.compression`). ``layout``: ``group``
        (default) or ``codec`` (see :mod:`qstream.io.codec`); ``chunks``: the output's chunks
        (default: multiples of the source's, see :func:`~qstream.engine.plan.default_chunks`)."""
        from ..io import codec

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
        self._view_hist = None  # the per-tensor histogram for the views (calibration views)
        self.token = uuid.uuid4().hex
        self.executor = executors.resolve(executor)
        if checkpoint is None:
            executors.check_shared("source", src, executor=self.executor)
        source = open_source(src, storage_options=storage_options)
        self.source = source
        self.storage_options = storage_options  # for the destination too
        if checkpoint is not None:
            opener = checkpoint[2] if len(checkpoint) > 2 else None  # a CheckpointSource
            self.ref = SourceRef(self.token, checkpoint[0], tensor=checkpoint[1], opener=opener)
        elif isinstance(src, (str, os.PathLike)) or _is_zarr_store(src):
            self.ref = SourceRef(self.token, _fspath(src), storage_options)
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
        axis = None if spec.axis is None else normalize_axis(spec.axis, len(shape))
        bs = spec.block_size
        if axis is None:
            param_shape: tuple[int, ...] = ()
        elif not bs:
            param_shape = (shape[axis],)
        else:
            param_shape = blocked_param_shape(shape, axis, bs)
        if bs and spec.scale is None and spec.method not in ("minmax", "dynamic"):
            raise InvalidParameterError(
                f"method {spec.method!r} is not available for blocked quantization; blocks take"
                " their own range (method 'dynamic' or 'minmax')"
            )
        if axis is not None and not bs and len(shape) == 1 and shape[0] > 1:
            import warnings

            from ..errors import QStreamWarning

            warnings.warn(
                f"per-channel quantization of a 1-D array (axis {spec.axis}) gives every"
                f" element its own scale: {shape[0]} parameters for {shape[0]} values, more"
                " bytes than the values; quantize it per tensor (axis=None) or keep it",
                QStreamWarning,
                stacklevel=3,
            )
        # statistics are per channel along a per-axis spec's axis, else one set for the tensor
        # (a blocked spec reports per tensor: its parameter blocks are too many to list)
        stat_axis = None if bs else axis
        self.max_memory = max_memory
        from ..io.scientific import source_dims

        self.dims = source_dims(source, len(shape)) or dimension_names(len(shape))
        self.chunks_given = chunks is not None
        if chunks is not None:
            from .chunking import check_chunks

            chunks = check_chunks(chunks, shape, bs, axis, source.dtype, max_memory)
        self.plan = JobPlan(
            spec=spec,
            shape=shape,
            chunks=chunks
            or default_chunks(
                shape,
                max(4, source.dtype.itemsize),
                source.chunks,
                axis=axis,
                block_size=bs,
                budget=block_budget(max_memory),
            ),
            axis=axis,
            stat_axis=stat_axis,
            channels=1 if stat_axis is None else shape[stat_axis],
            param_shape=param_shape,
            dynamic=spec.scale is None and (spec.method == "dynamic" or bs is not None),
        )
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
        # jobs that share the memory bound share the machine's workers too
        default = (
            max(1, pipeline.default_workers() // self.memory_share) if cap is None else min(cap, 2)
        )
        return fit_workers(self.memory, self.blocks, max(4, self.source.dtype.itemsize), default)

    @property
    def memory(self) -> int:
        """The working memory this job may use: its share of ``max_memory``."""
        return memory_limit(self.max_memory) // self.memory_share

    def scan(
        self,
        blocks,
        work,
        merge,
        progress,
        *,
        stage=None,
        workers=None,
        inflight=None,
        new_pass=True,
    ) -> None:
        if stage:
            report_stage(progress, stage, len(blocks))
        pipeline.run(
            blocks,
            work,
            merge,
            workers=workers or self.worker_count(),
            inflight=inflight,
            progress=_counter(progress, len(blocks)),
            executor=self.executor,
        )
        self.passes += new_pass
        self.bytes_read += sum(math.prod(b.shape) for b in blocks) * self.source.dtype.itemsize

    def ranges(self, progress=None) -> RangeStats:
        """Pass 1: exact per-channel ranges, merged in block order (min/max and counts are
        exact, so the result never depends on how the work was cut)."""
        plan = self.plan
        total = RangeStats.empty(plan.channels)
        first: list[int] = []

        def merge(b, st: RangeStats) -> None:
            merge_into(total, st, plan.offset(b.key))
            if st.first_nonfinite >= 0:
                first.append(st.first_nonfinite)

        self.scan(self.blocks, RangesWork(plan, self.ref), merge, progress, stage="ranges")
        return replace(total, first_nonfinite=min(first) if first else -1)

    def check_nonfinite(self, st: RangeStats) -> None:
        if self.spec.nan_policy == "error" and st.nonfinite:
            raise st.refusal(self.name, self.plan.shape)

    def calibration(self, progress=None) -> Calibration:
        """The statistics passes the spec needs, and the parameters they give."""
        spec, plan = self.spec, self.plan
        if spec.scale is not None:
            return Calibration(spec, None, {}, self._explicit_params())
        if plan.dynamic:  # one pass: each block takes its own range while quantizing
            return Calibration(spec, None, {"method": "per-block ranges"}, None)
        st = self.ranges(progress)
        self.check_nonfinite(st)
        lo, hi = np.where(st.count > 0, st.min, 0.0), np.where(st.count > 0, st.max, 0.0)
        thresholds = {"min": lo, "max": hi}
        if spec.method in HISTOGRAM_METHODS:
            lo, hi = self._histogram_ranges(lo, hi, progress)
            thresholds = {"min": lo, "max": hi, "num_bins": spec.num_bins}
        elif self.view_histogram and plan.channels == 1:
            from .compare import view_histogram

            self._view_hist = view_histogram(self, lo, hi, progress)
        from ..calibration.params import params_from_range
        from ..calibration.views import calibration_view

        if spec.float_offset:
            return Calibration(
                spec,
                st,
                thresholds,
                self._offset_params(lo, hi),
                calibration_view(spec, st, lo, hi, self._view_hist),
            )
        scale, zp = params_from_range(
            lo,
            hi,
            plan.qt,
            symmetric=spec.symmetric,
            narrow_range=spec.narrow_range,
            half_scale=spec.half_scales,
            full_levels=spec.full_levels,
        )
        params = QuantParams(
            scale.reshape(plan.param_shape), zp.reshape(plan.param_shape), plan.axis, None
        )
        view = calibration_view(spec, st, lo, hi, self._view_hist)
        return Calibration(spec, st, thresholds, params, view)

    def _histogram_ranges(self, lo, hi, progress):
        """Pass 2 and the threshold search. When every block holds whole channels (channels
        on the outermost axis), each block's histograms are searched as the block comes back
        (on a cluster, by the worker that built them: only the channels' ranges travel), with
        no histograms kept beyond the blocks in flight. Otherwise the histograms are
        merged here, over groups of channels that fit in the memory bound (``1/HIST_SHARE``
        of it for the histograms being merged and one in-flight block's partial per worker);
        blocks that hold none of a group's channels are not read for it, and when every block
        holds every channel (channels on an inner axis) each group reads the source once
        more."""
        from ..calibration.histogram import method_range

        spec, plan = self.spec, self.plan
        sym = spec.method in ("entropy", "mse") or (spec.method == "percentile" and spec.symmetric)
        edges_lo = np.zeros(plan.channels) if sym else lo
        edges_hi = np.maximum(-lo, hi) if sym else hi
        out_lo, out_hi = np.array(lo, np.float64), np.array(hi, np.float64)
        budget = self.memory // HIST_SHARE
        if 2 * spec.num_bins * 8 > budget:
            raise InvalidParameterError(
                f"num_bins {spec.num_bins} needs {_mib(2 * spec.num_bins * 8)} of histograms,"
                f" more than the memory bound ({_mib(self.memory)}) allows; lower num_bins or"
                " raise max_memory"
            )
        workers = self.worker_count()
        per_block = plan.block_channels(self.blocks[0]) * spec.num_bins * 8  # (the largest)
        if self._whole_channels() and workers * per_block <= budget:
            # on a cluster the workers search too (in parallel processes); here each block's
            # channels are searched in this thread as the block comes back, by the parallel
            # search kernel (one call per block)
            on_workers = (lo, hi) if self.executor.distributed else None
            work = HistogramWork(
                plan, self.ref, edges_lo, edges_hi, sym, 0, plan.channels, on_workers
            )

            def found(b, part) -> None:
                if on_workers is None:
                    at, h = part
                    c = slice(at, at + h.shape[0])
                    counts = {"counts": h, "lo": edges_lo[c], "hi": edges_hi[c], "abs": sym}
                    out_lo[c], out_hi[c] = method_range(counts, lo[c], hi[c], spec, plan.qt.bits)
                else:
                    at, glo, ghi = part
                    out_lo[at : at + glo.size], out_hi[at : at + ghi.size] = glo, ghi

            self.scan(self.blocks, work, found, progress, stage="histograms", workers=workers)
            return out_lo, out_hi
        workers = self.worker_count(cap=2)
        row = spec.num_bins * 8
        group = max(1, budget // ((workers + 1) * row))
        n_groups = -(-plan.channels // group)
        for c0 in range(0, plan.channels, group):
            c1 = min(plan.channels, c0 + group)
            hist = np.zeros((c1 - c0, spec.num_bins), np.int64)

            def merge(b, part, hist=hist, c0=c0) -> None:
                if part is not None:
                    at, h = part
                    hist[at - c0 : at - c0 + h.shape[0]] += h

            blocks = self.blocks.only(plan.stat_axis, c0, c1)
            work = HistogramWork(
                plan, self.ref, edges_lo[c0:c1].copy(), edges_hi[c0:c1].copy(), sym, c0, c1
            )
            # local: one partial per worker in flight; a cluster combines a task's partials
            inflight = None if self.executor.distributed else workers
            self.scan(
                blocks,
                work,
                merge,
                progress,
                stage="histograms"
                + (
                    f" (channels {c0}-{c1 - 1}, group {c0 // group + 1}/{n_groups})"
                    if n_groups > 1
                    else ""
                ),
                workers=workers,
                inflight=inflight,
                new_pass=c0 == 0,
            )
            counts = {"counts": hist, "lo": edges_lo[c0:c1], "hi": edges_hi[c0:c1], "abs": sym}
            searching = None
            if progress is not None and c1 - c0 > 1:  # thousands of channels take seconds
                report_stage(progress, f"search (channels {c0}-{c1 - 1})", c1 - c0)
                searching = progress
            out_lo[c0:c1], out_hi[c0:c1] = method_range(
                counts, lo[c0:c1], hi[c0:c1], spec, plan.qt.bits, progress=searching
            )
            if plan.channels == 1:  # kept for the views, in bounded size
                from ..calibration.views import Histogram

                self._view_hist = Histogram.from_counts(hist[0], edges_lo[0], edges_hi[0], abs=sym)
            del hist, counts
        return out_lo, out_hi

    def _whole_channels(self) -> bool:
        """Whether every block holds whole channels (all of the other axes)."""
        plan = self.plan
        if plan.stat_axis is None:
            return False
        return all(
            c >= n
            for d, (c, n) in enumerate(zip(plan.chunks, plan.shape, strict=True))
            if d != plan.stat_axis
        )

    def _offset_params(self, lo, hi) -> QuantParams:
        """Scale and float offsets (``spec.offset``) from the calibrated ranges."""
        from ..core.offsets import offset_params

        plan, spec = self.plan, self.spec
        offset = spec.offset
        if not isinstance(offset, str):
            offset = self._broadcast_param(offset, "offset").reshape(-1)
        scale, off = offset_params(
            lo,
            hi,
            plan.qt,
            narrow_range=spec.narrow_range,
            offset=offset,
            half_scale=spec.half_scales,
        )
        return self._with_offset(scale, off)

    def _with_offset(self, scale, off) -> QuantParams:
        plan = self.plan
        off = np.asarray(off, np.float64).reshape(plan.param_shape)
        if self.layout == "codec":  # the codec computes in float32: quantize with its offset
            off = off.astype(np.float32).astype(np.float64)
        return QuantParams(
            np.asarray(scale, np.float32).reshape(plan.param_shape),
            np.zeros(plan.param_shape),
            plan.axis,
            None,
            off,
        )

    def _broadcast_param(self, v, name: str) -> np.ndarray:
        plan = self.plan
        a = np.asarray(v, np.float64)
        try:
            return np.broadcast_to(a, plan.param_shape).copy()
        except ValueError:
            raise InvalidParameterError(
                f"{name} shape {a.shape} does not fit the parameter shape {plan.param_shape} of"
                f" {self.spec.granularity} quantization"
            ) from None

    def _explicit_params(self) -> QuantParams:
        plan = self.plan
        if self.spec.float_offset:  # an explicit scale and offset
            s = self._broadcast_param(self.spec.scale, "scale").astype(np.float32)
            checks.check_scale(s)
            if self.spec.half_scales:
                from ..calibration.params import half_scales

                s = half_scales(s)
            return self._with_offset(s, self._broadcast_param(self.spec.offset, "offset"))
        s = np.asarray(self.spec.scale, np.float32)
        z = np.asarray(0 if self.spec.zero_point is None else self.spec.zero_point, np.float64)
        try:
            s = np.broadcast_to(s, plan.param_shape).copy()
            z = np.broadcast_to(z, plan.param_shape).copy()
        except ValueError:
            raise InvalidParameterError(
                f"scale/zero_point shapes {s.shape}/{z.shape} do not fit the parameter shape"
                f" {plan.param_shape} of {self.spec.granularity} quantization"
            ) from None
        checks.check_scale(s)
        if self.spec.half_scales:
            from ..calibration.params import half_scales

            s = half_scales(s)
        qt = plan.qt
        if not qt.is_float and z.size and (z.min() < qt.qmin or z.max() > qt.qmax):
            raise InvalidParameterError(
                f"zero_point is outside the {qt.name} range [{qt.qmin:g}, {qt.qmax:g}]"
            )
        return QuantParams(s, z, plan.axis, self.spec.block_size)

    # ---- the whole job

    def run(self, dst, *, progress=None, overwrite=False, resume=True) -> QuantReport:
        """Quantize into ``dst`` (see :func:`qstream.quantize_store`)."""
        t0 = time.perf_counter()
        if self.source.description.get("kind") == "zarr":  # (others have no address here)
            destination.check_separate(self.source.description.get("path"), dst)
        executors.check_shared("destination", dst, executor=self.executor)
        destination.check_writable(dst)
        try:
            if _is_zip(dst):
                return self._run_zip(dst, t0, progress, overwrite)
            return self._run(dst, t0, progress, overwrite, resume)
        finally:
            self.close()

    def close(self) -> None:
        """Forget what this job opened (here and on the executor's workers)."""
        self.executor.release(self.token)

    def _run(self, dst, t0, progress, overwrite, resume) -> QuantReport:
        dest = Destination(
            dst, "quantized", self.fingerprint(), storage_options=self.storage_options
        )
        action, existing = dest.look(overwrite=overwrite)
        repair = False
        if action is Action.COMPLETE:
            if not self._damaged(dst):
                return self._already_complete(dst, existing.meta)
            # its own finished output, since damaged (parts deleted): made again, with the
            # same bytes and the same report (if it is still this job's once locked)
            repair, action = True, Action.REPLACE
        if action is Action.RESUME and not resume:
            raise StoreError(f"{dst} holds an unfinished run of this job; pass overwrite=True")
        cal = None
        if action is not Action.RESUME or not existing.meta.get("ready"):
            cal = self.calibration(progress)  # before anything is written
        with dest.claim(overwrite=overwrite, repair=repair) as (action, existing):
            # (what another process may have done meanwhile decides now)
            if action is Action.COMPLETE:
                return self._already_complete(dst, existing.meta)
            if action is Action.RESUME and (
                not existing.meta.get("ready") or self._members_lost(dst)
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
                    from ..io import codec

                    codec.to_plain(group, dst)
                arrays = None
                cal, summary = self._stored_calibration(group)
                Lease(group, self.token, dst).take()  # a resumed run of this job
            else:
                if cal is None:
                    cal = self.calibration(progress)
                group, arrays = self._create(dst, cal, dest.fingerprint)
                summary = cal.summary()
            errors, resumed = self._quantize_pass(dst, group, cal, progress, arrays)
            report = self._finish(group, summary, errors, dst, t0, resumed)
            destination.clean_partials(dst)
            return report

    def _run_zip(self, dst, t0, progress, overwrite) -> QuantReport:
        """A ``.zip`` output is built in a temporary directory and packed at the end (a zip
        cannot be updated in place), so it does not resume."""
        fp = self.fingerprint()
        action, existing = Destination(dst, "quantized", fp).look(overwrite=overwrite)
        if action is Action.COMPLETE:
            return self._already_complete(dst, existing.meta)
        cal = self.calibration(progress)
        work = tempfile.mkdtemp(prefix="qstream-", suffix=".zarr")
        try:
            group, arrays = self._create(work, cal, fp)
            errors, resumed = self._quantize_pass(work, group, cal, progress, arrays)
            report = self._finish(group, cal.summary(), errors, dst, t0, resumed)
            _pack_zip(work, os.fspath(dst))
            return report
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _already_complete(self, dst, meta: dict) -> QuantReport:
        report = QuantReport.from_dict(meta["report"])
        return replace(report, destination=display(dst), already_complete=True, seconds=0.0)

    def _stored_calibration(self, group) -> tuple[Calibration, dict]:
        """The parameters an interrupted run of this job chose (its blocks used them)."""
        meta = group.attrs["qstream"]
        params = None
        if not self.plan.dynamic:
            plan = self.plan
            params = QuantParams(
                np.asarray(group["scale"][...], np.float32).reshape(plan.param_shape),
                np.asarray(group["zero_point"][...], np.float64).reshape(plan.param_shape),
                plan.axis,
                self.spec.block_size if self.spec.scale is not None else None,
            )
            if self.spec.float_offset:
                params = replace(
                    params,
                    offset=np.asarray(group["offset"][...], np.float64).reshape(plan.param_shape),
                )
        return Calibration(self.spec, None, {}, params), meta["calibration"]

    def new_meta(self, fp: str, dst) -> dict:
        """The metadata of a new output of this job (``ready``/``complete`` false)."""
        plan, qt = self.plan, self.plan.qt
        return {
            "version": qarray.FORMAT_VERSION,
            "fingerprint": fp,
            "ready": False,
            "complete": False,
            "spec": self.spec.to_dict(),
            "source": self.source.description,
            "dtype": qt.name,
            "axis": plan.axis,
            "storage": qarray.storage_of(qt),
            **({"layout": self.layout} if self.layout != "group" else {}),
            **Lease.fields(dst, self.token),  # object stores: checked before ``complete``
        }

    def member_arrays(self, *, progress_log: bool = True) -> dict[str, dict]:
        """The ``create_array`` keywords of the output's members (``data``, ``scale``,
        ``zero_point`` and, unless ``progress_log`` is false, ``_progress``)."""
        plan, qt = self.plan, self.plan.qt
        store_dtype, serializer = qarray.data_encoding(qt)
        zp_dtype = qt.widened if not qt.is_float else np.dtype(np.float32)
        kw = {
            "compressors": compressions.compressors(self.compression),
            "shape": plan.param_shape,
            "fill_value": 0,
            "chunk_key_encoding": qarray.FLAT_KEYS,
            "dimension_names": param_dimension_names(
                len(plan.shape), plan.axis, self.spec.block_size, self.dims
            ),
        }
        if plan.axis is not None and not self.spec.block_size:  # ~1 MiB or more each
            c = plan.chunks[plan.axis]
            kw["chunks"] = (max(1, min(plan.param_shape[0], c * max(1, _PARAM_CHUNK // c))),)
        elif plan.axis is not None:  # one parameter chunk per block: dynamic blocks write own
            pc = list(plan.chunks)
            pc[plan.axis] = max(1, pc[plan.axis] // self.spec.block_size)
            kw["chunks"] = tuple(pc)
            # group scales are as many as 1/block_size of the data and hardly compress:
            # stored raw, a block's parameter chunks cost a write, not a zstd pass
            kw["compressors"] = None
        members = {
            "data": {
                "shape": plan.shape,
                "chunks": plan.chunks,
                "dtype": store_dtype,
                "serializer": serializer,
                "fill_value": 0,
                "compressors": compressions.compressors(self.compression, self.source.compressors),
                "config": qarray.WRITE_ALL_CHUNKS,
                "chunk_key_encoding": qarray.FLAT_KEYS,
                "dimension_names": list(self.dims),
            },
            "scale": {"dtype": np.float16 if self.spec.half_scales else np.float32, **kw},
            "zero_point": {"dtype": zp_dtype, **kw},
        }
        if self.spec.float_offset:  # x = q * scale + offset (float64: CF's add_offset)
            members["offset"] = {"dtype": np.float64, **kw}
        if progress_log:
            keep, bins = (
                (WorstGroups.KEEP, GroupSQNR.SLOTS) if self.keeps_worst_groups() else (0, 0)
            )
            members[ProgressLog.NAME] = ProgressLog.array_spec(plan.channels, keep, bins)
        return members

    def _create(self, dst, cal: Calibration, fp: str):
        """A new output: the group's metadata first (``ready: false``), then the members and
        the parameters, then ``ready: true``."""
        plan = self.plan
        meta = self.new_meta(fp, dst)
        group = qarray.create_group(dst, {"qstream": meta}, self.storage_options)
        try:
            arrays = qarray.create_arrays(group, self.member_arrays())
            if cal.params is not None and math.prod(plan.param_shape):
                ArrayWriter(arrays["scale"])[_whole(plan.param_shape)] = cal.params.scale.astype(
                    arrays["scale"].dtype
                )
                zp = cal.params.zero_point.astype(arrays["zero_point"].dtype)
                if zp.any():  # all-zero zero points (symmetric) are the fill value
                    ArrayWriter(arrays["zero_point"])[_whole(plan.param_shape)] = zp
                if cal.params.offset is not None:
                    ArrayWriter(arrays["offset"])[_whole(plan.param_shape)] = cal.params.offset
        except StoreError:
            raise
        except OSError as e:
            raise StoreError(f"cannot write {dst}: {e}") from None
        meta["calibration"] = cal.summary()
        meta["ready"] = True
        qarray.set_meta(group, meta)
        return group, arrays

    def _quantize_pass(self, dst, group, cal: Calibration, progress, arrays=None):
        """Quantize the blocks after the progress snapshot; fold their error sums onto it.
        ``arrays``: the members of a group :meth:`_create` just made (nothing landed yet)."""
        plan = self.plan
        fresh = WorstGroups.empty() if self.keeps_worst_groups() else None
        if arrays is None:
            log = ProgressLog.open(group)
            start, errors, worst = log.load()
        else:
            log = ProgressLog(arrays[ProgressLog.NAME])
            start, errors, worst = 0, ErrorStats.empty(plan.channels), fresh
        if errors.count.size != plan.channels or start > len(self.blocks):
            start, errors, worst = 0, ErrorStats.empty(plan.channels), fresh
        if start and not self._blocks_landed(group, start):
            start, errors, worst = 0, ErrorStats.empty(plan.channels), fresh
        if (worst is None) != (fresh is None):
            start, errors, worst = 0, ErrorStats.empty(plan.channels), fresh
        found = [worst]
        todo = self.blocks[start:]
        per = cal.params is not None and not self.spec.block_size
        dest = DestRef(self.token, _fspath(dst), self.storage_options)
        dest.register(group, arrays)
        work = QuantizeWork(
            plan,
            self.ref,
            dest,
            cal.params.scale if per else None,
            (cal.params.zero_point if cal.params.offset is None else cal.params.offset)
            if per
            else None,
        )
        done = [start]
        report_stage(progress, "quantize", len(self.blocks), start)
        lease = Lease(group, self.token, dst)

        def merge(b, result) -> None:
            err, groups = result
            merge_into(errors, err, plan.offset(b.key))  # in block order: deterministic
            if groups is not None:
                found[0] = found[0].merged(groups)
            done[0] += 1
            if log.due():
                log.save(done[0], errors, found[0])
            lease.renew()
            if progress:
                progress(done[0], len(self.blocks))

        finished = False
        try:
            self.scan(todo, work, merge, None)
            finished = True
        except NonFiniteBlock:
            self.check_nonfinite(self.ranges())  # the whole array's count and first index
            raise
        except OSError as e:
            if isinstance(e, StoreError):
                raise
            raise StoreError(f"cannot write {dst}: {e}") from None
        finally:
            # a failed pass (e.g. a full disk) leaves its last snapshot; a finished one needs
            # none (the report written next supersedes it; a kill before that redoes the
            # blocks after the last periodic snapshot)
            if not finished and done[0] > start:
                with contextlib.suppress(OSError):
                    log.save(done[0], errors, found[0])
        return (errors, found[0]), start

    def _blocks_landed(self, group, n: int) -> bool:
        """Whether the data chunks of the first ``n`` blocks exist (one listing of the store:
        a killed writer's last chunk, or chunks deleted since)."""
        from ..io.stores import stored_sizes

        data = group["data"]
        sizes = stored_sizes(data.store_path.store, data.store_path.path)
        for b in self.blocks[:n]:
            coords = tuple(k.start // c for k, c in zip(b.key, data.chunks, strict=True))
            if not sizes.get(data.metadata.encode_chunk_key(coords)):
                return False
        return True

    def _members_lost(self, dst) -> bool:
        group = open_group(dst, mode="r", storage_options=self.storage_options)
        return bool(qarray.missing_members(group))

    def _damaged(self, dst) -> bool:
        """Whether this job's finished output at ``dst`` lacks some of its parts."""
        try:
            group = open_group(dst, mode="r", storage_options=self.storage_options)
            return bool(qarray.gaps(group))
        except (StoreError, KeyError):
            return True

    def _check_landed(self, group, dst) -> None:
        """Before ``complete`` is written to an object store: the output is still this job's,
        and every part it wrote is in the store (a listing, not a re-read). A local output is
        locked while the job writes it, and its files are written before this returns."""
        if destination.is_local_node(group):
            return
        qarray.check_writer(group, self.token, dst)
        missing = qarray.gaps(group)
        if missing:
            raise StoreError(
                f"{dst}: {len(missing)} parts of the output are missing or damaged after the"
                f" run ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}):"
                " something else deleted or changed them; re-run to rewrite them"
            )

    def keeps_worst_groups(self) -> bool:
        """Whether the report lists the worst parameter groups (blocked integer specs)."""
        return bool(self.spec.block_size) and not self.plan.qt.is_float

    def finished(
        self, meta: dict, calibration: dict, found, dst, t0, resumed, scale, zero_point, offset=None
    ) -> tuple[dict, QuantReport, dict]:
        """The output's complete metadata, the job's report, and the attributes of ``data``
        (per-tensor integer outputs: CF ``scale_factor``/``add_offset``), from the folded
        error sums ``found`` and the stored parameters."""
        plan, qt = self.plan, self.plan.qt
        errors, worst = found
        err = errors.summary()
        if worst is not None:
            err["worst_groups"] = worst.summary(
                blocked_param_shape(plan.shape, plan.axis, self.spec.block_size),
                plan.axis,
                self.spec.block_size,
            )
            if worst.groups is not None:  # (None: resumed from an older run's snapshot)
                err["groups"] = worst.groups.summary()
        report = QuantReport(
            spec=self.spec,
            source=self.source.description,
            destination=display(dst),
            calibration=calibration,
            error=err,
            passes=self.passes,
            seconds=time.perf_counter() - t0,
            bytes_read=self.bytes_read,
            bytes_written=qarray.stored_nbytes(plan.shape, qt),
            resumed_blocks=resumed,
            missing_chunks=self.source.missing_chunks(),
        )
        from ..io.scientific import coordinates, source_attrs

        # the source's descriptive attributes; the parameters as coordinates (xarray)
        attrs = {**source_attrs(self.source), "coordinates": coordinates(offset is not None)}
        if plan.axis is None and not qt.is_float and self.layout == "group":
            s, z = float(np.asarray(scale).reshape(())), float(np.asarray(zero_point).reshape(()))
            if offset is not None:  # exact: see qstream.core.offsets
                attrs.update(scale_factor=s, add_offset=float(np.asarray(offset).reshape(())))
            else:
                attrs.update(scale_factor=s, add_offset=-z * s)
        if self.spec.nan_policy == "fill" and self.layout == "group":
            attrs["_FillValue"] = int(qt.qmin)  # the code NaN took
        meta = {**meta, "calibration": calibration, "error": err, "report": report.to_dict()}
        return {**meta, "complete": True}, report, attrs

    def _finish(self, group, calibration: dict, found, dst, t0, resumed) -> QuantReport:
        from ..io import codec
        from ..io.scientific import drop_progress

        plan = self.plan
        per_tensor = plan.axis is None and not plan.qt.is_float
        scale = group["scale"][...] if per_tensor else None
        zero_point = group["zero_point"][...] if per_tensor else None
        offset = None
        if self.spec.float_offset:
            offset = group["offset"][...] if per_tensor else np.zeros(0)
        meta, report, attrs = self.finished(
            dict(group.attrs["qstream"]),
            calibration,
            found,
            dst,
            t0,
            resumed,
            scale,
            zero_point,
            offset,
        )
        self._check_landed(group, dst)  # (before data's attributes: it may be gone)
        if attrs:
            try:
                group["data"].attrs.update(attrs)
            except KeyError:
                raise StoreError(
                    f"{dst}: its data array is missing after the run: something else deleted"
                    " it; re-run to rewrite it"
                ) from None
        if self.layout == "codec":  # data's document in the codec form (the chunks as they are)
            from ..core.offsets import codec_constants

            c, zp, o = codec_constants(scale, zero_point, offset)
            meta["codec"] = {"scale": c, "zero_point": zp, "offset": o}
            codec.to_codec(group, dst, plan.qt, c, zp, o, self.spec.nan_policy == "fill")
        qarray.set_meta(group, meta)  # written last
        drop_progress(dst, group, self.storage_options)  # (a complete output needs none)
        return report


# --------------------------------------------------------------------------- dequantize


def dequantize(
    src,
    dst,
    *,
    dtype="float32",
    max_memory=None,
    progress=None,
    overwrite=False,
    storage_options=None,
    executor=None,
    compression=compressions.AUTO,
) -> dict:
    """Dequantize the quantized group ``src`` into a plain Zarr array ``dst`` (see
    :func:`qstream.dequantize_store`)."""
    import zarr

    from ..io.scientific import carried_attrs

    t0 = time.perf_counter()
    compression = compressions.canonical(compression)
    executor = executors.resolve(executor)
    executors.check_shared("source", src, executor=executor)
    executors.check_shared("destination", dst, executor=executor)
    arr = qarray.open_quantized(src, storage_options=storage_options)
    out_dtype = float_dtype(dtype)
    src_loc = location(src)
    destination.check_separate(src_loc, dst)
    destination.check_writable(dst)
    fp = dequantized_fingerprint(src_loc, arr, out_dtype, compression)
    dest = Destination(dst, "dequantized", fp, storage_options=storage_options)
    result = {
        "source": display(src),
        "destination": display(dst),
        "dtype": out_dtype.name,
        "shape": list(arr.shape),
        "bytes_written": int(math.prod(arr.shape) * out_dtype.itemsize),
        "already_complete": False,
    }
    blocks = plan_blocks(arr.shape, arr.data.chunks)
    check_fits(max_memory, arr.data.chunks, np.dtype(np.float32), 1, arr.shape)
    token = uuid.uuid4().hex
    meta = {"dequantized_from": src_loc, "dtype": out_dtype.name, "fingerprint": fp}
    action, _ = dest.look(overwrite=overwrite)
    # its own finished output, damaged: made again (if it is still this job's once locked)
    repair = action is Action.COMPLETE and _gaps_at(dst, storage_options)
    with dest.claim(overwrite=overwrite, repair=repair) as (action, existing):
        if action is Action.COMPLETE:
            return {**result, "already_complete": True, "seconds": 0.0}
        if action is Action.RESUME:  # an unfinished run: made again (blocks are not logged)
            destination.remove_output(dst, existing, storage_options)
        from ..io.stores import open_store

        store = open_store(dst, mode="w", storage_options=storage_options)
        try:
            out = zarr.create_array(
                store,
                config=qarray.WRITE_ALL_CHUNKS,
                attributes={
                    **carried_attrs(dict(arr.data.attrs)),  # units, long_name, ...
                    "qstream": {**meta, **Lease.fields(dst, token), "complete": False},
                },
                **dequantized_array(arr, out_dtype, compression),
            )
        except zarr.errors.ContainsArrayError:
            raise StoreError(f"{dst} was created by another process meanwhile") from None
        except OSError as e:
            raise StoreError(f"cannot write {dst}: {e}") from None
        work = DequantizeWork(
            DestRef(token, _fspath(src), storage_options),
            DestRef(token, _fspath(dst), storage_options),
            out_dtype.name,
        )
        workers = fit_workers(max_memory, blocks, 4, pipeline.default_workers())
        report_stage(progress, "dequantize", len(blocks))
        lease = Lease(out, token, dst)
        tick = _counter(progress, len(blocks))

        def landed(b) -> None:
            lease.renew()
            if tick is not None:
                tick(b)

        try:
            pipeline.run(blocks, work, workers=workers, progress=landed, executor=executor)
        except OSError as e:
            if isinstance(e, StoreError):
                raise
            raise StoreError(f"cannot write {dst}: {e}") from None
        finally:
            executor.release(token)
        if not destination.is_local_node(out):  # (see QuantizeJob._check_landed)
            qarray.check_writer(out, token, dst)
            missing = qarray.gaps(out)
            if missing:
                raise StoreError(
                    f"{dst}: {len(missing)} chunks are missing or damaged after the run:"
                    " something else deleted or changed them; re-run to write them again"
                )
        try:
            out.attrs["qstream"] = {**meta, **Lease.fields(dst, token), "complete": True}
        except OSError as e:
            raise StoreError(f"cannot write {dst}: {e}") from None
        destination.clean_partials(dst)
    return {**result, "seconds": time.perf_counter() - t0}


def dequantized_fingerprint(src_loc, arr, out_dtype, compression: str) -> str:
    """What makes two dequantizations the same job: the source, its job, the dtype and the
    compression."""
    ident = [src_loc, arr.meta.get("fingerprint"), out_dtype.name]
    if compression != compressions.AUTO:
        ident.append(compression)
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:32]


def dequantized_array(arr, out_dtype, compression: str) -> dict:
    """The ``create_array`` keywords of the array ``arr`` dequantizes into (bfloat16 as the
    ``bfloat16`` Zarr data type qstream registers; earlier versions stored its uint16 bits)."""
    from ..io.zarr_ext import register_zarr_types

    register_zarr_types()
    return {
        "shape": arr.shape,
        "chunks": arr.data.chunks,
        "dtype": out_dtype,
        "fill_value": 0,
        "compressors": compressions.compressors(compression, arr.data.compressors),
        "chunk_key_encoding": qarray.FLAT_KEYS,
        # the quantized output's (the source's, for outputs that carry them)
        "dimension_names": list(
            getattr(arr.data.metadata, "dimension_names", None) or dimension_names(arr.ndim)
        ),
    }


# --------------------------------------------------------------------------- helpers


def _whole(shape) -> tuple[slice, ...]:
    return tuple(slice(0, n) for n in shape)


def _gaps_at(dst, storage_options) -> bool:
    """Whether the array at ``dst`` lacks parts (see :func:`qstream.io.qarray.gaps`)."""
    import zarr

    from ..io.stores import open_store

    try:
        store = open_store(dst, mode="r", storage_options=storage_options)
        return bool(qarray.gaps(zarr.open_array(store=store, mode="r")))
    except (OSError, KeyError, ValueError):
        return True


def _is_zip(dst) -> bool:
    return isinstance(dst, (str, os.PathLike)) and os.fspath(dst).endswith(".zip")


def _is_zarr_store(obj) -> bool:
    from zarr.abc.store import Store

    return isinstance(obj, Store)


def _fspath(target):
    """A path as a string; a store object as it is."""
    return os.fspath(target) if isinstance(target, (str, os.PathLike)) else target


def report_stage(progress, name: str, total: int, done: int = 0) -> None:
    """Tell a progress reporter which pass starts, when it has a ``stage(name, total, done)``
    method (plain ``(done, total)`` callables are only called per block)."""
    stage = getattr(progress, "stage", None)
    if stage is not None:
        stage(name, total, done)


def _counter(progress, total):
    if progress is None:
        return None
    n = [0]

    def tick(_b):
        n[0] += 1
        progress(n[0], total)

    return tick


def _pack_zip(directory: str, target: str) -> None:
    import zipfile

    tmp = f"{target}.{os.getpid()}.partial"
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
            for root, _, files in os.walk(directory):
                for f in sorted(files):
                    if f == destination.LOCK:
                        continue
                    full = os.path.join(root, f)
                    zf.write(full, os.path.relpath(full, directory))
        os.replace(tmp, target)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise StoreError(f"cannot write {target}: {e}") from None
