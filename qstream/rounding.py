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
