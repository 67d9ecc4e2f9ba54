"""Calling kernels safely: Numba's threading layer and thread counts.

Numba's ``workqueue`` layer aborts the process when two Python threads run parallel kernels at
once. qstream prefers ``omp`` then ``tbb``; if Numba still ends up on ``workqueue``, kernel
calls are serialised with a lock instead of crashing.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

import numba

if "NUMBA_THREADING_LAYER" not in os.environ and "NUMBA_THREADING_LAYER_PRIORITY" not in os.environ:
    numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]

_lock = threading.Lock()
_serial: bool | None = None  # unknown until the first parallel call has chosen a layer


def run(kernel, *args) -> None:
    """Call ``kernel(*args)``, serialised when the threading layer is not thread-safe."""
    global _serial
    if _serial is False:
        kernel(*args)
        return
    with _lock:
        kernel(*args)
        if _serial is None:
            _serial = threading_layer() == "workqueue"


def threading_layer() -> str | None:
    """The threading layer Numba chose, or None before the first parallel call."""
    try:
        return numba.threading_layer()
    except ValueError:
        return None


@contextmanager
def num_threads(n: int | None):
    """Limit Numba's threads for kernels called from this thread (``None``: leave as is)."""
    if n is None:
        yield
        return
    old = numba.get_num_threads()
    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))
    try:
        yield
    finally:
        numba.set_num_threads(old)
