"""Quantize and dequantize NumPy arrays, ONNX opset 21+ semantics by default."""

from __future__ import annotations

import numpy as np

from ..core import checks
from ..core.affine import affine_dequantize, affine_quantize
from ..core.layout import plan_layout
from ..errors import InvalidDTypeError
from ..qtypes import float_dtype, is_qtype_dtype, qtype
from ..rounding import round_code
from . import small


def quantize(
    x,
    scale,
    zero_point=None,
    *,
    axis: int | None = None,
    block_size: int | None = None,
    dtype=None,
    round_mode: str = "half_to_even",
    saturate: bool = True,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Quantize ``x``: ``y = saturate(round(x / scale) + zero_point)``.

    Args:
        x: floating array (float16, bfloat16, float32 or float64).
        scale: a scalar (per-tensor); with ``axis``, a 1-D array of length ``x.shape[axis]``
            (per-axis); with ``axis`` and ``block_size``, an array shaped like ``x`` with
            ``x.shape[axis]`` replaced by ``ceil(x.shape[axis] / block_size)`` (blocked, ONNX
            layout, short last block). Python numbers become float32. The division is done in
            ``np.result_type(x, scale)`` (float16 and bfloat16 quotients are rounded to their
            type, as the ONNX reference does). Must be finite and > 0.
        zero_point: integer(s) in the output type's range, shaped like ``scale``; default 0.
        axis, block_size: granularity, see ``scale``; negative axes count from the end.
        dtype: output type name or dtype (int8 uint8 int16 uint16 int32 int4 uint4 int2 uint2
            float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float4_e2m1fn). Default:
            the zero point's dtype if it is an array of a quantized type, else uint8 (as ONNX).
        round_mode: one of ``qstream.rounding.ROUND_MODES`` (default half_to_even).
        saturate: float8 only (ONNX): clamp overflow to the largest finite value instead of
            NaN/inf. Integer outputs always saturate.
        out: optional C-contiguous output array of the right shape and dtype.

    Non-finite inputs (the reference implementations leave them undefined) follow ONNX Runtime
    on x86-64: +inf and values beyond the range give the maximum, -inf the minimum, NaN the
    type's minimum. Float8 outputs keep NaN.

    Returns:
        The quantized array (sub-byte and float8/float4 types as ``ml_dtypes`` arrays).
    """
    if axis is None and block_size is None and out is None:
        q = small.quantize(x, scale, zero_point, dtype, round_mode)
        if q is not None:
            return q
    x = checks.as_float_input(x, "x")
    scale = checks.as_scale(scale)
    qt = checks.resolve_output_type(dtype, zero_point)
    zp = checks.as_zero_point(zero_point, qt, scale.shape)
    layout = plan_layout(x.shape, scale.shape, axis, block_size)
    checks.check_scale(scale)
    zp = checks.broadcast_param(zp, scale)
    return affine_quantize(
        x, scale, zp, layout, qt, code=round_code(round_mode), saturate=saturate, out=out
    )


def dequantize(
    q,
    scale,
    zero_point=None,
    *,
    axis: int | None = None,
    block_size: int | None = None,
    dtype="float32",
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Dequantize ``q``: ``y = (q - zero_point) * scale``, computed in float32.

    ``q`` must have a quantized dtype (see :func:`quantize`); ``scale``/``zero_point``/``axis``/
    ``block_size`` are as in :func:`quantize` (zero points must lie in ``q``'s range).
    ``dtype``: float32 (default), float16 or bfloat16 (computed in float32, then rounded, as
    ONNX), or float64 (computed in float64). int32 inputs are computed in float64
    and rounded once, as the ONNX reference does.
    """
    if axis is None and block_size is None and out is None and dtype == "float32":
        y = small.dequantize(q, scale, zero_point)
        if y is not None:
            return y
    q = np.asarray(q)
    if not is_qtype_dtype(q.dtype):
        raise InvalidDTypeError(f"q must have a quantized dtype, got {q.dtype}")
    qt = qtype(q.dtype)
    scale = checks.as_scale(scale)
    zp = checks.as_zero_point(zero_point, qt, scale.shape)
    layout = plan_layout(q.shape, scale.shape, axis, block_size)
    checks.check_scale(scale)
    zp = checks.broadcast_param(zp, scale)
    return affine_dequantize(q, scale, zp, layout, qt, float_dtype(dtype), out=out)
