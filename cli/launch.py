"""The ``qstream`` console script's first step: what must be settled before NumPy is imported,
then :func:`cli.main.console`. It imports nothing but the standard library until then.

NumPy's wheels bundle OpenBLAS, which starts a pool of threads (one per core, less one) when
NumPy is imported, and those threads spin for a while waiting for work. No qstream kernel
calls BLAS, so the spin only takes CPU from the job's own threads: 0.1 s of CPU in a
conversion of 1 GiB on 2 cores, 20-30 ms of its wall time (``benchmarks/README.md``).
:func:`console` imports NumPy with ``OPENBLAS_NUM_THREADS=1`` (no pool), unless the variable
is set already, and then puts the environment back as it was, so the programs qstream starts
inherit the user's.
"""

from __future__ import annotations

import os
import sys

#: the variables OpenBLAS reads for its pool's size when it is loaded (the first wins)
OPENBLAS_THREADS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def import_numpy_without_blas_pool() -> bool:
    """Import NumPy with OpenBLAS's thread pool off, leaving ``os.environ`` as it was; whether
    it was off (False: NumPy was imported already, or the user sets the pool's size)."""
    if "numpy" in sys.modules or any(os.environ.get(v) for v in OPENBLAS_THREADS):
        return False
    before = os.environ.get("OPENBLAS_NUM_THREADS")  # (None, or set but empty)
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        if before is None:
            del os.environ["OPENBLAS_NUM_THREADS"]
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = before
    return True


def console() -> None:  # pragma: no cover - console entry point
    """The ``qstream`` console script: NumPy imported without OpenBLAS's pool, then
    :func:`cli.main.console` (which never returns)."""
    import_numpy_without_blas_pool()
    from .main import console as run

    run()
