"""nGraph ``Quantize`` / ``Dequantize`` (``runtime/reference/quantize.hpp``, ``dequantize.hpp``).

``q = clamp(ROUND(input / scale) + offset, Tmin, Tmax)`` computed in the input's real type, with
scale and offset indexed by the projection of the element's coordinate on ``axes`` (any set of
axes; empty = per-tensor). All nine round modes are exact: nGraph's C++ forms such as
``floor(q + 0.5)`` are evaluated in double there, where they are exact for float inputs.
NaN reaches an undefined float-to-int cast in nGraph; this profile gives the type's minimum.
Dequantize: ``(REAL)(q - offset) * scale``.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..core.affine import affine_dequantize, affine_quantize
from ..core.layout import plan_layout
from ..errors import InvalidDTypeError, InvalidParameterError
from ..qtypes import float_dtype, is_qtype_dtype, qtype
from ..rounding import round_code

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


def _gather_axes(x: np.ndarray, scale: np.ndarray, axes: Iterable[int]):
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


def _restore(y: np.ndarray, axes, moved_shape) -> np.ndarray:
    return np.moveaxis(y.reshape(moved_shape), list(range(len(axes))), axes)


def quantize(
    input,
    scale,
    zero_point,
    *,
    type,
    axes: Iterable[int] = (),
    round_mode: str = "ROUND_NEAREST_TOWARD_EVEN",
) -> np.ndarray:
    """nGraph ``Quantize``; ``type`` is the quantized element type (e.g. "int8", "u8")."""
    x = np.asarray(input)
    scale = np.asarray(scale)
    if x.dtype.kind != "f" or scale.dtype != x.dtype:
        raise InvalidDTypeError(
            f"Scale element type ({scale.dtype}) must match input element type ({x.dtype}),"
            " which must be real"
        )
    qt = qtype({"i8": "int8", "u8": "uint8", "i32": "int32"}.get(type, type))
    offset = np.asarray(zero_point)
    if offset.dtype != qt.dtype:
        raise InvalidDTypeError(
            f"Offset element type ({offset.dtype}) must match output element type ({qt.name})"
        )
    if round_mode not in ROUND_MODES:
        raise InvalidParameterError(f"unknown round_mode {round_mode!r}")
    axes, moved_shape, flat = _gather_axes(x, scale, axes)
    s, z = scale.reshape(-1), offset.reshape(-1).astype(np.float64)
    layout = plan_layout(flat.shape, s.shape, 0 if axes else None, None)
    q = affine_quantize(flat, s, z, layout, qt, code=round_code(ROUND_MODES[round_mode]))
    return np.ascontiguousarray(_restore(q, axes, moved_shape))


def dequantize(input, scale, zero_point, *, type="float32", axes: Iterable[int] = ()) -> np.ndarray:
    """nGraph ``Dequantize``: ``(REAL)(q - offset) * scale`` in the real type ``type``."""
    q = np.asarray(input)
    if not is_qtype_dtype(q.dtype):
        raise InvalidDTypeError(f"input must be quantized, got {q.dtype}")
    real = float_dtype(type)
    scale = np.asarray(scale)
    if scale.dtype != real:
        raise InvalidDTypeError(f"Scale element type ({scale.dtype}) must match output ({real})")
    offset = np.asarray(zero_point)
    if offset.dtype != q.dtype:
        raise InvalidDTypeError(
            f"Offset element type ({offset.dtype}) must match input ({q.dtype})"
        )
    axes, moved_shape, flat = _gather_axes(q, scale, axes)
    s, z = scale.reshape(-1), offset.reshape(-1).astype(np.float64)
    layout = plan_layout(flat.shape, s.shape, 0 if axes else None, None)
    y = affine_dequantize(flat, s, z, layout, qtype(q.dtype), real)
    return np.ascontiguousarray(_restore(y, axes, moved_shape))
