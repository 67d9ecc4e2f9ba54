"""The affine core every profile shares: ``q = sat(round(x / scale) + zp)`` and
``x = (q - zp) * scale`` on validated parameters, dispatched to the Numba kernels."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .. import budget
from ..errors import InvalidParameterError
from ..kernels.numpy_twins import numpy_kernels
from ..qtypes import QType
from ..rounding import FLOAT32_OPS
from . import buffers
from .layout import Layout, plan_layout

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


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
    mode code or an operation code (``qstream.rounding``: torch's, for which ``scale`` is the
    reciprocal, oneDNN's, or nGraph's real-type forms). ``zp_dtype`` forces the float type the
    zero point is added in (torch adds in float32, nGraph in the input's type);
    ``narrow_range`` saturates at ``qmin + 1`` (integer types).
    """
    out = _check_out(out, x.shape, qt.dtype)
    if x.size == 0:
        return out
    div = F32 if code in FLOAT32_OPS else np.result_type(x.dtype, scale.dtype)
    if qt.is_float:
        out[...] = _quantize_float(x, scale, zero_point, layout, qt, div, saturate)
        return out
    if div not in (F32, F64):
        # float16 / bfloat16 division: NumPy forms the quotient in that type (exactly as the
        # ONNX reference does), then the kernel rounds it with a unit scale.
        x = np.divide(x.astype(div), layout.expand(scale).astype(div)).astype(F32)
        scale = np.ones(layout.param_shape or (1,), F32)
        layout = plan_layout(x.shape, scale.shape, layout.axis, layout.block_size)
    call = quantize_call(
        x,
        scale,
        zero_point,
        layout,
        qt,
        out,
        code=code,
        zp_dtype=zp_dtype,
        narrow_range=narrow_range,
    )
    assert call is not None  # (an integer type, divided in float32 or float64)
    if numpy_kernels():  # (a small job: quantize_call named the code, not the kernel)
        from ..kernels.numpy_twins import quantize

        quantize(*call)
    else:
        from ..kernels import runtime

        runtime.run(*call)
    return out


def quantize_call(
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    layout: Layout,
    qt: QType,
    out: np.ndarray,
    *,
    code: int = 0,
    zp_dtype: np.dtype | None = None,
    narrow_range: bool = False,
) -> tuple[Any, ...] | None:
    """``(kernel, *arguments)`` of the one kernel call in which :func:`affine_quantize`
    quantizes ``x`` into ``out`` (its ``[O, C, I]`` views, the parameters ``[Op, Cp, Ip]``),
    for a caller that runs it on parts of those views; None where it takes another path (a
    float type, a division in float16 or bfloat16). Where the job runs the NumPy twins
    (:func:`~qstream.kernels.numpy_twins.numpy_kernels`) the kernel is named by its round code,
    the first argument of :func:`~qstream.kernels.numpy_twins.quantize`."""
    div = F32 if code in FLOAT32_OPS else np.result_type(x.dtype, scale.dtype)
    if qt.is_float or div not in (F32, F64):
        return None
    wide = qt.bits > 16
    if zp_dtype is None:
        zp_dtype = F64 if (wide or div == F64) else F32
    bound = F64 if wide else F32
    xk = np.ascontiguousarray(x, dtype=div)
    sk = layout.params(scale.astype(div, copy=False))
    zk = layout.params(_zeros_like(zero_point, scale).astype(zp_dtype, copy=False))
    if numpy_kernels():
        kernel: Any = code
    else:
        from ..kernels.affine import QUANTIZE_KERNELS

        kernel = QUANTIZE_KERNELS[code]
    return (
        kernel,
        layout.view(xk),
        sk,
        zk,
        layout.cblock,
        layout.iblock,
        bound.type(qt.qrange(narrow_range)[0]),
        bound.type(qt.qmax),
        np.int32(qt.mask),
        layout.view(out.view(qt.container)),
    )


def affine_dequantize(
    q: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    layout: Layout,
    qt: QType,
    out_dtype: np.dtype = F32,
    *,
    out: np.ndarray | None = None,
    scale_dtype: np.dtype | None = None,
    zp_dtype: np.dtype | None = None,
    integer_difference: bool = False,
) -> np.ndarray:
    """Dequantize without validating values: the shared core of every profile.

    Default (ONNX): ``(float32(q) - zp) * scale`` in float32, or in float64 for int32 inputs
    and float64 outputs. ``scale_dtype`` / ``zp_dtype`` force the float type of the product /
    of the subtraction (torch per channel: ``(float32(q) - float32(zp))`` times a float64
    scale). ``integer_difference``: ``R(q - zp) * scale`` with R = ``scale_dtype`` (default
    ``out_dtype``), the difference formed in integers and wrapped to 32 bits, then converted
    to R and multiplied in R (nGraph, torch per-tensor qint32). The result is rounded to
    ``out_dtype`` at the end.
    """
    out = _check_out(out, q.shape, out_dtype)
    if q.size == 0:
        return out
    if qt.is_float:
        y = q.astype(F32) * layout.expand(scale)
        out[...] = y.astype(out_dtype)
        return out
    if not integer_difference and numpy_dequantizes(q.size):
        return _dequantize_small(q, scale, zero_point, layout, qt, out, scale_dtype, zp_dtype)
    from ..kernels import runtime
    from ..kernels.affine import dequantize_affine, dequantize_affine_int

    if integer_difference:
        compute = np.dtype(scale_dtype or out_dtype)
        if compute not in (F32, F64):
            raise InvalidParameterError(
                f"integer_difference computes in float32 or float64, not {compute}"
            )
        kernel = dequantize_affine_int
        z = np.asarray(_zeros_like(zero_point, scale))
        zk = layout.params((z if z.dtype.kind in "iu" else np.rint(z)).astype(np.int64))
    else:
        compute = F64 if (out_dtype == F64 or qt.bits > 16) else F32
        kernel = dequantize_affine
        zk = layout.params(_zeros_like(zero_point, scale).astype(zp_dtype or compute))
        compute = np.dtype(scale_dtype or compute)
    qk = np.ascontiguousarray(q, dtype=qt.widened)
    sk = layout.params(scale.astype(compute))
    direct = out_dtype in (F32, F64) and (out_dtype == compute or scale_dtype is not None)
    target = out if direct else np.empty(q.shape, compute)
    runtime.run(kernel, layout.view(qk), sk, zk, layout.cblock, layout.iblock, layout.view(target))
    if target is not out:
        out[...] = target.astype(out_dtype)
    return out


#: regions of at most this many values are dequantized with NumPy, the same operations in
#: the same types as the kernel (``dequantize_affine``), so that a first read of a few values
#: loads no kernel (Numba's first call costs ~0.5-1.5 s; a 4x8 slice then takes milliseconds)
NUMPY_BELOW = 1 << 16
#: the module whose import loads Numba's dequantize kernels
KERNELS = "qstream.kernels.affine"


def numpy_dequantizes(n: int) -> bool:
    """Whether a region of ``n`` values is dequantized with NumPy (the kernel's bytes either
    way): a small one (:data:`NUMPY_BELOW`), every one of a job that runs the NumPy twins (a
    small array's dequantize job), and one of at most :data:`~qstream.budget.NUMPY_JOB`
    values while the kernels are not loaded (reading a small output whole loads no Numba:
    0.2 s instead of 0.5 s in a fresh process; once they are, the kernel is the faster)."""
    if n <= NUMPY_BELOW or numpy_kernels():
        return True
    return n <= budget.NUMPY_JOB and KERNELS not in sys.modules


def _dequantize_small(
    q: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    layout: Layout,
    qt: QType,
    out: np.ndarray,
    scale_dtype: np.dtype | None,
    zp_dtype: np.dtype | None,
) -> np.ndarray:
    """:func:`affine_dequantize`'s default rule in NumPy: ``(float32(q) - z) * s`` with ``z``
    and ``s`` in the kernel's types, each step rounded as the kernel rounds it (NumPy's
    promotion of arrays is Numba's), stored in the kernel's target type, then ``out``'s."""
    compute = F64 if (out.dtype == F64 or qt.bits > 16) else F32
    z = layout.expand(_zeros_like(zero_point, scale).astype(zp_dtype or compute))
    compute = np.dtype(scale_dtype or compute)
    s = layout.expand(scale.astype(compute))
    y = (q.astype(F32) - z) * s
    direct = out.dtype in (F32, F64) and (out.dtype == compute or scale_dtype is not None)
    target = y.astype(out.dtype if direct else compute, copy=False)
    out[...] = target if direct else target.astype(out.dtype)
    return out


# --------------------------------------------------------------------------- helpers


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
