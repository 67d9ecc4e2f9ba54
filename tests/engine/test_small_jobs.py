"""Small conversions and store jobs of small arrays run the NumPy twins of the kernels and
never load Numba (``convert_checkpoint.small_job``, ``kernel_choice.small_array_job``): they
write the codes, parameters and every report figure of the kernels' run, the four float error
sums (and the figures made of them) to float64 rounding; the choice is the job's, made from
its whole plan."""

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


# ---------------------------------------------------------------- store jobs


def _array(tmp_path, name, x, chunks=None):
    import zarr

    qs.register_zarr_types()  # (bfloat16, for zarr 3.1)
    a = zarr.create_array(
        str(tmp_path / name), shape=x.shape, chunks=chunks or x.shape, dtype=x.dtype
    )
    a[...] = x
    return str(tmp_path / name)


def _store_cases(tmp_path):
    """``(source, spec, keywords)``: every path the twins take in a store job."""
    from ml_dtypes import bfloat16

    rng = np.random.default_rng(3)
    x = (rng.standard_normal((96, 700)) * 0.05).astype(np.float32)
    x[4, :] = -0.0
    x[7, :9] = 0.25
    nan = x.copy()
    nan[3, 5], nan[9, 2], nan[11, 0] = np.nan, np.inf, -np.inf
    src = _array(tmp_path, "x.zarr", x, (32, 700))
    return {
        "int8 per channel": (src, qs.QuantSpec(axis=0), {}),
        "uint8 per tensor, half_up": (
            src,
            qs.QuantSpec(dtype="uint8", symmetric=False, round_mode="half_up"),
            {"histogram": True},
        ),
        "int16 on axis 1": (src, qs.QuantSpec(dtype="int16", axis=1), {}),
        "percentile": (
            src,
            qs.QuantSpec(axis=0, method="percentile", percentile=99.0, num_bins=256),
            {},
        ),
        "blocks of 1 MiB": (src, qs.QuantSpec(axis=0), {"max_memory": 1 << 20}),
        "NaN to the zero point": (
            _array(tmp_path, "nan.zarr", nan),
            qs.QuantSpec(axis=0, nan_policy="zero_point", symmetric=False),
            {},
        ),
        "float16": (_array(tmp_path, "h.zarr", x.astype(np.float16)), qs.QuantSpec(axis=0), {}),
        "bfloat16": (
            _array(tmp_path, "b.zarr", x.astype(bfloat16)),
            qs.QuantSpec(dtype="uint8", symmetric=False),
            {},
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "int8 per channel",
        "uint8 per tensor, half_up",
        "int16 on axis 1",
        "percentile",
        "blocks of 1 MiB",
        "NaN to the zero point",
        "float16",
        "bfloat16",
    ],
)
def test_a_small_store_job_writes_the_kernels_codes_parameters_and_figures(
    tmp_path, monkeypatch, case
):
    src, spec, kw = _store_cases(tmp_path)[case]
    from qstream.engine.jobs import QuantizeJob

    job = QuantizeJob(src, spec)
    assert job.numpy_kernels
    job.close()
    twins = qs.quantize_store(src, str(tmp_path / "twins"), spec, **kw).to_dict()
    cal_twins = qs.calibrate(src, spec).to_dict()
    monkeypatch.setattr(budget, "NUMPY_JOB", 0)
    kernels = qs.quantize_store(src, str(tmp_path / "kernels"), spec, **kw).to_dict()
    cal_kernels = qs.calibrate(src, spec).to_dict()
    _same_figures(twins, kernels)
    _same_figures(cal_twins, cal_kernels)
    assert cal_twins["params"] == cal_kernels["params"]  # (exactly: the codes' parameters)
    a, b = _files(tmp_path / "twins"), _files(tmp_path / "kernels")
    assert a.keys() == b.keys()
    for name in a:
        if name.endswith("zarr.json"):
            _same_figures(json.loads(a[name]), json.loads(b[name]), name)
        else:  # codes, scales, zero points: the same bytes
            assert a[name] == b[name], name


def test_a_small_store_job_never_loads_numba(tmp_path):
    x = (np.random.default_rng(4).standard_normal((256, 512)) * 0.1).astype(np.float32)
    src = _array(tmp_path, "x.zarr", x, (64, 512))
    seen, p = run_watched("quantize", src, str(tmp_path / "q.zarr"), "--axis", "0", cwd=tmp_path)
    assert seen == {"code": 0, "numba": False}, p.stderr
    assert "compiling" not in p.stderr and "sqnr_db" in p.stdout
    seen, p = run_watched("calibrate", src, "--axis", "0", cwd=tmp_path)
    assert seen == {"code": 0, "numba": False}, p.stderr
    # above the bound: Numba's kernels, the same codes
    env = {**os.environ, "QSTREAM_NUMPY_JOB": str(x.size - 1)}
    seen, p = run_watched(
        "quantize", src, str(tmp_path / "k.zarr"), "--axis", "0", cwd=tmp_path, env=env
    )
    assert seen == {"code": 0, "numba": True}, p.stderr
    a, b = (qs.open_quantized(str(tmp_path / n)) for n in ("q.zarr", "k.zarr"))
    np.testing.assert_array_equal(a.quantized(...), b.quantized(...))


@pytest.mark.parametrize(
    ("shape", "dtype", "spec", "small"),
    [
        ((512, 512), "float32", {"axis": 0}, True),
        ((2048, 2048), "float32", {"axis": 0}, True),  # (4 Mi values: the bound)
        ((2048, 2049), "float32", {"axis": 0}, False),
        ((0, 16), "float32", {"axis": 0}, False),  # (nothing to quantize: as before)
        ((64, 64), "float64", {"dtype": "uint16", "round_mode": "toward_zero"}, True),
        ((64, 64), "bfloat16", {"method": "percentile", "percentile": 99.9}, True),
        ((64, 64), "float32", {"dtype": "int4"}, False),
        ((64, 64), "float32", {"dtype": "int32"}, False),
        ((64, 64), "float32", {"dtype": "float8_e4m3fn"}, False),
        ((64, 64), "float32", {"method": "entropy"}, False),
        ((64, 64), "float32", {"axis": 1, "block_size": 32, "method": "dynamic"}, False),
        ((64, 64), "int32", {}, False),
    ],
)
def test_which_store_jobs_run_the_twins(shape, dtype, spec, small):
    from ml_dtypes import bfloat16

    from qstream.engine.jobs import small_array_job

    dt = bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    assert small_array_job(shape, dt, qs.QuantSpec(**spec)) is small


def test_a_quantize_plan_says_whether_its_run_loads_the_kernels(tmp_path, monkeypatch):
    x = np.ones((64, 32), np.float32)
    src = _array(tmp_path, "x.zarr", x)
    assert not qs.plan_quantize(src, str(tmp_path / "q.zarr")).loads_kernels
    monkeypatch.setattr(budget, "NUMPY_JOB", x.size - 1)
    assert qs.plan_quantize(src, str(tmp_path / "q.zarr")).loads_kernels


@pytest.mark.parametrize(
    ("spec", "dtype"),
    [
        ({"axis": 0}, "float32"),
        ({"dtype": "uint8", "symmetric": False}, "float16"),
        ({"dtype": "int16", "axis": 1}, "bfloat16"),
        ({"dtype": "int4", "axis": 1, "block_size": 32, "method": "dynamic"}, "float32"),
    ],
    ids=["int8 per channel", "uint8 per tensor", "int16 on axis 1", "int4 blocks"],
)
def test_a_small_dequantize_job_writes_the_kernels_bytes(tmp_path, monkeypatch, spec, dtype):
    x = (np.random.default_rng(6).standard_normal((96, 700)) * 0.05).astype(np.float32)
    q = str(tmp_path / "q.zarr")
    qs.quantize_store(_array(tmp_path, "x.zarr", x, (32, 700)), q, qs.QuantSpec(**spec))
    qs.dequantize_store(q, str(tmp_path / "twins.zarr"), dtype=dtype)
    monkeypatch.setattr(budget, "NUMPY_JOB", 0)
    qs.dequantize_store(q, str(tmp_path / "kernels.zarr"), dtype=dtype)
    a, b = _files(tmp_path / "twins.zarr"), _files(tmp_path / "kernels.zarr")
    assert a.keys() == b.keys()
    for name in a:
        if name.endswith("zarr.json"):  # (its job's token and timings aside)
            continue
        assert a[name] == b[name], name


def test_a_small_dequantize_never_loads_numba(tmp_path):
    x = (np.random.default_rng(7).standard_normal((256, 512)) * 0.1).astype(np.float32)
    q = str(tmp_path / "q.zarr")
    qs.quantize_store(_array(tmp_path, "x.zarr", x), q, qs.QuantSpec(axis=0))
    seen, p = run_watched("dequantize", q, str(tmp_path / "y.zarr"), cwd=tmp_path)
    assert seen == {"code": 0, "numba": False}, p.stderr
    y = qs.open_quantized(q)[...]
    import zarr

    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "y.zarr"))[...], y)
