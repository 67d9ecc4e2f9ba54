"""What the CLI says names what the user gave: a calibrated tensor by its name, and a
bfloat16 output with the note plain zarr needs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr
from typer.testing import CliRunner

from cli.main import app

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "tiny-transformer.safetensors"
runner = CliRunner()


def test_calibrate_of_one_tensor_titles_it_by_name_not_by_its_reader():
    r = runner.invoke(app, ["calibrate", str(SAMPLE), "--tensor", "layers.0.mlp.up_proj.weight"])
    assert r.exit_code == 0, r.output
    assert f"calibration of layers.0.mlp.up_proj.weight of {SAMPLE} (minmax" in r.stdout
    assert "CheckpointTensor" not in r.output


def test_a_bfloat16_dequantized_output_notes_how_plain_zarr_opens_it(tmp_path):
    zarr.save_array(tmp_path / "x.zarr", np.ones((64, 32), np.float32), zarr_format=3)
    assert (
        runner.invoke(
            app, ["quantize", str(tmp_path / "x.zarr"), str(tmp_path / "q.zarr"), "-q"]
        ).exit_code
        == 0
    )
    r = runner.invoke(
        app,
        ["dequantize", str(tmp_path / "q.zarr"), str(tmp_path / "d.zarr"), "--dtype", "bfloat16"],
    )
    assert r.exit_code == 0, r.output
    assert "qstream.register_zarr_types()" in r.stderr
    r = runner.invoke(
        app,
        ["dequantize", str(tmp_path / "q.zarr"), str(tmp_path / "f.zarr"), "--dtype", "float16"],
    )
    assert r.exit_code == 0 and "register_zarr_types" not in r.output
