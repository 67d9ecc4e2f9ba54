"""The Dask executor on a real local cluster (2 worker processes): the same bytes and the same
report as the local executor for every method and granularity, exact resume after a killed
client or a lost worker, and clear refusals of what workers cannot reach."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

import qstream as qs
from cli.main import app
from qstream import QuantSpec

from ..support.kill_hook import KILL_HOOK

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def client():
    from qstream.engine.run.dask import local_client

    with local_client(2) as c:
        yield c


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """Channels of very different ranges, a NaN, an inf, chunks that do not divide the shape."""
    rng = np.random.default_rng(11)
    shape = (300, 200)
    x = (rng.standard_normal(shape) * np.exp(rng.normal(0, 0.7, (shape[0], 1)))).astype(np.float32)
    x[7, 3] = np.nan
    x[250, 199] = np.inf
    path = tmp_path_factory.mktemp("dask") / "src.zarr"
    a = zarr.create_array(str(path), shape=shape, chunks=(40, 64), dtype="float32")
    a[...] = x
    return path


SPECS = {
    "explicit-tensor": {"dtype": "int8", "scale": 0.01, "zero_point": 3},
    "explicit-blocked": {"dtype": "int8", "axis": 1, "block_size": 50, "scale": 0.02},
    "dynamic-blocked-uint4-asym": {
        "dtype": "uint4",
        "axis": 1,
        "block_size": 64,
        "method": "dynamic",
        "symmetric": False,
    },
    "dynamic-blocked-int4": {"dtype": "int4", "axis": 1, "block_size": 32, "method": "dynamic"},
    "minmax-blocked-uint8-axis0": {
        "dtype": "uint8",
        "axis": 0,
        "block_size": 16,
        "method": "minmax",
        "symmetric": False,
    },
    "minmax-tensor": {"dtype": "int8", "method": "minmax"},
    "minmax-axis0": {"dtype": "int8", "axis": 0, "method": "minmax"},
    "percentile-axis1": {"dtype": "uint8", "axis": 1, "method": "percentile", "symmetric": False},
    "percentile-tensor": {"dtype": "int8", "method": "percentile", "num_bins": 512},
    "entropy-axis0": {"dtype": "int8", "axis": 0, "method": "entropy", "num_bins": 512},
    "mse-tensor": {"dtype": "int8", "method": "mse", "num_bins": 512},
    "l2-axis1": {"dtype": "int8", "axis": 1, "method": "l2", "num_bins": 256},
    "float8-axis0": {"dtype": "float8_e4m3fn", "axis": 0, "method": "minmax"},
}


def _spec(d: dict) -> QuantSpec:
    return QuantSpec.from_dict({"nan_policy": "zero_point", **d})


def _contents(dst) -> dict:
    g = zarr.open_group(str(dst), mode="r")
    return {m: np.asarray(g[m][...]) for m in ("data", "scale", "zero_point")}


def _same_output(a, b) -> None:
    ca, cb = _contents(a), _contents(b)
    for m in ca:
        np.testing.assert_array_equal(ca[m], cb[m])
        assert ca[m].dtype == cb[m].dtype


def _same_report(a: qs.QuantReport, b: qs.QuantReport) -> None:
    da, db = a.to_dict(), b.to_dict()
    for k in ("error", "calibration", "bytes_written", "bytes_read", "passes", "spec"):
        # serialised: NaN == NaN, and every float compared to the bit
        assert json.dumps(da[k], sort_keys=True) == json.dumps(db[k], sort_keys=True), k


@pytest.mark.parametrize("name", list(SPECS))
def test_dask_run_writes_the_local_runs_bytes_and_report(client, source, tmp_path, name):
    spec = _spec(SPECS[name])
    # a small memory bound: many blocks, so tasks batch several and histograms combine
    local = qs.quantize_store(str(source), tmp_path / "local.zarr", spec, max_memory=1 << 20)
    ex = qs.DaskExecutor(client, blocks_per_task=3)
    remote = qs.quantize_store(
        str(source), tmp_path / "dask.zarr", spec, executor=ex, max_memory=1 << 20
    )
    _same_output(tmp_path / "local.zarr", tmp_path / "dask.zarr")
    _same_report(local, remote)
    assert ex.last_blocks_per_task == 3
    assert not list((tmp_path / "dask.zarr").rglob("*.partial"))


def test_dask_run_with_raw_chunks_writes_the_local_runs_bytes(client, source, tmp_path):
    spec = _spec(SPECS["dynamic-blocked-int4"])
    local = qs.quantize_store(str(source), tmp_path / "local.zarr", spec, compression="none")
    remote = qs.quantize_store(
        str(source), tmp_path / "dask.zarr", spec, executor="dask", compression="none"
    )
    _same_report(local, remote)
    for member in ("data", "scale", "zero_point"):
        files = sorted(p.name for p in (tmp_path / "local.zarr" / member).iterdir())
        assert files == sorted(p.name for p in (tmp_path / "dask.zarr" / member).iterdir())
        for f in files:  # raw chunks: the same files, byte for byte
            a = (tmp_path / "local.zarr" / member / f).read_bytes()
            assert a == (tmp_path / "dask.zarr" / member / f).read_bytes(), (member, f)


def test_dask_default_batching_and_the_string_executor_give_the_same_bytes(
    client, source, tmp_path
):
    spec = _spec({"dtype": "int8", "axis": 0, "method": "percentile"})
    a = qs.quantize_store(str(source), tmp_path / "a.zarr", spec)
    b = qs.quantize_store(str(source), tmp_path / "b.zarr", spec, executor="dask")
    _same_output(tmp_path / "a.zarr", tmp_path / "b.zarr")
    _same_report(a, b)
    # the executor registered the plugin that warms the kernels on every worker
    plugins = client.run(lambda dask_worker: sorted(dask_worker.plugins))
    assert all("qstream" in names for names in plugins.values()), plugins


def test_dask_calibrate_gives_the_local_thresholds(client, source):
    spec = _spec({"dtype": "int8", "axis": 1, "method": "entropy", "num_bins": 256})
    a = qs.calibrate(str(source), spec)
    b = qs.calibrate(str(source), spec, executor=qs.DaskExecutor(client, blocks_per_task=4))
    assert json.dumps(a.summary(), sort_keys=True) == json.dumps(b.summary(), sort_keys=True)
    np.testing.assert_array_equal(a.params.scale, b.params.scale)


def test_dask_dequantize_writes_the_local_bytes(client, source, tmp_path):
    q = tmp_path / "q.zarr"
    qs.quantize_store(str(source), q, _spec({"dtype": "int4", "axis": 0, "method": "minmax"}))
    for dtype in ("float32", "bfloat16"):
        qs.dequantize_store(q, tmp_path / f"l-{dtype}.zarr", dtype=dtype)
        qs.dequantize_store(q, tmp_path / f"d-{dtype}.zarr", dtype=dtype, executor="dask")
        a = zarr.open_array(str(tmp_path / f"l-{dtype}.zarr"))[...]
        b = zarr.open_array(str(tmp_path / f"d-{dtype}.zarr"))[...]
        np.testing.assert_array_equal(a, b)


def test_dask_convert_checkpoint_matches_the_local_conversion(client, tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(5)
    tensors = {
        "layer.0.weight": rng.standard_normal((96, 80)).astype(np.float32),
        "layer.0.bias": rng.standard_normal(80).astype(np.float32),
        "layer.1.weight": rng.standard_normal((64, 96)).astype(np.float16),
    }
    ck = tmp_path / "model.safetensors"
    save_file(tensors, str(ck))
    recipe = qs.Recipe.from_dict({"defaults": {"dtype": "int8", "axis": 0, "method": "minmax"}})
    a = qs.convert_checkpoint(ck, tmp_path / "a", recipe)
    b = qs.convert_checkpoint(ck, tmp_path / "b", recipe, executor="dask")
    assert json.dumps(a["tensors"], sort_keys=True) == json.dumps(b["tensors"], sort_keys=True)
    for name, r in a["tensors"].items():
        if not r["kept"]:
            _same_output(tmp_path / "a" / name, tmp_path / "b" / name)


@pytest.mark.parametrize(
    "kind, reason",
    [
        ("numpy", "NumPy array lives in this process only"),
        ("memory-dst", "in-memory store lives in this process only"),
        ("zip-dst", ".zip store cannot be written by several processes"),
        ("zarr-array", "open zarr.Array is an object of this process"),
    ],
)
def test_dask_refuses_what_workers_cannot_reach_and_writes_nothing(
    client, source, tmp_path, kind, reason
):
    spec = _spec({"dtype": "int8"})
    src, dst = str(source), str(tmp_path / "out.zarr")
    if kind == "numpy":
        src = np.zeros((4, 4), np.float32)
    elif kind == "memory-dst":
        dst = "memory://dask-refused"
    elif kind == "zip-dst":
        dst = str(tmp_path / "out.zip")
    else:
        src = zarr.open_array(str(source), mode="r")
    with pytest.raises(qs.InvalidParameterError, match=reason):
        qs.quantize_store(src, dst, spec, executor="dask")
    assert not os.path.exists(tmp_path / "out.zarr") and not os.path.exists(tmp_path / "out.zip")


def test_executor_arguments_are_checked():
    with pytest.raises(qs.InvalidParameterError, match="executor must be"):
        qs.calibrate(np.zeros(4, np.float32), executor="ray")
    with pytest.raises(qs.InvalidParameterError, match="kernel_threads"):
        qs.DaskExecutor(kernel_threads=0)
    with pytest.raises(qs.InvalidParameterError, match="blocks_per_task"):
        qs.DaskExecutor(blocks_per_task=0)
    with pytest.raises(qs.InvalidParameterError, match="stall_timeout"):
        qs.DaskExecutor(stall_timeout=0)


def test_the_stall_deadline_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("QSTREAM_DASK_STALL", raising=False)
    assert qs.DaskExecutor().stall_timeout == 300
    monkeypatch.setenv("QSTREAM_DASK_STALL", "2.5")
    assert qs.DaskExecutor().stall_timeout == 2.5
    assert qs.DaskExecutor(stall_timeout=7).stall_timeout == 7
    for bad in ("soon", "0", "-1", "inf"):
        monkeypatch.setenv("QSTREAM_DASK_STALL", bad)
        with pytest.raises(qs.InvalidParameterError, match="QSTREAM_DASK_STALL must be"):
            qs.DaskExecutor()


def test_nan_policy_error_fails_on_the_cluster_with_the_whole_count(client, source, tmp_path):
    spec = QuantSpec(dtype="int8", scale=0.01)  # nan_policy="error": raised by a worker
    with pytest.raises(qs.NonFiniteInputError, match="2 non-finite values"):
        qs.quantize_store(str(source), tmp_path / "e.zarr", spec, executor="dask")


# A client process that SIGKILLs itself at its n-th write event (the client writes the
# group's metadata, the parameters and the progress snapshots; workers write the chunks).
CLIENT = KILL_HOOK + textwrap.dedent(
    """
    import json, sys
    import distributed
    import qstream as qs

    address, src, dst, spec = json.loads(sys.argv[1])
    with distributed.Client(address) as c:
        ex = qs.DaskExecutor(c, blocks_per_task=1)
        report = qs.quantize_store(src, dst, qs.QuantSpec.from_dict(spec), executor=ex)
    print(json.dumps({"report": report.to_dict(), "events": count[0]}))
    """
)


def _client_run(address, src, dst, spec, kill_at=None):
    env = {**os.environ, "QSTREAM_PROGRESS_EVERY": "0"}
    env.pop("KILL_AT", None)
    if kill_at is not None:
        env["KILL_AT"] = str(kill_at)
    args = json.dumps([address, str(src), str(dst), spec])
    return subprocess.run(
        [sys.executable, "-c", CLIENT, args], capture_output=True, text=True, env=env, timeout=300
    )


def test_killed_client_then_rerun_gives_the_uninterrupted_bytes_and_report(
    client, source, tmp_path
):
    spec = {"dtype": "int8", "axis": 0, "method": "percentile", "nan_policy": "zero_point"}
    address = client.scheduler.address
    whole = _client_run(address, source, tmp_path / "whole.zarr", spec)
    assert whole.returncode == 0, whole.stderr
    events = json.loads(whole.stdout.splitlines()[-1])["events"]
    want = json.loads(whole.stdout.splitlines()[-1])["report"]
    assert events > 10
    # early (creation), middle (snapshots) and late (last snapshot, final metadata)
    for n, kill_at in enumerate(sorted({1, 3, events // 2, events - 2, events - 1})):
        dst = tmp_path / f"k{n}.zarr"
        killed = _client_run(address, source, dst, spec, kill_at=kill_at)
        assert killed.returncode == -signal.SIGKILL, (kill_at, killed.stderr[-2000:])
        again = _client_run(address, source, dst, spec)
        assert again.returncode == 0, again.stderr
        got = json.loads(again.stdout.splitlines()[-1])["report"]
        for k in ("error", "calibration", "bytes_written", "spec"):
            assert got[k] == want[k], (kill_at, k)
        _same_output(tmp_path / "whole.zarr", dst)
        assert not list(dst.rglob("*.partial"))


def test_a_lost_worker_does_not_change_the_bytes_or_the_report(client, source, tmp_path):
    spec = _spec({"dtype": "int8", "axis": 1, "method": "minmax"})
    want = qs.quantize_store(str(source), tmp_path / "want.zarr", spec, max_memory=1 << 20)
    pids = client.run(os.getpid)
    victim = next(iter(pids.values()))
    started = threading.Event()

    def slow_progress(done, total):
        if done == 2 and not started.is_set():
            started.set()
            os.kill(victim, signal.SIGKILL)  # the nanny restarts it; its tasks run again
            time.sleep(0.5)

    got = qs.quantize_store(
        str(source),
        tmp_path / "got.zarr",
        spec,
        executor=qs.DaskExecutor(client, blocks_per_task=1),
        progress=slow_progress,
        max_memory=1 << 20,
    )
    assert started.is_set()
    _same_output(tmp_path / "want.zarr", tmp_path / "got.zarr")
    _same_report(want, got)
    client.wait_for_workers(2, timeout=60)


def test_cli_scheduler_runs_on_the_cluster_and_writes_the_local_bytes(client, source, tmp_path):
    args = ["--axis", "1", "--method", "entropy", "--nan-policy", "zero_point", "--json"]
    local = CliRunner().invoke(app, ["quantize", str(source), str(tmp_path / "l.zarr"), *args])
    assert local.exit_code == 0, local.output
    address = client.scheduler.address
    remote = CliRunner().invoke(
        app, ["quantize", str(source), str(tmp_path / "d.zarr"), *args, "--scheduler", address]
    )
    assert remote.exit_code == 0, remote.output
    _same_output(tmp_path / "l.zarr", tmp_path / "d.zarr")
    a, b = json.loads(local.stdout), json.loads(remote.stdout)
    assert a["error"] == b["error"] and a["calibration"] == b["calibration"]


@pytest.mark.parametrize(
    "extra, code, message",
    [
        (["--scheduler", "local:0"], 2, "number of workers >= 1"),
        (["--scheduler", "local:1", "--max-memory", "1MiB"], 2, "cannot be written by several"),
    ],
)
def test_cli_scheduler_mistakes_exit_with_one_line(source, tmp_path, extra, code, message):
    result = CliRunner().invoke(app, ["quantize", str(source), str(tmp_path / "o.zip"), *extra])
    assert result.exit_code == code
    assert message in result.output
    assert not (tmp_path / "o.zip").exists()


@pytest.mark.parametrize("method", ["percentile", "entropy", "mse", "l2"])
def test_whole_channel_blocks_searched_by_workers_give_the_merged_histograms_ranges(
    client, tmp_path, method, monkeypatch
):
    """Blocks that hold whole channels (axis 0) are searched where their histograms are built;
    the ranges must be those of the path that merges histograms on the client."""
    from qstream.engine.jobs.job import QuantizeJob

    rng = np.random.default_rng(2)
    x = (rng.standard_normal((160, 300)) * np.exp(rng.normal(0, 1, (160, 1)))).astype(np.float32)
    source = tmp_path / "rows.zarr"
    zarr.create_array(str(source), shape=x.shape, chunks=(16, 300), dtype="float32")[...] = x
    spec = _spec({"dtype": "int8", "axis": 0, "method": method, "num_bins": 256})
    job = QuantizeJob(str(source), spec, max_memory=1 << 20)
    assert job._whole_channels() and len(job.blocks) > 1
    a = qs.calibrate(str(source), spec, max_memory=1 << 20)
    on_cluster = qs.calibrate(
        str(source), spec, max_memory=1 << 20, executor=qs.DaskExecutor(client, blocks_per_task=2)
    )
    monkeypatch.setattr(QuantizeJob, "_whole_channels", lambda self: False)
    b = qs.calibrate(str(source), spec, max_memory=1 << 20)
    for other in (b, on_cluster):
        assert json.dumps(a.summary(), sort_keys=True) == json.dumps(
            other.summary(), sort_keys=True
        )
        np.testing.assert_array_equal(a.params.scale, other.params.scale)


@pytest.mark.parametrize("axis", [None, 0])
def test_dask_compare_methods_gives_the_local_comparison(client, source, axis):
    spec = _spec({"dtype": "int8", "axis": axis, "method": "mse", "num_bins": 256})
    a = qs.compare_methods(str(source), spec)
    b = qs.compare_methods(str(source), spec, executor=qs.DaskExecutor(client, blocks_per_task=4))
    assert json.dumps(a.to_dict(), sort_keys=True) == json.dumps(b.to_dict(), sort_keys=True)
    assert len(b.view.predictions) == 5


def test_two_lost_workers_in_one_pass_do_not_fail_the_job(client, source, tmp_path):
    """Every worker holding the pass's work object dies: the scheduler computes it again (it
    is a task, not scattered data) and runs the lost tasks again; bytes and report as a
    local run."""
    spec = _spec({"dtype": "int8", "axis": 1, "method": "minmax"})
    want = qs.quantize_store(str(source), tmp_path / "want.zarr", spec, max_memory=1 << 20)
    client.wait_for_workers(2, timeout=60)
    pids = list(client.run(os.getpid).values())
    killed = threading.Event()

    def kill_both(done, total):
        if done == 2 and not killed.is_set():
            killed.set()
            for pid in pids:
                os.kill(pid, signal.SIGKILL)  # the nannies restart them
            time.sleep(0.5)

    executor = qs.DaskExecutor(client, blocks_per_task=1)
    got = qs.quantize_store(
        str(source),
        tmp_path / "got.zarr",
        spec,
        executor=executor,
        progress=kill_both,
        max_memory=1 << 20,
    )
    assert killed.is_set()
    _same_output(tmp_path / "want.zarr", tmp_path / "got.zarr")
    _same_report(want, got)
    client.wait_for_workers(2, timeout=60)
