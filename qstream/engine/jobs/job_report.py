"""A store job's report, and the output's last writes that make it complete.

The quantize pass folds every block's error sums in block order
(:mod:`qstream.engine.jobs.quantize_pass`); :func:`finished` turns them and the job's counts into
the output's complete metadata and the :class:`~qstream.spec.QuantReport`, and
:func:`finish` checks that every part landed (:func:`check_landed`) and writes them
(``complete: true`` last).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from ...core import blocked_param_shape
from ...errors import StoreError
from ...io.outputs import destination, qarray
from ...io.storage import display
from ...spec import ErrorStats, QuantReport, WorstGroups
from ..blocks import JobPlan
from .passes import JobView

#: what the quantize pass folds: the error sums, and the worst parameter groups (None for
#: specs that keep none)
Found = tuple[ErrorStats, WorstGroups | None]


def keeps_worst_groups(plan: JobPlan) -> bool:
    """Whether the report lists the worst parameter groups (blocked integer specs)."""
    return bool(plan.spec.block_size) and not plan.qt.is_float


def finished(
    job: JobView,
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
    """The output's complete metadata, the job's report, and the attributes of ``data``
    (per-tensor integer outputs: CF ``scale_factor``/``add_offset``), from the folded
    error sums ``found`` and the stored parameters."""
    plan, qt, spec = job.plan, job.plan.qt, job.spec
    errors, worst = found
    err = errors.summary()
    if worst is not None:
        axis, bs = plan.axis, spec.block_size
        assert axis is not None and bs  # (kept for blocked specs only, which have an axis)
        err["worst_groups"] = worst.summary(blocked_param_shape(plan.shape, axis, bs), axis, bs)
        if worst.groups is not None:  # (None: resumed from an older run's snapshot)
            err["groups"] = worst.groups.summary()
    report = QuantReport(
        spec=spec,
        source=job.source.description,
        destination=display(dst),
        calibration=calibration,
        error=err,
        passes=job.passes,
        seconds=time.perf_counter() - t0,
        bytes_read=job.bytes_read,
        bytes_written=qarray.stored_nbytes(plan.shape, qt),
        resumed_blocks=resumed,
        missing_chunks=job.source.missing_chunks(),
        bytes_before=math.prod(plan.shape) * np.dtype(job.source.dtype).itemsize,
        bytes_after=qarray.quantized_nbytes(plan.shape, spec),
    )
    from ...io.outputs import codes_attrs, coordinates, source_attrs

    # the source's descriptive attributes; the parameters as coordinates (xarray); codes
    # that xarray does not decode flagged as such
    attrs = {**source_attrs(job.source), "coordinates": coordinates(offset is not None)}
    if job.layout == "group":
        attrs.update(codes_attrs(qt.name, plan.axis, spec.block_size, offset is not None))
    if plan.axis is None and not qt.is_float and job.layout == "group":
        s, z = float(np.asarray(scale).reshape(())), float(np.asarray(zero_point).reshape(()))
        if offset is not None:  # exact: see qstream.core.offsets
            attrs.update(scale_factor=s, add_offset=float(np.asarray(offset).reshape(())))
        else:
            attrs.update(scale_factor=s, add_offset=-z * s)
    if spec.nan_policy == "fill" and job.layout == "group":
        attrs["_FillValue"] = int(qt.qmin)  # the code NaN took
    meta = {**meta, "calibration": calibration, "error": err, "report": report.to_dict()}
    return {**meta, "complete": True}, report, attrs


def finish(
    job: JobView,
    group: Any,
    calibration: dict[str, Any],
    found: Found,
    dst: Any,
    t0: float,
    resumed: int,
) -> QuantReport:
    """Write the report into the output ``group`` (a ``zarr.Group``), the attributes of its
    ``data``, and (codec layout) swap its codes into the codec form; ``complete`` last."""
    from ...io.outputs import codec, drop_progress

    plan = job.plan
    per_tensor = plan.axis is None and not plan.qt.is_float
    scale = group["scale"][...] if per_tensor else None
    zero_point = group["zero_point"][...] if per_tensor else None
    offset = None
    if job.spec.float_offset:
        offset = group["offset"][...] if per_tensor else np.zeros(0)
    meta, report, attrs = finished(
        job,
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
    from ...io.outputs import copy_coords

    copy_coords(job.source, group, job.dims, plan.shape)  # (lat, lon, time, ...: xarray's)
    check_landed(group, job.token, dst)  # (before data's attributes: it may be gone)
    if attrs:
        try:
            group["data"].attrs.update(attrs)
        except KeyError:
            raise StoreError(
                f"{dst}: its data array is missing after the run: something else deleted"
                " it; re-run to rewrite it"
            ) from None
    if job.layout == "codec":  # data's document in the codec form (the chunks as they are)
        from ...core import codec_constants

        c, zp, o = codec_constants(scale, zero_point, offset)
        meta["codec"] = {"scale": c, "zero_point": zp, "offset": o}
        codec.to_codec(group, dst, plan.qt, c, zp, o, job.spec.nan_policy == "fill")
    qarray.set_meta(group, meta)  # written last
    drop_progress(dst, group, job.storage_options)  # (left by a kill: the re-run drops it)
    return report


def check_landed(group: Any, token: str, dst: Any) -> None:
    """Before ``complete`` is written to an object store: the output is still the run's
    (``token``), and every part it wrote is in the store (a listing, not a re-read). A local
    output is locked while the job writes it, and its files are written before this
    returns."""
    if destination.is_local_node(group):
        return
    qarray.check_writer(group, token, dst)
    missing = qarray.gaps(group)
    if missing:
        raise StoreError(
            f"{dst}: {len(missing)} parts of the output are missing or damaged after the"
            f" run ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}):"
            " something else deleted or changed them; re-run to rewrite them"
        )
