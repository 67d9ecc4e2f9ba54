"""Turn ranges into scale / zero point (symmetric or asymmetric, any integer or float8 type).

Conventions (stated because the peers differ):

- symmetric, signed: ``scale = absmax / qmax`` (int8: /127, as ONNX Runtime and quanto), zero
  point 0; with ``narrow_range`` the type's lowest value is never produced.
- symmetric, unsigned: zero point at mid-range (uint8: 128), ``scale = absmax / (qmax - zp)``.
- asymmetric: the range is widened to contain 0 (so 0 is exact), ``scale = (hi - lo) /
  (qmax - qmin)``, ``zero_point = round_half_even(qmin - lo / scale)`` clipped to the type.
- a zero range (all values 0) gives scale 1.
- float8/float4: ``scale = absmax / max_finite``, zero point 0.

Arithmetic is in float64; the scale is stored as float32, or rounded to float16 or bfloat16
first (``scale_mode``, see :func:`~qstream.core.round_scales`), in which case the zero point
is derived from the rounded scale.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..core import half_scales, round_scales
from ..qtypes import QType

__all__ = ["half_scales", "params_from_range", "symmetric_steps"]


def symmetric_steps(
    qt: QType, narrow_range: bool = False, full_levels: bool = False
) -> tuple[float, float]:
    """``(steps, zero_point)`` of a symmetric integer range: ``scale = absmax / steps``; signed
    types have zero point 0, unsigned ones the mid-range code. ``full_levels``: half a step
    more, so that every code is used (int4: absmax / 7.5, -absmax -> -8)."""
    qmin, qmax = qt.qrange(narrow_range)
    extra = 0.5 if full_levels else 0.0
    if qt.signed:
        return float(min(qmax, -qmin)) + extra, 0.0
    zp = float((qmin + qmax + 1) // 2)
    return float(min(qmax - zp, zp - qmin)) + extra, zp


def params_from_range(
    lo: npt.ArrayLike,
    hi: npt.ArrayLike,
    qt: QType,
    *,
    symmetric: bool,
    narrow_range: bool = False,
    scale_mode: int = 0,
    full_levels: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Scale (float32) and zero point (float64, integer-valued) arrays from range arrays;
    ``scale_mode``: scales rounded to float16 (1) or bfloat16 (2) values first
    (:func:`~qstream.core.round_scales`, ``QuantSpec.scale_mode``). A float32 scale that
    rounds to 0 (a range of a few subnormals) becomes :data:`~qstream.qtypes.TINY_SCALE`,
    which still holds the range: a stored scale is never 0."""

    def fix(s: np.ndarray) -> np.ndarray:
        return round_scales(s, scale_mode)

    lo = np.minimum(np.asarray(lo, np.float64), 0.0)
    hi = np.maximum(np.asarray(hi, np.float64), 0.0)
    qmin, qmax = qt.qrange(narrow_range)
    if qt.is_float:
        amax = np.maximum(-lo, hi)
        scale = np.where(amax > 0, amax / qt.qmax, 1.0)
        return fix(scale.astype(np.float32)), np.zeros(scale.shape)
    if symmetric:
        amax = np.maximum(-lo, hi)
        steps, zp = symmetric_steps(qt, narrow_range, full_levels)
        scale = np.where(amax > 0, amax / steps, 1.0)
        return fix(scale.astype(np.float32)), np.full(scale.shape, zp)
    span = hi - lo
    scale = fix(np.where(span > 0, span / (qmax - qmin), 1.0).astype(np.float32))
    zps = np.clip(np.rint(qmin - lo / scale.astype(np.float64)), qmin, qmax)
    return scale, zps
