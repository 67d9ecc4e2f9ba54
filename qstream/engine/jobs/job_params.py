"""A job's parameters that no statistics pass derives: given ones, float offsets, stored ones.

Each is shaped to the job's parameter shape (``plan.param_shape``): explicit scales and zero
points checked and broadcast (:func:`explicit_params`), a scale with float offsets
(:func:`offset_params`), and the parameters an interrupted run chose
(:func:`stored_calibration`), which its blocks already used.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ...core import checks
from ...errors import InvalidParameterError
from ...spec import Calibration, QuantParams, QuantSpec
from ..blocks import JobPlan


def broadcast_param(v: Any, name: str, plan: JobPlan) -> np.ndarray:
    """``v`` broadcast to the parameter shape (float64), or refused naming ``name``."""
    a = np.asarray(v, np.float64)
    try:
        return np.broadcast_to(a, plan.param_shape).copy()
    except ValueError:
        raise InvalidParameterError(
            f"{name} shape {a.shape} does not fit the parameter shape {plan.param_shape} of"
            f" {plan.spec.granularity} quantization"
        ) from None


def with_offset(scale: Any, off: Any, plan: JobPlan, layout: str) -> QuantParams:
    """Parameters of a scale and float offsets (zero points all zero)."""
    off = np.asarray(off, np.float64).reshape(plan.param_shape)
    if layout == "codec":  # the codec computes in float32: quantize with its offset
        off = off.astype(np.float32).astype(np.float64)
    return QuantParams(
        np.asarray(scale, np.float32).reshape(plan.param_shape),
        np.zeros(plan.param_shape),
        plan.axis,
        None,
        off,
    )


def offset_params(lo: np.ndarray, hi: np.ndarray, plan: JobPlan, layout: str) -> QuantParams:
    """Scale and float offsets (``spec.offset``) from the calibrated ranges."""
    from ...core import offset_params as from_range

    spec = plan.spec
    offset = spec.offset
    if not isinstance(offset, str):
        offset = broadcast_param(offset, "offset", plan).reshape(-1)
    scale, off = from_range(
        lo,
        hi,
        plan.qt,
        narrow_range=spec.narrow_range,
        offset=offset,
        scale_mode=spec.scale_mode,
    )
    return with_offset(scale, off, plan, layout)


def explicit_params(plan: JobPlan, layout: str) -> QuantParams:
    """The spec's own scale and zero point (or offset), checked against the quantized type."""
    spec = plan.spec
    if spec.float_offset:  # an explicit scale and offset
        s = broadcast_param(spec.scale, "scale", plan).astype(np.float32)
        checks.check_scale(s)
        s = rounded(s, spec)
        return with_offset(s, broadcast_param(spec.offset, "offset", plan), plan, layout)
    s = np.asarray(spec.scale, np.float32)
    z = np.asarray(0 if spec.zero_point is None else spec.zero_point, np.float64)
    try:
        s = np.broadcast_to(s, plan.param_shape).copy()
        z = np.broadcast_to(z, plan.param_shape).copy()
    except ValueError:
        raise InvalidParameterError(
            f"scale/zero_point shapes {s.shape}/{z.shape} do not fit the parameter shape"
            f" {plan.param_shape} of {spec.granularity} quantization"
        ) from None
    checks.check_scale(s)
    s = rounded(s, spec)
    qt = plan.qt
    if not qt.is_float and z.size and (z.min() < qt.qmin or z.max() > qt.qmax):
        raise InvalidParameterError(
            f"zero_point is outside the {qt.name} range [{qt.qmin:g}, {qt.qmax:g}]"
        )
    return QuantParams(s, z, plan.axis, spec.block_size)


def stored_calibration(group: Any, plan: JobPlan) -> tuple[Calibration, dict[str, Any]]:
    """The parameters an interrupted run of this job chose (its blocks used them), and the
    summary of its calibration as the output's metadata holds it. ``group``: the output
    (a ``zarr.Group``)."""
    spec = plan.spec
    meta = group.attrs["qstream"]
    params = None
    if not plan.dynamic:
        params = QuantParams(
            np.asarray(group["scale"][...], np.float32).reshape(plan.param_shape),
            np.asarray(group["zero_point"][...], np.float64).reshape(plan.param_shape),
            plan.axis,
            spec.block_size if spec.scale is not None else None,
        )
        if spec.float_offset:
            params = replace(
                params,
                offset=np.asarray(group["offset"][...], np.float64).reshape(plan.param_shape),
            )
    return Calibration(spec, None, {}, params), meta["calibration"]


def rounded(s: np.ndarray, spec: QuantSpec) -> np.ndarray:
    """Explicit scales as ``spec.scale_dtype`` stores them: rounded to float16 or bfloat16
    values (``qstream.core.round_scales``), float32 ones as given."""
    if spec.scale_mode == 0:
        return s
    from ...core import round_scales

    return round_scales(s, spec.scale_mode)
