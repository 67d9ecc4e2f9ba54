"""Compile (or load from Numba's cache) kernels ahead of need.

- :func:`warm_kernels`: the common jobs' kernels, in this process (a Dask worker at start-up
  does not stall its first task).
- :func:`warm_common`: every kernel of the common job kinds, in parallel processes (``qstream
  warm-up``: once per machine or image).
- :func:`warm_up`: the quantize pass's kernels of given specs, optionally in a background
  process. A first run on a machine compiles the calibration kernels in the job's process
  while a second process compiles the quantize pass's into Numba's on-disk cache, from
  which the job then loads them: on two cores the compile time of the first run is about
  halved. Nothing is started when those kernels are cached already.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
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


#: the job kinds ``qstream warm-up`` compiles: checkpoint conversions and store jobs users
#: run most (int8 per tensor / per channel / percentile, int4 and int8 groups, asymmetric
#: uint8 and uint4 groups, float8)
COMMON_SPECS = (
    {"dtype": "int8"},
    {"dtype": "int8", "axis": 0},
    {"dtype": "int8", "axis": 0, "method": "percentile"},
    {"dtype": "int4", "axis": 1, "block_size": 32, "method": "dynamic"},
    {"dtype": "int8", "axis": 1, "block_size": 32, "method": "dynamic"},
    {"dtype": "uint8", "symmetric": False},
    {"dtype": "uint4", "axis": 1, "block_size": 32, "method": "dynamic", "symmetric": False},
    {"dtype": "float8_e4m3fn", "axis": 0},
)


def warm_common(processes: int | None = None) -> dict:
    """Compile every kernel the common job kinds (:data:`COMMON_SPECS`: calibration,
    quantize and report passes, serial and parallel builds, and their dequantize) into
    Numba's on-disk cache, spread over ``processes`` processes (default: the cores), so that
    no later job on this machine compiles them: what a Dockerfile, a cron host or a Dask
    worker image runs once. Returns the specs compiled and the seconds it took."""
    import time

    t0 = time.perf_counter()
    n = max(1, min(len(COMMON_SPECS), processes or os.cpu_count() or 1))
    shares = [list(COMMON_SPECS[i::n]) for i in range(n)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "qstream.engine.warmup", json.dumps(share), "--full"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for share in shares
    ]
    failed = []
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            failed.append(err.decode(errors="replace").strip().splitlines()[-1:])
    if failed:
        from ..errors import QStreamError

        raise QStreamError(f"warming the kernels failed: {failed[0]}")
    return {"specs": list(COMMON_SPECS), "seconds": time.perf_counter() - t0}


def _run_full_jobs(specs) -> None:
    """Whole tiny jobs (calibration, quantize, report, dequantize) of ``specs``, with the
    serial and then the parallel builds of the kernels."""
    import numpy as np

    from ..io.stores import _MEMORY_STORES
    from ..kernels import runtime
    from .job import QuantizeJob, dequantize

    x = np.linspace(-1.0, 1.0, 64 * 256, dtype=np.float32).reshape(64, 256)
    before = runtime.SERIAL_BELOW
    try:
        for serial_below in (1 << 62, 0):
            runtime.SERIAL_BELOW = serial_below
            for spec in specs:
                names = [f"qstream-warmup-{uuid.uuid4().hex}" for _ in range(2)]
                try:
                    QuantizeJob(x, spec).run(f"memory://{names[0]}")
                    dequantize(f"memory://{names[0]}", f"memory://{names[1]}")
                finally:
                    for name in names:
                        _MEMORY_STORES.pop(name, None)
    finally:
        runtime.SERIAL_BELOW = before


def _quantize_pass_specs(specs):
    """Explicit-scale versions of ``specs``: the same quantize pass with no calibration."""
    from dataclasses import replace

    out = []
    for spec in specs:
        if spec.method != "dynamic" and spec.scale is None:
            spec = replace(spec, method="minmax", scale=0.01, zero_point=None)
        if spec not in out:
            out.append(spec)
    return out


def _run_quantize_passes(specs, parallel: bool) -> None:
    import numpy as np

    from ..io.stores import _MEMORY_STORES
    from ..kernels import runtime
    from .job import QuantizeJob

    before = runtime.SERIAL_BELOW
    runtime.SERIAL_BELOW = 0 if parallel else 1 << 62
    x = np.linspace(-1.0, 1.0, 64 * 64, dtype=np.float32).reshape(64, 64)
    try:
        for spec in _quantize_pass_specs(specs):
            name = f"qstream-warmup-{uuid.uuid4().hex}"
            try:
                QuantizeJob(x, spec).run(f"memory://{name}")
            except Exception:  # a spec this tiny array cannot take (e.g. a bad axis): skip
                pass
            finally:
                _MEMORY_STORES.pop(name, None)
    finally:
        runtime.SERIAL_BELOW = before


def _cached(kernel) -> bool:
    """Whether Numba's on-disk cache holds some build of ``kernel`` (best effort)."""
    try:
        return os.path.exists(kernel._cache._cache_file._index_path)
    except AttributeError:
        return True  # unknown: do not start anything


def warm_up(specs, *, background: bool = False) -> subprocess.Popen | None:
    """Compile the quantize pass's kernels of ``specs`` (serial builds first, then parallel
    ones) into Numba's cache. ``background``: in a separate process, started only on a first
    run (no build of the specs' quantize kernels cached yet; the process is ended when this
    one exits); returns it."""
    specs = list(specs)
    if not background:
        _run_quantize_passes(specs, parallel=False)
        _run_quantize_passes(specs, parallel=True)
        return None
    from ..kernels.affine import QUANTIZE_KERNELS
    from ..rounding import round_code

    kernels = [QUANTIZE_KERNELS[round_code(s.round_mode)] for s in specs]
    if all(_cached(k.serial) for k in kernels):  # not a first run
        return None
    payload = json.dumps([s.to_dict() for s in specs])
    proc = subprocess.Popen(
        [sys.executable, "-m", "qstream.engine.warmup", payload],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    atexit.register(_end, proc)
    return proc


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()  # Numba writes cache files by rename: a kill leaves none half-written
        proc.wait()


if __name__ == "__main__":  # the background process of warm_up, or one of warm_common's
    from ..spec import QuantSpec

    wanted = [QuantSpec.from_dict(d) for d in json.loads(sys.argv[1])]
    if sys.argv[2:] == ["--full"]:
        _run_full_jobs(wanted)
    else:
        _run_quantize_passes(wanted, parallel=False)
        _run_quantize_passes(wanted, parallel=True)
