"""Round modes: their names and the integer codes the kernels use.

The nine modes are nGraph's (``ROUND_NEAREST_TOWARD_EVEN`` ... ``ROUND_DOWN``); every one is
mathematically exact on the float quotient (no ``x + 0.5`` double rounding).
"""

from __future__ import annotations

from .errors import InvalidParameterError

ROUND_MODES: tuple[str, ...] = (
    "half_to_even",
    "half_away_from_zero",
    "half_toward_zero",
    "half_up",
    "half_down",
    "up",
    "down",
    "toward_zero",
    "away_from_zero",
)

# Element operations beyond "round(x / scale) + zero_point": torch's and oneDNN's forms.
OP_MUL_ADD = len(ROUND_MODES)  # rint(x * inv_scale + zp), unfused (torch per-channel, qint32)
OP_FMA = OP_MUL_ADD + 1  # rint(fma(x, inv_scale, zp))          (torch per-tensor 8-bit)
OP_DIV_ADD = OP_FMA + 1  # rint(x / scale + zp), zp added before rounding (oneDNN)
# Operations whose quotient/product is formed in float32 whatever the input type.
FLOAT32_OPS = (OP_MUL_ADD, OP_FMA, OP_DIV_ADD)

# nGraph's nearest modes as its reference kernel writes them, every step in the input's real
# type R: ``floor(q + R(0.5))`` and ``ceil(q - R(0.5))`` are rounded in R (so, in float32,
# 0.49999997 goes up to 1 and odd integers in [2**23, 2**24) move by one), then ``+ R(zp)`` in
# R. The four directed modes are exact in R already and keep their codes (``real_type_code``).
OP_REAL_HALF_AWAY_FROM_ZERO = OP_DIV_ADD + 1
OP_REAL_HALF_TOWARD_ZERO = OP_REAL_HALF_AWAY_FROM_ZERO + 1
OP_REAL_HALF_UP = OP_REAL_HALF_TOWARD_ZERO + 1
OP_REAL_HALF_DOWN = OP_REAL_HALF_UP + 1
OP_REAL_HALF_TO_EVEN = OP_REAL_HALF_DOWN + 1
_REAL_TYPE_CODES = {
    "half_away_from_zero": OP_REAL_HALF_AWAY_FROM_ZERO,
    "half_toward_zero": OP_REAL_HALF_TOWARD_ZERO,
    "half_up": OP_REAL_HALF_UP,
    "half_down": OP_REAL_HALF_DOWN,
    "half_to_even": OP_REAL_HALF_TO_EVEN,
}


def round_code(mode: str | int) -> int:
    """The kernel code of a round mode name (or a code already)."""
    if isinstance(mode, int) and 0 <= mode < len(ROUND_MODES):
        return mode
    try:
        return ROUND_MODES.index(str(mode).lower())
    except ValueError:
        raise InvalidParameterError(
            f"unknown round_mode {mode!r}; expected one of: {', '.join(ROUND_MODES)}"
        ) from None


def real_type_code(mode: str | int) -> int:
    """The kernel code evaluating round mode ``mode`` the way nGraph's reference kernel does,
    in the input's real type (the ``OP_REAL_*`` codes; directed modes are already exact)."""
    code = round_code(mode)
    return _REAL_TYPE_CODES.get(ROUND_MODES[code], code)
