"""Quantize and dequantize NumPy arrays, ONNX opset 21+ semantics by default."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from ..engine.jobs import array_jobs as arrays
from ..errors import InvalidDTypeError, InvalidParameterError
from ..qtypes import QType, is_qtype_dtype, qtype
from . import direct as small

if TYPE_CHECKING:
    from ..spec import QuantSpec


def quantize(
    x: ArrayLike,
    scale: ArrayLike,
    zero_point: ArrayLike | None = None,
    *,
    axis: int | None = None,
    block_size: int | None = None,
    dtype: DTypeLike | QType | None = None,
    round_mode: str = "half_to_even",
    saturate: bool = True,
    out: NDArray[Any] | None = None,
) -> NDArray[Any]:
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
    return arrays.quantize_array(
        x,
        scale,
        zero_point,
        axis=axis,
        block_size=block_size,
        dtype=dtype,
        round_mode=round_mode,
        saturate=saturate,
        out=out,
    )


def dequantize(
    q: ArrayLike,
    scale: ArrayLike,
    zero_point: ArrayLike | None = None,
    *,
    axis: int | None = None,
    block_size: int | None = None,
    dtype: DTypeLike = "float32",
    out: NDArray[Any] | None = None,
) -> NDArray[Any]:
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
    qa = np.asarray(q)
    if not is_qtype_dtype(qa.dtype):
        raise InvalidDTypeError(f"q must have a quantized dtype, got {qa.dtype}")
    return arrays.dequantize_array(
        qa,
        qtype(qa.dtype),
        scale,
        zero_point,
        axis=axis,
        block_size=block_size,
        dtype=dtype,
        out=out,
    )


class GroupQuantized(NamedTuple):
    """The result of :func:`quantize_dynamic`: ``q`` shaped like the input, ``scale`` and
    ``zero_point`` in the ONNX blocked layout (the input's shape with ``shape[axis]`` ->
    ``ceil(shape[axis] / block_size)``), so ``dequantize(q, scale, zero_point, axis=axis,
    block_size=block_size)`` is the ONNX ``DequantizeLinear`` of the result."""

    q: NDArray[Any]
    scale: NDArray[np.floating[Any]]
    zero_point: NDArray[Any]
    axis: int
    block_size: int

    def dequantize(self, dtype: DTypeLike = "float32") -> NDArray[Any]:
        """``(q - zero_point) * scale`` per group, as :func:`dequantize`."""
        return dequantize(
            self.q,
            self.scale,
            self.zero_point,
            axis=self.axis,
            block_size=self.block_size,
            dtype=dtype,
        )


def quantize_dynamic(
    x: ArrayLike, spec: QuantSpec | None = None, /, **fields: Any
) -> GroupQuantized:
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
    from ..spec import QuantSpec

    if spec is None:
        spec = QuantSpec(**{"method": "dynamic", **fields})
    elif fields:
        raise InvalidParameterError("give either a QuantSpec or its fields as keywords, not both")
    if (
        spec.method != "dynamic"
        or spec.block_size is None
        or spec.axis is None  # (never, with a block_size: for mypy)
        or spec.scale is not None
    ):
        raise InvalidParameterError(
            "quantize_dynamic needs method='dynamic' with axis and block_size (each group its"
            " own range); other methods calibrate over the whole array: use"
            " qstream.quantize_store(x, 'memory://...', spec)"
        )
    q, scale, zero_point, axis = arrays.quantize_groups(x, spec, spec.axis)
    return GroupQuantized(q, scale, zero_point, axis, int(spec.block_size))
