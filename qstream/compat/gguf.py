"""GGUF block types as gguf-py 0.19 (``gguf.quants``) quantizes and dequantizes them, bit for
bit: Q8_0, Q4_0, Q4_1, and the plain F32, F16 and BF16 (and, as llama.cpp writes them, the
K-quants, Q5_0 / Q5_1, and Q4_0 / Q4_1 with an importance matrix: see :func:`quantize`).

Blocks are runs of 32 values along the last axis; every operation is float32, in gguf-py's
order (which matches ggml's reference C for these types):

- **Q8_0** (34 bytes): ``d = absmax / 127``; codes ``round_half_away(x * (1 / d))``, computed
  with the float32 ``d`` *before* it is stored as float16; dequantized ``code * f16(d)``.
- **Q4_0** (18 bytes): ``d = m / -8`` where ``m`` is the block's value of largest magnitude
  (signed; the first on ties), so ``m`` itself maps to code 0 (-8); nibble ``trunc(x * (1 / d)
  + 8.5)`` clipped to 0..15; dequantized ``f16(d) * (nibble - 8)``.
- **Q4_1** (20 bytes): ``d = (max - min) / 15``; nibble ``trunc((x - min) * (1 / d) + 0.5)``
  clipped to 0..15; ``d`` and ``min`` stored as float16; dequantized ``f16(d) * n + f16(min)``.

Nibbles: byte ``j`` of a block holds value ``j`` (low nibble) and value ``j + 16`` (high). A
zero block has ``d = 0`` (and ``1 / d`` taken as 0). These derivations differ from qstream's
affine specs (the scale is rounded to float16 after the codes are computed; Q4_0's scale is
negative; Q4_1's offset is a float), so GGUF types are produced by this profile, not by a
QuantSpec: ``qstream convert CK out.gguf`` and :func:`qstream.export_gguf` use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ..errors import InvalidDTypeError, InvalidParameterError

BLOCK = 32
#: bytes per block of 32 values, per quantized type
TYPE_SIZE = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34}
#: GGML type numbers (``gguf.GGMLQuantizationType``)
TYPE_ID = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "BF16": 30}
#: the types llama.cpp quantizes differently with an importance matrix (the 32-block ones:
#: :mod:`qstream.compat.gguf_legacy`; Q5_0 / Q5_1 always written there)
_LEGACY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1")
PLAIN: dict[str, np.dtype] = {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16)}
TYPES = tuple(TYPE_ID)
#: llama.cpp's K-quants (super-blocks of 256 values; :mod:`qstream.compat.gguf_kquants`)
K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
#: the K types' GGML numbers too (the GGUF writer names them; ``TYPES`` stays the 32-block
#: and plain types)
TYPE_ID.update({"Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14})
K_BLOCK = 256
#: bytes per super-block of 256 values, per K type
K_TYPE_SIZE = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
__all__ = ["BLOCK", "TYPES", "byte_shape", "dequantize", "quantize"]


def _type(qtype: str, k_types: bool = False) -> str:
    name = str(getattr(qtype, "name", qtype)).upper()
    if name not in TYPES and not (k_types and name in K_TYPES):
        known = (*TYPES, *K_TYPES) if k_types else TYPES
        raise InvalidParameterError(
            f"unknown GGUF type {qtype!r}; expected one of: {', '.join(known)}"
        )
    return name


def byte_shape(shape: Sequence[int], qtype: str) -> tuple[int, ...]:
    """The stored shape of a tensor of ``shape``: quantized types (and BF16) as bytes, the last
    axis ``shape[-1] / 32 * type size``; F32/F16 as values."""
    qtype = _type(qtype, k_types=True)
    if qtype in K_TYPES:
        from . import gguf_kquants

        return gguf_kquants.byte_shape(shape, qtype)
    shape = tuple(int(d) for d in shape)
    if qtype in PLAIN:
        return shape
    if qtype == "BF16":
        return (*shape[:-1], shape[-1] * 2)
    if not shape or shape[-1] % BLOCK:
        raise InvalidParameterError(
            f"{qtype} needs a last axis that is a multiple of {BLOCK}, got shape {list(shape)}"
        )
    return (*shape[:-1], shape[-1] // BLOCK * TYPE_SIZE[qtype])


def quantize(x: npt.ArrayLike, qtype: str, imatrix: npt.ArrayLike | None = None) -> np.ndarray:
    """``gguf.quants.quantize(x, qtype)``: uint8 blocks for Q8_0/Q4_0/Q4_1/BF16 (shaped
    :func:`byte_shape`), float32/float16 values for F32/F16; the K-quants (Q2_K..Q6_K), Q5_0
    and Q5_1, and Q4_0/Q4_1 given ``imatrix``, as llama.cpp's ``ggml_quantize_chunk`` writes
    them, with ``imatrix`` (one importance weight per column of the last axis, or one row of
    them per leading index) as llama-quantize's ``--imatrix`` uses it
    (:mod:`qstream.compat.gguf_kquants`, :mod:`qstream.compat.gguf_legacy`)."""
    qtype = _type(qtype, k_types=True)
    if qtype in K_TYPES:
        from . import gguf_kquants

        return gguf_kquants.quantize(x, qtype, imatrix)
    if qtype in _LEGACY and (imatrix is not None or qtype in ("Q5_0", "Q5_1")):
        from . import gguf_legacy

        return gguf_legacy.quantize(x, qtype, imatrix)
    if imatrix is not None:
        raise InvalidParameterError(
            f"an importance matrix is used by the K-quants ({', '.join(K_TYPES)}) and by"
            f" {', '.join(_LEGACY)}, not {qtype}"
        )
    x = np.asarray(x)
    if x.dtype.kind != "f" and x.dtype.name != "bfloat16":
        raise InvalidDTypeError(f"GGUF quantize needs a floating array, got {x.dtype}")
    if qtype in PLAIN:
        return x.astype(PLAIN[qtype], copy=False)
    out_shape = byte_shape(x.shape, qtype)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if qtype == "BF16":
        return _bf16(x).reshape(out_shape)
    blocks = x.reshape(-1, BLOCK)
    # (a block of subnormals has a scale whose inverse overflows, and its codes are the
    # casts of inf and NaN gguf-py makes too: the same bytes, without numpy's warnings)
    with np.errstate(over="ignore", invalid="ignore"):
        quantized = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1}[qtype](blocks)
    return quantized.reshape(out_shape)


def dequantize(raw: npt.ArrayLike, qtype: str, shape: Sequence[int] | None = None) -> np.ndarray:
    """``gguf.quants.dequantize(raw, qtype)``: float32 values of stored blocks (the last axis
    back to values; ``shape``: the values' shape, checked)."""
    qtype = _type(qtype, k_types=True)
    if qtype in K_TYPES:
        from . import gguf_kquants

        return gguf_kquants.dequantize(raw, qtype, shape)
    if qtype in ("Q5_0", "Q5_1"):
        from . import gguf_legacy

        return gguf_legacy.dequantize(raw, qtype, shape)
    values = _dequantize(raw, qtype)
    if shape is not None:
        if math.prod(shape) != values.size:
            raise InvalidParameterError(
                f"{qtype} blocks of {values.size} values cannot have the shape {list(shape)}"
            )
        return values.reshape(tuple(shape))
    return values


def _dequantize(raw: npt.ArrayLike, qtype: str) -> np.ndarray:
    raw = np.asarray(raw)
    if qtype == "F32":
        return raw.view(np.float32)
    if qtype == "F16":
        return raw.view(np.float16).astype(np.float32)
    raw = np.ascontiguousarray(raw).view(np.uint8)
    if qtype == "BF16":
        return (raw.view(np.int16).astype(np.int32) << 16).view(np.float32)
    size = TYPE_SIZE[qtype]
    if raw.shape[-1] % size:
        raise InvalidParameterError(f"{qtype} rows must be whole blocks of {size} bytes")
    blocks = raw.reshape(-1, size)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    if qtype == "Q8_0":
        x = blocks[:, 2:].view(np.int8).astype(np.float32) * d
    elif qtype == "Q4_0":
        x = d * (_nibbles(blocks[:, 2:]).astype(np.int8) - np.int8(8)).astype(np.float32)
    else:
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        x = (d * _nibbles(blocks[:, 4:]).astype(np.float32)) + m
    return x.reshape(*raw.shape[:-1], raw.shape[-1] // size * BLOCK)


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """Rounding half away from zero, as gguf-py's ``np_roundf`` computes it in float32."""
    a = np.abs(v)
    f = np.floor(a)
    return np.sign(v) * (f + np.floor(np.float32(2) * (a - f)))


def _pack(nibbles: np.ndarray) -> np.ndarray:
    """``[n, 32]`` values 0..15 -> ``[n, 16]`` bytes: value j low, value j + 16 high."""
    return nibbles[:, :16] | (nibbles[:, 16:] << np.uint8(4))


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """The inverse of :func:`_pack`: ``[n, 16]`` bytes -> ``[n, 32]`` uint8 values."""
    return np.concatenate([packed & np.uint8(0x0F), packed >> np.uint8(4)], axis=1)


def _half_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).view(np.uint8)


def _q8_0(b: np.ndarray) -> np.ndarray:
    d = np.abs(b).max(axis=1, keepdims=True) / np.float32(127)
    q = _round_half_away(b * _inverse(d)).astype(np.int8)
    return np.concatenate([_half_bytes(d), q.view(np.uint8)], axis=1)


def _q4_0(b: np.ndarray) -> np.ndarray:
    m = np.take_along_axis(b, np.abs(b).argmax(axis=1, keepdims=True), axis=1)
    d = m / np.float32(-8)
    n = np.trunc(b * _inverse(d) + np.float32(8.5), dtype=np.float32)
    return np.concatenate([_half_bytes(d), _pack(n.astype(np.uint8).clip(0, 15))], axis=1)


def _q4_1(b: np.ndarray) -> np.ndarray:
    hi = b.max(axis=1, keepdims=True)
    lo = b.min(axis=1, keepdims=True)
    d = (hi - lo) / np.float32(15)
    n = np.trunc((b - lo) * _inverse(d) + np.float32(0.5), dtype=np.float32)
    packed = _pack(n.astype(np.uint8).clip(0, 15))
    return np.concatenate([_half_bytes(d), _half_bytes(lo), packed], axis=1)


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bytes as gguf-py rounds (to nearest even; NaN kept quiet)."""
    n = x.reshape(-1).view(np.uint32)
    n = np.where(
        (n & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000),
        (n & np.uint32(0xFFFF0000)) | np.uint32(64 << 16),
        n,
    )
    r = (n.astype(np.uint64) + (np.uint64(0x7FFF) + ((n >> np.uint32(16)) & np.uint32(1)))) >> 16
    return r.astype(np.uint16).view(np.uint8)
