"""NVFP4 weights (``nvfp4-pack-quantized``, presets ``NVFP4A16`` / ``NVFP4``), quantized and
decoded exactly as compressed-tensors 0.20 (with llm-compressor's min-max observer) does on CPU.

For a 2-D float32/bfloat16 weight ``[out, in]`` (``in`` divisible by 16):

- global scale (float32 ``[1]``, ``generate_gparam``): ``T = max(absmax(w), tiny)`` and
  ``(1 / T) * 2688`` (448 * 6), each step rounded to the weight's dtype (PyTorch computes a
  scalar divided by a tensor as a reciprocal times the scalar); 1.0 when that overflows;
- local scales (``[out, in / 16]`` float8_e4m3fn): the group's absmax / 6 in the weight's dtype,
  times the global scale in float32, clamped to ±448 and rounded to E4M3; a zero becomes 0.125;
- codes: ``w / (scale / global_scale)`` in float32, rounded to E2M1 (ties to even) and packed
  two a byte, element ``2k`` in the low nibble.

Decoding (the decompressor): ``e2m1 * (scale / global_scale)`` in float32, returned in
bfloat16 (compressed-tensors' output dtype) or float32 when asked (the same products, unrounded).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import numpy.typing as npt

from ..errors import InvalidDTypeError, InvalidParameterError, NonFiniteInputError
from .float_formats import (
    BF16,
    E2M1_MAX,
    E4M3,
    E4M3_MAX,
    F32,
    divide,
    e2m1_codes,
    e4m3_values,
    expand_groups,
    group_absmax,
    multiply,
    pack_nibbles,
    round_to,
    source_values,
    to_e4m3,
    unpack_e2m1,
)

NVFP4_GROUP = 16
_ZERO_SCALE = np.float32(0.125)  # compressed-tensors' eps for FP8 scales
_TINY = np.float32(ml_dtypes.finfo(np.float32).tiny)  # float32 and bfloat16 share it


def nvfp4_global_scale(w: npt.ArrayLike) -> np.ndarray:
    """The float32 ``[1]`` global scale compressed-tensors' ``generate_gparam`` gives a
    float32/bfloat16 weight (its min and max as llm-compressor's observer takes them)."""
    x, dtype = source_values(w, "NVFP4 quantization")
    return _global_scale(x, dtype)


def _global_scale(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    amax = np.maximum(np.float32(np.abs(x).max()), _TINY).reshape(1)
    recip = divide(np.float32(1.0), amax, dtype)
    gs = multiply(recip, np.float32(E4M3_MAX * E2M1_MAX), dtype)
    return np.where(np.isfinite(gs), gs, np.float32(1.0)).astype(F32)


def nvfp4_quantize(w: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NVFP4 codes and scales of a 2-D float32/bfloat16 weight, as compressed-tensors'
    ``nvfp4-pack-quantized`` compressor writes them after llm-compressor's observers.

    Returns ``(packed, scale, global_scale)``: ``[out, in / 2]`` uint8 (two E2M1 nibbles a
    byte, sign in bit 3, element ``2k`` low), ``[out, in / 16]`` float8_e4m3fn
    (``ml_dtypes``; ``.view(np.uint8)`` gives the bytes), float32 ``[1]``.
    """
    x, dtype = source_values(w, "NVFP4 quantization")
    amax = group_absmax(x, NVFP4_GROUP, "NVFP4 quantization")
    gs = _global_scale(x, dtype)
    local = divide(amax, np.float32(E2M1_MAX), dtype)
    with np.errstate(over="ignore"):
        scaled = np.multiply(gs, local, dtype=F32)
    scale = to_e4m3(scaled).view(E4M3).astype(F32)
    scale = np.where(scale == 0, _ZERO_SCALE, scale).astype(F32)
    q = divide(x, expand_groups(divide(scale, gs, F32), NVFP4_GROUP), F32)
    return pack_nibbles(e2m1_codes(q)), scale.astype(E4M3), gs


def nvfp4_dequantize(
    packed: npt.ArrayLike,
    scale: npt.ArrayLike,
    global_scale: npt.ArrayLike,
    dtype: npt.DTypeLike = BF16,
) -> np.ndarray:
    """Decode NVFP4 weights as compressed-tensors' decompressor does: ``e2m1 * (scale /
    global_scale)`` in float32, then ``dtype`` (bfloat16, the decompressor's, by default).

    ``packed``: ``[out, in / 2]`` uint8; ``scale``: ``[out, in / 16]`` float8_e4m3fn (or its
    uint8 bytes); ``global_scale``: float32 with one element. Refuses wrong shapes and dtypes,
    NaN scale codes, and a global scale that is not positive and finite.
    """
    vals = unpack_e2m1(packed, "NVFP4 weight_packed")
    s = e4m3_values(scale, "NVFP4 weight_scale")
    rows, cols = vals.shape
    want = (rows, cols // NVFP4_GROUP)
    if cols % NVFP4_GROUP or s.shape != want:
        raise InvalidParameterError(
            f"NVFP4 weight_scale of a weight [{rows}, {cols}] must have shape {want} "
            f"(groups of {NVFP4_GROUP}), got {s.shape}"
        )
    g = np.asarray(global_scale)
    if g.dtype != F32 or g.size != 1:
        raise InvalidDTypeError(
            f"NVFP4 weight_global_scale must be one float32 value, got {g.dtype} {g.shape}"
        )
    gv = g.reshape(1)
    if not (np.isfinite(gv).all() and (gv > 0).all()):
        raise NonFiniteInputError(
            f"NVFP4 weight_global_scale must be positive and finite, got {float(gv[0])}"
        )
    out = multiply(vals, expand_groups(divide(s, gv, F32), NVFP4_GROUP), F32)
    out_dtype = np.dtype(dtype)
    if out_dtype not in (F32, BF16):
        raise InvalidDTypeError(f"decoded values must be float32 or bfloat16, got {out_dtype}")
    return round_to(out, out_dtype).astype(out_dtype)
