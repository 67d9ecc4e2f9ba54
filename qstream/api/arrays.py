"""Quantize and dequantize NumPy arrays, ONNX opset 21+ semantics by default.

``quantize``/``dequantize`` validate their arguments and call ``affine_quantize`` /
``affine_dequantize``, the unchecked core the compatibility profiles share.
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidDTypeError, InvalidParameterError
from ..layout import Layout, plan_layout
from ..qtypes import QType, float_dtype, is_float_dtype, is_qtype_dtype, qtype
from ..rounding import OP_MUL_ADD, round_code
from . import buffers

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


# --------------------------------------------------------------------------- public API


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
    x = _as_float_input(x, "x")
    scale = _as_scale(scale)
    qt = _resolve_output_type(dtype, zero_point)
    zp = _as_zero_point(zero_point, qt, scale.shape)
    layout = plan_layout(x.shape, scale.shape, axis, block_size)
    check_scale(scale)
    zp = _broadcast_param(zp, scale)
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
    q = np.asarray(q)
    if not is_qtype_dtype(q.dtype):
        raise InvalidDTypeError(f"q must have a quantized dtype, got {q.dtype}")
    qt = qtype(q.dtype)
    scale = _as_scale(scale)
    zp = _as_zero_point(zero_point, qt, scale.shape)
    layout = plan_layout(q.shape, scale.shape, axis, block_size)
    check_scale(scale)
    zp = _broadcast_param(zp, scale)
    return affine_dequantize(q, scale, zp, layout, qt, float_dtype(dtype), out=out)


# --------------------------------------------------------------------------- unchecked core


def affine_quantize(
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    layout: Layout,
    qt: QType,
    *,
    code: int = 0,
    saturate: bool = True,
    out: np.ndarray | None = None,
    zp_dtype: np.dtype | None = None,
    narrow_range: bool = False,
) -> np.ndarray:
    """Quantize without validating values: the shared core of every profile.

    ``scale``/``zero_point`` have ``layout.param_shape`` (or one element); ``code`` is a round
    mode code or a torch op code (``qstream.rounding``), for which ``scale`` is the reciprocal.
    ``zp_dtype`` forces the float type the zero point is added in (torch adds in float32);
    ``narrow_range`` saturates at ``qmin + 1`` (integer types).
    """
    out = _check_out(out, x.shape, qt.dtype)
    if x.size == 0:
        return out
    div = F32 if code >= OP_MUL_ADD else np.result_type(x.dtype, scale.dtype)
    if qt.is_float:
        out[...] = _quantize_float(x, scale, zero_point, layout, qt, div, saturate)
        return out
    if div not in (F32, F64):
        # float16 / bfloat16 division: NumPy forms the quotient in that type (exactly as the
        # ONNX reference does), then the kernel rounds it with a unit scale.
        x = np.divide(x.astype(div), layout.expand(scale).astype(div)).astype(F32)
        scale = np.ones(layout.param_shape or (1,), F32)
        layout = plan_layout(x.shape, scale.shape, layout.axis, layout.block_size)
        div = F32
    wide = qt.bits > 16
    if zp_dtype is None:
        zp_dtype = F64 if (wide or div == F64) else F32
    bound = F64 if wide else F32
    xk = np.ascontiguousarray(x, dtype=div)
    sk = layout.params(scale.astype(div, copy=False))
    zk = layout.params(_zeros_like(zero_point, scale).astype(zp_dtype, copy=False))
    from ..kernels import runtime
    from ..kernels.affine import QUANTIZE_KERNELS

    runtime.run(
        QUANTIZE_KERNELS[code],
        layout.view(xk),
        sk,
        zk,
        layout.cblock,
        layout.iblock,
        bound.type(qt.qmin + (1 if narrow_range else 0)),
        bound.type(qt.qmax),
        np.int32(qt.mask),
        layout.view(out.view(qt.container)),
    )
    return out


def affine_dequantize(
    q: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    layout: Layout,
    qt: QType,
    out_dtype: np.dtype = F32,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Dequantize without validating values: the shared core of every profile."""
    out = _check_out(out, q.shape, out_dtype)
    if q.size == 0:
        return out
    if qt.is_float:
        y = q.astype(F32) * layout.expand(scale)
        out[...] = y.astype(out_dtype)
        return out
    compute = F64 if (out_dtype == F64 or qt.bits > 16) else F32
    qk = np.ascontiguousarray(q, dtype=qt.widened)
    sk = layout.params(scale.astype(compute))
    zk = layout.params(_zeros_like(zero_point, scale).astype(compute))
    target = out if out_dtype in (F32, F64) and out_dtype == compute else np.empty(q.shape, compute)
    from ..kernels import runtime
    from ..kernels.affine import dequantize_affine

    runtime.run(
        dequantize_affine,
        layout.view(qk),
        sk,
        zk,
        layout.cblock,
        layout.iblock,
        layout.view(target),
    )
    if target is not out:
        out[...] = target.astype(out_dtype)
    return out


# --------------------------------------------------------------------------- helpers


def check_scale(scale: np.ndarray) -> None:
    """Reject a zero, negative, NaN or infinite scale, naming the first bad value."""
    s = np.asarray(scale, dtype=F64)
    bad = ~(np.isfinite(s) & (s > 0))
    if bad.any():
        idx = np.unravel_index(int(np.argmax(bad)), s.shape) if s.ndim else ()
        what = (
            "NaN"
            if np.isnan(s[idx])
            else "infinite"
            if np.isinf(s[idx])
            else ("zero" if s[idx] == 0 else "negative")
        )
        where = f" at index {tuple(int(i) for i in idx)}" if s.ndim else ""
        raise InvalidParameterError(
            f"scale must be finite and > 0, got {what} value {s[idx]!r}{where}"
            f" ({int(bad.sum())} bad of {s.size})"
        )


def _as_float_input(x, name: str) -> np.ndarray:
    x = np.asarray(x)
    if not is_float_dtype(x.dtype):
        raise InvalidDTypeError(
            f"{name} must be a floating array (float16, bfloat16, float32, float64), got {x.dtype}"
        )
    return x


def _as_scale(scale) -> np.ndarray:
    if isinstance(scale, (np.ndarray, np.generic)):
        s = np.asarray(scale)
        if not is_float_dtype(s.dtype):
            if s.dtype.kind in "iub":
                s = s.astype(F32)
            else:
                raise InvalidDTypeError(f"scale must be a floating array, got {s.dtype}")
        return s
    try:
        return np.asarray(scale, dtype=F32)
    except (TypeError, ValueError) as e:
        raise InvalidDTypeError(f"scale must be a number or a float array: {e}") from None


def _resolve_output_type(dtype, zero_point) -> QType:
    """``dtype`` if given (the zero point's values are range-checked later), else the zero
    point's dtype when it is an array of a quantized type, else uint8 (as ONNX)."""
    if dtype is not None:
        return qtype(dtype)
    if isinstance(zero_point, (np.ndarray, np.generic)) and is_qtype_dtype(zero_point.dtype):
        return qtype(zero_point.dtype)
    return qtype("uint8")


def _as_zero_point(zero_point, qt: QType, scale_shape) -> np.ndarray | None:
    if zero_point is None:
        return None
    z = np.asarray(zero_point)
    if z.dtype.kind not in "iuf" and not is_qtype_dtype(z.dtype):
        raise InvalidDTypeError(f"zero_point must be numeric, got {z.dtype}")
    zf = z.astype(F64)
    if not np.all(np.isfinite(zf)) or not np.all(zf == np.round(zf)):
        raise InvalidParameterError("zero_point must hold integer values")
    if qt.is_float:
        if np.any(zf != 0):
            raise InvalidParameterError(f"zero_point must be 0 for {qt.name} outputs")
    elif zf.size and (zf.min() < qt.qmin or zf.max() > qt.qmax):
        bad = zf[(zf < qt.qmin) | (zf > qt.qmax)].flat[0]
        raise InvalidParameterError(
            f"zero_point {bad:g} is outside the {qt.name} range [{qt.qmin:g}, {qt.qmax:g}]"
        )
    if z.size != 1 and z.shape != tuple(scale_shape):
        raise InvalidParameterError(
            f"zero_point shape {z.shape} does not match scale shape {tuple(scale_shape)}"
        )
    return zf


def _broadcast_param(zp: np.ndarray | None, scale: np.ndarray) -> np.ndarray | None:
    if zp is None or zp.shape == scale.shape:
        return zp
    return np.broadcast_to(zp.reshape(()) if zp.size == 1 else zp, scale.shape)


def _zeros_like(zp: np.ndarray | None, scale: np.ndarray) -> np.ndarray:
    return np.zeros(scale.shape, F64) if zp is None else np.asarray(zp)


def _check_out(out, shape, dtype) -> np.ndarray:
    if out is None:
        return buffers.empty(shape, dtype)
    if not isinstance(out, np.ndarray) or out.shape != tuple(shape) or out.dtype != dtype:
        got = (out.shape, out.dtype) if isinstance(out, np.ndarray) else type(out).__name__
        raise InvalidParameterError(
            f"out must be an array of shape {tuple(shape)} and dtype {np.dtype(dtype)}, got {got}"
        )
    if not out.flags.c_contiguous:
        raise InvalidParameterError("out must be C-contiguous")
    return out


def _quantize_float(x, scale, zero_point, layout, qt, div, saturate) -> np.ndarray:
    """Float8 / float4 outputs: the ONNX reference's ml_dtypes casts, element by element."""
    v = np.divide(x.astype(div), layout.expand(scale).astype(div))
    if qt.name == "float4_e2m1fn":
        if zero_point is not None:
            v = v + layout.expand(zero_point).astype(div)
        return v.astype(qt.dtype)
    if saturate:
        v = np.clip(v, qt.qmin, qt.qmax)
    return v.astype(qt.dtype)
