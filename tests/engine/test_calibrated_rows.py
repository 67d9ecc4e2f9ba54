"""A job of one block, read once and kept (a pack, a small tensor of a conversion), calibrated
per channel on axis 0 by its rows' ranges, takes each row's range, parameters, codes and error
sums in one kernel call (:func:`~qstream.engine.jobs.job_memory.calibrated_in_memory`): its
calibration (ranges, thresholds, parameters, views), its output (codes, parameters, error
figures) and its report are those of the ranges pass then the quantize pass, bit for bit."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from qstream import budget
from qstream.engine import blocks
from qstream.engine.jobs import QuantizeJob, calibrated_in_memory, quantize_in_memory
from qstream.engine.run import InlineExecutor
from qstream.errors import NonFiniteInputError
from qstream.kernels import runtime
from qstream.spec import QuantSpec

CASES = {
    "int8": ({"dtype": "int8"}, np.float32),
    "uint8-asymmetric": ({"dtype": "uint8", "symmetric": False}, np.float32),
    "int8-asymmetric": ({"dtype": "int8", "symmetric": False}, np.float32),
    "uint8-symmetric": ({"dtype": "uint8"}, np.float32),
    "int8-narrow": ({"dtype": "int8", "narrow_range": True}, np.float32),
    "int8-full-levels": ({"dtype": "int8", "symmetric_levels": "full"}, np.float32),
    "half-away": ({"dtype": "int8", "round_mode": "half_away_from_zero"}, np.float32),
    "toward-zero": (
        {"dtype": "uint8", "round_mode": "toward_zero", "symmetric": False},
        np.float32,
    ),
    "up": ({"dtype": "int8", "round_mode": "up"}, np.float32),
    "float16-scales": ({"dtype": "int8", "scale_dtype": "float16"}, np.float32),
    "bfloat16-scales": (
        {"dtype": "uint8", "scale_dtype": "bfloat16", "symmetric": False},
        np.float32,
    ),
    "int16": ({"dtype": "int16"}, np.float32),
    "int16-float64": ({"dtype": "int16", "symmetric": False}, np.float64),
    "int32-float64": ({"dtype": "int32"}, np.float64),
    "float16": ({"dtype": "int8"}, np.float16),
    "bfloat16": ({"dtype": "int8", "symmetric": False}, ml_dtypes.bfloat16),
    "nan-zero-point": ({"dtype": "int8", "nan_policy": "zero_point"}, np.float32),
    "nan-zero-point-asymmetric": (
        {"dtype": "uint8", "nan_policy": "zero_point", "symmetric": False},
        np.float32,
    ),
    "nan-fill": ({"dtype": "int8", "nan_policy": "fill"}, np.float32),
    "nan-min": ({"dtype": "uint8", "nan_policy": "min", "symmetric": False}, np.float32),
    "uint4": ({"dtype": "uint4", "symmetric": False}, np.float32),  # (codes widened by a view)
    "uint2-nan-fill": ({"dtype": "uint2", "nan_policy": "fill"}, np.float32),
}
#: specs the calibrating kernel does not take (the two passes run): signed sub-byte codes
#: (sign-extended by a copy for the error sums), float types, histogram methods
NOT_TAKEN = {
    "int4": ({"dtype": "int4"}, np.float32),
    "float8": ({"dtype": "float8_e4m3fn"}, np.float32),
    "percentile": ({"dtype": "int8", "method": "percentile"}, np.float32),
}


def _source(dtype, nonfinite: bool, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape) * rng.uniform(0.01, 30, (shape[0],) + (1,) * (len(shape) - 1))
    x[5] = 0.0  # a channel of zeros
    x[6] = -0.0  # of negative zeros
    x[7] = 0.25  # of one positive value
    x[8] = -3.0  # of one negative value
    x[9].flat[:3] = [-0.0, 1e-30, -1e-30]
    x[11].flat[4:] = 3e4  # a run of large equal values (within float16's range)
    if nonfinite:
        x[17].flat[4], x[60].flat[0] = np.nan, np.inf
        x[61].flat[-1], x[100].flat[3] = -np.inf, np.nan
        x[20] = np.nan  # a channel with no finite value
        x[21] = np.inf  # nor here
    return x.astype(dtype)


def _job(x: np.ndarray, spec: QuantSpec, views: bool) -> QuantizeJob:
    job = QuantizeJob(x, spec, executor=InlineExecutor(), compression="none", views=views)
    job.source.pinned = x
    return job


def _both(monkeypatch, x: np.ndarray, spec: QuantSpec, views: bool = True):
    """``(taken, passes, got, want)``: whether the calibrating kernel ran, and the passes,
    calibration and output of the job by :func:`calibrated_in_memory` (``got``) and by the
    two passes (``want``)."""
    taken = []
    real = blocks.calibrate_rows_with_errors

    def noted(*args):
        got = real(*args)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(blocks, "calibrate_rows_with_errors", noted)
    one = _job(x, spec, views)
    two = _job(x, spec, views)
    try:
        got = calibrated_in_memory(one)
        cal = two.calibration()
        want = (cal, quantize_in_memory(two, cal))
        assert (one.passes, one.bytes_read) == (two.passes, two.bytes_read)
        return taken == [True], one.passes, got, want
    finally:
        one.close()
        two.close()


def _same(got, want) -> None:
    (cal_a, out_a), (cal_b, out_b) = got, want
    assert json.dumps(cal_a.to_dict()) == json.dumps(cal_b.to_dict())
    assert cal_a.stats.first_nonfinite == cal_b.stats.first_nonfinite
    for a, b in ((cal_a.scale, cal_b.scale), (cal_a.zero_point, cal_b.zero_point)):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    assert repr(out_a.members) == repr(out_b.members)
    for name in ("data", "scale", "zero_point"):
        a, b = getattr(out_a, name), getattr(out_b, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name
    for name, a in vars(out_a.errors).items():
        b = getattr(out_b.errors, name)
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name
    assert out_a.worst is None and out_b.worst is None


#: cases whose parallel build runs by default; every case's serial build does (the two builds
#: are one source, and tests/kernels/test_kernel_runtime.py holds them to the same bytes), the
#: other parallel builds under ``-m slow`` (~1.5 s of first compiles each)
PARALLEL_BY_DEFAULT = {"int8", "uint8-asymmetric", "int32-float64", "bfloat16", "nan-fill", "uint4"}


@pytest.mark.parametrize(
    ("case", "build"),
    [
        pytest.param(
            case,
            build,
            id=f"{case}-{build}",
            marks=[pytest.mark.slow]
            if build == "parallel" and case not in PARALLEL_BY_DEFAULT
            else [],
        )
        for case in CASES
        for build in ("serial", "parallel")
    ],
)
def test_the_calibrating_kernel_gives_the_two_passes_calibration_codes_and_figures(
    monkeypatch, case, build
):
    spec_d, dtype = CASES[case]
    spec = QuantSpec.from_dict({"axis": 0, "method": "minmax", **spec_d})
    monkeypatch.setattr(budget, "NUMPY_JOB", 0)
    monkeypatch.setattr(runtime, "SERIAL_BELOW", 1 << 40 if build == "serial" else 0)
    shape = (203, 6, 11) if build == "serial" else (640, 1000)
    x = _source(dtype, spec.nan_policy != "error", shape)
    taken, passes, got, want = _both(monkeypatch, x, spec)
    assert taken and passes == 2  # (the ranges and quantize passes, made row by row)
    _same(got, want)


@pytest.mark.parametrize("case", list(NOT_TAKEN))
def test_specs_the_calibrating_kernel_does_not_take_run_the_two_passes(monkeypatch, case):
    spec_d, dtype = NOT_TAKEN[case]
    spec = QuantSpec.from_dict({"axis": 0, "method": "minmax", **spec_d})
    monkeypatch.setattr(budget, "NUMPY_JOB", 0)
    taken, _, got, want = _both(monkeypatch, _source(dtype, False, (64, 40)), spec)
    assert not taken
    _same(got, want)


@pytest.mark.parametrize(
    "shape",
    [
        (40, 1),  # a value per channel: one row of a parameter per value
        (64, 1 << 17),  # rows longer than a kernel tile
    ],
)
def test_layouts_that_are_not_a_parameter_a_row_run_the_two_passes(monkeypatch, shape):
    monkeypatch.setattr(budget, "NUMPY_JOB", 0)
    x = _source(np.float32, False, shape)
    taken, _, got, want = _both(monkeypatch, x, QuantSpec(dtype="int8", axis=0))
    assert not taken
    _same(got, want)


def test_non_finite_values_under_the_error_policy_are_refused_as_the_ranges_pass_refuses(
    monkeypatch,
):
    monkeypatch.setattr(budget, "NUMPY_JOB", 0)
    x = _source(np.float32, True, (128, 40))
    spec = QuantSpec(dtype="int8", axis=0)
    messages = []
    for run in (calibrated_in_memory, lambda job: job.calibration()):
        job = _job(x, spec, True)
        try:
            with pytest.raises(NonFiniteInputError) as e:
                run(job)
            messages.append(str(e.value))
        finally:
            job.close()
    assert messages[0] == messages[1]
    assert "first at index (17, 4)" in messages[0]


def test_a_kept_source_read_in_pieces_runs_the_two_passes(tmp_path, monkeypatch):
    """A job whose source is read piece by piece (a chunked Zarr array, kept in memory all
    the same) sums each channel's errors piece by piece: the two passes run, whose figures
    are those sums (not the kernel's, row by row)."""
    import zarr

    monkeypatch.setattr(budget, "NUMPY_JOB", 0)
    x = _source(np.float32, False, (64, 3000))
    z = zarr.create_array(str(tmp_path / "x.zarr"), shape=x.shape, chunks=(64, 7), dtype="f4")
    z[...] = x
    spec = QuantSpec(dtype="int8", axis=0)
    jobs = [QuantizeJob(str(tmp_path / "x.zarr"), spec, executor=InlineExecutor()) for _ in "ab"]
    taken = []
    real = blocks.calibrate_rows_with_errors
    monkeypatch.setattr(
        blocks, "calibrate_rows_with_errors", lambda *a: taken.append(a) or real(*a)
    )
    try:
        for job in jobs:
            job.source.pinned = x
        assert len(jobs[0].blocks) == 1 and len(jobs[0].source.pieces(jobs[0].blocks[0].key)) > 1
        got = calibrated_in_memory(jobs[0])
        cal = jobs[1].calibration()
        want = (cal, quantize_in_memory(jobs[1], cal))
    finally:
        for job in jobs:
            job.close()
    assert not taken
    _same(got, want)
