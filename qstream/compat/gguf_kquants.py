"""llama.cpp's K-quant GGUF types, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, bit for bit as
``ggml_quantize_chunk`` writes them (with and without an importance matrix) and as gguf-py
0.19's ``gguf.quants.dequantize`` reads them.

The conventions are those of :mod:`qstream.compat.gguf`: blocks run along the last axis, each
row stored as its blocks' bytes (here super-blocks of 256 values: 84, 110, 144, 176 and 210
bytes), so a ``[rows, n]`` float tensor becomes ``[rows, n / 256 * size]`` uint8.

``imatrix`` is llama.cpp's ``quant_weights``: one importance weight per column (the mean
square of the activations feeding it, as ``llama-imatrix`` collects), shaped ``[n]`` for all
rows, or ``[*x.shape[:-2], n]`` for one weight vector per leading index (the experts of a MoE
tensor, as llama-quantize hands them out). With it, ggml quantizes by different code paths
(weighted scale searches, quantized sub-block scales), reproduced here too.

Non-finite values are refused before any work (:class:`~qstream.errors.NonFiniteInputError`):
ggml would quantize them into blocks that llama-quantize's own validation rejects, and
llama-quantize refuses an importance matrix holding them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ..errors import InvalidDTypeError, InvalidParameterError, NonFiniteInputError
from ..kernels import kquants
from ..kernels.runtime import run

BLOCK = 256
#: GGML type numbers (``gguf.GGMLQuantizationType``)
TYPE_ID = {"Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
#: bytes per super-block of 256 values
TYPE_SIZE = {name: kquants.BLOCK_BYTES[i] for name, i in TYPE_ID.items()}
TYPES = tuple(TYPE_ID)
__all__ = [
    "BLOCK",
    "TYPES",
    "TYPE_ID",
    "TYPE_SIZE",
    "byte_shape",
    "dequantize",
    "importance_rows",
    "quantize",
]


def _type(qtype: object) -> str:
    name = str(getattr(qtype, "name", qtype)).upper()
    if name not in TYPE_ID:
        raise InvalidParameterError(
            f"unknown K-quant type {qtype!r}; expected one of: {', '.join(TYPES)}"
        )
    return name


def byte_shape(shape: Sequence[int], qtype: str) -> tuple[int, ...]:
    """The stored shape of a float tensor of ``shape`` in ``qtype``: the last axis becomes
    ``shape[-1] / 256 * type size`` bytes."""
    qtype = _type(qtype)
    shape = tuple(int(d) for d in shape)
    if not shape or shape[-1] % BLOCK:
        raise InvalidParameterError(
            f"{qtype} needs a last axis that is a multiple of {BLOCK}, got shape {list(shape)}"
        )
    return (*shape[:-1], shape[-1] // BLOCK * TYPE_SIZE[qtype])


def importance_rows(imatrix: npt.ArrayLike, shape: tuple[int, ...]) -> np.ndarray:
    """The importance matrix ``imatrix`` as float32 ``[groups, n]`` (``[n]``: one group; or one
    row per index of ``shape[:-2]``), checked against the tensor's ``shape`` and for
    non-finite values."""
    w = np.asarray(imatrix)
    if w.dtype.kind not in "fiu":
        raise InvalidDTypeError(f"an importance matrix must be numeric, got {w.dtype}")
    n = shape[-1]
    lead = shape[:-2]
    if w.shape == (n,):
        groups = 1
    elif w.shape == (*lead, n) and lead:
        groups = int(np.prod(lead))
    else:
        wanted = f"[{n}]" + (f" or {[*lead, n]}" if lead else "")
        raise InvalidParameterError(
            f"importance matrix of shape {list(w.shape)} does not fit a tensor of shape "
            f"{list(shape)}: expected {wanted} (one weight per column)"
        )
    w = np.ascontiguousarray(w, dtype=np.float32).reshape(groups, n)
    if not np.isfinite(w).all():
        raise NonFiniteInputError("the importance matrix holds NaN or infinite values")
    return w


def quantize(x: npt.ArrayLike, qtype: str, imatrix: npt.ArrayLike | None = None) -> np.ndarray:
    """``ggml_quantize_chunk(qtype, x, ..., imatrix)``: the uint8 super-blocks of the float
    tensor ``x`` (shaped :func:`byte_shape`), with ``imatrix`` as its importance weights
    (``[n]``, or ``[*x.shape[:-2], n]`` per leading index) or without any."""
    qtype = _type(qtype)
    x = np.asarray(x)
    if x.dtype.kind != "f" and x.dtype.name != "bfloat16":
        raise InvalidDTypeError(f"{qtype} quantize needs a floating array, got {x.dtype}")
    out_shape = byte_shape(x.shape, qtype)
    weights = None if imatrix is None else importance_rows(imatrix, x.shape)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise NonFiniteInputError(f"{qtype} cannot quantize NaN or infinite values")
    out = np.empty(out_shape, np.uint8)
    if x.size == 0:
        return out
    kind = TYPE_ID[qtype]
    per_row = x.shape[-1] // BLOCK
    flat_x = x.reshape(-1)
    flat_out = out.reshape(-1)
    if weights is None:
        run(kquants.quantize_blocks, flat_x, _no_weights(), False, per_row, kind, flat_out)
    else:
        groups = weights.shape[0]
        xs = flat_x.reshape(groups, -1)
        outs = flat_out.reshape(groups, -1)
        for g in range(groups):
            run(kquants.quantize_blocks, xs[g], weights[g], True, per_row, kind, outs[g])
    return out


def _no_weights() -> np.ndarray:
    """The (empty) weights argument of the kernels when there is no importance matrix."""
    return np.zeros(0, np.float32)


def dequantize(blocks: npt.ArrayLike, qtype: str, shape: Sequence[int] | None = None) -> np.ndarray:
    """``gguf.quants.dequantize(blocks, qtype)``: the float32 values of stored super-blocks,
    shaped ``shape`` when given (it must hold as many values as the blocks), else the blocks'
    shape with the last axis back to values."""
    qtype = _type(qtype)
    raw = np.ascontiguousarray(np.asarray(blocks)).view(np.uint8)
    size = TYPE_SIZE[qtype]
    if raw.ndim == 0 or raw.shape[-1] % size:
        raise InvalidParameterError(f"{qtype} rows must be whole super-blocks of {size} bytes")
    values = raw.size // size * BLOCK
    if shape is None:
        out_shape: tuple[int, ...] = (*raw.shape[:-1], raw.shape[-1] // size * BLOCK)
    else:
        out_shape = tuple(int(d) for d in shape)
        if int(np.prod(out_shape)) != values or not out_shape or out_shape[-1] % BLOCK:
            raise InvalidParameterError(
                f"{raw.size} bytes of {qtype} hold {values} values, not a tensor of shape "
                f"{list(out_shape)}"
            )
    out = np.empty(out_shape, np.float32)
    if values:
        run(kquants.dequantize_blocks, raw.reshape(-1), TYPE_ID[qtype], out.reshape(-1))
    return out
