"""The GGUF block types Q5_0 and Q5_1, and Q4_0 / Q4_1 with an importance matrix, as
llama.cpp's ``ggml_quantize_chunk`` writes them (:func:`quantize`); Q5_0, Q5_1 and MXFP4 as
gguf-py 0.19's ``gguf.quants.dequantize`` reads them (:func:`dequantize`: float32, in its
order). The kernels are :mod:`qstream.kernels.legacy_quants`.

``imatrix`` is llama.cpp's ``quant_weights``: one importance weight per column, ``[n]`` for
all rows or ``[*x.shape[:-2], n]`` for one vector per leading index (a MoE tensor's experts),
as in :mod:`qstream.compat.gguf_kquants`. With it ggml quantizes every block by a weighted
scale search (``make_qx_quants`` for Q4_0 / Q5_0, ``make_qkx3_quants`` for Q4_1 / Q5_1);
without it, Q5_0 / Q5_1 by their reference rule (Q4_0 / Q4_1 without one are gguf-py's
rule, which is ggml's: :mod:`qstream.compat.gguf` writes them). Non-finite values are refused
before any work.

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

from ..errors import InvalidDTypeError, InvalidParameterError, NonFiniteInputError

BLOCK = 32
#: bytes per block of 32 values
TYPE_SIZE = {"Q5_0": 22, "Q5_1": 24, "MXFP4": 17}
TYPES = tuple(TYPE_SIZE)
#: the types :func:`quantize` writes, and their GGML type numbers
#: (ggml's numbers, as the kernels know them; the kernels are imported when first used, so
#: that reading a GGUF header or a Zarr output loads no Numba)
QUANTIZED = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7}
_SIZE = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24}
# the E2M1 values, doubled, of nibbles 0..15
_KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)
__all__ = ["BLOCK", "QUANTIZED", "TYPES", "TYPE_SIZE", "dequantize", "quantize"]


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
    if name == "MXFP4":
        x = _mxfp4(blocks)
    else:
        x = np.empty(blocks.shape[0] * BLOCK, np.float32)
        if x.size:
            from ..kernels import legacy_quants as lq
            from ..kernels.runtime import run

            run(lq.dequantize_blocks, blocks.reshape(-1), QUANTIZED[name], x)
    out_shape = (*raw.shape[:-1], raw.shape[-1] // size * BLOCK)
    if shape is not None:
        if int(np.prod(shape, dtype=np.int64)) != x.size:
            raise InvalidParameterError(
                f"{name} blocks of {x.size} values cannot have the shape {list(shape)}"
            )
        out_shape = tuple(int(d) for d in shape)
    return x.reshape(out_shape)


def _low_high(qs: np.ndarray) -> np.ndarray:
    """``[n, 16]`` packed bytes -> ``[n, 32]`` nibbles: byte j's low nibble is value j, its
    high nibble value j + 16."""
    return np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1)


def _mxfp4(blocks: np.ndarray) -> np.ndarray:
    e = blocks[:, :1].astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23)).astype(
        np.uint32
    )
    d = bits.view(np.float32)
    with np.errstate(over="ignore"):  # (exponent 255: inf, as gguf-py gives)
        return d * _KVALUES[_low_high(blocks[:, 1:])]


def quantize(x: npt.ArrayLike, qtype: str, imatrix: npt.ArrayLike | None = None) -> np.ndarray:
    """``ggml_quantize_chunk(qtype, x, ..., imatrix)`` for Q4_0, Q4_1, Q5_0 and Q5_1: the
    uint8 blocks of the float tensor ``x`` (the last axis ``n / 32 * type size`` bytes), with
    ``imatrix`` as its importance weights (``[n]``, or ``[*x.shape[:-2], n]`` per leading
    index) or, for Q5_0 / Q5_1, without any."""
    name = str(getattr(qtype, "name", qtype)).upper()
    if name not in QUANTIZED:
        raise InvalidParameterError(
            f"unknown GGUF type {qtype!r} here; expected one of {tuple(QUANTIZED)}"
        )
    arr = np.asarray(x)
    if arr.dtype.kind != "f" and arr.dtype.name != "bfloat16":
        raise InvalidDTypeError(f"{name} quantize needs a floating array, got {arr.dtype}")
    shape = tuple(int(d) for d in arr.shape)
    if not shape or shape[-1] % BLOCK:
        raise InvalidParameterError(
            f"{name} needs a last axis that is a multiple of {BLOCK}, got shape {list(shape)}"
        )
    if imatrix is None and name in ("Q4_0", "Q4_1"):
        raise InvalidParameterError(
            f"{name} without an importance matrix is gguf-py's rule (ggml's reference):"
            " qstream.compat.gguf.quantize writes it"
        )
    from .gguf_kquants import importance_rows  # (its kernels: loaded when first used)

    weights = None if imatrix is None else importance_rows(imatrix, shape)
    flat = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.isfinite(flat).all():
        raise NonFiniteInputError(f"{name} cannot quantize NaN or infinite values")
    out = np.empty((*shape[:-1], shape[-1] // BLOCK * _SIZE[name]), np.uint8)
    if flat.size == 0:
        return out
    from ..kernels import legacy_quants as lq
    from ..kernels.runtime import run

    kind = QUANTIZED[name]
    if weights is None:
        run(lq.quantize_blocks, flat.reshape(-1), kind, out.reshape(-1))
        return out
    groups = weights.shape[0]
    xs = flat.reshape(groups, -1)
    outs = out.reshape(groups, -1)
    for g in range(groups):
        run(lq.quantize_rows_weighted, xs[g], weights[g], shape[-1], kind, outs[g])
    return out
