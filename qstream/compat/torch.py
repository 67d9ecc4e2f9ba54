"""PyTorch ``quantize_per_tensor`` / ``quantize_per_channel`` / ``dequantize`` (torch 2.13, x86).

torch multiplies by the float32 reciprocal ``inv = 1.0f / float(scale)`` instead of dividing,
and its kernels differ in where the zero point is added (measured against torch 2.13.0+cpu):

- per-tensor qint8/quint8 (fbgemm): ``nearbyint(fma(x, inv, zp))``, NaN -> the type's maximum;
- per-tensor qint32 and every per-channel call: ``nearbyint(x * inv + zp)`` in float32,
  unfused; NaN -> the type's minimum (qint32) or 0 (per-channel qint8/quint8);
- +inf and overflow saturate to the maximum, -inf to the minimum.

Dequantize (measured against torch 2.13, every int32 value):

- per tensor: ``float(int32(q - zp)) * float(scale)``: the difference in int32 (it wraps, as
  torch's does), converted to float32, then multiplied in float32;
- per channel: ``float((float(q) - float(zp)) * double(scale))``: the subtraction in float32
  (both operands rounded to float32 first), the product in float64, rounded once to float32.

``dtype`` is torch's name ("qint8", "quint8", "qint32", also ``torch.qint8`` or
"torch.qint8") or qstream's ("int8", "uint8", "int32"); results are plain NumPy integer arrays.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..core import affine_dequantize, affine_quantize, plan_layout
from ..errors import InvalidDTypeError, InvalidParameterError
from ..qtypes import QType, qtype
from ..rounding import OP_FMA, OP_MUL_ADD
from ._names import resolve_type

_TYPES = {"qint8": "int8", "quint8": "uint8", "qint32": "int32"}
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


def _qtype(dtype: object) -> tuple[str, QType]:
    """``(torch name, QType)`` of a torch quantized dtype given by torch's or qstream's name."""
    qt = qtype(resolve_type(dtype, _TYPES, "torch quantized dtype", prefix="torch."))
    return {v: k for k, v in _TYPES.items()}[qt.name], qt


def _float_input(x: npt.ArrayLike) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != F32:
        got = {"float16": "Half", "bfloat16": "BFloat16", "float64": "Double"}.get(
            x.dtype.name, x.dtype.name
        )
        raise InvalidDTypeError(f"Quantize only works on Float Tensor, got {got}")
    return x


def _check_zero_points(zp: np.ndarray, qt: QType) -> None:
    if zp.size and zp.max() > qt.qmax:
        raise InvalidParameterError(f"zero_point {int(zp.max())} is above upper bound.")
    if zp.size and zp.min() < qt.qmin:
        raise InvalidParameterError(f"zero_point {int(zp.min())} is below lower bound.")


def _reciprocal(scale: npt.ArrayLike) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return F32.type(1.0) / np.asarray(scale, dtype=np.float64).astype(F32)


def quantize_per_tensor(x: npt.ArrayLike, scale: float, zero_point: int, dtype: str) -> np.ndarray:
    """``torch.quantize_per_tensor(x, scale, zero_point, dtype).int_repr()``."""
    x = _float_input(x)
    name, qt = _qtype(dtype)
    zp = np.asarray(zero_point, dtype=np.float64)
    _check_zero_points(zp, qt)
    inv = _reciprocal(scale)
    layout = plan_layout(x.shape, (), None, None)
    code = OP_MUL_ADD if name == "qint32" else OP_FMA
    q = affine_quantize(x, inv, zp, layout, qt, code=code, zp_dtype=F32)
    if code == OP_FMA:
        with np.errstate(invalid="ignore"):
            q[np.isnan(x * inv)] = qt.qmax  # fbgemm's NaN result
    return q


def quantize_per_channel(
    x: npt.ArrayLike,
    scales: npt.ArrayLike,
    zero_points: npt.ArrayLike,
    axis: int,
    dtype: str,
) -> np.ndarray:
    """``torch.quantize_per_channel(x, scales, zero_points, axis, dtype).int_repr()``."""
    x = _float_input(x)
    _, qt = _qtype(dtype)
    if not 0 <= axis < x.ndim:
        raise InvalidParameterError(
            f"Channel axis out of range in per channel affine quantization. Got: {axis}"
            f"Expected: [0, {x.ndim})"
        )
    scales = np.asarray(scales, dtype=np.float64).reshape(-1)
    zps = np.asarray(zero_points).reshape(-1)
    if scales.size != x.shape[axis]:
        raise InvalidParameterError("length of scales must equal to channel")
    if zps.size != x.shape[axis]:
        raise InvalidParameterError("length of zero_points must equal to channel")
    zps = np.rint(zps.astype(np.float64))
    _check_zero_points(zps, qt)
    layout = plan_layout(x.shape, scales.shape, axis, None)
    q = affine_quantize(x, _reciprocal(scales), zps, layout, qt, code=OP_MUL_ADD, zp_dtype=F32)
    if qt.bits == 8:
        q[np.isnan(x)] = 0  # torch's per-channel NaN result
    return q


def dequantize(
    q: npt.ArrayLike, scale: npt.ArrayLike, zero_point: npt.ArrayLike, axis: int | None = None
) -> np.ndarray:
    """``dequantize()`` of a torch quantized tensor given by its integer representation ``q``."""
    q = np.asarray(q)
    if q.dtype.name not in _TYPES.values():
        raise InvalidDTypeError(
            f"q must be int8 (qint8), uint8 (quint8) or int32 (qint32), got {q.dtype}"
        )
    qt = qtype(q.dtype)
    scale = np.asarray(scale, dtype=np.float64)
    zp = np.asarray(zero_point)
    if axis is None:
        layout = plan_layout(q.shape, (), None, None)
        z = np.asarray(int(zp), np.int64)
        return affine_dequantize(q, scale.reshape(()), z, layout, qt, integer_difference=True)
    if not 0 <= axis < q.ndim:
        raise InvalidParameterError(f"Channel axis out of range: {axis}, expected [0, {q.ndim})")
    layout = plan_layout(q.shape, scale.reshape(-1).shape, axis, None)
    z = np.rint(zp.reshape(-1).astype(np.float64)) if zp.dtype.kind == "f" else zp.reshape(-1)
    return affine_dequantize(
        q, scale.reshape(-1), z.astype(np.int64), layout, qt, scale_dtype=F64, zp_dtype=F32
    )
