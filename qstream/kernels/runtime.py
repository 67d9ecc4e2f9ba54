"""Calling kernels safely: Numba's threading layer.

Numba's ``workqueue`` layer aborts the process when two Python threads run parallel kernels at
once. qstream prefers ``omp`` then ``tbb``; if Numba still ends up on ``workqueue``, kernel
calls are serialised with a lock instead of crashing.
"""

from __future__ import annotations

import os
import threading

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


def kernel_threads() -> int:
    """The number of threads kernels called from this thread use."""
    return numba.get_num_threads()


def limit_threads(n: int) -> None:
    """Let kernels called from this thread use ``n`` threads (Numba's setting is per thread)."""
    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))
