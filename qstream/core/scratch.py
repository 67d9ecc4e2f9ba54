"""Per-thread reusable buffers for the streaming engine.

A worker takes block after block through the same steps; reusing its buffers avoids faulting in
fresh pages for every block (on a VM that returns free memory to its host, a fresh page costs
~10 us: 2.4 ms per MiB, measured). A buffer is valid until the same thread asks for the same
name again. Buffers start on a 4 KiB boundary, as ``O_DIRECT`` writes require.
"""

from __future__ import annotations

import math
import threading

import numpy as np

_local = threading.local()


def scratch(name: str, shape, dtype) -> np.ndarray:
    """A C-contiguous array of ``shape``/``dtype`` owned by this thread, reused across calls
    with the same ``name`` (its contents are undefined)."""
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    nbytes = max(1, math.prod(shape) * dtype.itemsize)
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    raw = bufs.get(name)
    if raw is None or raw.nbytes < nbytes:
        raw = bufs[name] = aligned_empty(nbytes)
    return raw[:nbytes].view(dtype)[: math.prod(shape)].reshape(shape)


ALIGN = 4096


def aligned_empty(nbytes: int) -> np.ndarray:
    """``nbytes`` uint8, starting on an ``ALIGN`` boundary."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + nbytes]
