"""Decoding of the GGUF block types :mod:`qstream.compat.gguf` does not cover: Q5_0, Q5_1
and MXFP4, bit for bit as gguf-py 0.19's ``gguf.quants.dequantize`` (float32, in its order).

- **Q5_0** (22 bytes per 32 values): ``f16 d``, 4 bytes of high bits (bit ``j`` of the
  little-endian word: value ``j``), 16 bytes of low nibbles (byte ``j``: value ``j`` low,
  value ``j + 16`` high); value ``d * (q - 16)``.
- **Q5_1** (24 bytes): ``f16 d``, ``f16 m``, the high bits and nibbles as Q5_0; value
  ``d * q + m``.
- **MXFP4** (17 bytes): an E8M0 exponent byte ``e`` and 16 bytes of E2M1 nibbles (same
  nibble order); value ``half(e) * k`` where ``k`` is the doubled E2M1 value
  (``0, 1, 2, 3, 4, 6, 8, 12`` and negatives) and ``half(e)`` is ``2**(e - 128)`` (ggml's
  ``ggml_e8m0_to_fp32_half``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ..errors import InvalidParameterError

BLOCK = 32
#: bytes per block of 32 values
TYPE_SIZE = {"Q5_0": 22, "Q5_1": 24, "MXFP4": 17}
TYPES = tuple(TYPE_SIZE)
# the E2M1 values, doubled, of nibbles 0..15
_KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)
__all__ = ["BLOCK", "TYPES", "TYPE_SIZE", "dequantize"]


def dequantize(raw: npt.ArrayLike, qtype: str, shape: Sequence[int] | None = None) -> np.ndarray:
    """``gguf.quants.dequantize(raw, qtype)`` for Q5_0, Q5_1 and MXFP4: the float32 values of
    the stored blocks ``raw`` (uint8, the last axis whole blocks), the last axis back to
    values; ``shape``: the values' shape, checked."""
    name = str(getattr(qtype, "name", qtype)).upper()
    if name not in TYPE_SIZE:
        raise InvalidParameterError(f"unknown GGUF type {qtype!r}; expected one of {TYPES}")
    raw = np.ascontiguousarray(np.asarray(raw)).view(np.uint8)
    size = TYPE_SIZE[name]
    if raw.ndim == 0 or raw.shape[-1] % size:
        raise InvalidParameterError(f"{name} rows must be whole blocks of {size} bytes")
    blocks = raw.reshape(-1, size)
    x = _mxfp4(blocks) if name == "MXFP4" else _q5(blocks, with_min=name == "Q5_1")
    out_shape = (*raw.shape[:-1], raw.shape[-1] // size * BLOCK)
    if shape is not None:
        if int(np.prod(shape, dtype=np.int64)) != x.size:
            raise InvalidParameterError(
                f"{name} blocks of {x.size} values cannot have the shape {list(shape)}"
            )
        out_shape = tuple(int(d) for d in shape)
    return x.reshape(out_shape)


def _half(b: np.ndarray) -> np.ndarray:
    """Two bytes per row as float16 values, widened to float32 (``[n, 2]`` -> ``[n, 1]``)."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _low_high(qs: np.ndarray) -> np.ndarray:
    """``[n, 16]`` packed bytes -> ``[n, 32]`` nibbles: byte j's low nibble is value j, its
    high nibble value j + 16."""
    return np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1)


def _q5(blocks: np.ndarray, with_min: bool) -> np.ndarray:
    d = _half(blocks[:, 0:2])
    at = 4 if with_min else 2
    word = np.ascontiguousarray(blocks[:, at : at + 4]).view("<u4")  # [n, 1]
    high = ((word >> np.arange(32, dtype=np.uint32)) & np.uint32(1)).astype(np.uint8)
    q = _low_high(blocks[:, at + 4 :]) | (high << np.uint8(4))
    if with_min:
        return (d * q.astype(np.float32)) + _half(blocks[:, 2:4])
    return d * (q.astype(np.int8) - np.int8(16)).astype(np.float32)


def _mxfp4(blocks: np.ndarray) -> np.ndarray:
    e = blocks[:, :1].astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23)).astype(
        np.uint32
    )
    d = bits.view(np.float32)
    with np.errstate(over="ignore"):  # (exponent 255: inf, as gguf-py gives)
        return d * _KVALUES[_low_high(blocks[:, 1:])]
