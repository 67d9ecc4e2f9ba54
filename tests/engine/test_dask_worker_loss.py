"""A Dask worker SIGKILLed at the start of each pass (issue 51, item 7).

``qstream quantize --method percentile`` (statistics, histogram and quantize passes) and
``qstream convert`` run in a child process whose preamble (:data:`HOOK`, test-only) wraps
``DaskExecutor.map_ordered``: when a pass named in ``KILL_AT`` starts (its number, or a work
class for the first pass of that kind), before any task of it is submitted, it finds the
workers' pids through the client (``client.run(os.getpid)``) and SIGKILLs ``KILL_WORKERS`` of
them. The job must either complete with the bytes of an uninterrupted local run, or fail with
one resumable error line, after which the same command completes with those bytes; never hang
(every child is bounded by a subprocess timeout). A pass in which no task can finish (no
workers left) fails at the ``QSTREAM_DASK_STALL`` deadline with that line.

Most runs use one cluster of this module (2 worker processes under nannies, which restart a
killed worker); one runs the reported command itself, ``--scheduler local:2``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import zarr

if TYPE_CHECKING:
    from distributed import Client, LocalCluster

distributed = pytest.importorskip("distributed")

HANG = 240  # seconds a child may take before the test calls it a hang
STALL = "60"  # the jobs' deadline for a pass without progress (QSTREAM_DASK_STALL)

HOOK = textwrap.dedent(
    """
    import atexit, json, os, signal, sys
    import qstream.engine.run.dask as qd

    # passes to kill at the start of: their numbers, or a work class (its first pass)
    kill_at = [k for k in os.environ.get("KILL_AT", "").split(",") if k]
    kill_workers = int(os.environ.get("KILL_WORKERS", "1"))
    passes = []
    _real = qd.DaskExecutor.map_ordered

    def map_ordered(self, blocks, work, **kw):
        n, kind = len(passes), type(work).__name__
        first = kind not in passes
        passes.append(kind)
        if str(n) in kill_at or (first and kind in kill_at):  # no task of it submitted yet
            pids = sorted(self.client.run(os.getpid).values())[:kill_workers]
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            print(f"hook: killed {pids} at pass {n} ({kind})", file=sys.stderr, flush=True)
        yield from _real(self, blocks, work, **kw)

    qd.DaskExecutor.map_ordered = map_ordered
    atexit.register(lambda: print("hook: passes " + json.dumps(passes), file=sys.stderr))
    from cli.main import console  # (what the qstream script runs)
    console()
    """
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Client]:
    from qstream.engine.run.dask import local_client

    with local_client(2) as c:
        yield c


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A store of 8 blocks (at --max-memory 4MiB) and a checkpoint of two multi-block
    tensors, two small ones and one kept."""
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("loss")
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((1024, 512)) * np.exp(rng.normal(0, 0.7, (1024, 1)))).astype(
        np.float32
    )
    zarr.create_array(str(root / "src.zarr"), shape=x.shape, chunks=(64, 512), dtype="float32")[
        ...
    ] = x
    tensors: dict[str, np.ndarray] = {
        "layer.0.weight": (
            rng.standard_normal((512, 256)) * np.exp(rng.normal(0, 0.5, (512, 1)))
        ).astype(np.float32),
        "layer.0.bias": rng.standard_normal(256).astype(np.float32),
        "layer.1.weight": rng.standard_normal((384, 512)).astype(np.float32),
        "layer.2.weight": rng.standard_normal((64, 96)).astype(np.float32),
        "layer.3.weight": rng.standard_normal((64, 96)).astype(np.float16),
    }
    save_file(tensors, str(root / "model.safetensors"))
    return root


def quantize_args(data: Path, dst: Path, *extra: str) -> list[str]:
    src = str(data / "src.zarr")
    return [
        "quantize",
        src,
        str(dst),
        "--method",
        "percentile",
        "--max-memory",
        "4MiB",
        "-q",
        *extra,
    ]


def convert_args(data: Path, dst: Path, *extra: str) -> list[str]:
    ck = str(data / "model.safetensors")
    return ["convert", ck, str(dst), "--method", "percentile", "--max-memory", "2MiB", "-q", *extra]


def run(
    args: list[str],
    *,
    kill: list[int | str] | None = None,
    workers: int = 1,
    stall: str = STALL,
) -> subprocess.CompletedProcess[str]:
    """The command line ``args`` in a child with the hook, killing ``workers`` workers at the
    start of each pass in ``kill`` (bounded: a hang fails the test)."""
    env = {**os.environ, "QSTREAM_DASK_STALL": stall}
    env.pop("KILL_AT", None)
    if kill:
        env.update(KILL_AT=",".join(map(str, kill)), KILL_WORKERS=str(workers))
    try:
        return subprocess.run(
            [sys.executable, "-c", HOOK, *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=HANG,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung: {args} (kills at passes {kill}) ran past {HANG} s: {e.stderr!r}")


def passes(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The passes the hook saw (their work objects' classes)."""
    line = [ln for ln in result.stderr.splitlines() if ln.startswith("hook: passes ")][-1]
    found: list[str] = json.loads(line.removeprefix("hook: passes "))
    return found


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("error:")]


def resumable(result: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a failed run, which says the job is resumable."""
    errors = error_lines(result.stderr)
    assert result.returncode == 1 and len(errors) == 1, result.stderr[-3000:]
    assert "resumable" in errors[0] and "run the same command again" in errors[0], errors
    return errors[0]


# what differs between runs that write the same bytes: where, how long, and the work done: a
# resumed run makes only the passes left; a cluster searches the percentiles of whole-channel
# blocks where it built their histograms, without the local executor's second read
# (tests/engine/test_dask.py compares those where they are equal)
VARIES = ("destination", "seconds", "passes", "bytes_read")


def _normal(doc: object) -> object:
    """A metadata document without what :data:`VARIES`."""
    if isinstance(doc, dict):
        return {k: _normal(v) for k, v in doc.items() if k not in VARIES}
    if isinstance(doc, list):
        return [_normal(v) for v in doc]
    return doc


def _flat(doc: object, at: str = "") -> dict[str, object]:
    """``{path: value}`` of a JSON document's leaves."""
    if isinstance(doc, dict):
        return {k: v for key, item in doc.items() for k, v in _flat(item, f"{at}/{key}").items()}
    if isinstance(doc, list):
        return {k: v for i, item in enumerate(doc) for k, v in _flat(item, f"{at}[{i}]").items()}
    return {at: doc}


def same_files(want: Path, got: Path) -> None:
    """The same files, each chunk byte for byte, each metadata document equal but for its
    own path and timing."""
    files = sorted(p.relative_to(want) for p in want.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(got) for p in got.rglob("*") if p.is_file())
    for rel in files:
        a, b = (want / rel).read_bytes(), (got / rel).read_bytes()
        if rel.name == "zarr.json":
            fa, fb = _flat(_normal(json.loads(a))), _flat(_normal(json.loads(b)))
            assert fa == fb, (
                rel,
                {
                    k: (fa.get(k), fb.get(k))
                    for k in fa.keys() ^ fb.keys()
                    | {k for k in fa.keys() & fb.keys() if fa[k] != fb[k]}
                },
            )
        else:
            assert a == b, rel


def completes(
    args: list[str], got: Path, want: Path, kill: list[int | str], workers: int = 1
) -> subprocess.CompletedProcess[str]:
    """Run ``args`` with kills: it completes, or fails with one resumable line and the same
    command then completes; either way with ``want``'s bytes."""
    first = run(args, kill=kill, workers=workers)
    killed = first.stderr.count("hook: killed")  # (a failed run may stop before the last)
    assert killed == len(kill) or (killed and first.returncode), first.stderr[-3000:]
    if first.returncode != 0:
        resumable(first)
        again = run(args)
        assert again.returncode == 0, again.stderr[-3000:]
    same_files(want, got)
    return first


@pytest.fixture(scope="module")
def wanted(data: Path) -> dict[str, Path]:
    """Uninterrupted local runs (no --scheduler; the same command line, in this process)."""
    from typer.testing import CliRunner

    from cli.main import app

    out = {"quantize": data / "want-q.zarr", "convert": data / "want-c"}
    for kind, dst in out.items():
        args = quantize_args(data, dst) if kind == "quantize" else convert_args(data, dst)
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.output
    return out


QUANTIZE_PASSES = ["RangesWork", "HistogramWork", "QuantizeWork"]


@pytest.mark.parametrize(
    "kill, workers",
    [
        (QUANTIZE_PASSES, 1),  # one worker as each pass starts, in one run
        pytest.param(["RangesWork"], 1, marks=pytest.mark.slow),
        pytest.param(["HistogramWork"], 1, marks=pytest.mark.slow),  # the reported case
        pytest.param(["QuantizeWork"], 1, marks=pytest.mark.slow),
        pytest.param(["RangesWork"], 2, marks=pytest.mark.slow),
        pytest.param(["HistogramWork"], 2, marks=pytest.mark.slow),
        pytest.param(["QuantizeWork"], 2, marks=pytest.mark.slow),
    ],
)
def test_quantize_survives_workers_killed_at_the_start_of_a_pass(
    cluster, data, wanted, tmp_path, kill, workers
):
    """``--method percentile``: statistics, histogram and quantize passes; one worker or both
    (the nannies restart them) killed as a pass starts, or one at every pass."""
    cluster.wait_for_workers(2, timeout=120)
    dst = tmp_path / "q.zarr"
    args = quantize_args(data, dst, "--scheduler", cluster.scheduler.address)
    first = completes(args, dst, wanted["quantize"], kill=kill, workers=workers)
    assert passes(first) == QUANTIZE_PASSES


@pytest.mark.slow
def test_the_reported_command_survives_a_worker_killed_at_the_histogram_pass(
    data, wanted, tmp_path
):
    """``qstream quantize SRC DST --method percentile --scheduler local:2``, one worker of its
    own cluster killed as the histogram pass starts (it hung, or failed with
    CommClosedError, when the pass's work object was scattered to every worker)."""
    dst = tmp_path / "q.zarr"
    args = quantize_args(data, dst, "--scheduler", "local:2")
    first = completes(args, dst, wanted["quantize"], kill=["HistogramWork"])
    assert passes(first) == QUANTIZE_PASSES


CONVERT_KINDS = {"UnitWork", "RangesWork", "HistogramWork", "QuantizeWork"}


def test_convert_survives_a_worker_killed_at_the_start_of_a_quantize_pass(
    cluster, data, wanted, tmp_path
):
    """The first multi-block tensor's quantize pass (its statistics and histogram passes
    done); the slow tests kill at every pass."""
    cluster.wait_for_workers(2, timeout=120)
    dst = tmp_path / "c"
    args = convert_args(data, dst, "--scheduler", cluster.scheduler.address)
    first = completes(args, dst, wanted["convert"], kill=["QuantizeWork"])
    assert set(passes(first)) == CONVERT_KINDS


@pytest.fixture(scope="module")
def convert_passes(cluster, data, tmp_path_factory) -> list[str]:
    """The passes of the conversion on the cluster (their kinds, in order)."""
    dst = tmp_path_factory.mktemp("passes") / "c"
    r = run(convert_args(data, dst, "--scheduler", cluster.scheduler.address))
    assert r.returncode == 0, r.stderr[-3000:]
    found = passes(r)
    assert set(found) == CONVERT_KINDS, found
    return found


@pytest.mark.slow
@pytest.mark.parametrize("sweep", ["firsts", "sweep"])
def test_convert_survives_a_worker_killed_at_the_start_of_passes(
    cluster, data, wanted, convert_passes, tmp_path, sweep
):
    """``firsts``: one run killing at the first pass of each kind (small tensors, statistics,
    histogram, quantize) and at the last; ``sweep``: every pass, a run each."""
    if sweep == "firsts":
        runs: list[list[int | str]] = [[*sorted(CONVERT_KINDS), len(convert_passes) - 1]]
    else:
        runs = [[n] for n in range(len(convert_passes))]
    for n, kill in enumerate(runs):
        cluster.wait_for_workers(2, timeout=120)
        dst = tmp_path / f"c{n}"
        args = convert_args(data, dst, "--scheduler", cluster.scheduler.address)
        first = completes(args, dst, wanted["convert"], kill=kill)
        assert passes(first) == convert_passes, kill


@pytest.fixture
def bare_scheduler() -> Iterator[LocalCluster]:
    """A scheduler with no workers (in this process; thread workers are added with
    ``scale``)."""
    with distributed.LocalCluster(
        n_workers=0, processes=False, protocol="tcp", dashboard_address=":0"
    ) as lc:
        yield lc


def test_a_pass_without_workers_fails_at_the_deadline_with_one_resumable_line(
    bare_scheduler, data, tmp_path
):
    """No worker to run the statistics pass: the job fails at the deadline (it never waits
    for ever), nothing written."""
    dst = tmp_path / "q.zarr"
    first = run(
        quantize_args(data, dst, "--scheduler", bare_scheduler.scheduler_address), stall="2"
    )
    line = resumable(first)
    assert "finished no task of the statistics pass in 2 s (0 workers now" in line, line
    assert not dst.exists()


def test_workers_lost_for_good_at_the_quantize_pass_then_the_same_command_resumes(
    bare_scheduler, data, wanted, tmp_path
):
    """The only worker (a process, no nanny to restart it) SIGKILLed as the quantize pass
    starts: the job fails at the deadline with one resumable line, its output not
    complete; a worker joins and the same command resumes to the uninterrupted bytes."""
    address = bare_scheduler.scheduler_address
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "distributed.cli.dask_worker",
            address,
            "--no-nanny",
            "--nthreads",
            "2",
            "--no-dashboard",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with distributed.Client(address) as c:
            c.wait_for_workers(1, timeout=120)
        dst = tmp_path / "q.zarr"
        args = quantize_args(data, dst, "--scheduler", address)
        first = run(args, kill=[2], stall="3")
        assert "hook: killed" in first.stderr
        line = resumable(first)
        assert "finished no task of the quantize pass in 3 s (0 workers now" in line, line
        assert passes(first) == QUANTIZE_PASSES
        assert worker.wait(timeout=60) == -9
        bare_scheduler.scale(1)
        again = run(args)
        assert again.returncode == 0, again.stderr[-3000:]
        same_files(wanted["quantize"], dst)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
