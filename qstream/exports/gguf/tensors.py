"""The tensors of a GGUF export, each a :class:`~qstream.exports.gguf.file.GGUFTensor` whose
reader produces its bytes in row slabs: float values quantized to GGUF blocks (or written
in a float type) by :mod:`qstream.compat.gguf`, or a qstream output's codes and scales
copied into blocks where those hold them exactly."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...compat import gguf as q
from ...compat.gguf_names import row_order
from ...errors import InvalidParameterError, NonFiniteInputError
from ...io.checkpoints import TensorLike, read_rows
from ...io.outputs import QuantizedArray
from ..files import SLAB
from .file import GGUFTensor

_PLAIN = {"float32": "F32", "float64": "F32", "float16": "F16", "bfloat16": "BF16"}


#: a weighted tensor's rows quantized again without the imatrix, for the report's
#: ``without_imatrix`` figures: every ``k``-th row, ``k = rows // BASELINE_ROWS`` (so
#: 256-511 rows; every row of a tensor of fewer than 512): an estimate of what the imatrix
#: bought at a few percent of the file's own quantization time, not a second full one
BASELINE_ROWS = 256


class ErrorSums:
    """The error of a tensor's GGUF values against its source values, summed as the slabs
    are written (float64; per row, then rows added in file order: the same sums whatever
    the slab size). With importance weights (an imatrix), also the weighted sums (what
    llama.cpp's weighted search minimises) and, in :attr:`plain`, the same sums for the
    baseline rows (:data:`BASELINE_ROWS`) quantized without the imatrix, with :attr:`sampled`
    the file's values on those same rows: what the imatrix bought."""

    def __init__(self) -> None:
        self.count = 0
        self.sums = np.zeros(4)  # x^2, (x - y)^2, x * y, y^2
        self.weighted = np.zeros(2)  # w x^2, w (x - y)^2
        self.max_abs = 0.0
        self.plain: ErrorSums | None = None
        self.sampled: ErrorSums | None = None
        self.rows = 0  # (of the baseline: rows sampled, of ``total_rows``)
        self.total_rows = 0
        self._program: tuple[int, np.ndarray] | None = None

    def add_baseline(
        self, x: np.ndarray, y: np.ndarray, plain: np.ndarray, w: np.ndarray, rows: int
    ) -> None:
        """Add the baseline rows of a slab: source values ``x``, the file's values ``y`` and
        the values ``plain`` quantized without the imatrix (rows along the last axis), their
        importance weights ``w``; ``rows``: the tensor's row count."""
        if self.plain is None or self.sampled is None:
            self.plain, self.sampled = ErrorSums(), ErrorSums()
        self.plain.add(x, plain, w)
        self.sampled.add(x, y, w)
        self.rows += len(x)
        self.total_rows = rows

    def add(self, x: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> None:
        """Add source values ``x`` and their GGUF values ``y`` (rows along the last axis);
        ``w``: the importance weights of the rows (``[rows or 1, columns]``). One pass of a
        kernel (:func:`qstream.kernels.kquants.row_error_sums`) per row gives the bits of
        NumPy's ``(a * a).sum(axis=1)`` etc. on float64 copies (``a = x``, ``b = y``,
        ``e = a - b``), the rows then added in order."""
        from ...kernels import kquants

        cols = x.shape[-1] if x.ndim else 1
        x, y = _float(x).reshape(-1, cols), _float(y).reshape(-1, cols)
        if not x.size:
            return
        if self._program is None or self._program[0] != cols:
            self._program = (cols, kquants.pairwise_program(cols))
        weights = np.zeros((0, 0), np.float32) if w is None else np.ascontiguousarray(w)
        rows = np.empty((x.shape[0], 7))
        kquants.row_error_sums(x, y, weights, self._program[1], rows)
        self.sums = _added(self.sums, rows[:, :4].T)
        if w is not None:
            self.weighted = _added(self.weighted, rows[:, 4:6].T)
        self.max_abs = max(self.max_abs, float(rows[:, 6].max()))
        self.count += x.size

    def summary(self) -> dict[str, Any]:
        """SQNR (dB), MSE, cosine similarity, count and the largest absolute error; with
        importance weights ``weighted_sqnr_db`` too, and ``without_imatrix``: the same
        figures for the tensor quantized without them."""
        from ...spec import error_metrics

        out = error_metrics(self.count, *(float(v) for v in self.sums))
        out["max_abs"] = self.max_abs
        if self.weighted.any():
            signal, noise = (float(v) for v in self.weighted)
            out["weighted_sqnr_db"] = (
                float("inf") if noise == 0 else 10 * math.log10(signal / noise) if signal else None
            )
        if self.plain is not None and self.sampled is not None:
            base = self.plain.summary()
            with_ = self.sampled.summary().get("weighted_sqnr_db")
            without = base.get("weighted_sqnr_db")
            gain = None if with_ is None or without is None else float(with_) - float(without)
            base["gain_db"] = gain if gain is not None and math.isfinite(gain) else None
            base["rows"], base["of_rows"] = self.rows, self.total_rows
            out["without_imatrix"] = base
        return out


def baseline_rows(rows: int, r0: int, n: int) -> slice:
    """The baseline rows (:data:`BASELINE_ROWS`) among rows ``r0:r0 + n`` of a tensor of
    ``rows`` rows, as a slice of the slab."""
    stride = max(1, rows // BASELINE_ROWS)
    return slice((-r0) % stride, n, stride)


def _float(v: np.ndarray) -> np.ndarray:
    """``v`` C-contiguous in float32 or float64 (narrower floats widened to float32: exact)."""
    v = np.asarray(v)
    dtype = v.dtype if v.dtype in (np.float32, np.float64) else np.float32
    return np.ascontiguousarray(v, dtype=dtype)


def _added(total: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``total`` plus the columns of ``rows`` added one at a time, in order."""
    return np.cumsum(np.concatenate([total[:, None], rows], axis=1), axis=1)[:, -1]


def float_tensor(
    name: str,
    t: TensorLike,
    gtype: str,
    heads: int | None,
    max_rows_bytes: int,
    errors: ErrorSums | None = None,
    *,
    add: float = 0.0,
    rows: int | None = None,
    imatrix: np.ndarray | None = None,
) -> GGUFTensor:
    """A tensor quantized (or converted) from float values read in row slabs (the leading
    axes flattened into rows; a permuted q/k weight one head at a time, the permutation
    staying within a head). ``errors``: summed from each slab's values as written. The
    converter's transforms: ``add`` to every value (Gemma norms; in float32, float16 values
    in float16, as the converter adds), only the first ``rows`` rows (Gemma 3's embedding).
    ``imatrix``: the importance weights of a K type (one per column)."""
    shape = tuple(t.shape)
    if rows is not None and shape:
        shape = (min(rows, shape[0]), *shape[1:])
    return _rows_tensor(name, shape, gtype, _reader(t, shape, heads, add), heads,
                        max_rows_bytes, errors, imatrix=imatrix)  # fmt: skip


def experts_tensor(
    name: str,
    parts: list[TensorLike],
    gtype: str,
    max_rows_bytes: int,
    errors: ErrorSums | None = None,
    imatrix: np.ndarray | None = None,
) -> GGUFTensor:
    """One 3-D tensor of a layer's experts ``parts`` (alike 2-D tensors, in expert order),
    stacked along a new first axis as llama.cpp's ``ffn_*_exps``: read in row slabs from one
    expert (or two, across a boundary) at a time, never the layer's experts at once.
    ``imatrix``: a K type's importance weights, ``[experts, columns]``."""
    inner = tuple(parts[0].shape)
    per = inner[0]
    readers = [_reader(p, inner, None, 0.0) for p in parts]

    def values(r0: int, r1: int) -> np.ndarray:
        pieces = []
        r = r0
        while r < r1:
            e, lo = divmod(r, per)
            hi = min(per, lo + (r1 - r))
            pieces.append(readers[e](lo, hi))
            r += hi - lo
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    shape = (len(parts), *inner)
    return _rows_tensor(name, shape, gtype, values, None, max_rows_bytes, errors, unit=1,
                        imatrix=imatrix)  # fmt: skip


def _reader(t: TensorLike, shape: tuple[int, ...], heads: int | None, add: float) -> Any:
    """``values(r0, r1)``: rows ``r0:r1`` of ``t`` (of the written ``shape``; leading axes
    flattened; rows permuted over ``heads``; ``add`` added)."""
    cols = shape[-1] if shape else 1
    inner = math.prod(shape[1:-1]) if len(shape) > 2 else 1
    order = row_order(shape[0], heads) if heads else None
    dtype = np.dtype(t.dtype)

    def plus(x: np.ndarray) -> np.ndarray:
        if not add:
            return x
        if x.dtype == np.float16:
            return np.asarray(x + np.float16(add))
        return np.asarray(x, np.float32) + np.float32(add)

    def values(r0: int, r1: int) -> np.ndarray:
        if not shape:
            return plus(np.asarray(t[...], np.float32).reshape(1))
        if len(shape) == 1:  # a vector: one piece (a q/k bias permuted as its weight's rows)
            x = np.asarray(t[...])
            return plus(np.asarray(x[order]) if order is not None else x)
        if order is not None:  # rows r0:r1 are one head's: read them, then reorder
            x = read_rows(t, (slice(r0, r1),), dtype)
            return plus(np.asarray(x[order[r0:r1] - r0]))
        x = read_rows(t, (slice(r0 // inner, r1 // inner),), dtype)
        return plus(x.reshape(r1 - r0, cols))

    return values


def _rows_tensor(
    name: str,
    shape: tuple[int, ...],
    gtype: str,
    values: Any,
    heads: int | None,
    max_rows_bytes: int,
    errors: ErrorSums | None,
    unit: int | None = None,
    imatrix: np.ndarray | None = None,
) -> GGUFTensor:
    """A tensor of ``shape`` whose rows ``values(r0, r1)`` reads, written as ``gtype`` in
    slabs of whole ``unit`` rows (None: whole indices of axis 0), each row quantized with
    its ``imatrix`` row (``[columns]``, or ``[experts, columns]``: rows of axis 0's index)."""
    cols = shape[-1] if shape else 1
    rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    inner = math.prod(shape[1:-1]) if len(shape) > 2 else 1  # rows per index of axis 0
    if heads and len(shape) == 2:  # (permuted)
        step = shape[0] // heads  # one head's rows
    else:  # whole indices of axis 0 (or any rows: ``unit`` 1), within the budget
        unit = inner if unit is None else unit
        step = unit * max(1, min(rows // unit, max_rows_bytes // max(1, unit * cols * 4)))

    def read(r0: int, r1: int) -> np.ndarray:
        x = source = values(r0, r1)
        if gtype in q.TYPE_SIZE or gtype in q.K_TYPES:
            x = np.asarray(x, np.float32)
            if not np.isfinite(x).all():
                raise NonFiniteInputError(
                    f"{name}: holds NaN or infinite values, which GGUF blocks cannot hold"
                )
        per = rows // max(1, shape[0])
        raw = np.ascontiguousarray(_quantize(x, gtype, imatrix, r0, per))
        if errors is not None:
            w = None if imatrix is None else _row_weights(imatrix, r0, len(x), per)
            y = q.dequantize(raw, gtype)
            errors.add(np.asarray(source), y, w)
            if w is not None:  # (baseline rows without the imatrix: what it bought)
                pick = baseline_rows(rows, r0, len(x))
                src = np.asarray(source).reshape(len(x), -1)[pick]
                if len(src):
                    plain = q.dequantize(np.ascontiguousarray(q.quantize(x[pick], gtype)), gtype)
                    wp = w if len(w) == 1 else w[pick]
                    errors.add_baseline(src, y.reshape(len(x), -1)[pick], plain, wp, rows)
        return raw.view(np.uint8)

    if len(shape) > 1:
        return GGUFTensor(name, shape, gtype, rows, read, max(1, step))
    return GGUFTensor(name, shape, gtype, 1, read, 1)


def _row_weights(w: np.ndarray, r0: int, n: int, per: int) -> np.ndarray:
    """The importance weights of rows ``r0:r0 + n``: ``[1, columns]`` for one vector,
    ``[n, columns]`` for one an expert (``per`` rows an expert)."""
    if w.ndim == 1:
        return w.reshape(1, -1)
    return w[(r0 + np.arange(n)) // per]


def _quantize(x: Any, gtype: str, w: np.ndarray | None, r0: int, per: int) -> np.ndarray:
    """``x`` (rows ``r0:``) as ``gtype``, each row with its importance weights in ``w``
    (``[columns]``; ``[experts, columns]``: ``per`` rows an expert), quantized per expert."""
    if w is None or w.ndim == 1:
        return q.quantize(x, gtype, imatrix=w)
    pieces, r = [], 0
    while r < len(x):
        e = (r0 + r) // per
        n = min(len(x) - r, (e + 1) * per - (r0 + r))
        pieces.append(q.quantize(x[r : r + n], gtype, imatrix=w[e]))
        r += n
    return np.concatenate(pieces)


def copy_type(hf: str, arr: QuantizedArray) -> str:
    """The GGUF block type that holds the codes and scales of the qstream output's tensor
    ``hf`` exactly (Q8_0, Q4_0), else :class:`InvalidParameterError` saying why (its
    parameters are read, not its codes)."""

    def refuse(why: str) -> InvalidParameterError:
        return InvalidParameterError(
            f"{hf}: {why}; GGUF holds symmetric int8 (Q8_0) or int4 (Q4_0) codes with float16"
            " scales per 32 values along the last axis: convert with a recipe whose spec has"
            ' scale_dtype = "float16" and groups of a multiple of 32 along the last axis (or'
            " per channel on axis 0), or convert the float checkpoint to .gguf directly"
        )

    qt = arr.qtype
    if arr.spec.float_offset:
        raise refuse("a float offset")
    kind = {"int8": "Q8_0", "int4": "Q4_0"}.get(qt.name)
    if kind is None:
        raise refuse(f"{qt.name} codes")
    if arr.ndim != 2 or arr.shape[1] % q.BLOCK:
        raise refuse(f"shape {list(arr.shape)}")
    spec = arr.spec
    if np.any(arr.zero_point != 0):
        raise refuse("an asymmetric range (nonzero zero points)")
    if spec.block_size:
        if arr.axis != 1 or spec.block_size % q.BLOCK:
            raise refuse(f"groups of {spec.block_size} along axis {arr.axis}")
    elif arr.axis not in (None, 0):
        raise refuse(f"one scale per position on axis {arr.axis}")
    scale = np.asarray(arr.scale, np.float32)
    if not np.array_equal(scale.astype(np.float16).astype(np.float32), scale):
        raise refuse("float32 scales that float16 does not hold")
    return kind


def quantized_tensor(name: str, hf: str, arr: QuantizedArray, heads: int | None) -> GGUFTensor:
    """A qstream output's quantized tensor ``hf`` copied into GGUF blocks as ``name``, if
    they hold it exactly (:func:`copy_type`)."""
    kind = copy_type(hf, arr)
    spec = arr.spec
    out, cols = arr.shape
    per_block = spec.block_size // q.BLOCK if spec.block_size else 0
    order = row_order(out, heads) if heads else None

    def read(r0: int, r1: int) -> np.ndarray:
        a = arr
        rows = np.arange(r0, r1) if order is None else order[r0:r1]
        lo, hi = int(rows.min()), int(rows.max()) + 1
        codes = a.quantized((slice(lo, hi),))[rows - lo].astype(np.int8)
        s = np.asarray(a.scale, np.float32)
        if spec.block_size:
            d = np.repeat(s.reshape(out, -1)[rows], per_block, axis=1)
        elif a.axis == 0:
            d = np.repeat(s.reshape(out, 1)[rows], cols // q.BLOCK, axis=1)
        else:
            d = np.full((len(rows), cols // q.BLOCK), s.reshape(-1)[0], np.float32)
        d = d.reshape(-1, 1).astype(np.float16).view(np.uint8)
        b = codes.reshape(-1, q.BLOCK)
        if kind == "Q8_0":
            body = b.view(np.uint8)
        else:
            n = (b.astype(np.int16) + 8).astype(np.uint8)
            body = n[:, :16] | (n[:, 16:] << np.uint8(4))
        return np.concatenate([d, body], axis=1)

    return GGUFTensor(name, arr.shape, kind, out, read, max(1, SLAB // max(1, cols)))


def plain_type(t: Any, name: str) -> str:
    """The GGUF type of a kept tensor ``t``: its own float type (float64 as F32)."""
    dtype = np.dtype(t.dtype).name
    meta = getattr(t, "attrs", None)
    if meta is not None:
        dtype = dict(meta.get("qstream", {})).get("dtype", dtype)
    if dtype not in _PLAIN:
        raise InvalidParameterError(f"{name}: GGUF has no type for {dtype} values")
    return _PLAIN[dtype]
