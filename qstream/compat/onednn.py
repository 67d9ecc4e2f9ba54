"""oneDNN Graph ``Quantize`` / ``Dequantize`` (``qtype`` per_tensor | per_channel).

From the oneDNN Graph operation docs and its reference helpers: ``dst = round(src / scale +
zp)``, with the zero point added *before* rounding (in float32), saturation in float, then
round-half-to-even (``cvtss2si`` under the default MXCSR mode). Dequantize is
``(src - zp) * scale`` in float32. f8_e4m3 / f8_e5m2 destinations are saturating
round-to-nearest-even casts and take no zero points. NaN is not documented by oneDNN; this
profile gives the type's minimum, as the ONNX profile does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ..core import Layout, affine_dequantize, affine_quantize, plan_layout
from ..errors import InvalidDTypeError, InvalidParameterError
from ..qtypes import is_qtype_dtype, qtype
from ..rounding import OP_DIV_ADD
from ._names import resolve_type

# oneDNN's data_type names of the Quantize destinations, and qstream's names for them.
_DST = {"s8": "int8", "u8": "uint8", "f8_e4m3": "float8_e4m3fn", "f8_e5m2": "float8_e5m2"}


def _params(
    shape: tuple[int, ...],
    scales: Sequence[float],
    zps: Sequence[int] | None,
    qtype_: str,
    axis: int,
) -> tuple[Layout, np.ndarray, np.ndarray | None]:
    s: np.ndarray = np.asarray(scales, dtype=np.float32).reshape(-1)
    if qtype_ == "per_tensor":
        if s.size != 1:
            raise InvalidParameterError("per_tensor quantization takes exactly one scale")
        layout = plan_layout(shape, (), None, None)
        s = s.reshape(())
    elif qtype_ == "per_channel":
        if not -len(shape) <= axis < len(shape):
            raise InvalidParameterError(
                f"axis {axis} is out of range [{-len(shape)}, {len(shape) - 1}]"
            )
        layout = plan_layout(shape, s.shape, axis, None)
    else:
        raise InvalidParameterError(f"qtype must be 'per_tensor' or 'per_channel', got {qtype_!r}")
    if zps is None:
        return layout, s, None
    z = np.asarray(zps, dtype=np.int64).reshape(-1)
    if z.size != s.size:
        raise InvalidParameterError(f"zps has {z.size} elements, scales has {s.size}")
    return layout, s, z.reshape(s.shape).astype(np.float64)


def quantize(
    src: npt.ArrayLike,
    *,
    scales: Sequence[float],
    zps: Sequence[int] | None = None,
    qtype: str = "per_tensor",
    axis: int = 1,
    dst_dtype: str = "int8",
) -> np.ndarray:
    """oneDNN Graph ``Quantize``: ``dst = saturate(round_half_even(src / scale + zp))``.

    ``dst_dtype``: oneDNN's "s8", "u8", "f8_e4m3", "f8_e5m2" or qstream's "int8", "uint8",
    "float8_e4m3fn", "float8_e5m2" (or their dtypes).
    """
    src = np.asarray(src)
    if src.dtype != np.float32:
        raise InvalidDTypeError(f"Quantize takes f32 src, got {src.dtype}")
    qt = _qtype(resolve_type(dst_dtype, _DST, "oneDNN Quantize dst_dtype"))
    layout, s, z = _params(src.shape, scales, zps, qtype, axis)
    if qt.is_float:
        if z is not None and np.any(z != 0):
            raise InvalidParameterError("zps are not supported for f8 destinations")
        return affine_quantize(src, s, None, layout, qt, saturate=True)
    if z is not None and (z.min() < qt.qmin or z.max() > qt.qmax):
        raise InvalidParameterError(f"zps must lie in the {qt.name} range")
    return affine_quantize(src, s, z, layout, qt, code=OP_DIV_ADD)


def dequantize(
    src: npt.ArrayLike,
    *,
    scales: Sequence[float],
    zps: Sequence[int] | None = None,
    qtype: str = "per_tensor",
    axis: int = 1,
) -> np.ndarray:
    """oneDNN Graph ``Dequantize``: ``dst = (src - zp) * scale`` in f32."""
    src = np.asarray(src)
    if not (is_qtype_dtype(src.dtype) and _qtype(src.dtype).name in _DST.values()):
        raise InvalidDTypeError(
            f"Dequantize takes s8, u8, f8_e4m3 or f8_e5m2 src (int8, uint8, float8_e4m3fn,"
            f" float8_e5m2), got {src.dtype}"
        )
    qt = _qtype(src.dtype)
    layout, s, z = _params(src.shape, scales, zps, qtype, axis)
    return affine_dequantize(src, s, z, layout, qt, np.dtype(np.float32))


_qtype = qtype
