"""``qstream dequantize`` refuses what its plan refuses as ``convert`` does: exit 2, one line
naming the problem, nothing created at DST, and ``--dry-run`` the same. The sources: a GGUF
file from gguf-py's writer cut in its data, and a compressed-tensors checkpoint made by
compressed-tensors' own compressors with one negative ``weight_scale``."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")  # (compressed-tensors' checkpoints; not in the 3.12 extras)

from ..io.test_gguf_source import _stored, _write  # noqa: E402
from ..io.test_quantized_sources import Q, _variant, build  # noqa: E402


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """Each refused source with the words its refusal names."""
    folder = tmp_path_factory.mktemp("refused")
    x = np.random.default_rng(49).standard_normal((8, 256)).astype(np.float32)
    whole = _write(folder / "whole.gguf", {"w": (_stored(x, "Q8_0"), "Q8_0")}).read_bytes()
    cut = folder / "cut.gguf"
    cut.write_bytes(whole[:-100])
    ct = folder / "ct"
    build(str(ct), "FP8_DYNAMIC")

    def negative(sd: dict[str, torch.Tensor]) -> None:
        sd[Q].view(-1)[0].fill_(-1.0)

    bad = _variant(str(ct), str(folder / "negative"), negative)
    return {
        "truncated-gguf": (str(cut), "ends past the end of the file"),
        "negative-scale": (bad, "negative scales"),
    }


@pytest.mark.parametrize("case", ["truncated-gguf", "negative-scale"])
@pytest.mark.parametrize("dst", ["out.zarr", "out/model.safetensors"])
@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
def test_a_source_the_plan_refuses_exits_2_with_one_line_and_creates_nothing(
    refused, tmp_path, case, dst, dry_run
):
    src, why = refused[case]
    out = tmp_path / "dst" / dst
    r = CliRunner().invoke(app, ["dequantize", src, str(out)] + ["--dry-run"] * dry_run)
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert why in text and "Traceback" not in r.output, r.output
    assert len([ln for ln in r.output.splitlines() if ln.startswith("error:")]) == 1
    assert not (tmp_path / "dst").exists()
