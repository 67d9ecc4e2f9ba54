"""``convert`` runs two tensors at once on the local executor: the outputs, the reports and
the events are those of one tensor at a time, in the checkpoint's order; a failing tensor
stops the run with its own error and leaves the others finished or resumable."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr
from safetensors.numpy import save_file

import qstream as qs
from qstream.engine.convert import convert_checkpoint as ckpt_mod
from qstream.io.checkpoints.open import open_checkpoint

RECIPE = qs.Recipe.from_dict(
    {"defaults": {"dtype": "uint4", "axis": 1, "block_size": 32, "method": "dynamic",
                  "symmetric": False}}
)  # fmt: skip


def _checkpoint(tmp_path, n=6, nan_in=None):
    rng = np.random.default_rng(4)
    tensors = {
        f"layers.{i}.weight": (rng.standard_normal((96 + 8 * i, 256)) * 0.02).astype(np.float32)
        for i in range(n)
    }
    if nan_in is not None:
        tensors[f"layers.{nan_in}.weight"][5, 7] = np.nan
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    return path, list(tensors)


def _run(ck, dst, in_flight, monkeypatch, **kw):
    monkeypatch.setattr(ckpt_mod, "TENSORS_IN_FLIGHT", in_flight)
    events = []
    report = qs.convert_checkpoint(
        ck, dst, RECIPE, max_memory=1 << 20, on_tensor=events.append, **kw
    )
    return report, events


def test_two_tensors_at_once_give_the_bytes_reports_and_event_order_of_one_at_a_time(
    tmp_path, monkeypatch
):
    ck, names = _checkpoint(tmp_path)
    one, _ = _run(ck, tmp_path / "one", 1, monkeypatch)
    two, ev2 = _run(ck, tmp_path / "two", 2, monkeypatch)
    assert list(one["tensors"]) == list(two["tensors"]) == names
    for n in names:  # error sums bit for bit: blocks do not depend on the overlap
        assert json.dumps(one["tensors"][n], sort_keys=True) == json.dumps(
            two["tensors"][n], sort_keys=True
        )
        a, b = (zarr.open_group(str(tmp_path / d / n), mode="r") for d in ("one", "two"))
        for m in ("data", "scale", "zero_point"):
            np.testing.assert_array_equal(a[m][...], b[m][...])
    # results come in the checkpoint's order; each tensor's start precedes its result
    assert [e.name for e in ev2 if e.result is not None] == names
    for n in names:
        starts = [i for i, e in enumerate(ev2) if e.name == n and e.result is None]
        ends = [i for i, e in enumerate(ev2) if e.name == n and e.result is not None]
        assert len(starts) == len(ends) == 1 and starts[0] < ends[0]


def test_a_failing_tensor_stops_the_run_with_its_error_and_the_rest_resumes(tmp_path, monkeypatch):
    ck, names = _checkpoint(tmp_path, nan_in=2)
    dst = tmp_path / "out"
    with pytest.raises(qs.NonFiniteInputError, match="1 non-finite"):
        _run(ck, dst, 2, monkeypatch)
    opened = qs.open_quantized(dst, allow_incomplete=True)
    assert opened.meta["complete"] is False
    listed = list(opened.tensors)  # what finished: those before it, maybe the one beside it
    assert listed[:2] == names[:2] and names[2] not in listed and set(listed) <= set(names[:4])
    # the NaN fixed in place (same file, same names): the re-run resumes, and its outputs and
    # reports are those of a clean run
    (tmp_path / "fixed").mkdir()
    fixed, _ = _checkpoint(tmp_path / "fixed")
    ck.write_bytes(fixed.read_bytes())
    report, _ = _run(ck, dst, 2, monkeypatch)
    clean, _ = _run(fixed, tmp_path / "clean", 2, monkeypatch)
    assert list(report["tensors"]) == names
    for n in names:
        assert json.dumps(report["tensors"][n], sort_keys=True) == json.dumps(
            clean["tensors"][n], sort_keys=True
        )
        a, b = (zarr.open_group(str(d / n), mode="r") for d in (dst, tmp_path / "clean"))
        for m in ("data", "scale", "zero_point"):
            np.testing.assert_array_equal(a[m][...], b[m][...])
    assert zarr.open_group(str(dst), mode="r").attrs["qstream_checkpoint"]["complete"] is True


def test_checkpoint_tensor_regions_map_the_file_without_a_copy(tmp_path):
    ck, names = _checkpoint(tmp_path, n=2)
    t = open_checkpoint(ck)[names[1]]
    for key in [(slice(0, t.shape[0]), slice(0, 256)), (slice(3, 50), slice(0, 256))]:
        v = t.view(key)
        assert v is not None and v.flags.c_contiguous and v.flags.writeable
        np.testing.assert_array_equal(v, t[key])
    assert t.view((slice(0, 4), slice(0, 100))) is None  # not one run of bytes: copy instead
    assert t.view((slice(4, 0, -1), slice(0, 256))) is None


@pytest.mark.parametrize("stop_after", [0, 2])
def test_a_stopped_tensor_job_ends_resumable_and_its_rerun_equals_a_clean_run(tmp_path, stop_after):
    import threading

    from qstream.engine.convert.conversion import Stoppable as _Stoppable
    from qstream.engine.convert.conversion import Stopped
    from qstream.engine.jobs.job import QuantizeJob

    x = (np.random.default_rng(6).standard_normal((512, 256)) * 0.02).astype(np.float32)
    spec = RECIPE.spec_for("w", x.shape, x.dtype)
    stop = threading.Event()

    def after_blocks(done, total):  # a Ctrl-C (or another tensor's failure) mid-job
        if done >= stop_after:
            stop.set()

    if stop_after == 0:
        stop.set()
    dst = tmp_path / "stopped"
    with pytest.raises(Stopped):
        QuantizeJob(x, spec, max_memory=1 << 20).run(dst, progress=_Stoppable(after_blocks, stop))
    with pytest.raises(qs.StoreError):  # what it left does not pass for a finished output
        qs.open_quantized(dst)
    again = qs.quantize_store(x, dst, spec, max_memory=1 << 20)
    clean = qs.quantize_store(x, tmp_path / "clean", spec, max_memory=1 << 20)
    assert json.dumps(again.error, sort_keys=True) == json.dumps(clean.error, sort_keys=True)
    a, b = (zarr.open_group(str(d), mode="r") for d in (dst, tmp_path / "clean"))
    for m in ("data", "scale", "zero_point"):
        np.testing.assert_array_equal(a[m][...], b[m][...])


@pytest.mark.parametrize(
    "spec",
    [
        {"dtype": "int8", "axis": 0},
        {"dtype": "uint8", "axis": 1, "method": "percentile", "symmetric": False},
        {"dtype": "int4", "axis": 1, "block_size": 32, "method": "dynamic"},
        {"dtype": "int8", "method": "entropy", "num_bins": 512},
        {"dtype": "float8_e4m3fn", "axis": 0},
    ],
)
@pytest.mark.parametrize("twins", [True, False], ids=["twins", "kernels"])
def test_a_small_tensor_converted_whole_equals_its_own_job(tmp_path, monkeypatch, spec, twins):
    """A tensor that is one block of its job (converted start to end by one worker,
    qstream.engine.convert.one_block) gives the codes, parameters and report of the same job run as
    a store job on the same kernels (a small conversion's NumPy twins, or Numba's), and
    restores to what dequantize gives."""
    from safetensors.numpy import save_file

    from qstream import budget
    from qstream.kernels.numpy_twins import using_numpy_kernels

    rng = np.random.default_rng(6)
    x = (rng.standard_normal((48, 96)) * np.exp(rng.normal(0, 0.5, (48, 1)))).astype(np.float32)
    save_file({"w": x}, str(tmp_path / "m.safetensors"))
    recipe = qs.Recipe(defaults=qs.QuantSpec.from_dict(spec))
    if not twins:
        monkeypatch.setattr(budget, "NUMPY_JOB", 0)
    ran_twins = ckpt_mod.small_job(open_checkpoint(tmp_path / "m.safetensors"), recipe)
    qs.convert_checkpoint(tmp_path / "m.safetensors", tmp_path / "ck", recipe)
    small = qs.open_quantized(tmp_path / "ck")["w"]
    with using_numpy_kernels(ran_twins):
        job = qs.quantize_store(x, tmp_path / "job.zarr", qs.QuantSpec.from_dict(spec))
    ref = qs.open_quantized(tmp_path / "job.zarr")
    np.testing.assert_array_equal(small.quantized(...), ref.quantized(...))
    np.testing.assert_array_equal(small.scale, ref.scale)
    np.testing.assert_array_equal(small.zero_point, ref.zero_point)
    assert json.dumps(small.meta["error"], sort_keys=True) == json.dumps(job.error, sort_keys=True)
    assert json.dumps(small.meta["calibration"], sort_keys=True) == json.dumps(
        job.calibration, sort_keys=True
    )
    # restored whole, as dequantize restores it
    qs.dequantize_store(tmp_path / "ck", tmp_path / "restored")
    qs.dequantize_store(tmp_path / "ck" / "w", tmp_path / "one")
    a = zarr.open_array(str(tmp_path / "restored" / "w"), mode="r")
    b = zarr.open_array(str(tmp_path / "one"), mode="r")
    np.testing.assert_array_equal(a[...], b[...])
    assert a.metadata.to_dict() | {"attributes": None} == b.metadata.to_dict() | {
        "attributes": None
    }
    assert a.attrs["qstream"]["complete"] is True
