"""nGraph ``Quantize`` / ``Dequantize`` (``runtime/reference/quantize.hpp``, ``dequantize.hpp``).

The reference kernels as nGraph's last release has them (NervanaSystems/ngraph master; the
OpenVINO copy is the same), evaluated in the input's real type ``REAL`` (float32 or float64;
nGraph's interpreter and CPU backends run no other), step by step:

- ``q = input / scale`` in REAL; scale and offset are indexed by the projection of the
  element's coordinate on ``axes`` (any set of axes; empty = per-tensor);
- the round mode, written with REAL constants: ``floor(q + REAL(0.5))``, ``ceil(q -
  REAL(0.5))``, ``floor(|q| + REAL(0.5))`` ... are rounded in REAL. In float32, 0.49999997
  + 0.5 rounds to 1, so ROUND_NEAREST_UPWARD / TOWARD_INFINITY give 1 for it, and odd
  integers in [2**23, 2**24) move by one in the nearest modes (8388609 -> 8388610 with
  ROUND_NEAREST_TOWARD_EVEN). The directed modes (ROUND_UP ...) are exact;
- ``q += offset`` in REAL: the integer offset is converted to REAL (rounded above 2**24 in
  float32), then added with one rounding;
- clamp to ``[REAL(Tmin), REAL(Tmax)]``, then ``static_cast<QUANT>``.

Where the C++ is undefined this profile chooses: NaN gives the type's minimum; with float32
input and int32 output the upper clamp bound ``float(INT32_MAX)`` is 2**31, whose cast is
undefined, and this profile gives INT32_MAX (x86-64 builds would give INT32_MIN).

Dequantize: ``(REAL)(q - offset) * scale``: the difference in C++ ``int`` (wrapped to 32 bits
for int32, as x86-64 does), converted to REAL (rounded above 2**24 in float32), then
multiplied in REAL: two roundings.

Types: quantized ``i8``/``u8``/``i32`` (or ``int8``/``uint8``/``int32``), real ``f32``/``f64``
(or ``float32``/``float64``). The 2018 revision of the kernel wrote ``q + 0.5`` with a double
constant (exact for float32 inputs); this profile follows the later REAL-typed one.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from ..core import affine_dequantize, affine_quantize, plan_layout
from ..errors import InvalidDTypeError, InvalidParameterError
from ..qtypes import qtype
from ..rounding import real_type_code
from ._names import resolve_type

# nGraph's quantized element types (element::Type::is_quantized) and the real types its
# kernels run, by nGraph's names.
QUANTIZED_TYPES = {"i8": "int8", "u8": "uint8", "i32": "int32"}
REAL_TYPES = {"f32": "float32", "f64": "float64"}

ROUND_MODES = {
    "ROUND_NEAREST_TOWARD_INFINITY": "half_away_from_zero",
    "HALF_AWAY_FROM_ZERO": "half_away_from_zero",
    "ROUND_NEAREST_TOWARD_ZERO": "half_toward_zero",
    "ROUND_NEAREST_UPWARD": "half_up",
    "ROUND_NEAREST_DOWNWARD": "half_down",
    "ROUND_NEAREST_TOWARD_EVEN": "half_to_even",
    "ROUND_TOWARD_INFINITY": "away_from_zero",
    "ROUND_TOWARD_ZERO": "toward_zero",
    "ROUND_UP": "up",
    "ROUND_DOWN": "down",
}


def _gather_axes(
    x: np.ndarray, scale: np.ndarray, axes: Iterable[int]
) -> tuple[list[int], tuple[int, ...], np.ndarray]:
    """Move ``axes`` to the front and flatten them, so the parameters become per-axis on 0."""
    axes = sorted({int(a) for a in axes})
    for a in axes:
        if not 0 <= a < x.ndim:
            raise InvalidParameterError(f"quantization axis {a} must be less than rank {x.ndim}")
    want = tuple(x.shape[a] for a in axes)
    if scale.shape != want:
        raise InvalidParameterError(
            f"scale/offset shape {scale.shape} must equal the input's dims at axes {axes}: {want}"
        )
    moved = np.moveaxis(x, axes, list(range(len(axes))))
    flat = moved.reshape((int(np.prod(want)), -1) if axes else (1, -1))
    return axes, moved.shape, flat


def _restore(y: np.ndarray, axes: list[int], moved_shape: tuple[int, ...]) -> np.ndarray:
    return np.moveaxis(y.reshape(moved_shape), list(range(len(axes))), axes)


def _real(dtype: object, what: str) -> np.dtype:
    return np.dtype(resolve_type(dtype, REAL_TYPES, what))


def quantize(
    input: npt.ArrayLike,
    scale: npt.ArrayLike,
    zero_point: npt.ArrayLike,
    *,
    type: object,
    axes: Iterable[int] = (),
    round_mode: str = "ROUND_NEAREST_TOWARD_EVEN",
) -> np.ndarray:
    """nGraph ``Quantize``; ``type`` is the quantized element type ("i8", "u8", "i32" or
    qstream's "int8", "uint8", "int32")."""
    x = np.asarray(input)
    scale = np.asarray(scale)
    if x.dtype.kind != "f" or scale.dtype != x.dtype:
        raise InvalidDTypeError(
            f"Scale element type ({scale.dtype}) must match input element type ({x.dtype}),"
            " which must be real"
        )
    real = _real(x.dtype, "nGraph Quantize input type (nGraph's kernels run f32 and f64)")
    qt = qtype(resolve_type(type, QUANTIZED_TYPES, "nGraph quantized type"))
    offset = np.asarray(zero_point)
    if offset.dtype != qt.dtype:
        raise InvalidDTypeError(
            f"Offset element type ({offset.dtype}) must match output element type ({qt.name})"
        )
    if round_mode not in ROUND_MODES:
        raise InvalidParameterError(
            f"unknown round_mode {round_mode!r}; expected one of: {', '.join(ROUND_MODES)}"
        )
    axes, moved_shape, flat = _gather_axes(x, scale, axes)
    s, z = scale.reshape(-1), offset.reshape(-1)
    layout = plan_layout(flat.shape, s.shape, 0 if axes else None, None)
    code = real_type_code(ROUND_MODES[round_mode])
    q = affine_quantize(flat, s, z, layout, qt, code=code, zp_dtype=real)
    return np.ascontiguousarray(_restore(q, axes, moved_shape))


def dequantize(
    input: npt.ArrayLike,
    scale: npt.ArrayLike,
    zero_point: npt.ArrayLike,
    *,
    type: object = "float32",
    axes: Iterable[int] = (),
) -> np.ndarray:
    """nGraph ``Dequantize``: ``(REAL)(q - offset) * scale`` in the real type ``type``
    ("f32", "f64" or qstream's "float32", "float64")."""
    q = np.asarray(input)
    if not any(q.dtype == qtype(n).dtype for n in QUANTIZED_TYPES.values()):
        raise InvalidDTypeError(
            f"Zero point / input element type ({q.dtype}) must be a quantized type (i8, u8 or i32)"
        )
    real = _real(type, "nGraph Dequantize output type")
    scale = np.asarray(scale)
    if scale.dtype != real:
        raise InvalidDTypeError(f"Scale element type ({scale.dtype}) must match output ({real})")
    offset = np.asarray(zero_point)
    if offset.dtype != q.dtype:
        raise InvalidDTypeError(
            f"Offset element type ({offset.dtype}) must match input ({q.dtype})"
        )
    axes, moved_shape, flat = _gather_axes(q, scale, axes)
    s, z = scale.reshape(-1), offset.reshape(-1)
    layout = plan_layout(flat.shape, s.shape, 0 if axes else None, None)
    y = affine_dequantize(flat, s, z, layout, qtype(q.dtype), real, integer_difference=True)
    return np.ascontiguousarray(_restore(y, axes, moved_shape))
