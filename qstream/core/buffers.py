"""A bounded pool of large output buffers, so repeated calls do not fault in fresh pages.

Each large result array is built on a pooled raw buffer through a ``memoryview`` (not an
ndarray), so NumPy does not collapse views past it: every view of the result keeps it alive,
and only when the last one is gone does its buffer go back to the pool. The pool keeps at
most ``QSTREAM_BUFFER_POOL`` bytes (default 512 MiB; 0 disables it).
"""

from __future__ import annotations

import math
import os
import threading
import weakref

import numpy as np

MIN_BYTES = 8 << 20
LIMIT = int(os.environ.get("QSTREAM_BUFFER_POOL", 512 << 20))

_lock = threading.Lock()
_free: dict[int, list[np.ndarray]] = {}
_held = [0]


def empty(shape, dtype) -> np.ndarray:
    """Like ``np.empty``; large arrays come from (and later return to) the pool."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if LIMIT <= 0 or nbytes < MIN_BYTES:
        return np.empty(shape, dtype)
    with _lock:
        bucket = _free.get(nbytes)
        raw = bucket.pop() if bucket else None
        if raw is not None:
            _held[0] -= nbytes
    if raw is None:
        raw = np.empty(nbytes, np.uint8)
    owner = np.frombuffer(raw.data, dtype=dtype)
    weakref.finalize(owner, _release, raw)
    return owner.reshape(shape)


def _release(raw: np.ndarray) -> None:
    with _lock:
        if _held[0] + raw.nbytes <= LIMIT:
            _free.setdefault(raw.nbytes, []).append(raw)
            _held[0] += raw.nbytes


def clear() -> None:
    """Drop every pooled buffer (returns the memory to the system)."""
    with _lock:
        _free.clear()
        _held[0] = 0
