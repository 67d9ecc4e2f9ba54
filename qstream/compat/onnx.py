"""ONNX ``QuantizeLinear`` / ``DequantizeLinear`` / ``DynamicQuantizeLinear`` (opsets 10-25) and
the ONNX Runtime ``com.microsoft`` contrib ``QuantizeLinear`` / ``DequantizeLinear``.

Arithmetic follows the ONNX reference evaluator: the quotient is formed in the scale's type
(``np.result_type(x, scale)``; set ``precision=`` to override, e.g. ``precision="float32"`` gives
ONNX Runtime's float32 division for float16 inputs), rounded half to even, then the zero point
is added and the result saturated. Float8 outputs are ``cast(x / scale)`` with ``saturate``,
float4 ``cast(x / scale + zp)``.

Where every reference leaves the result undefined, this profile follows ONNX Runtime on x86-64:
+inf and too-large values give the type's maximum, -inf the minimum, NaN the type's minimum
(the reference evaluator gives the minimum for +inf too, an artefact of its int32 cast).
Zero and negative scales are accepted, as both ONNX implementations accept them.
"""

from __future__ import annotations

from types import EllipsisType

import numpy as np
import numpy.typing as npt

from ..core import Layout, affine_dequantize, affine_quantize, blocked_param_shape, plan_layout
from ..errors import InvalidDTypeError, InvalidParameterError
from ..qtypes import QType, float_dtype, is_qtype_dtype, qtype
from ._names import resolve_type

# TensorProto element types these operators use: code -> (ONNX's name, qstream's name).
_TENSOR_TYPES = {
    1: ("FLOAT", "float32"),
    2: ("UINT8", "uint8"),
    3: ("INT8", "int8"),
    4: ("UINT16", "uint16"),
    5: ("INT16", "int16"),
    6: ("INT32", "int32"),
    10: ("FLOAT16", "float16"),
    11: ("DOUBLE", "float64"),
    16: ("BFLOAT16", "bfloat16"),
    17: ("FLOAT8E4M3FN", "float8_e4m3fn"),
    18: ("FLOAT8E4M3FNUZ", "float8_e4m3fnuz"),
    19: ("FLOAT8E5M2", "float8_e5m2"),
    20: ("FLOAT8E5M2FNUZ", "float8_e5m2fnuz"),
    21: ("UINT4", "uint4"),
    22: ("INT4", "int4"),
    23: ("FLOAT4E2M1", "float4_e2m1fn"),
    25: ("UINT2", "uint2"),
    26: ("INT2", "int2"),
}
_FLOAT_INPUTS = ("float32", "float16", "bfloat16", "float64")
_ONNX_NAMES = dict(_TENSOR_TYPES.values())
_QUANTIZED_NAMES = {k: v for k, v in _ONNX_NAMES.items() if v not in _FLOAT_INPUTS}
_REAL_NAMES = {k: v for k, v in _ONNX_NAMES.items() if v in _FLOAT_INPUTS}

# An element type: a TensorProto code, ONNX's or qstream's name, or a dtype.
TypeArg = int | npt.DTypeLike


def _type_name(t: TypeArg, names: dict[str, str], what: str) -> str:
    """qstream's name of an element type given as a TensorProto code, ONNX's name ("FLOAT",
    "INT8", "FLOAT8E4M3FN" ..., any case), qstream's name or a dtype, among ``names``."""
    if isinstance(t, (int, np.integer)) and not isinstance(t, bool):
        name = _TENSOR_TYPES.get(int(t), (None, None))[1]
        if name is None or name not in names.values():
            codes = ", ".join(
                f"{c} ({o})" for c, (o, n) in _TENSOR_TYPES.items() if n in names.values()
            )
            raise InvalidDTypeError(f"unsupported {what} {int(t)}; expected one of: {codes}")
        return name
    return resolve_type(t, names, what)


_OUT = "ONNX QuantizeLinear output_dtype"


def _output_type(zero_point: npt.ArrayLike | None, output_dtype: TypeArg | None) -> QType:
    if zero_point is not None:
        zt = qtype(np.asarray(zero_point).dtype)
        if output_dtype and qtype(_type_name(output_dtype, _QUANTIZED_NAMES, _OUT)) != zt:
            raise InvalidParameterError(
                f"Mismatched output data-types: output_dtype={output_dtype},"
                f" zero_point type={zt.name}"
            )
        return zt
    return qtype(_type_name(output_dtype, _QUANTIZED_NAMES, _OUT) if output_dtype else "uint8")


def _layout(
    shape: tuple[int, ...], scale: npt.ArrayLike, axis: int | None, block_size: int
) -> tuple[Layout, EllipsisType | tuple[slice, ...]]:
    """Granularity as the ONNX reference decides it; returns (layout, scale_used, slicer)."""
    scale = np.asarray(scale)
    if block_size:
        if block_size < 0:
            raise InvalidParameterError("block_size must be a positive integer.")
        k = _axis(axis, len(shape))
        nblocks = blocked_param_shape(shape, k, block_size)[k]
        if scale.ndim != len(shape) or scale.shape[k] < nblocks:
            raise InvalidParameterError(
                "Invalid shapes for Blocked Quantization: x_scale must have x's rank and"
                f" ceil({shape[k]}/{block_size}) = {nblocks} entries along axis {k},"
                f" got {scale.shape}"
            )
        take = (slice(None),) * k + (slice(0, nblocks),)
        return plan_layout(shape, scale[take].shape, k, block_size), take
    if scale.ndim > 1:
        raise InvalidParameterError("Input 2 must be a vector or a number.")
    if scale.size == 1:
        return plan_layout(shape, scale.shape, None, None), ...
    return plan_layout(shape, scale.shape, _axis(axis, len(shape)), None), ...


def _axis(axis: int | None, ndim: int) -> int:
    if axis is None or not -ndim <= axis < ndim:
        raise InvalidParameterError(
            f"axis {axis} is out of boundary for an input of rank {ndim}"
            f" (valid range [{-ndim}, {ndim - 1}])"
        )
    return axis % ndim


def _float_input(x: npt.ArrayLike, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == np.int32:
        return x.astype(np.float64)  # x / scale promotes int32 to float64 in the reference
    if x.dtype.name not in _FLOAT_INPUTS:
        raise InvalidDTypeError(
            f"{name} must be float32, float16, bfloat16, float64 or int32, got {x.dtype}"
        )
    return x


def _zero_point_values(
    zero_point: npt.ArrayLike | None,
    scale: np.ndarray,
    take: EllipsisType | tuple[slice, ...],
) -> np.ndarray | None:
    if zero_point is None:
        return None
    z = np.asarray(zero_point)
    z = z[take] if take is not ... and z.ndim else z
    zf = z.astype(np.float64)
    return np.broadcast_to(zf.reshape(()) if zf.size == 1 else zf, np.shape(scale))


def quantize_linear(
    x: npt.ArrayLike,
    y_scale: npt.ArrayLike,
    y_zero_point: npt.ArrayLike | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    saturate: int = 1,
    output_dtype: TypeArg | None = None,
    precision: TypeArg | None = None,
) -> np.ndarray:
    """ONNX ``QuantizeLinear``: ``y = saturate(round_half_even(x / y_scale) + y_zero_point)``.

    ``output_dtype`` and ``precision`` take a TensorProto code, a name or a dtype.
    """
    x = _float_input(x, "x")
    scale = np.asarray(y_scale)
    qt = _output_type(y_zero_point, output_dtype)
    layout, take = _layout(x.shape, scale, axis, block_size)
    scale = scale[take] if take is not ... else scale.reshape(layout.param_shape or ())
    if precision:
        p = float_dtype(_type_name(precision, _REAL_NAMES, "ONNX precision"))
        x, scale = x.astype(p), scale.astype(p)
    zp = _zero_point_values(y_zero_point, scale, take)
    if zp is not None and not qt.is_float:
        zp = zp.reshape(scale.shape)
    return affine_quantize(x, scale, zp, layout, qt, saturate=bool(saturate))


def dequantize_linear(
    x: npt.ArrayLike,
    x_scale: npt.ArrayLike,
    x_zero_point: npt.ArrayLike | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: TypeArg | None = None,
) -> np.ndarray:
    """ONNX ``DequantizeLinear``: ``y = (x - x_zero_point) * x_scale``, computed in float32.

    The result has ``output_dtype`` if given, else the scale's type. Float8/float4 inputs take
    no zero point (a non-zero one is an error, as in the reference).
    """
    q = np.asarray(x)
    if not is_qtype_dtype(q.dtype):
        raise InvalidDTypeError(f"x must have a quantized type, got {q.dtype}")
    qt = qtype(q.dtype)
    scale = np.asarray(x_scale)
    if x_zero_point is not None:
        z = np.asarray(x_zero_point)
        if qt.is_float:
            if np.any(z.astype(np.float32) != 0):
                raise InvalidParameterError(
                    "x_zero_point is not null but should be zero for float8 types."
                )
            x_zero_point = None
        elif z.dtype != q.dtype:
            raise InvalidDTypeError(f"Type mismatch {z.dtype} != {q.dtype} in DequantizeLinear.")
    layout, take = _layout(q.shape, scale, axis, block_size)
    scale_used = scale[take] if take is not ... else scale.reshape(layout.param_shape or ())
    zp = _zero_point_values(x_zero_point, scale_used, take)
    out_dtype = float_dtype(
        _type_name(output_dtype, _REAL_NAMES, "ONNX DequantizeLinear output_dtype")
        if output_dtype
        else scale.dtype
    )
    return affine_dequantize(q, scale_used, zp, layout, qt, out_dtype)


def dynamic_quantize_linear(x: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX ``DynamicQuantizeLinear`` (uint8): returns ``(y, y_scale, y_zero_point)``.

    ``scale = (max(0, max(x)) - min(0, min(x))) / 255`` in float32 (1/255 when the range is
    empty), ``zero_point = rint(clip(-min / scale, 0, 255))``.
    """
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise InvalidDTypeError(f"DynamicQuantizeLinear takes float32 input, got {x.dtype}")
    qmax = np.float32(255)
    hi = np.float32(np.maximum(0, np.max(x))) if x.size else np.float32(0)
    lo = np.float32(np.minimum(0, np.min(x))) if x.size else np.float32(0)
    scale = np.float32(np.float32(1.0) if hi == lo else hi - lo) / qmax
    zp = np.float32(np.rint(np.clip(np.float32(0) - lo / scale, np.float32(0), qmax)))
    layout = plan_layout(x.shape, (), None, None)
    y = affine_quantize(x, np.asarray(scale), np.asarray(zp, np.float64), layout, qtype("uint8"))
    return y, np.array(scale, np.float32), np.array(zp, np.uint8)


def contrib_quantize_linear(
    x: npt.ArrayLike,
    y_scale: npt.ArrayLike,
    y_zero_point: npt.ArrayLike | None = None,
    *,
    axis: int | None = None,
) -> np.ndarray:
    """ORT ``com.microsoft`` ``QuantizeLinear``: like ONNX, but ``axis`` is optional (absent:
    per-tensor, the scale must be a scalar) and there is no block_size or saturate."""
    if axis is None and np.size(y_scale) != 1:
        raise InvalidParameterError("without axis, y_scale and y_zero_point must be scalars")
    x = np.asarray(x)
    if x.dtype.name not in ("float32", "float16"):
        raise InvalidDTypeError(
            f"com.microsoft QuantizeLinear takes float or float16, got {x.dtype}"
        )
    return quantize_linear(x, y_scale, y_zero_point, axis=1 if axis is None else axis)


def contrib_dequantize_linear(
    x: npt.ArrayLike,
    x_scale: npt.ArrayLike,
    x_zero_point: npt.ArrayLike | None = None,
    *,
    axis: int | None = None,
) -> np.ndarray:
    """ORT ``com.microsoft`` ``DequantizeLinear``: optional ``axis`` (absent: per-tensor)."""
    if axis is None and np.size(x_scale) != 1:
        raise InvalidParameterError("without axis, x_scale and x_zero_point must be scalars")
    return dequantize_linear(x, x_scale, x_zero_point, axis=1 if axis is None else axis)
