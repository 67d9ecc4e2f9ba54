"""The fused group-wise kernel's builds: rows and columns, for finite input and complete, give
the same bytes; warm-up compiles each; the background warm-up of a dynamic spec."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qstream as qs
from qstream.engine.blocks.blockmath import block_errors_fused, dynamic_blocked
from qstream.kernels import affine, blocked, runtime
from qstream.qtypes import qtype


def _args(x, qt, spec, axis):
    """The fused kernels' arguments for ``x`` (as ``dynamic_blocked`` makes them)."""
    from qstream.calibration.params import symmetric_steps
    from qstream.core.layout import blocked_param_shape, plan_layout
    from qstream.kernels.error_stats import N_SUMS

    bs = spec.block_size
    layout = plan_layout(x.shape, blocked_param_shape(x.shape, axis, bs), axis, bs)
    qmin, qmax = qt.qrange(False)
    mode = affine.SYM_SIGNED if qt.signed else affine.SYM_UNSIGNED
    steps, zp = symmetric_steps(qt, False, False)
    if not spec.symmetric:
        mode, steps, zp = affine.ASYM, 1.0, 0.0
    p = layout.pshape3
    return layout, (
        layout.view(x), layout.cblock, layout.iblock, mode, float(qmin), float(qmax), steps,
        zp, np.float32(qmin), np.float32(qt.qmax), np.int32(qt.mask if qt.bits < 8 else 0),
        False, np.empty(p, np.float32), np.empty(p, np.float32),
        layout.view(np.empty(x.shape, qt.widened)), np.zeros(p[0] * p[1], np.int64), True,
        np.zeros((1, N_SUMS)), np.zeros(p), np.zeros(p), np.zeros(p),
    )  # fmt: skip


@pytest.mark.parametrize("serial_below", [1 << 62, 0], ids=["serial", "parallel"])
@pytest.mark.parametrize("axis", [0, 1], ids=["columns", "rows"])
@pytest.mark.parametrize("dtype, sym", [("int4", True), ("uint4", False)])
def test_the_finite_build_gives_the_complete_builds_bytes_and_leaves_nan_to_it(
    monkeypatch, serial_below, axis, dtype, sym
):
    monkeypatch.setattr(runtime, "SERIAL_BELOW", serial_below)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((96, 200)) * rng.uniform(0.01, 3, (96, 1))).astype(np.float32)
    spec = qs.QuantSpec(dtype=dtype, axis=axis, block_size=32, method="dynamic", symmetric=sym)
    qt = qtype(dtype)
    layout, finite = _args(x, qt, spec, axis)
    _, complete = _args(x, qt, spec, axis)
    runtime.run(blocked.dynamic_kernel(layout.iblock, finite=True), *finite)
    runtime.run(blocked.dynamic_kernel(layout.iblock), *complete)
    for a, b in zip(finite, complete, strict=True):
        if isinstance(a, np.ndarray):
            assert a.tobytes() == b.tobytes()
    assert not finite[15].any()  # no piece held NaN or inf

    x[50, 70] = np.nan
    _, args = _args(x, qt, spec, axis)
    runtime.run(blocked.dynamic_kernel(layout.iblock, finite=True), *args)
    assert (args[15] == -1).sum() == 1  # the piece with the NaN: left to the complete build
    q = np.empty(x.shape, qt.dtype)
    s, z, _, nonfinite, (stats, groups) = dynamic_blocked(x, qt, spec, axis, q, True)
    assert nonfinite == 1 and int(stats.nan[0]) == 1
    want = tuple(np.zeros(layout.pshape3) for _ in range(3))
    ref = block_errors_fused(x, q, s, z, layout, qt, qt.qrange(False)[0], None, want)
    assert stats.sum_e2.tobytes() == ref.sum_e2.tobytes()
    for got, exp in zip(groups, want, strict=True):
        assert got.tobytes() == exp.tobytes()


def test_groups_of_one_along_rows_of_one_take_their_error_sums():
    """A (N, 1) tensor in groups of 1 along axis 1: the error sums of its single-element
    rows are the error kernel's (the fused pass once left them at zero)."""
    x = np.random.default_rng(1).standard_normal((40, 1)).astype(np.float32)
    x[3, 0] = np.inf
    spec = qs.QuantSpec(dtype="int8", axis=1, block_size=1, method="dynamic")
    qt = qtype("int8")
    q = np.empty(x.shape, np.int8)
    s, z, layout, nonfinite, (stats, groups) = dynamic_blocked(x, qt, spec, 1, q, True)
    want = tuple(np.zeros(layout.pshape3) for _ in range(3))
    ref = block_errors_fused(x, q, s, z, layout, qt, qt.qrange(False)[0], None, want)
    assert int(stats.count[0]) == 39 and nonfinite == 1
    for field in ("count", "sum_x2", "sum_e2", "max_abs", "posinf"):
        assert getattr(stats, field).tobytes() == getattr(ref, field).tobytes(), field
    for got, exp in zip(groups, want, strict=True):
        assert got.tobytes() == exp.tobytes()


def test_warm_up_runs_every_build_of_the_fused_kernel(monkeypatch):
    """``qstream warm-up``'s jobs of a dynamic spec also run the builds its own job does not:
    groups down the columns, and the complete builds (input with NaN)."""
    from qstream.engine.warmup import _run_fused

    monkeypatch.setattr(runtime, "SERIAL_BELOW", 1 << 62)
    spec = qs.QuantSpec(dtype="int4", axis=1, block_size=32, method="dynamic")
    _run_fused(spec, np.linspace(-1, 1, 64 * 256, dtype=np.float32).reshape(64, 256))
    for iblock in (1, 32):
        for finite in (True, False):
            assert blocked.dynamic_kernel(iblock, finite).serial.signatures, (iblock, finite)


def test_background_warm_up_of_a_dynamic_spec_runs_on_a_first_run_only(tmp_path):
    """The background process compiles the kernels the job runs after its fused pass (the
    job compiles the fused kernel at once); once anything is cached, none is started (a
    dynamic spec's job never compiles the quantize kernel that was looked for)."""
    code = textwrap.dedent(
        """
        import sys
        import numpy as np
        import qstream as qs
        from qstream.kernels import runtime
        spec = qs.QuantSpec(dtype="int4", axis=1, block_size=32, method="dynamic")
        if sys.argv[1] == "warm":
            proc = qs.warm_up([spec], background=True)
            print("started" if proc is not None else "none")
            if proc is not None:
                proc.wait()
        else:
            seen = []
            runtime.on_compile(seen.append)
            x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
            qs.quantize_store(x, sys.argv[2], spec)
            print(",".join(seen))
        """
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def child(*args):
        r = subprocess.run(
            [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    assert child("warm") == "started"
    compiled = child("job", str(tmp_path / "q.zarr")).split(",")
    assert not {"worst_candidates", "_pack4", "dynamic_rows_half_to_even__finite"} & set(compiled)
    assert child("warm") == "none"


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_warm_up_gives_specs_of_the_same_fused_builds_to_one_process(n):
    from qstream.workflows.warm_up import COMMON_SPECS, _shares

    shares = _shares(COMMON_SPECS, n)
    assert len(shares) <= n
    assert sorted(str(d) for share in shares for d in share) == sorted(map(str, COMMON_SPECS))
    fused8 = [
        i
        for i, share in enumerate(shares)
        for d in share
        if d["dtype"] in ("int4", "int8") and d.get("method") == "dynamic"
    ]
    assert len(fused8) == 2 and len(set(fused8)) == 1
