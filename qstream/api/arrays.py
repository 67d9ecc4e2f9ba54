"""Quantize and dequantize NumPy arrays, ONNX opset 21+ semantics by default."""

from __future__ import annotations

from typing import NamedTuple

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


class GroupQuantized(NamedTuple):
    """The result of :func:`quantize_dynamic`: ``q`` shaped like the input, ``scale`` and
    ``zero_point`` in the ONNX blocked layout (the input's shape with ``shape[axis]`` ->
    ``ceil(shape[axis] / block_size)``), so ``dequantize(q, scale, zero_point, axis=axis,
    block_size=block_size)`` is the ONNX ``DequantizeLinear`` of the result."""

    q: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int
    block_size: int

    def dequantize(self, dtype="float32") -> np.ndarray:
        """``(q - zero_point) * scale`` per group, as :func:`dequantize`."""
        return dequantize(
            self.q,
            self.scale,
            self.zero_point,
            axis=self.axis,
            block_size=self.block_size,
            dtype=dtype,
        )


def quantize_dynamic(x, spec=None, /, **fields) -> GroupQuantized:
    """Group-wise (blocked) dynamic quantization of an in-memory array: each group of
    ``block_size`` elements along ``axis`` gets its own scale (and zero point) from its own
    finite range, then is quantized with them. The same codes and parameters as
    ``quantize_store`` with the same spec (without its error report), in one fused kernel
    pass for float32 input, integer types up to 16 bits and ``half_to_even`` rounding.

    Args:
        x: floating array (float16, bfloat16, float32 or float64).
        spec: a :class:`qstream.QuantSpec` with ``axis`` and ``block_size`` (its method must be
            ``dynamic``), or None and its fields as keywords (``method`` defaults to
            ``dynamic``), e.g. ``quantize_dynamic(w, dtype="int8", axis=1, block_size=32)``.

    NaN and infinities follow the spec's ``nan_policy``: ``error`` (the default) raises
    :class:`qstream.NonFiniteInputError`; ``zero_point`` and ``min`` quantize them as
    ``quantize_store`` does.

    Returns:
        A :class:`GroupQuantized` ``(q, scale, zero_point, axis, block_size)``: ``q`` and
        ``zero_point`` in the output type (sub-byte types as ``ml_dtypes`` arrays, one code
        per byte), ``scale`` float32, or float16 with ``scale_dtype="float16"``.
    """
    from ..core import buffers
    from ..core.layout import normalize_axis
    from ..engine.blockmath import block_ranges, dynamic_quantize, nan_to_zero_point
    from ..errors import InvalidParameterError
    from ..spec import QuantSpec

    if spec is None:
        spec = QuantSpec(**{"method": "dynamic", **fields})
    elif fields:
        raise InvalidParameterError("give either a QuantSpec or its fields as keywords, not both")
    if spec.method != "dynamic" or spec.block_size is None or spec.scale is not None:
        raise InvalidParameterError(
            "quantize_dynamic needs method='dynamic' with axis and block_size (each group its"
            " own range); other methods calibrate over the whole array: use"
            " qstream.quantize_store(x, 'memory://...', spec)"
        )
    x = checks.as_float_input(x, "x")
    axis = normalize_axis(spec.axis, x.ndim)
    qt = spec.qtype
    q = buffers.empty(x.shape, qt.dtype)  # a large result: from the pool of freed buffers
    s, z, layout, nonfinite = dynamic_quantize(x, qt, spec, axis, q)
    if nonfinite and spec.nan_policy == "error":
        raise block_ranges(x, None).refusal("x", x.shape)
    if nonfinite and spec.nan_policy == "zero_point":
        nan_to_zero_point(x, q, z, layout, qt)
    if nonfinite and spec.nan_policy == "fill":  # the reserved code (the type's minimum)
        from ..engine.work import fill_nan

        fill_nan(x, q, qt)
    scale = s
    if spec.half_scales:  # float16 values already: their bit patterns, without a rounding cast
        from ..kernels.blocked import float16_bits
        from ..kernels.runtime import run

        scale = np.empty(s.shape, np.uint16)
        run(float16_bits, s.reshape(-1), scale.reshape(-1))
        scale = scale.view(np.float16)
    return GroupQuantized(q, scale, z.astype(qt.dtype), axis, int(spec.block_size))
