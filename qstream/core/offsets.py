"""Float offsets: ``x = q * scale + offset`` (CF ``scale_factor``/``add_offset``).

An integer zero point makes 0 exact, so the range must contain 0: a field of 262-297 K in
uint8 then spends its 256 codes on [0, 297] (step 1.16). A float offset spends them on the
data's own range (step 0.137): the max error falls from half of one step to half of the other.

Arithmetic (the exactness contract):

- parameters: ``scale`` float32 (as every qstream scale), ``offset`` float64;
  ``offset="range"``: ``scale = (hi - lo) / (qmax - qmin)`` rounded to float32, then
  ``offset = lo - qmin * scale`` in float64, so ``lo`` is code ``qmin`` (unsigned: the
  offset is the minimum);
- quantize: ``q = sat(round((float64(x) - offset) / float64(scale)))``, in the spec's round mode;
- dequantize: ``float64(q) * scale + offset`` in float64, then rounded to the output type. The
  product is exact (codes of at most 16 bits times a float32 scale), so this is one rounding in
  float64 and one to float32: exactly what xarray's CF decoding computes with
  ``scale_factor = float(scale)`` and ``add_offset = float(offset)`` (JSON numbers are
  float64), followed by ``.astype("float32")``. Bit for bit.
- the codec layout (:mod:`qstream.io.outputs.codec`) decodes with zarr's ``scale_offset``, which
  divides: there the output's own decode is ``float32(q) / float32(1 / scale) + float32(offset)``
  (:func:`codec_decode`), and qstream's readers use that for such outputs.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import numpy.typing as npt

from ..qtypes import TINY_SCALE, QType
from .layout import Layout

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


HALF_MIN = 2.0**-24  # the smallest positive float16
HALF_MAX = 65504.0  # the largest finite float16
BF16_MIN = 2.0**-133  # the smallest positive bfloat16 (a subnormal, as float16's HALF_MIN)
BF16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)  # 3.3895e38, the largest finite

#: how a scale is rounded before anything is quantized with it, by ``QuantSpec.scale_dtype``
#: (the codes of ``qstream.kernels.blocked``'s ``scale_mode``): float32 (only kept above 0),
#: float16 or bfloat16 values
SCALE_MODES = {"float32": 0, "float16": 1, "bfloat16": 2}


def half_scales(scale: npt.ArrayLike) -> np.ndarray:
    """Scales rounded to the nearest float16 (ties to even) and clamped to ``[2**-24,
    65504]`` (so none becomes 0 or inf), as float32 values."""
    s = np.asarray(scale, np.float32)
    h = np.clip(s, HALF_MIN, HALF_MAX).astype(np.float16)
    return h.astype(np.float32)


def bf16_scales(scale: npt.ArrayLike) -> np.ndarray:
    """Scales rounded to the nearest bfloat16 (ties to even, as torch's
    ``.to(torch.bfloat16)``) and clamped to ``[2**-133, 3.3895e38]`` (the smallest positive
    and the largest finite bfloat16: none becomes 0 or inf), as float32 values."""
    s = np.clip(np.asarray(scale, np.float32), np.float32(BF16_MIN), np.float32(BF16_MAX))
    return s.astype(ml_dtypes.bfloat16).astype(np.float32)


def round_scales(scale: npt.ArrayLike, mode: int) -> np.ndarray:
    """Float32 scales as a spec's ``scale_dtype`` (its :data:`SCALE_MODES` code) stores them:
    float16 (:func:`half_scales`) or bfloat16 (:func:`bf16_scales`) values, or float32 ones
    no smaller than :data:`~qstream.qtypes.TINY_SCALE` (a scale is never 0)."""
    if mode == SCALE_MODES["float16"]:
        return half_scales(scale)
    if mode == SCALE_MODES["bfloat16"]:
        return bf16_scales(scale)
    return np.maximum(np.asarray(scale, np.float32), TINY_SCALE)


def offset_params(lo, hi, qt: QType, *, narrow_range: bool, offset, scale_mode: int = 0):
    """``(scale float32, offset float64)`` arrays for the ranges ``lo``/``hi`` (no widening to
    0). ``offset``: ``"range"`` (from the ranges), or numbers (broadcast to the ranges' shape):
    the scale then covers ``[lo, hi]`` from that offset; ``scale_mode``: how scales are
    rounded first (:func:`round_scales`)."""

    def fix(s: np.ndarray) -> np.ndarray:
        return round_scales(s, scale_mode)

    lo = np.asarray(lo, np.float64)
    hi = np.asarray(hi, np.float64)
    qmin, qmax = (float(v) for v in qt.qrange(narrow_range))
    if isinstance(offset, str):
        span = hi - lo
        scale = fix(np.where(span > 0, span / (qmax - qmin), 1.0).astype(np.float32))
        off = lo - qmin * scale.astype(np.float64)
        return scale, off
    off = np.broadcast_to(np.asarray(offset, np.float64), lo.shape).copy()
    cand = np.zeros(lo.shape)
    if qmax > 0:
        cand = np.maximum(cand, (hi - off) / qmax)
    if qmin < 0:
        cand = np.maximum(cand, (lo - off) / qmin)
    scale = fix(np.where(cand > 0, cand, 1.0).astype(np.float32))
    return scale, off


def offset_quantize(x, scale, offset, layout: Layout, qt: QType, *, code: int, narrow_range, out):
    """Quantize ``x`` into ``out`` (``qt``'s dtype, shaped like ``x``) with float offsets:
    ``sat(round((x - offset) / scale))`` in float64; NaN gives the lowest code of the range."""
    from ..kernels import runtime
    from ..kernels.offset import OFFSET_KERNELS

    if x.size == 0:
        return out
    lo = qt.qrange(narrow_range)[0]
    runtime.run(
        OFFSET_KERNELS[code],
        layout.view(np.ascontiguousarray(x)),
        layout.params(np.asarray(scale, F64)),
        layout.params(np.asarray(offset, F64)),
        layout.cblock,
        layout.iblock,
        float(lo),
        float(qt.qmax),
        layout.view(out.view(qt.widened)),
    )
    return out


def offset_dequantize(q, scale, offset, layout: Layout, out_dtype=F32, *, out=None):
    """``q * scale + offset`` in float64, rounded to ``out_dtype`` (float32/float64, or any
    other float type through float32)."""
    from ..kernels import runtime
    from ..kernels.offset import dequantize_offset

    out_dtype = np.dtype(out_dtype)
    if out is None:
        out = np.empty(q.shape, out_dtype)
    if q.size == 0:
        return out
    direct = out_dtype in (F32, F64) and out.flags.c_contiguous
    target = out if direct else np.empty(q.shape, F32)
    runtime.run(
        dequantize_offset,
        layout.view(np.ascontiguousarray(q)),
        layout.params(np.asarray(scale, F64)),
        layout.params(np.asarray(offset, F64)),
        layout.cblock,
        layout.iblock,
        layout.view(target),
    )
    if target is not out:
        out[...] = target.astype(out_dtype)
    return out


def codec_constants(scale, zero_point, offset) -> tuple[float, float, float]:
    """The per-tensor constants of the codec layout's decode, as float32 values:
    ``(c, zp, o)`` with ``c = float32(1 / scale)`` (zarr's ``scale_offset`` divides by its
    ``scale``), ``zp`` the integer zero point and ``o`` the float offset rounded to float32
    (the codec's arithmetic is the array's type)."""
    s = float(np.asarray(scale, np.float64).reshape(()))
    c = np.float32(1.0 / s)
    zp = np.float32(0.0 if zero_point is None else float(np.asarray(zero_point).reshape(())))
    o = np.float32(0.0 if offset is None else float(np.asarray(offset).reshape(())))
    return float(c), float(zp), float(o)


def codec_decode(q, c: float, zp: float, o: float, out=None) -> np.ndarray:
    """What zarr's codec pipeline ``[scale_offset(scale=c, offset=o), scale_offset(offset=-zp),
    cast_value]`` decodes ``q`` to, operation for operation in float32 (``x / scale + offset``
    per ``scale_offset``)."""
    y = np.asarray(q).astype(F32)
    if zp != 0.0:
        y = y / np.float32(1.0) + np.float32(-zp)
    y = y / np.float32(c) + np.float32(o)
    if out is None:
        return y
    out[...] = y
    return out
