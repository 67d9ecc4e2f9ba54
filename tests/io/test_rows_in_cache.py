"""A piece whose rows are its channels (per channel on axis 0, each row no longer than a tile)
is quantized and error-summed by one fused kernel, row by row
(:func:`~qstream.engine.blocks.fused_rows.quantize_rows_with_errors`), so that each row is still in
the CPU's cache for its sums. Each row's codes and sums are the two kernels' own, so the output
and every figure of the report are those of the two kernels over the whole piece, byte for
byte."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import qstream as qs
from qstream import budget as qstream_budget
from qstream.engine.blocks import fused_rows, quantize_work
from qstream.spec import QuantSpec

CASES = {
    "int8": ({"dtype": "int8", "axis": 0}, np.float32),
    "uint8-asymmetric": ({"dtype": "uint8", "axis": 0, "symmetric": False}, np.float32),
    "uint4-asymmetric": ({"dtype": "uint4", "axis": 0, "symmetric": False}, np.float32),
    "int8-narrow": ({"dtype": "int8", "axis": 0, "narrow_range": True}, np.float32),
    "half-away": ({"dtype": "int8", "axis": 0, "round_mode": "half_away_from_zero"}, np.float32),
    "up": ({"dtype": "int8", "axis": 0, "round_mode": "up"}, np.float32),
    "percentile": ({"dtype": "int8", "axis": 0, "method": "percentile"}, np.float32),
    "int16-float64": ({"dtype": "int16", "axis": 0}, np.float64),
    "int32-float64": ({"dtype": "int32", "axis": 0}, np.float64),
    "float16": ({"dtype": "int8", "axis": 0}, np.float16),
    "bfloat16": ({"dtype": "int8", "axis": 0}, ml_dtypes.bfloat16),
    "nan-zero-point": ({"dtype": "int8", "axis": 0, "nan_policy": "zero_point"}, np.float32),
    "nan-fill": ({"dtype": "int8", "axis": 0, "nan_policy": "fill"}, np.float32),
    "nan-min": ({"dtype": "uint8", "axis": 0, "nan_policy": "min", "symmetric": False}, np.float32),
    # not taken: int4 codes are widened for the error sums by a copy, made before quantizing
    "int4": ({"dtype": "int4", "axis": 0}, np.float32),
}


def _source(dtype, nonfinite: bool) -> np.ndarray:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((203, 6, 11)) * rng.uniform(0.01, 30, (203, 1, 1))
    x[5] = 0.0  # a channel of zeros
    x[9, 0, :3] = [-0.0, 1e-30, -1e-30]
    x[11, 1, :] = 3e4  # a run of large equal values (within float16's range)
    if nonfinite:
        x[17, 2, 4], x[60, 0, 0], x[61, 5, 10], x[200, 3, 3] = np.nan, np.inf, -np.inf, np.nan
    return x.astype(dtype)


@pytest.mark.parametrize("case", list(CASES))
def test_the_fused_kernel_gives_the_two_kernels_codes_and_report(tmp_path, monkeypatch, case):
    spec_d, dtype = CASES[case]
    spec = QuantSpec.from_dict(spec_d)
    x = _source(dtype, spec.nan_policy != "error")
    taken = []
    real = quantize_work.quantize_rows_with_errors

    def noted(*args):
        got = real(*args)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(quantize_work, "quantize_rows_with_errors", noted)
    # (the kernels: a small array's twins take the whole piece at once)
    monkeypatch.setattr(qstream_budget, "NUMPY_JOB", 0)
    out = {}
    for label, least in (("whole", x.size + 1), ("runs", 0)):  # (the two kernels; fused)
        monkeypatch.setattr(qstream_budget, "FUSED_FROM", least)
        taken.clear()
        report = qs.quantize_store(x, tmp_path / f"{label}.zarr", spec)
        out[label] = (qs.open_quantized(tmp_path / f"{label}.zarr"), report, list(taken))
    (whole, r_whole, t_whole), (runs, r_runs, t_runs) = out["whole"], out["runs"]
    assert t_whole == [False]
    assert t_runs == [case != "int4"]
    assert whole.quantized(...).tobytes() == runs.quantized(...).tobytes()
    assert np.asarray(whole.scale).tobytes() == np.asarray(runs.scale).tobytes()
    assert np.asarray(whole.zero_point).tobytes() == np.asarray(runs.zero_point).tobytes()
    assert json.dumps(r_whole.error) == json.dumps(r_runs.error)
    assert json.dumps(r_whole.calibration) == json.dumps(r_runs.calibration)


@pytest.mark.parametrize(
    "shape, axis, taken",
    [
        ((2048, 256), 0, True),  # FUSED_FROM values
        ((2047, 256), 0, False),  # fewer: the two kernels (their twins compile faster)
        ((64, 1 << 17), 0, False),  # rows longer than a tile
        ((1 << 19,), 0, False),  # a value per row (a parameter per value)
        ((1 << 19, 1), 0, False),  # one row of a parameter per value (not one a row)
        ((2048, 256), 1, False),  # channels along the rows
        ((2048, 40000), 0, False),  # rows longer than a tile
    ],
)
def test_the_fused_kernel_is_taken_only_for_rows_that_are_channels(shape, axis, taken):
    from qstream.core.layout import plan_layout

    x = np.ones(shape, np.float32)
    c = shape[axis]
    s, z = np.ones(c, np.float32), np.zeros(c, np.float32)
    layout = plan_layout(shape, (c,), axis, None)
    spec = QuantSpec(dtype="int8", axis=axis)
    out = np.empty(shape, np.int8)
    got = fused_rows.quantize_rows_with_errors(x, s, z, layout, spec.qtype, spec, out, -128.0)
    assert (got is not None) == taken


@pytest.mark.parametrize("case", ["int8", "uint8-asymmetric", "half-away", "bfloat16", "nan-fill"])
def test_the_fused_parallel_build_gives_the_two_kernels_codes_and_report(
    tmp_path, monkeypatch, case
):
    """A piece large enough for the kernels' parallel builds (not their serial twins): the
    fused kernel's codes and figures are still the two kernels' over the whole piece."""
    spec_d, dtype = CASES[case]
    spec = QuantSpec.from_dict(spec_d)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((640, 1000)) * rng.uniform(0.01, 30, (640, 1))
    x[7] = 0.0
    if spec.nan_policy != "error":
        x[9, 5], x[300, 999], x[301, 0] = np.nan, np.inf, -np.inf
    x = x.astype(dtype)
    assert x.size >= 2 * qstream_budget.SERIAL_BELOW
    monkeypatch.setattr(qstream_budget, "NUMPY_JOB", 0)
    real = quantize_work.quantize_rows_with_errors
    taken = []

    def noted(*args):
        got = real(*args)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(quantize_work, "quantize_rows_with_errors", noted)
    got = {}
    for label, least in (("two", x.size + 1), ("fused", 0)):
        monkeypatch.setattr(qstream_budget, "FUSED_FROM", least)
        taken.clear()
        report = qs.quantize_store(x, tmp_path / f"{label}.zarr", spec)
        got[label] = (qs.open_quantized(tmp_path / f"{label}.zarr"), report)
        assert taken == [label == "fused"]  # (one piece: fused, or the two kernels)
    (two, r_two), (fused, r_fused) = got["two"], got["fused"]
    assert two.quantized(...).tobytes() == fused.quantized(...).tobytes()
    assert np.asarray(two.scale).tobytes() == np.asarray(fused.scale).tobytes()
    assert json.dumps(r_two.error) == json.dumps(r_fused.error)


def test_every_round_code_has_a_fused_build_with_its_quantize_kernels_operation():
    """Each round code's fused builds (the one that calibrates too, through its rows'
    function) apply the element operation of that code's quantize kernel (``q_<name>`` applies
    ``rounding.<name>``): made for every code, without compiling."""
    from qstream.kernels import rounding
    from qstream.kernels.affine import QUANTIZE_KERNELS
    from qstream.kernels.quantize_sums import fused_kernel

    for code, kernel in enumerate(QUANTIZE_KERNELS):
        built = fused_kernel(code)
        op = built.py_func.__globals__["ROUND"]
        assert op is getattr(rounding, kernel.__name__.removeprefix("q_"))
        assert built.__qualname__ == f"quantize_rows_sums__r{code}"
        calibrating = fused_kernel(code, calibrate=True)
        rows = calibrating.py_func.__globals__["CALIBRATE_ROWS"]
        assert rows.py_func.__globals__["ROUND"] is op
        assert calibrating.__qualname__ == f"calibrate_rows_sums__r{code}"
        assert rows.py_func.__qualname__ == f"calibrate_rows__r{code}"
