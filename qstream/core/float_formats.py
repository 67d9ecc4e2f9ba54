"""Float weight formats of compressed-tensors: FP8 E4M3 (``float-quantized``) and the MX formats
(``mxfp4-pack-quantized``, ``mxfp8-quantized``), quantized and decoded exactly as
compressed-tensors 0.20 (with llm-compressor's min-max weight observer) does on CPU.

Source weights are 2-D ``[out, in]`` arrays of float32 or bfloat16 (``ml_dtypes.bfloat16``, the
dtype :mod:`qstream.qtypes` uses). Every step is carried out in the dtype compressed-tensors
computes it in: a bfloat16 operation is a float32 operation rounded to bfloat16 (to nearest
even), as PyTorch computes on CPU.

FP8 (presets ``FP8``, ``FP8_DYNAMIC``, ``FP8_BLOCK``), per tensor, per output channel or per
``block`` (128x128; edge blocks hold what is left): ``scale = absmax / 448`` in the weight's
dtype (a zero scale becomes that dtype's epsilon), ``code = e4m3(clamp(w / scale, ±448))``
with ``w / scale`` rounded to the weight's dtype first, plus the symmetric zero point 0 the
calibrated module carries (so ``-0.0`` becomes ``+0.0``; FP4 codes keep the sign of zero).
Scales are stored in the weight's dtype (llm-compressor's parameter dtype); codes are
returned as the uint8 bit patterns of ``float8_e4m3fn``. Decoding: ``e4m3 * scale`` in the
scale's dtype.

MX (``MXFP4A16``, ``MXFP8A16``), groups of 32 along ``in``: the group's absmax is rounded to a
power of two (up from 1.75 times a power of two, ``round_to_power_2``), ``E = exponent -
offset`` (offset 2 for FP4, 8 for FP8) gives an E8M0 code ``clamp(127 + E, 0, 255)`` (an
all-zero group gets code 0, the scale 2**-127); codes are ``w / 2**E`` rounded to the
weight's dtype, clamped and rounded to E2M1 / E4M3 (to nearest, ties to even). Decoding
(the decompressors): ``value * 2**E`` in bfloat16, whatever the source dtype was.

NVFP4 lives in :mod:`qstream.core.nvfp4`; the E2M1 rounding and packing are shared from here.
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np
import numpy.typing as npt

from ..errors import InvalidDTypeError, InvalidParameterError, NonFiniteInputError

F32 = np.dtype(np.float32)
BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
U8 = np.dtype(np.uint8)
E4M3_MAX = 448.0
E2M1_MAX = 6.0
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=F32)
FP8_GRANULARITIES = ("tensor", "channel", "block")
MX_FORMATS = {"mxfp4": 2, "mxfp8": 8}  # name -> exponent offset, floor(log2(max of element))
MX_GROUP = 32
_EPS = {F32: float(np.finfo(np.float32).eps), BF16: float(ml_dtypes.finfo(BF16).eps)}
_SOURCE_DTYPES = "float32 or bfloat16"


def source_values(w: npt.ArrayLike, what: str) -> tuple[np.ndarray, np.dtype]:
    """The float32 values of a 2-D float32/bfloat16 weight and its dtype; refuses other
    dtypes, other ranks, empty arrays and non-finite values before any work."""
    arr = np.asarray(w)
    if arr.dtype not in (F32, BF16):
        raise InvalidDTypeError(f"{what}: weights must be {_SOURCE_DTYPES}, got {arr.dtype}")
    if arr.ndim != 2 or arr.size == 0:
        raise InvalidParameterError(
            f"{what}: weights must be a non-empty 2-D [out, in] array, got shape {arr.shape}"
        )
    x = arr.astype(F32)
    if not np.isfinite(x).all():
        raise NonFiniteInputError(
            f"{what}: the weight holds {int(np.count_nonzero(~np.isfinite(x)))} NaN or "
            "infinite values; compressed-tensors' scales would be NaN/inf"
        )
    return x, arr.dtype


def round_to(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Float32 values rounded to ``dtype`` (float32 or bfloat16, to nearest even), as float32."""
    if dtype == F32:
        return x.astype(F32, copy=False)
    return x.astype(dtype).astype(F32)


def divide(a: np.ndarray | np.float32, b: np.ndarray | np.float32, dtype: np.dtype) -> np.ndarray:
    """``a / b`` as PyTorch computes it in ``dtype`` on CPU (a float32 division, then rounded
    to ``dtype``); overflow gives inf as it does there."""
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        q = np.divide(a, b, dtype=F32)
    return round_to(q, dtype)


def multiply(a: np.ndarray | np.float32, b: np.ndarray | np.float32, dtype: np.dtype) -> np.ndarray:
    """``a * b`` in ``dtype`` as PyTorch computes it on CPU (float32 product, then rounded)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        p = np.multiply(a, b, dtype=F32)
    return round_to(p, dtype)


def group_absmax(x: np.ndarray, group: int, what: str) -> np.ndarray:
    """``max |x|`` over groups of ``group`` consecutive values along the last axis
    (``[out, in / group]``); the columns must divide, as compressed-tensors requires."""
    rows, cols = x.shape
    if cols % group:
        raise InvalidParameterError(
            f"{what}: {cols} columns are not divisible by the group size {group} "
            "(compressed-tensors refuses such a weight)"
        )
    return np.abs(x).reshape(rows, cols // group, group).max(axis=-1)


def block_absmax(x: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """``max |x|`` over ``block`` tiles (``[ceil(out / bh), ceil(in / bw)]``); edge tiles
    hold what is left (compressed-tensors pads with zeros, which never raise a max)."""
    bh, bw = block
    rows, cols = x.shape
    rb, cb = -(-rows // bh), -(-cols // bw)
    padded = np.zeros((rb * bh, cb * bw), dtype=F32)
    padded[:rows, :cols] = np.abs(x)
    return padded.reshape(rb, bh, cb, bw).max(axis=(1, 3))


def expand_blocks(s: np.ndarray, shape: tuple[int, int], block: tuple[int, int]) -> np.ndarray:
    """A ``[rb, cb]`` per-block array repeated over the tiles and cut to ``shape``."""
    full = np.repeat(np.repeat(s, block[0], axis=0), block[1], axis=1)
    return full[: shape[0], : shape[1]]


def expand_groups(s: np.ndarray, group: int) -> np.ndarray:
    """A ``[rows, groups]`` per-group array repeated over each group's columns."""
    return np.repeat(s, group, axis=1)


def to_e4m3(x: np.ndarray) -> np.ndarray:
    """Float32 values clamped to ±448 and rounded to float8_e4m3fn (nearest, ties to even),
    as ``torch.clamp(...).to(torch.float8_e4m3fn)``; returned as uint8 bit patterns."""
    return np.clip(x, -E4M3_MAX, E4M3_MAX).astype(E4M3).view(U8)


def e4m3_values(codes: npt.ArrayLike, what: str) -> np.ndarray:
    """The float32 values of float8_e4m3fn codes (given as uint8 bit patterns or as
    ``ml_dtypes.float8_e4m3fn``); refuses NaN codes (``0x7f``/``0xff``)."""
    arr = np.asarray(codes)
    if arr.dtype not in (U8, E4M3):
        raise InvalidDTypeError(f"{what}: expected uint8 or float8_e4m3fn, got {arr.dtype}")
    bits = arr.view(U8)
    nan = (bits & 0x7F) == 0x7F
    if nan.any():
        raise NonFiniteInputError(f"{what}: {int(np.count_nonzero(nan))} NaN float8 codes")
    return bits.view(E4M3).astype(F32)


def e2m1_codes(q: np.ndarray) -> np.ndarray:
    """E2M1 nibbles (sign in bit 3, magnitude index 0..7) of float32 values already divided
    by their scale: clamped to ±6 and rounded to the nearest E2M1 value, ties to even (0.25
    -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), as
    compressed-tensors' ``cast_to_fp4`` + ``pack_fp4_to_uint8``: a negative value that rounds
    to zero keeps its sign (nibble 8)."""
    a = np.minimum(np.abs(q), E2M1_MAX)
    idx = (
        (a > 0.25).astype(U8)
        + (a >= 0.75)
        + (a > 1.25)
        + (a >= 1.75)
        + (a > 2.5)
        + (a >= 3.5)
        + (a > 5.0)
    ).astype(U8)
    return idx | ((q < 0).astype(U8) << 3)


def pack_nibbles(nibbles: np.ndarray) -> np.ndarray:
    """Two E2M1 nibbles a byte along the last axis: element ``2k`` in the low nibble of byte
    ``k``, element ``2k + 1`` in the high one (compressed-tensors' ``pack_fp4_to_uint8``)."""
    rows, cols = nibbles.shape
    if cols % 2:
        raise InvalidParameterError(f"FP4 packing needs an even number of columns, got {cols}")
    pairs = nibbles.reshape(rows, cols // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(U8)


def unpack_e2m1(packed: npt.ArrayLike, what: str) -> np.ndarray:
    """The float32 values of packed E2M1 codes (``[rows, cols / 2]`` uint8 -> ``[rows,
    cols]``), as compressed-tensors' ``unpack_fp4_from_uint8`` (nibble 8 is -0.0)."""
    arr = np.asarray(packed)
    if arr.dtype != U8 or arr.ndim != 2:
        raise InvalidDTypeError(
            f"{what}: packed FP4 codes must be 2-D uint8, got {arr.dtype} {arr.shape}"
        )
    nib = np.stack((arr & 0x0F, arr >> 4), axis=-1).reshape(arr.shape[0], -1)
    vals = E2M1_VALUES[nib & 0x07]
    return np.where((nib & 0x08) != 0, -vals, vals).astype(F32)


# ---------------------------------------------------------------------------------------------
# FP8 E4M3 ("float-quantized")


def _check_granularity(granularity: str, block: Sequence[int]) -> tuple[int, int]:
    if granularity not in FP8_GRANULARITIES:
        raise InvalidParameterError(
            f"FP8 granularity must be one of {', '.join(FP8_GRANULARITIES)}, got {granularity!r}"
        )
    blk = tuple(int(b) for b in block)
    if len(blk) != 2 or min(blk) < 1:
        raise InvalidParameterError(f"FP8 block must be two positive sizes, got {block!r}")
    return blk[0], blk[1]


def _fp8_scale_map(
    scale: np.ndarray, shape: tuple[int, int], granularity: str, block: tuple[int, int]
) -> np.ndarray:
    """A scale array broadcast against a weight of ``shape``."""
    if granularity == "block":
        return expand_blocks(scale, shape, block)
    return scale  # [1] or [rows, 1] broadcast directly


def fp8_scale_shape(
    shape: tuple[int, int], granularity: str, block: Sequence[int] = (128, 128)
) -> tuple[int, ...]:
    """The ``weight_scale`` shape compressed-tensors gives a ``[out, in]`` FP8 weight."""
    bh, bw = _check_granularity(granularity, block)
    if granularity == "tensor":
        return (1,)
    if granularity == "channel":
        return (shape[0], 1)
    return (-(-shape[0] // bh), -(-shape[1] // bw))


def fp8_quantize(
    w: npt.ArrayLike, granularity: str = "channel", block: Sequence[int] = (128, 128)
) -> tuple[np.ndarray, np.ndarray]:
    """FP8 E4M3 codes and scales of a 2-D float32/bfloat16 weight, as compressed-tensors'
    ``float-quantized`` compressor writes them after llm-compressor's min-max observer.

    ``granularity``: ``"tensor"`` (scale ``[1]``, preset FP8), ``"channel"`` (``[out, 1]``,
    FP8_DYNAMIC) or ``"block"`` (``[ceil(out / bh), ceil(in / bw)]``, FP8_BLOCK with
    ``block=(128, 128)``). Returns ``(codes, scale)``: codes ``[out, in]`` uint8 bit patterns
    of float8_e4m3fn; the scale in the weight's dtype.
    """
    blk = _check_granularity(granularity, block)
    x, dtype = source_values(w, "FP8 quantization")
    if granularity == "tensor":
        amax = np.abs(x).max(keepdims=True).reshape(1)
    elif granularity == "channel":
        amax = np.abs(x).max(axis=1, keepdims=True)
    else:
        amax = block_absmax(x, blk)
    scale = divide(amax, np.float32(E4M3_MAX), dtype)
    scale = np.where(scale == 0, np.float32(_EPS[dtype]), scale).astype(F32)
    q = divide(x, _fp8_scale_map(scale, x.shape, granularity, blk), dtype)
    return to_e4m3(q + np.float32(0.0)), scale.astype(dtype)


def fp8_dequantize(
    codes: npt.ArrayLike,
    scale: npt.ArrayLike,
    granularity: str = "channel",
    block: Sequence[int] = (128, 128),
    dtype: npt.DTypeLike | None = None,
) -> np.ndarray:
    """Decode FP8 E4M3 codes (uint8 bit patterns or float8_e4m3fn) with their scale as
    compressed-tensors' ``float-quantized`` decompressor does: ``float(code) * scale`` in the
    scale's dtype (float32 or bfloat16), then cast to ``dtype`` when one is given.

    Refuses a scale of the wrong shape or dtype, non-finite scales and NaN codes.
    """
    blk = _check_granularity(granularity, block)
    vals = e4m3_values(codes, "FP8 codes")
    if vals.ndim != 2:
        raise InvalidParameterError(f"FP8 codes must be 2-D, got shape {vals.shape}")
    s, sdtype = _float_scale(scale, "FP8 weight_scale")
    want = fp8_scale_shape(vals.shape, granularity, blk)
    if s.shape != want:
        raise InvalidParameterError(
            f"FP8 weight_scale of a {granularity} weight {vals.shape} must have shape "
            f"{want}, got {s.shape}"
        )
    out = multiply(vals, _fp8_scale_map(s, vals.shape, granularity, blk), sdtype)
    return _cast_out(out, sdtype if dtype is None else np.dtype(dtype))


def _float_scale(scale: npt.ArrayLike, what: str) -> tuple[np.ndarray, np.dtype]:
    arr = np.asarray(scale)
    if arr.dtype not in (F32, BF16):
        raise InvalidDTypeError(f"{what}: expected float32 or bfloat16, got {arr.dtype}")
    s = arr.astype(F32)
    if not np.isfinite(s).all():
        raise NonFiniteInputError(f"{what}: NaN or infinite scales")
    return s, arr.dtype


def _cast_out(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype not in (F32, BF16):
        raise InvalidDTypeError(f"decoded values must be float32 or bfloat16, got {dtype}")
    return values.astype(dtype)


# ---------------------------------------------------------------------------------------------
# MX: E8M0 scales per 32 values ("mxfp4-pack-quantized", "mxfp8-quantized")


def _mx_offset(fmt: str) -> int:
    if fmt not in MX_FORMATS:
        raise InvalidParameterError(
            f"MX format must be one of {', '.join(MX_FORMATS)}, got {fmt!r}"
        )
    return MX_FORMATS[fmt]


def _pow2_exponent_field(amax: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The biased exponent field of ``round_to_power_2(amax)`` in ``dtype``: the bits plus
    half of the mantissa below E2M1's one bit, masked to sign and exponent (0: zero)."""
    if dtype == F32:
        bits = amax.astype(F32).view(np.uint32).astype(np.int64)
        mant = 23
    else:
        bits = amax.astype(BF16).view(np.uint16).astype(np.int64)
        mant = 7
    rounded = (bits + (1 << (mant - 2))) & (0x1FF << mant)
    return rounded >> mant


def mx_quantize(w: npt.ArrayLike, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """MXFP4 or MXFP8 codes and E8M0 scales of a 2-D float32/bfloat16 weight (``in``
    divisible by 32), as compressed-tensors' ``mxfp4-pack-quantized`` /
    ``mxfp8-quantized`` compressors write them after llm-compressor's min-max observer.

    Returns ``(codes, scales)``: ``mxfp4``: ``[out, in / 2]`` uint8, two E2M1 nibbles a byte
    (element ``2k`` low); ``mxfp8``: ``[out, in]`` uint8 bit patterns of float8_e4m3fn;
    scales ``[out, in / 32]`` uint8 biased exponents (``2 ** (s - 127)``).
    """
    offset = _mx_offset(fmt)
    x, dtype = source_values(w, f"{fmt.upper()} quantization")
    amax = group_absmax(x, MX_GROUP, f"{fmt.upper()} quantization")
    field = _pow2_exponent_field(amax, dtype)
    if (field >= 0xFF).any():
        raise InvalidParameterError(
            f"{fmt.upper()} quantization: a group's largest magnitude (>= 1.75 * 2**127) has "
            "no E8M0 scale (compressed-tensors' scale would be infinite)"
        )
    # a zero field (log2(0) = -inf) clamps to code 0, like every exponent below the offset
    codes = np.clip(field - offset, 0, 255).astype(U8)
    with np.errstate(under="ignore"):
        scale = round_to(np.ldexp(np.float32(1.0), codes.astype(np.int32) - 127), dtype)
    q = divide(x, expand_groups(scale, MX_GROUP), dtype)
    if fmt == "mxfp4":
        return pack_nibbles(e2m1_codes(q)), codes
    return to_e4m3(q + np.float32(0.0)), codes


def e8m0_scales(scales: npt.ArrayLike, what: str) -> np.ndarray:
    """The bfloat16 scale values (as float32) of E8M0 biased exponents, ``2 ** (s - 127)``
    as compressed-tensors' ``decompress_mx_scale``; refuses 255 (E8M0's NaN, an infinite
    scale there) and non-uint8 arrays."""
    arr = np.asarray(scales)
    if arr.dtype != U8:
        raise InvalidDTypeError(f"{what}: E8M0 scales must be uint8, got {arr.dtype}")
    if (arr == 0xFF).any():
        raise NonFiniteInputError(f"{what}: E8M0 code 255 (NaN) in the scales")
    with np.errstate(under="ignore"):
        return round_to(np.ldexp(np.float32(1.0), arr.astype(np.int32) - 127), BF16)


def mx_dequantize(
    codes: npt.ArrayLike, scales: npt.ArrayLike, fmt: str, dtype: npt.DTypeLike | None = None
) -> np.ndarray:
    """Decode MXFP4 (packed uint8 ``[out, in / 2]``) or MXFP8 (uint8/float8_e4m3fn ``[out,
    in]``) codes with their uint8 E8M0 scales ``[out, in / 32]`` as compressed-tensors'
    decompressors do: ``value * 2 ** (s - 127)`` in bfloat16 (their output dtype), then cast
    to ``dtype`` when one is given."""
    _mx_offset(fmt)
    what = f"{fmt.upper()} codes"
    vals = unpack_e2m1(codes, what) if fmt == "mxfp4" else e4m3_values(codes, what)
    if vals.ndim != 2:
        raise InvalidParameterError(f"{what} must be 2-D, got shape {vals.shape}")
    s = e8m0_scales(scales, f"{fmt.upper()} weight_scale")
    rows, cols = vals.shape
    want = (rows, cols // MX_GROUP)
    if cols % MX_GROUP or s.shape != want:
        raise InvalidParameterError(
            f"{fmt.upper()} weight_scale of a weight [{rows}, {cols}] must have shape {want} "
            f"(groups of {MX_GROUP}), got {s.shape}"
        )
    out = multiply(vals, expand_groups(s, MX_GROUP), BF16)
    return _cast_out(out, BF16 if dtype is None else np.dtype(dtype))
