"""NumPy arrays quantized in memory, in one call: the computation behind
:func:`qstream.quantize`, :func:`qstream.dequantize` and :func:`qstream.quantize_dynamic`.

The public functions (:mod:`qstream.api.arrays`) check what they name themselves and call
these; the shared argument checks (:mod:`qstream.core.checks`) run here, in the order that
decides which error a call with several bad arguments gets. Small per-tensor calls that
:mod:`qstream.api.direct` has screened go straight to the serial kernel
(:func:`quantize_direct`, :func:`dequantize_direct`).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from ...budget import SERIAL_BELOW
from ...core import affine_dequantize, affine_quantize, checks, plan_layout
from ...qtypes import QType, float_dtype
from ...rounding import round_code

if TYPE_CHECKING:
    from ...spec import QuantSpec

F32 = np.dtype(np.float32)
#: arrays with fewer elements than this run on the serial kernel in the calling thread
DIRECT_BELOW = SERIAL_BELOW


def quantize_array(
    x: ArrayLike,
    scale: ArrayLike,
    zero_point: ArrayLike | None,
    *,
    axis: int | None,
    block_size: int | None,
    dtype: DTypeLike | QType | None,
    round_mode: str,
    saturate: bool,
    out: NDArray[Any] | None,
) -> NDArray[Any]:
    """``saturate(round(x / scale) + zero_point)`` after the shared argument checks (see
    :func:`qstream.quantize` for the arguments)."""
    xa = checks.as_float_input(x, "x")
    s = checks.as_scale(scale)
    qt = checks.resolve_output_type(dtype, zero_point)
    zp = checks.as_zero_point(zero_point, qt, s.shape)
    layout = plan_layout(xa.shape, s.shape, axis, block_size)
    checks.check_scale(s)
    zp = checks.broadcast_param(zp, s)
    return affine_quantize(
        xa, s, zp, layout, qt, code=round_code(round_mode), saturate=saturate, out=out
    )


def dequantize_array(
    q: NDArray[Any],
    qt: QType,
    scale: ArrayLike,
    zero_point: ArrayLike | None,
    *,
    axis: int | None,
    block_size: int | None,
    dtype: DTypeLike,
    out: NDArray[Any] | None,
) -> NDArray[Any]:
    """``(q - zero_point) * scale`` of ``q`` (of the quantized type ``qt``) after the shared
    argument checks (see :func:`qstream.dequantize` for the arguments)."""
    s = checks.as_scale(scale)
    zp = checks.as_zero_point(zero_point, qt, s.shape)
    layout = plan_layout(q.shape, s.shape, axis, block_size)
    checks.check_scale(s)
    zp = checks.broadcast_param(zp, s)
    return affine_dequantize(q, s, zp, layout, qt, float_dtype(dtype), out=out)


def quantize_groups(
    x: ArrayLike, spec: QuantSpec, axis: int
) -> tuple[NDArray[Any], NDArray[np.floating[Any]], NDArray[Any], int]:
    """``(q, scale, zero_point, axis)`` of the dynamic blocked ``spec`` (its ``axis``) on
    ``x``: each group its own range, as ``quantize_store`` computes them (see
    :func:`qstream.quantize_dynamic`); ``axis`` normalised, ``zero_point`` in the output
    type, ``scale`` float16 or bfloat16 as ``spec.scale_dtype`` says."""
    from ...core import buffers, normalize_axis
    from ..blocks import block_ranges, dynamic_quantize, nan_to_zero_point

    xa = checks.as_float_input(x, "x")
    spec = spec.for_source(xa.dtype)  # (scale_dtype "source": x's dtype)
    axis = normalize_axis(axis, xa.ndim)
    qt = spec.qtype
    q = buffers.empty(xa.shape, qt.dtype)  # a large result: from the pool of freed buffers
    s, z, layout, nonfinite = dynamic_quantize(xa, qt, spec, axis, q)
    if nonfinite and spec.nan_policy == "error":
        raise block_ranges(xa, None).refusal("x", xa.shape)
    if nonfinite and spec.nan_policy == "zero_point":
        nan_to_zero_point(xa, q, z, layout, qt)
    if nonfinite and spec.nan_policy == "fill":  # the reserved code (the type's minimum)
        from ..blocks import fill_nan

        fill_nan(xa, q, qt)
    scale = s
    if spec.scale_mode == 2:  # bfloat16 values already: float32's upper halves, no rounding
        scale = (s.view(np.uint32) >> np.uint32(16)).astype(np.uint16).view(spec.scale_numpy_dtype)
    if spec.half_scales:  # float16 values already: their bit patterns, without a rounding cast
        from ...kernels.blocked import float16_bits
        from ...kernels.runtime import run

        bits = np.empty(s.shape, np.uint16)
        run(float16_bits, s.reshape(-1), bits.reshape(-1))
        scale = bits.view(np.float16)
    return q, scale, z.astype(qt.dtype), axis


# ----------------------------------------------------------- small per-tensor calls


_local = threading.local()
_BOUNDS: dict[str, tuple[np.float32, np.float32, np.int32]] = {}
_kernels: tuple[Any, Any, Any] | None = None


def _affine_kernels() -> tuple[Any, Any, Any]:
    """``(read_only, QUANTIZE_KERNELS, dequantize_affine)`` of :mod:`qstream.kernels`,
    imported at the first call (a plan or a dry run, which never quantizes, never loads
    Numba; workers find them loaded: ``engine.run.worker_imports``)."""
    global _kernels
    if _kernels is None:
        from ...kernels.affine import QUANTIZE_KERNELS, dequantize_affine
        from ...kernels.runtime import read_only

        _kernels = (read_only, QUANTIZE_KERNELS, dequantize_affine)
    return _kernels


def _params(s: float, z: int) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """This thread's one-element ``[1, 1, 1]`` scale and zero-point arrays, set to s, z, as
    read-only views (the kernels' inputs: see ``runtime.read_only``)."""
    p: tuple[NDArray[np.float32], NDArray[np.float32]] | None = getattr(_local, "p", None)
    if p is None:
        read_only = _affine_kernels()[0]
        p = _local.p = (np.empty((1, 1, 1), F32), np.empty((1, 1, 1), F32))
        _local.views = (read_only(p[0]), read_only(p[1]))
    p[0][0, 0, 0] = s
    p[1][0, 0, 0] = z
    views: tuple[NDArray[np.float32], NDArray[np.float32]] = _local.views
    return views


def _bounds(qt: QType) -> tuple[np.float32, np.float32, np.int32]:
    b = _BOUNDS.get(qt.name)
    if b is None:
        b = _BOUNDS[qt.name] = (np.float32(qt.qmin), np.float32(qt.qmax), np.int32(qt.mask))
    return b


def quantize_direct(
    x: NDArray[np.float32], scale: float, zero_point: int, qt: QType, code: int
) -> NDArray[Any]:
    """Per-tensor quantize of a small C-contiguous float32 array on the serial kernel:
    ``scale`` a valid float32 value, ``zero_point`` in the range of ``qt`` (an integer type of
    at most 16 bits), ``code`` a round mode's code (all checked by the caller)."""
    read_only, kernels, _ = _affine_kernels()
    out = np.empty(x.shape, qt.dtype)
    lo, hi, mask = _bounds(qt)
    n = x.size
    kernels[code].serial(
        read_only(x.reshape(1, 1, n)),
        *_params(scale, zero_point),
        1,
        1,
        lo,
        hi,
        mask,
        out.view(qt.container).reshape(1, 1, n),
    )
    return out


def dequantize_direct(q: NDArray[Any], scale: float, zero_point: int) -> NDArray[np.float32]:
    """Per-tensor float32 dequantize of a small C-contiguous int8/uint8/int16/uint16 array on
    the serial kernel (``scale`` and ``zero_point`` checked by the caller)."""
    read_only, _, dequantize_affine = _affine_kernels()
    out = np.empty(q.shape, F32)
    n = q.size
    dequantize_affine.serial(
        read_only(q.reshape(1, 1, n)),
        *_params(scale, zero_point),
        1,
        1,
        out.reshape(1, 1, n),
    )
    return out
