"""The packed layouts of llama.cpp's K-quant blocks, shared by the quantize and dequantize
kernels (:mod:`.kquants`): the 6-bit scales and mins of Q4_K/Q5_K (:func:`pack_k4` /
:func:`scale_min_k4`), the 6-bit signed scales of Q3_K (:func:`pack_k3` / :func:`scale_k3`)
and the 2-bit codes of Q2_K/Q3_K (:func:`pack_2bit`). (The float16 scales: ``put_half`` /
``half_at`` in :mod:`.kquants_search`.)"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from .kquants_search import QK_K

_OPTS: dict[str, Any] = {"cache": True, "nogil": True, "error_model": "numpy"}


@njit(inline="always", **_OPTS)
def pack_k4(s, j, ls, lm):
    """Q4_K/Q5_K: 6-bit scale ``ls`` and min ``lm`` of sub-block ``j`` into the 12 bytes."""
    if j < 4:
        s[j] = ls & 0xFF
        s[j + 4] = lm & 0xFF
    else:
        s[j + 4] = ((ls & 0xF) | ((lm & 0xF) << 4)) & 0xFF
        s[j - 4] = (np.int32(s[j - 4]) | ((ls >> 4) << 6)) & 0xFF
        s[j] = (np.int32(s[j]) | ((lm >> 4) << 6)) & 0xFF


@njit(inline="always", **_OPTS)
def scale_min_k4(s, j):
    """ggml's ``get_scale_min_k4``: the 6-bit scale and min of sub-block ``j``."""
    if j < 4:
        return np.int32(s[j]) & 63, np.int32(s[j + 4]) & 63
    b = np.int32(s[j + 4])
    sc = (b & 0xF) | ((np.int32(s[j - 4]) >> 6) << 4)
    m = (b >> 4) | ((np.int32(s[j]) >> 6) << 4)
    return sc, m


@njit(inline="always", **_OPTS)
def pack_k3(s, j, lv):
    """Q3_K: the 6-bit scale ``lv`` (0..63) of sub-block ``j`` into the 12 bytes."""
    if j < 8:
        s[j] = lv & 0xF
    else:
        s[j - 8] = (np.int32(s[j - 8]) | ((lv & 0xF) << 4)) & 0xFF
    s[j % 4 + 8] = (np.int32(s[j % 4 + 8]) | ((lv >> 4) << (2 * (j // 4)))) & 0xFF


@njit(inline="always", **_OPTS)
def scale_k3(s, j):
    """Q3_K: the signed scale (-32..31) of sub-block ``j``."""
    lo = (np.int32(s[j]) & 0xF) if j < 8 else (np.int32(s[j - 8]) >> 4)
    return (lo | (((np.int32(s[8 + j % 4]) >> (2 * (j // 4))) & 3) << 4)) - 32


@njit(**_OPTS)
def pack_2bit(L, qs):
    """Q2_K/Q3_K: 2-bit codes, byte ``32 * h + i`` holding values ``128 * h + i + 32 * k``
    in bits ``2k``."""
    for j in range(0, QK_K, 128):
        for lane in range(32):
            i = j + lane
            a = np.int32(L[i])
            b = np.int32(L[i + 32])
            c = np.int32(L[i + 64])
            e = np.int32(L[i + 96])
            qs[j // 4 + lane] = (a | (b << 2) | (c << 4) | (e << 6)) & 0xFF
