"""Error figures of values at the float range's edge: where the codes dequantize beyond
float32's range (x_hat = inf), the error sums overflow, and the SQNR is -inf dB, in a tensor's
own report and in a pack's columns alike, never a crash."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

import qstream as qs
from qstream import budget
from qstream.spec.stats import error_metrics


def test_an_overflowed_error_sum_gives_minus_infinity_db():
    assert error_metrics(4, 1e79, math.inf, math.inf, math.inf)["sqnr_db"] == -math.inf
    assert math.isnan(error_metrics(4, math.inf, math.inf, math.inf, math.inf)["sqnr_db"])
    assert error_metrics(4, 1e79, 0.0, 1e79, 1e79)["sqnr_db"] == math.inf
    assert error_metrics(4, 0.0, 1.0, 0.0, 1.0)["sqnr_db"] == -math.inf
    assert error_metrics(4, 100.0, 1.0, 0.0, 1.0)["sqnr_db"] == pytest.approx(20.0)


@pytest.mark.parametrize("kernels", ["NumPy twins", "Numba"])
@pytest.mark.parametrize("packs", [False, True])
def test_a_tensor_at_float32s_largest_values_converts_with_minus_infinity_db(
    tmp_path, monkeypatch, packs, kernels
):
    if kernels == "Numba":
        monkeypatch.setattr(budget, "NUMPY_JOB", 0)
    x = np.full((16, 16), np.finfo(np.float32).max, np.float32)
    x[::2] *= -1
    tensors = {f"layers.{i}.w": x for i in range(3)}  # (alike: a pack when packs are on)
    save_file(tensors, str(tmp_path / "huge.safetensors"))
    out = tmp_path / "out.zarr"
    results = qs.convert_checkpoint(str(tmp_path / "huge.safetensors"), str(out), packs=packs)
    rows = results.get("tensors", results)
    for name in tensors:
        assert float(rows[name]["error"]["sqnr_db"]) == -math.inf, rows[name]
    assert os.path.exists(out / "zarr.json")
    json.loads((out / "zarr.json").read_text())  # (a complete, readable root)


def test_the_command_line_prints_a_tensor_at_float32s_largest_values(tmp_path):
    """``convert``'s table (its max error "inf") and ``inspect`` of the output, exit 0."""
    from typer.testing import CliRunner

    from cli.main import app

    x = np.full((16, 16), np.finfo(np.float32).max, np.float32)
    x[::2] *= -1
    save_file({"huge.w": x, "fine.w": np.eye(8, dtype=np.float32)}, str(tmp_path / "h.safetensors"))
    runner = CliRunner()
    out = str(tmp_path / "out.zarr")
    r = runner.invoke(app, ["convert", str(tmp_path / "h.safetensors"), out])
    assert r.exit_code == 0, r.output
    row = next(line for line in r.output.splitlines() if line.startswith("huge.w "))
    assert row.split()[-3:] == ["-inf", "inf", "0.000"], row  # (SQNR dB, max err, clip %)
    r = runner.invoke(app, ["inspect", out])
    assert r.exit_code == 0, r.output
    assert "-inf" in r.output
