"""Small conversions run the NumPy twins of the kernels and never load Numba
(``convert_checkpoint.small_job``): they write the codes, parameters and every report figure
of the kernels' run, the four float error sums (and the figures made of them) to float64
rounding; the choice is the job's, made from its whole plan."""

from __future__ import annotations

import base64
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import qstream as qs
from qstream import budget
from qstream.engine.convert import convert_checkpoint as ckpt
from qstream.io.checkpoints.open import open_checkpoint

from ..support.numba_watch import run_watched

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(ROOT, "samples", "tiny-transformer.safetensors")
RECIPE = os.path.join(ROOT, "samples", "recipe-int8.toml")

#: report keys whose values are the run's own (where it was written, how long it took)
RUN_KEYS = ("destination", "seconds")


def _checkpoint(tmp_path):
    """Tensors that take every path the twins cover: per tensor and per channel (middle,
    inner and outer axes), rows longer than a kernel tile, NaN and infinities, signed zeros,
    a constant row."""
    rng = np.random.default_rng(11)
    t = {
        "a.weight": (rng.standard_normal((64, 48)) * 0.05).astype(np.float32),
        "b.weight": (rng.standard_normal((3, 20000)) * 2.0).astype(np.float32),
        "c.weight": (rng.standard_normal((6, 5, 7)) * 3.0).astype(np.float32),
        "d.weight": np.round(rng.standard_normal((32, 16)), 1).astype(np.float32),
        "e.weight": (rng.standard_normal((40, 24)) * 0.5).astype(np.float32),
        "f.weight": (rng.standard_normal((16, 1)) * 4.0).astype(np.float32),
        "g.weight": (rng.standard_normal((24, 40)) * 0.5).astype(np.float16),
        "h.weight": rng.standard_normal((12, 30)) * 1e-3,  # (float64)
    }
    t["d.weight"][3, :] = -0.0
    t["d.weight"][4, :5] = 0.0
    t["e.weight"][2, 3] = np.nan
    t["e.weight"][7, 1] = np.inf
    t["a.weight"][5, :] = 0.25
    path = tmp_path / "m.safetensors"
    save_file(t, str(path))
    return str(path)


RECIPE_RULES = qs.Recipe.from_dict(
    {
        "defaults": {"dtype": "int8", "axis": 0, "symmetric": True, "method": "minmax"},
        "rules": [
            {"pattern": "b.*", "spec": {"dtype": "uint8", "axis": None, "symmetric": False}},
            {"pattern": "c.*", "spec": {"dtype": "int16", "axis": 1, "round_mode": "half_up"}},
            {"pattern": "d.*", "spec": {"method": "percentile", "percentile": 99.0,
                                        "symmetric": False, "num_bins": 64}},
            {"pattern": "e.*", "spec": {"nan_policy": "zero_point", "axis": 1}},
            {"pattern": "f.*", "spec": {"dtype": "uint8", "round_mode": "toward_zero",
                                        "symmetric": False}},
            {"pattern": "g.*", "spec": {"method": "percentile", "percentile": 99.9,
                                        "num_bins": 128}},
        ],
    }
)  # fmt: skip


def _files(root):
    out = {}
    for base, _, names in os.walk(root):
        for n in names:
            p = os.path.join(base, n)
            out[os.path.relpath(p, root)] = Path(p).read_bytes()
    return out


def _same_figures(a, b, where=""):
    """``a`` and ``b`` (JSON) alike: strings, integers and structure exactly, floats to a
    relative 1e-12 (the error sums' rounding); the run's own keys skipped."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            if k not in RUN_KEYS:
                _same_figures(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (u, v) in enumerate(zip(a, b, strict=True)):
            _same_figures(u, v, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300), (where, a, b)
    elif where.endswith("/float64"):  # (an index column: base64 of its float64 values)
        u, v = (np.frombuffer(base64.b64decode(x), np.float64) for x in (a, b))
        np.testing.assert_allclose(u, v, rtol=1e-12, atol=0, err_msg=where)
    else:
        assert a == b, (where, a, b)


def _convert_both(tmp_path, monkeypatch, checkpoint, recipe, **kw):
    twins = qs.convert_checkpoint(checkpoint, str(tmp_path / "twins"), recipe, **kw)
    monkeypatch.setattr(budget, "NUMPY_JOB", 0)
    kernels = qs.convert_checkpoint(checkpoint, str(tmp_path / "kernels"), recipe, **kw)
    return twins, kernels


@pytest.mark.parametrize("which", ["sample", "edge cases", "blocks"])
def test_a_small_conversion_writes_the_kernels_codes_parameters_and_figures(
    tmp_path, monkeypatch, which
):
    # (blocks: at 1 MiB of memory the larger tensors are jobs of many blocks, merged)
    kw = {"max_memory": 1 << 20} if which == "blocks" else {}
    if which in ("sample", "blocks"):
        checkpoint, recipe = SAMPLE, qs.Recipe.load(RECIPE)
    else:
        checkpoint, recipe = _checkpoint(tmp_path), RECIPE_RULES
    tensors = open_checkpoint(checkpoint)
    assert ckpt.small_job(tensors, recipe)
    twins, kernels = _convert_both(tmp_path, monkeypatch, checkpoint, recipe, **kw)
    _same_figures(
        {k: v for k, v in twins.items() if k != "destination"},
        {k: v for k, v in kernels.items() if k != "destination"},
    )
    a, b = _files(tmp_path / "twins"), _files(tmp_path / "kernels")
    assert a.keys() == b.keys()
    for name in a:
        if name.endswith("zarr.json"):
            _same_figures(json.loads(a[name]), json.loads(b[name]), name)
        else:  # codes, scales, zero points, kept tensors: the same bytes
            assert a[name] == b[name], name


@pytest.mark.parametrize(
    ("out", "extra"),
    [
        ("out", ()),
        ("out", ("--max-memory", "1MiB")),  # (1 MiB: tensors of many blocks, each a job)
        ("out.safetensors", ()),  # (a compressed-tensors folder: converted, then exported)
    ],
    ids=["whole tensors", "jobs of blocks", "safetensors export"],
)
def test_the_samples_conversion_never_loads_numba(tmp_path, out, extra):
    dst = str(tmp_path / "model" / out)
    watch = ("numba", "numcodecs", "zarr")
    seen, p = run_watched(
        "convert", SAMPLE, dst, "--recipe", RECIPE, *extra, cwd=tmp_path, watch=watch
    )
    assert seen["code"] == 0 and not seen["numba"], p.stderr
    assert "compiling" not in p.stderr
    if out == "out" and not extra:  # whole tensors: nor numcodecs' package, nor zarr-python
        assert seen == {"code": 0, "numba": False, "numcodecs": False, "zarr": False}
    if out == "out":
        assert "25 quantized, 9 kept" in p.stdout + p.stderr
    else:
        assert os.path.exists(dst)


def _spec_recipe(**spec):
    return qs.Recipe.from_dict({"defaults": {"dtype": "int8", "axis": 0, **spec}})


@pytest.mark.parametrize(
    ("recipe", "small"),
    [
        (_spec_recipe(), True),
        (_spec_recipe(dtype="uint16", axis=None, round_mode="half_up"), True),
        (_spec_recipe(method="percentile", percentile=99.5), True),
        (_spec_recipe(block_size=32, method="dynamic"), False),
        (_spec_recipe(dtype="int4"), False),
        (_spec_recipe(dtype="int32"), False),
        (_spec_recipe(dtype="float8_e4m3fn"), False),
        (_spec_recipe(method="entropy"), False),
    ],
)
def test_only_small_plans_the_twins_cover_run_them(recipe, small):
    assert ckpt.small_job(open_checkpoint(SAMPLE), recipe) is small


def test_a_job_above_the_bound_runs_the_kernels(monkeypatch):
    tensors = open_checkpoint(SAMPLE)
    recipe = qs.Recipe.load(RECIPE)
    quantized = sum(
        math.prod(t.shape)
        for n, t in tensors.items()
        if recipe.spec_for(n, t.shape, t.dtype) is not None
    )
    monkeypatch.setattr(budget, "NUMPY_JOB", quantized)
    assert ckpt.small_job(tensors, recipe)
    monkeypatch.setattr(budget, "NUMPY_JOB", quantized - 1)
    assert not ckpt.small_job(tensors, recipe)


def test_nan_refused_by_a_small_job_as_by_the_kernels(tmp_path, monkeypatch):
    x = np.ones((8, 16), np.float32)
    x[2, 5] = np.nan
    save_file({"w": x}, str(tmp_path / "m.safetensors"))
    recipe = _spec_recipe()
    assert ckpt.small_job(open_checkpoint(str(tmp_path / "m.safetensors")), recipe)
    errors = []
    for bound in (budget.NUMPY_JOB, 0):
        monkeypatch.setattr(budget, "NUMPY_JOB", bound)
        with pytest.raises(qs.NonFiniteInputError) as e:
            qs.convert_checkpoint(tmp_path / "m.safetensors", tmp_path / f"o{bound}", recipe)
        errors.append(str(e.value).replace(f"o{bound}", "o"))
    assert errors[0] == errors[1] and "NaN" in errors[0]
