"""Compile (or load from Numba's cache) kernels ahead of need.

- :func:`warm_kernels`: the common jobs' kernels, in this process (a Dask worker at start-up
  does not stall its first task).
- :func:`run_full_jobs`: whole tiny jobs of given specs, serial and parallel builds (what each
  process of :func:`qstream.workflows.warm_up.warm_common`, ``qstream warm-up``, runs).
- :func:`warm_up`: the quantize pass's kernels of given specs, optionally in a background
  process. A first run on a machine compiles the calibration kernels in the job's process
  while a second process compiles the quantize pass's into Numba's on-disk cache, from
  which the job then loads them: on two cores the compile time of the first run is about
  halved. Nothing is started when those kernels are cached already. Before them it compiles
  the kernels a job of the specs runs after its quantize pass (the worst groups of a
  group-wise report, sub-byte packing): a dynamic spec has no calibration, and its job
  compiles its fused quantize kernel straight away, then those. (A checkpoint's packs and
  small tensors need neither: the job's process compiles the kernel that calibrates them
  while it quantizes, :func:`~qstream.engine.blocks.calibrate_rows_with_errors`.)
"""

from __future__ import annotations

import atexit
import json
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from ..spec import QuantSpec


def _both_paths(run: Callable[[], None]) -> None:
    """``run()`` twice: as jobs run it, and with every piece of rows that are channels taken
    by the fused quantize-and-sum kernel (``budget.FUSED_FROM``: 0), which warm-up's tiny
    jobs would otherwise never reach while a checkpoint's packs always do."""
    from .. import budget

    before = budget.FUSED_FROM
    try:
        for least in (before, 0):
            budget.FUSED_FROM = least
            run()
    finally:
        budget.FUSED_FROM = before


def warm_kernels() -> float:
    """Run tiny float32 -> int8 jobs (per-tensor min/max, per-channel percentile) through the
    engine in this process; returns the seconds it took. Kernels go to ``NUMBA_CACHE_DIR``
    when it is writable, so the next process loads instead of compiling."""
    import time

    import numpy as np

    from ..io.storage import MEMORY_STORES
    from ..spec import QuantSpec
    from .jobs import QuantizeJob

    t0 = time.perf_counter()
    x = np.linspace(-1.0, 1.0, 64 * 64, dtype=np.float32).reshape(64, 64)
    _run_calibrating(QuantSpec(dtype="int8", axis=0, method="minmax"), x)  # (a checkpoint's)
    for spec in (
        QuantSpec(dtype="int8", method="minmax"),
        QuantSpec(dtype="int8", axis=0, method="percentile"),
    ):

        def job(spec: QuantSpec = spec) -> None:
            name = f"qstream-warmup-{uuid.uuid4().hex}"
            try:
                QuantizeJob(x, spec).run(f"memory://{name}")
            finally:
                MEMORY_STORES.pop(name, None)

        _both_paths(job)
    return time.perf_counter() - t0


def run_full_jobs(
    specs: Sequence[QuantSpec],
    per_spec: Callable[[QuantSpec, str], None] | None = None,
    after: Callable[[str], None] | None = None,
) -> None:
    """Whole tiny jobs (calibration, quantize, report, dequantize) of ``specs``, with the
    serial and then the parallel builds of the kernels, the kernels (not their NumPy twins)
    however small; ``per_spec(spec, folder)`` runs more of each spec's jobs and
    ``after(folder)`` more jobs, under each build (``folder``: a temporary one for their
    files). A line on stdout as each spec's jobs are done (what ``qstream warm-up`` counts)."""
    import numpy as np

    from .. import budget
    from ..io.storage import MEMORY_STORES
    from ..kernels import runtime
    from .jobs import QuantizeJob, dequantize

    x = np.linspace(-1.0, 1.0, 64 * 256, dtype=np.float32).reshape(64, 256)
    before = runtime.SERIAL_BELOW
    budget.NUMPY_JOB = 0  # (this process's jobs are tiny: they would run the NumPy twins)
    with tempfile.TemporaryDirectory(prefix="qstream-warm-up-") as folder:
        try:
            for serial_below in (1 << 62, 0):
                runtime.SERIAL_BELOW = serial_below
                for spec in specs:

                    def job(spec: QuantSpec = spec) -> None:
                        names = [f"qstream-warmup-{uuid.uuid4().hex}" for _ in range(2)]
                        try:
                            QuantizeJob(x, spec).run(f"memory://{names[0]}")
                            dequantize(f"memory://{names[0]}", f"memory://{names[1]}")
                        finally:
                            for name in names:
                                MEMORY_STORES.pop(name, None)

                    _both_paths(job)
                    _run_fused(spec, x)
                    _run_calibrating(spec, x)
                    if per_spec is not None:
                        per_spec(spec, folder)
                    print(json.dumps(spec.to_dict()), flush=True)  # (a line for warm_common)
                if after is not None:
                    after(folder)
        finally:
            runtime.SERIAL_BELOW = before


def _run_fused(spec: QuantSpec, x: np.ndarray) -> None:
    """For a dynamic spec, every build of the fused quantize kernel its jobs may run: groups
    along the rows and down the columns (blocked along the last axis or an outer one), for
    finite values and with a NaN (the builds that handle them)."""
    import numpy as np

    from ..qtypes import qtype
    from .blocks import dynamic_blocked

    if spec.method != "dynamic" or not spec.block_size:
        return
    qt = qtype(spec.dtype)
    bad = x.copy()
    bad[0, 0] = np.nan
    for values in (x, bad):
        for axis in (0, 1):
            dynamic_blocked(values, qt, spec, axis, np.empty(values.shape, qt.dtype), True)


def _run_calibrating(spec: QuantSpec, x: np.ndarray) -> None:
    """A one-block job of ``spec`` kept in memory, as a checkpoint's packs and small tensors
    run (:func:`~qstream.engine.jobs.calibrated_in_memory`): for a spec calibrated by its
    ranges, the kernel that takes a job's ranges, parameters and codes at once (a per-tensor
    spec's packs are per channel on axis 0: a tensor a row)."""
    from dataclasses import replace

    from .jobs import QuantizeJob, calibrated_in_memory
    from .run import InlineExecutor

    if spec.block_size or spec.scale is not None or spec.axis not in (None, 0, -2):
        return  # (not calibrated by ranges, or not per channel on the rows of 2-D ``x``)
    job = QuantizeJob(x, replace(spec, axis=0), executor=InlineExecutor())
    try:
        job.source.pinned = x
        calibrated_in_memory(job)
    finally:
        job.close()


def _run_after_pass(specs: Sequence[QuantSpec]) -> None:
    """The kernels a job of ``specs`` runs after its quantize pass: the worst groups of a
    group-wise spec's report, the packing of sub-byte codes."""
    import numpy as np

    from ..kernels.error_stats import worst_candidates
    from ..kernels.packing import pack_codes
    from ..qtypes import qtype
    from ..spec import WorstGroups

    if any(s.block_size for s in specs):
        worst_candidates(np.ones(4), np.ones(4), WorstGroups.KEEP, 1.0 + 1e-9)
    for bits in sorted({qtype(s.dtype).bits for s in specs} & {2, 4}):
        pack_codes(np.zeros(8, np.uint8), bits, np.zeros(8, np.uint8))


def _quantize_pass_specs(specs: Iterable[QuantSpec]) -> list[QuantSpec]:
    """Explicit-scale versions of ``specs``: the same quantize pass with no calibration."""
    from dataclasses import replace

    out = []
    for spec in specs:
        if spec.method != "dynamic" and spec.scale is None:
            spec = replace(spec, method="minmax", scale=0.01, zero_point=None)
        if spec not in out:
            out.append(spec)
    return out


def _run_quantize_passes(specs: Sequence[QuantSpec], parallel: bool) -> None:
    import numpy as np

    from ..io.storage import MEMORY_STORES
    from ..kernels import runtime
    from .jobs import QuantizeJob

    before = runtime.SERIAL_BELOW
    runtime.SERIAL_BELOW = 0 if parallel else 1 << 62
    x = _Tensor(np.linspace(-1.0, 1.0, 64 * 64, dtype=np.float32).reshape(64, 64))
    try:
        for spec in _quantize_pass_specs(specs):

            def job(spec: QuantSpec = spec) -> None:
                name = f"qstream-warmup-{uuid.uuid4().hex}"
                try:
                    QuantizeJob(x, spec).run(f"memory://{name}")
                except Exception:  # a spec this tiny array cannot take (e.g. a bad axis): skip
                    pass
                finally:
                    MEMORY_STORES.pop(name, None)

            _both_paths(job)
    finally:
        runtime.SERIAL_BELOW = before


def warm_up(
    specs: Iterable[QuantSpec], *, background: bool = False
) -> subprocess.Popen[bytes] | None:
    """Compile the quantize pass's kernels of ``specs`` (serial builds first, then parallel
    ones) into Numba's cache, and before them the kernels their jobs run after that pass.
    ``background``: in a separate process, started only on a first run (no build of the
    specs' quantize kernels cached yet; the process is ended when this one exits); returns
    it."""
    specs = list(specs)
    if not background:
        _run_after_pass(specs)
        _run_quantize_passes(specs, parallel=False)
        _run_quantize_passes(specs, parallel=True)
        return None
    from ..kernels.runtime import cached_somewhere

    if all(
        any(cached_somewhere(k) or cached_somewhere(k.serial) for k in _pass_kernels(s))
        for s in specs
    ):
        return None  # not a first run
    payload = json.dumps([s.to_dict() for s in specs])
    proc = subprocess.Popen(
        [sys.executable, "-m", "qstream.engine.warmup", payload],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    atexit.register(end_process, proc)
    return proc


def _pass_kernels(spec: QuantSpec) -> list[Any]:
    """The kernels (parallel builds, with their serial twins) a quantize pass of ``spec``
    runs: the fused kernel's builds for finite values, either layout, for a dynamic spec it
    applies to, else the quantize kernel of its round mode."""
    from ..qtypes import qtype
    from .blocks import fused_applies

    if spec.method == "dynamic" and fused_applies(qtype(spec.dtype), spec):
        from ..kernels import blocked

        return [blocked.dynamic_kernel(1, finite=True), blocked.dynamic_kernel(2, finite=True)]
    from ..kernels.affine import QUANTIZE_KERNELS
    from ..rounding import round_code

    return [QUANTIZE_KERNELS[round_code(spec.round_mode)]]


class _Tensor:
    """A warm-up job's source read by slices, as checkpoint tensors are (a NumPy source is
    also hashed for the job's identity, a kernel that a checkpoint conversion never runs)."""

    name = "warm-up"

    def __init__(self, values: np.ndarray) -> None:
        self.values = values
        self.shape = values.shape
        self.dtype = values.dtype

    def __getitem__(self, key: Any) -> np.ndarray:
        """The values at ``key`` (a slice of the tensor)."""
        part: np.ndarray = self.values[key]
        return part


def end_process(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc`` if it still runs, and wait for it."""
    if proc.poll() is None:
        proc.kill()  # Numba writes cache files by rename: a kill leaves none half-written
        proc.wait()


if __name__ == "__main__":  # the background process of warm_up
    from ..spec import QuantSpec

    warm_up([QuantSpec.from_dict(d) for d in json.loads(sys.argv[1])])
