"""Compile (or load from Numba's cache) the kernels the common jobs use, ahead of the first
block: a worker that does this at start-up does not stall its first task."""

from __future__ import annotations

import uuid


def warm_kernels() -> float:
    """Run tiny float32 -> int8 jobs (per-tensor min/max, per-channel percentile) through the
    engine in this process; returns the seconds it took. Kernels go to ``NUMBA_CACHE_DIR``
    when it is writable, so the next process loads instead of compiling."""
    import time

    import numpy as np

    from ..io.stores import _MEMORY_STORES
    from ..spec import QuantSpec
    from .job import QuantizeJob

    t0 = time.perf_counter()
    x = np.linspace(-1.0, 1.0, 64 * 64, dtype=np.float32).reshape(64, 64)
    for spec in (
        QuantSpec(dtype="int8", method="minmax"),
        QuantSpec(dtype="int8", axis=0, method="percentile"),
    ):
        name = f"qstream-warmup-{uuid.uuid4().hex}"
        try:
            QuantizeJob(x, spec).run(f"memory://{name}")
        finally:
            _MEMORY_STORES.pop(name, None)
    return time.perf_counter() - t0
