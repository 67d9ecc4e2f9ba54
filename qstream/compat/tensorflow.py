"""TensorFlow ``tf.quantization.quantize`` (QuantizeV2) and ``tf.quantization.dequantize``.

A NumPy re-implementation, bit for bit, of the TensorFlow 2.21 CPU kernels (``quantize_op.cc``,
``dequantize_op.cc``, ``quantization_utils.h``) behind their Python wrappers, checked against
tensorflow-cpu 2.21.0 on x86-64:

- ``axis=None`` is per-tensor; a negative axis becomes ``axis % ndim`` (the wrapper does this
  rather than raising); a per-axis request on an axis of length 1 takes the per-tensor path, so
  ``output_min``/``output_max`` are then scalars.
- Quantize first adjusts each range: ``min' = min(0, min)``,
  ``max' = max(0, max(max, min' + max(1, |min|, |max|) * ensure_minimum_range))``.
- MIN_COMBINED: ``sf = (Tmax - Tmin) / (max' - min')`` (in double, stored as float);
  ``round_half_away((clip(x) - min') * sf - (Tmax - Tmin + 1) / 2)`` for signed T, and
  ``trunc((clip(x) - min') * sf + 0.5)`` for unsigned T.
- MIN_FIRST: the ``FloatToQuantizedStruct`` formula of ``quantization_utils.h``, with no
  clipping before scaling.
- SCALED: the scale comes from the side that fills its range first; the returned range is
  ``[min_out / sf, max_out / sf]``. HALF_TO_EVEN is ``rint``, HALF_AWAY_FROM_ZERO is
  ``std::round``.
- Arithmetic is float32 except where the kernels use double. Subnormals are flushed to zero,
  both as operands and as results, because TF runs its kernels with FTZ/DAZ set. ``std::min``
  and ``std::max`` keep their NaN and signed-zero asymmetry, and float -> integer conversions
  behave as in the x86-64 build. Two consequences:
  - +inf (or any value reaching ``2**31``) with qint32 MIN_COMBINED/SCALED wraps to INT32_MIN;
  - per-tensor SCALED dequantize reads qint32 values of ``2**31 - 64`` and above as INT32_MIN
    (the kernel casts through float).

Documented choices:

- **NaN and other "integer indefinite" conversions** (NaN inputs, and NaN or infinite
  intermediates from degenerate ranges) are undefined behaviour in C++. We return what
  tensorflow-cpu 2.21 (x86-64, AVX build) returns when it evaluates the op on one thread:
  - 0 for every case except the ones below;
  - MIN_FIRST qint32 gives INT32_MIN;
  - qint8/qint16 MIN_COMBINED and SCALED on the per-tensor path give Tmin, but only at flat
    positions inside Eigen's vectorised part. That part is the first ``n - n % 8`` elements
    (HALF_AWAY_FROM_ZERO) or ``n - n % 32`` elements (HALF_TO_EVEN); the scalar tail gives 0.

  TensorFlow splits larger tensors (about 20 000 elements and up on this build) into thread
  blocks that depend on the machine's thread count, and each block has its own scalar tail.
  For those tensors, NaN outputs near block ends cannot be predicted, and this module may
  differ there. Finite inputs are unaffected.
- **oneDNN.** These are TF's own kernels. TensorFlow builds for x86-64 enable "oneDNN custom
  operations" by default on CPUs with AVX512_VNNI, AVX512_BF16 or AMX, and then run qint8/quint8
  QuantizeV2 with SCALED + HALF_TO_EVEN, and MIN_FIRST, through ``_MklQuantizeV2``, which scales
  differently (observed on such a CPU: qint8 SCALED over [-1, 1] maps -1 to -128 and returns the
  range [-1, 1] instead of [-1.0078740, 1]; quint8 MIN_FIRST matches MIN_COMBINED; qint32 SCALED
  HALF_TO_EVEN raises "No registered '_MklQuantizeV2' OpKernel"). Run TF with
  ``TF_ENABLE_ONEDNN_OPTS=0`` to get the results this module reproduces on every CPU.
- ``input`` must be float32. A NumPy array of another dtype raises ``InvalidDTypeError``;
  TF's eager wrapper would cast it silently, but the op itself only takes float32. Python
  scalars and lists are converted to float32, as TF converts them. ``min_range`` and
  ``max_range`` are always converted to float32.
- A negative ``axis`` on a rank-0 input raises ``InvalidParameterError`` (in TF, the
  wrapper's ``axis %= 0`` raises ZeroDivisionError).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..errors import InvalidDTypeError, InvalidParameterError
from ._names import resolve_type

__all__ = ["dequantize", "quantize"]

_TYPES: dict[str, np.dtype] = {
    "qint8": np.dtype(np.int8),
    "quint8": np.dtype(np.uint8),
    "qint16": np.dtype(np.int16),
    "quint16": np.dtype(np.uint16),
    "qint32": np.dtype(np.int32),
}
# TF's names and qstream's: attr T of QuantizeV2, attr dtype of Dequantize ("float" is the
# op's own spelling of float32, as in its error messages).
_T_NAMES = {n: t.name for n, t in _TYPES.items()}
_DTYPE_NAMES = {"float": "float32", "float32": "float32", "bfloat16": "bfloat16"}
_MODES = ("MIN_COMBINED", "MIN_FIRST", "SCALED")
_ROUND_MODES = ("HALF_AWAY_FROM_ZERO", "HALF_TO_EVEN")
# Width, in elements, of the vectorised float -> qint8/qint16 conversion on the AVX build.
_VECTOR_WIDTH = {"HALF_AWAY_FROM_ZERO": 8, "HALF_TO_EVEN": 32}
_F32 = np.float32
_FLT_MAX = np.finfo(np.float32).max
_FLT_MIN = np.finfo(np.float32).tiny


# --------------------------------------------------------------------------------------------
# C++ primitives
# --------------------------------------------------------------------------------------------


def _ftz(v) -> np.ndarray:
    """Flush float32 subnormals to signed zero. TF runs its CPU kernels with FTZ and DAZ set,
    so every float32 operand and result below passes through this."""
    v = np.asarray(v, dtype=np.float32)
    return np.where(np.abs(v) < _FLT_MIN, np.copysign(_F32(0), v), v)


def _std_min(a, b) -> np.ndarray:
    """``std::min(a, b)`` / Eigen ``cwiseMin``: ``b < a ? b : a`` (keeps ``a`` if NaN)."""
    return np.where(b < a, b, a)


def _std_max(a, b) -> np.ndarray:
    """``std::max(a, b)`` / Eigen ``cwiseMax``: ``a < b ? b : a`` (keeps ``a`` if NaN)."""
    return np.where(a < b, b, a)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """``std::round`` / Eigen ``.round()`` on float32, exactly (no ``v + 0.5`` rounding)."""
    t = np.trunc(v)
    return t + np.copysign((np.abs(v - t) >= _F32(0.5)).astype(np.float32), v)


def _to_int(
    v: np.ndarray, dtype: np.dtype, indefinite: int = 0, vector_width: int | None = None
) -> np.ndarray:
    """A C++ float -> integer conversion: truncate toward zero, then wrap to ``dtype``'s width
    (as ``static_cast`` from a wider integer).

    Non-finite values give ``indefinite``. With ``vector_width`` (TF's vectorised qint8/qint16
    cast), they give Tmin instead at flat positions below ``n - n % vector_width``.
    """
    bad = ~np.isfinite(v)
    with np.errstate(invalid="ignore"):
        out = np.where(bad, _F32(0), v).astype(np.int64).astype(dtype)
    if bad.any():
        fill: int | np.ndarray = indefinite
        if vector_width is not None:
            n = v.size
            in_vector = np.arange(n).reshape(v.shape) < n - n % vector_width
            fill = np.where(in_vector, np.iinfo(dtype).min, indefinite)
        out = np.where(bad, fill, out).astype(dtype)
    return out


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


def _type_attr(attr: str, value, names: dict[str, str]) -> str:
    """qstream's name of a type attribute given by TF's name, qstream's name, a dtype or a
    ``tf.DType``; else TF's error, listing both spellings."""
    try:
        return resolve_type(value, names, f"attr {attr!r}")
    except InvalidDTypeError:
        qs = ", ".join(dict.fromkeys(names.values()))
        raise InvalidDTypeError(
            f"Value for attr '{attr}' of {value!r} is not in the list of allowed values:"
            f" {', '.join(names)} (or qstream's names: {qs})"
        ) from None


def _check_mode(mode: str) -> None:
    if mode not in _MODES:
        raise InvalidParameterError(
            f"Value for attr 'mode' of \"{mode}\" is not in the list of allowed values:"
            ' "MIN_COMBINED", "MIN_FIRST", "SCALED"'
        )


def _wrap_axis(axis: int | None, ndim: int) -> int:
    """The Python wrapper's axis handling: None -> -1 (per-tensor), negative -> axis % ndim."""
    if axis is None:
        return -1
    axis = int(axis)
    if axis < 0:
        if ndim == 0:
            raise InvalidParameterError(f"axis {axis} given for a scalar (rank-0) input")
        axis %= ndim
    return axis


def _ranges(min_range, max_range) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(min_range, dtype=np.float32), np.asarray(max_range, dtype=np.float32)


def _float_input(input) -> np.ndarray:
    if isinstance(input, (np.ndarray, np.generic)):
        if input.dtype != np.float32:
            raise InvalidDTypeError(
                f"QuantizeV2 input must be a float (float32) tensor, got {input.dtype}"
            )
        return np.asarray(input)
    return np.asarray(input, dtype=np.float32)


# --------------------------------------------------------------------------------------------
# QuantizeV2
# --------------------------------------------------------------------------------------------


def quantize(
    input: npt.ArrayLike,
    min_range: npt.ArrayLike,
    max_range: npt.ArrayLike,
    T: str,
    *,
    mode: str = "MIN_COMBINED",
    round_mode: str = "HALF_AWAY_FROM_ZERO",
    narrow_range: bool = False,
    axis: int | None = None,
    ensure_minimum_range: float = 0.01,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``tf.quantization.quantize``: returns ``(output, output_min, output_max)``.

    ``output`` has T's plain NumPy dtype (qint8 -> int8, ...). ``output_min``/``output_max``
    are float32: scalars on the per-tensor path, 1-D (one entry per slice) on the per-axis path.
    """
    dtype = np.dtype(_type_attr("T", T, _T_NAMES))
    _check_mode(mode)
    if round_mode not in _ROUND_MODES:
        raise InvalidParameterError(
            f"Value for attr 'round_mode' of \"{round_mode}\" is not in the list of allowed"
            ' values: "HALF_AWAY_FROM_ZERO", "HALF_TO_EVEN"'
        )
    if round_mode == "HALF_TO_EVEN" and mode != "SCALED":
        raise InvalidParameterError(
            f"Round mode 'HALF_TO_EVEN' only supported for mode 'SCALED', but mode is '{mode}'."
        )
    x = _float_input(input)
    axis = _wrap_axis(axis, x.ndim)
    lo_in, hi_in = _ranges(min_range, max_range)

    num_slices = 1
    if axis > -1:
        if axis >= x.ndim:
            raise InvalidParameterError(
                "Axis is on a zero-based index, so its value must always be less than number of"
                f" input's dims, but given axis value was {axis} and input's dims was {x.ndim}"
            )
        num_slices = x.shape[axis]
        for name, r in (("min_range", lo_in), ("max_range", hi_in)):
            prefix = (
                f"If axis is specified, {name} must be a 1-D tensor whose size matches the axis"
                " dimension of the input and output tensors, but"
            )
            if r.ndim != 1:
                raise InvalidParameterError(f"{prefix} {name} dims are {r.ndim}")
            if r.shape[0] != num_slices:
                raise InvalidParameterError(
                    f"{prefix} {name} is a 1-D tensor of size {r.shape[0]} and input's axis"
                    f" dimension is of size {num_slices}"
                )
    else:
        for name, r in (("min_range", lo_in), ("max_range", hi_in)):
            if r.size != 1:
                raise InvalidParameterError(
                    f"If axis is not specified, {name} must contain a single float element,"
                    f" but it contains {r.size} elements"
                )

    if num_slices == 1:  # per-tensor path (also taken for an axis of length 1)
        out_shape: tuple[int, ...] = ()
        lo_in, hi_in = lo_in.reshape(()), hi_in.reshape(())
    else:
        if mode == "MIN_FIRST":
            raise InvalidParameterError(
                "MIN_FIRST mode is not implemented for Quantize with axis != -1."
            )
        out_shape = (num_slices,)
        bshape = [1] * x.ndim
        bshape[axis] = num_slices
        lo_in, hi_in = lo_in.reshape(bshape), hi_in.reshape(bshape)
    if np.any(hi_in < lo_in):
        raise InvalidParameterError("input_max_range must be larger than input_min_range.")

    x, lo_in, hi_in = _ftz(x), _ftz(lo_in), _ftz(hi_in)
    with np.errstate(all="ignore"):
        # Range adjustment: the range always holds 0 and is at least `epsilon` wide.
        lo = _std_min(_F32(0), lo_in)
        widest = _std_max(_F32(1), _std_max(np.abs(lo_in), np.abs(hi_in)))
        eps = _ftz(widest * _ftz(_F32(ensure_minimum_range)))
        hi = _std_max(_F32(0), _std_max(hi_in, _ftz(lo + eps)))
        info = np.iinfo(dtype)
        vectorised = num_slices == 1 and info.min < 0 and info.bits < 32
        width = _VECTOR_WIDTH[round_mode] if vectorised else None

        if mode == "MIN_COMBINED":
            span = _ftz(hi - lo).astype(np.float64)
            sf = _ftz(np.float64(info.max - info.min) / span)
            v = _ftz(_ftz(_std_max(_std_min(x, hi), lo) - lo) * sf)
            if info.min < 0:
                v = _round_half_away(_ftz(v - _F32((info.max - info.min + 1) / 2)))
            else:
                v = _ftz(v + _F32(0.5))  # the unsigned kernel truncates instead of rounding
            out = _to_int(v, dtype, vector_width=width)
            out_lo, out_hi = lo, hi
        elif mode == "MIN_FIRST":
            steps = float(2 ** (8 * dtype.itemsize) - 1)
            span = _ftz(hi - lo).astype(np.float64)
            rs = np.where(hi == lo, _F32(0), _ftz(steps / span))
            offset = _ftz(_round_half_away(_ftz(lo * rs)) - _F32(info.min))
            v = _ftz(_round_half_away(_ftz(x * rs)) - offset)
            lower, upper = _F32(max(info.min, -2.147483648e9)), _F32(min(info.max, 2.147483520e9))
            v = _std_min(_std_max(v, lower), upper)
            # Float -> int32 (NaN: INT32_MIN), then int32 -> T wraps.
            out = _to_int(v, np.dtype(np.int32), indefinite=-(2**31)).astype(dtype)
            out_lo, out_hi = lo, hi
        else:  # SCALED
            min_out = _F32(info.min + (1 if narrow_range else 0))
            max_out = _F32(info.max)
            sf_min = np.where(_ftz(min_out * lo) > 0, _ftz(min_out / lo), _FLT_MAX)
            sf_max = np.where(_ftz(max_out * hi) > 0, _ftz(max_out / hi), _FLT_MAX)
            sf = _std_min(sf_min, sf_max)
            out_lo, out_hi = _ftz(min_out / sf), _ftz(max_out / sf)
            v = _ftz(_std_max(_std_min(x, out_hi), out_lo) * sf)
            v = np.rint(v) if round_mode == "HALF_TO_EVEN" else _round_half_away(v)
            out = _to_int(v, dtype, vector_width=width)

    return (
        out.reshape(x.shape),
        np.asarray(out_lo, dtype=np.float32).reshape(out_shape),
        np.asarray(out_hi, dtype=np.float32).reshape(out_shape),
    )


# --------------------------------------------------------------------------------------------
# Dequantize
# --------------------------------------------------------------------------------------------


def dequantize(
    input: npt.ArrayLike,
    min_range: npt.ArrayLike,
    max_range: npt.ArrayLike,
    *,
    mode: str = "MIN_COMBINED",
    narrow_range: bool = False,
    axis: int | None = None,
    dtype: str | npt.DTypeLike = "float32",
) -> np.ndarray:
    """``tf.quantization.dequantize``: float32 (or ``ml_dtypes.bfloat16``) values of ``input``.

    The quantized type follows from ``input``'s dtype (int8 -> qint8, uint8 -> quint8, ...).
    No range adjustment is made, and ``min > max`` is accepted, as in TF.
    """
    _check_mode(mode)
    out_dtype = np.dtype(_type_attr("dtype", dtype, _DTYPE_NAMES))
    if out_dtype != np.float32 and mode != "MIN_COMBINED":
        raise InvalidParameterError(
            f"When output type is bfloat16, Mode string must be 'MIN_COMBINED', is '{mode}'"
        )
    q = np.asarray(input)
    if q.dtype not in _TYPES.values():
        raise InvalidDTypeError(
            f"dequantize input must be int8, uint8, int16, uint16 or int32 (qint8, quint8,"
            f" qint16, quint16, qint32), got {q.dtype}"
        )
    axis = _wrap_axis(axis, q.ndim)
    if axis >= q.ndim:
        raise InvalidParameterError(f"Axis must be less than input dimension({q.ndim}), got {axis}")
    lo, hi = _ranges(min_range, max_range)
    num_slices = q.shape[axis] if axis > -1 else 1
    for name, r in (("input_min_tensor", lo), ("input_max_tensor", hi)):
        if r.size != num_slices:
            raise InvalidParameterError(
                f"{name} must have as many elements as input on the dequantization axis ({axis}),"
                f" got {r.size}, expected {num_slices}"
            )
    if num_slices == 1:
        lo, hi = lo.reshape(()), hi.reshape(())
    else:
        if mode == "MIN_FIRST":
            raise InvalidParameterError(
                "MIN_FIRST mode is not implemented for Dequantize with axis != -1."
            )
        bshape = [1] * q.ndim
        bshape[axis] = num_slices
        lo, hi = lo.reshape(bshape), hi.reshape(bshape)

    lo, hi = _ftz(lo), _ftz(hi)
    info = np.iinfo(q.dtype)
    tmin, tmax = _F32(info.min), _F32(info.max)
    qf = q.astype(np.float32)
    with np.errstate(all="ignore"):
        if mode == "MIN_COMBINED":
            half = (tmax - tmin + _F32(1)) / _F32(2) if info.min < 0 else _F32(0)
            sf = _ftz(_ftz(hi - lo) / (tmax - tmin))
            y = _ftz(_ftz(_ftz(qf + half) * sf) + lo)
        elif mode == "MIN_FIRST":
            steps = float(2 ** (8 * q.dtype.itemsize) - 1)
            rs = _ftz(_ftz(hi - lo).astype(np.float64) / steps)
            rounded = _ftz(_round_half_away(_ftz(lo / rs)) * rs)
            rounded = np.where(hi == lo, lo, rounded)
            y = _ftz(_ftz(rounded - _ftz(tmin * rs)) + _ftz(qf * rs))
        else:  # SCALED
            if info.min == 0:
                sf = _ftz(hi / tmax)
            else:
                min_out = _F32(info.min + (1 if narrow_range else 0))
                sf = _std_max(_ftz(lo / min_out), _ftz(hi / tmax))
            if num_slices == 1 and info.bits == 32:
                # The per-tensor kernel casts qint32 -> int via float: 2**31 overflows.
                qf = np.where(qf >= _F32(2**31), _F32(-(2**31)), qf)
            y = _ftz(qf * sf)
    return np.asarray(y, dtype=np.float32).reshape(q.shape).astype(out_dtype)
