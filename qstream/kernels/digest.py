"""A fast content digest of an array's bytes, for job identity (not for security).

The bytes are cut into fixed 1 MiB tiles (so the result does not depend on the thread count);
each tile is hashed by a 64-bit multiply-xorshift over its little-endian 8-byte words (four
independent lanes, so it runs near memory speed), with the tile's index and length mixed in.
The caller hashes the tile hashes with BLAKE2b.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .runtime import njit, parallel_kernel

TILE = 1 << 20
_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


@njit(inline="always", cache=True)
def _mix(h):
    h ^= h >> np.uint64(30)
    h *= _M2
    h ^= h >> np.uint64(27)
    h *= _M3
    h ^= h >> np.uint64(31)
    return h


@parallel_kernel(inputs=2)
def tile_hashes(words, tail, out):
    """``out[t]``: the hash of tile ``t`` of ``words`` (uint64, the array's bytes) followed by
    the ``tail`` bytes (uint8, the last ``nbytes % 8``) in the last tile."""
    n = words.size
    per = TILE // 8
    n_tiles = out.size
    for t in prange(n_tiles):
        i0 = t * per
        i1 = min(n, i0 + per)
        a = np.uint64(t) * _M1 + np.uint64(1)
        b = a ^ _M2
        c = a ^ _M3
        d = a + _M1
        i = i0
        while i + 4 <= i1:
            a = (a ^ words[i]) * _M1
            b = (b ^ words[i + 1]) * _M1
            c = (c ^ words[i + 2]) * _M1
            d = (d ^ words[i + 3]) * _M1
            i += 4
        while i < i1:
            a = (a ^ words[i]) * _M1
            i += 1
        h = _mix(a) ^ _mix(b + _M1) ^ _mix(c + _M2) ^ _mix(d + _M3)
        if t == n_tiles - 1:
            for j in range(tail.size):
                h = _mix(h ^ np.uint64(tail[j]))
        out[t] = _mix(h ^ np.uint64(i1 - i0))
