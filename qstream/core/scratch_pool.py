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

# Buffers of threads that have ended, for the next threads: a job's worker threads end with
# the job, and a conversion runs one job per tensor, so without this each tensor's workers
# would fault in their buffers afresh. Bounded: beyond SPARE_LIMIT bytes they are freed.
SPARE_LIMIT = 512 << 20
_spare: list[np.ndarray] = []
_spare_lock = threading.Lock()


class _ThreadBuffers(dict):
    """One thread's buffers by name; handed to the spare list when the thread ends."""

    def __del__(self) -> None:
        with _spare_lock:
            held = sum(b.nbytes for b in _spare)
            for raw in self.values():
                if held + raw.nbytes <= SPARE_LIMIT:
                    _spare.append(raw)
                    held += raw.nbytes


def _from_spare(nbytes: int) -> np.ndarray | None:
    """The smallest spare buffer of at least ``nbytes`` (and at most 4x that), if any."""
    with _spare_lock:
        fits = [i for i, b in enumerate(_spare) if nbytes <= b.nbytes <= 4 * nbytes]
        if not fits:
            return None
        i = min(fits, key=lambda i: _spare[i].nbytes)
        return _spare.pop(i)


def scratch(name: str, shape, dtype) -> np.ndarray:
    """A C-contiguous array of ``shape``/``dtype`` owned by this thread, reused across calls
    with the same ``name`` (its contents are undefined)."""
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    nbytes = max(1, math.prod(shape) * dtype.itemsize)
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = _ThreadBuffers()
    raw = bufs.get(name)
    if raw is None or raw.nbytes < nbytes:
        raw = _from_spare(nbytes)
        bufs[name] = raw if raw is not None else aligned_empty(nbytes)
        raw = bufs[name]
    return raw[:nbytes].view(dtype)[: math.prod(shape)].reshape(shape)


ALIGN = 4096


def aligned_empty(nbytes: int) -> np.ndarray:
    """``nbytes`` uint8, starting on an ``ALIGN`` boundary."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + nbytes]
