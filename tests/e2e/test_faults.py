"""Real faults: a job killed with SIGKILL at many points (from the group's creation to after
the last chunk), a full disk, two processes starting one job at once. Every interrupted job,
re-run with the same command, must leave the bytes and the report of an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

import qstream as qs
from qstream.io.zarr_types import zarr_ext

from ..support.kill_hook import KILL_HOOK, SWEEPS, kill_points

# The child runs one job. With KILL_AT=n it SIGKILLs itself at the n-th write event: just
# before or just after each atomic rename (every chunk, metadata and snapshot write of
# qstream and of zarr's local store goes through one), so every state a kill can leave on
# disk between two writes is reached, including the creation of the group.
CHILD = KILL_HOOK + textwrap.dedent(
    """
    import json, sys
    import qstream as qs

    src, dst, spec, max_memory, compression = json.loads(sys.argv[1])
    report = qs.quantize_store(
        src, dst, qs.QuantSpec.from_dict(spec), max_memory=max_memory, compression=compression
    )
    print(json.dumps({"report": report.to_dict(), "events": count[0]}))
    """
)

SPECS = {
    "per-axis": {"dtype": "int8", "axis": 0},
    "per-tensor-percentile": {"dtype": "uint8", "method": "percentile", "symmetric": False},
    "blocked-dynamic": {"dtype": "int4", "axis": 1, "block_size": 32, "method": "dynamic"},
}
# (spec, compression) per case: raw chunks are written by another path than compressed ones
CASES = {name: (spec, "auto") for name, spec in SPECS.items()}
CASES["per-axis-raw"] = (SPECS["per-axis"], "none")


def _env():
    env = {**os.environ, "QSTREAM_PROGRESS_EVERY": "0"}  # a snapshot after every block
    env.pop("KILL_AT", None)
    return env


def _args(src, dst, spec, max_memory=1 << 20, compression="auto") -> str:
    """The child's one argument."""
    return json.dumps([str(src), str(dst), spec, max_memory, compression])


def _child(src, dst, spec, kill_at=None, max_memory=1 << 20, compression="auto"):
    env = _env()
    if kill_at is not None:
        env["KILL_AT"] = str(kill_at)
    args = _args(src, dst, spec, max_memory, compression)
    return subprocess.run(
        [sys.executable, "-c", CHILD, args], capture_output=True, text=True, env=env, timeout=300
    )


def _source(tmp_path: Path, shape=(256, 512), chunks=(16, 512)) -> Path:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * np.exp(rng.normal(0, 0.5, (shape[0], 1)))).astype(np.float32)
    path = tmp_path / "src.zarr"
    a = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype="float32")
    a[...] = x
    return path


def _contents(dst: Path) -> dict:
    zarr_ext.register_zarr_types()  # (zarr 3.1 does not load data types from entry points)
    g = zarr.open_group(str(dst), mode="r")
    meta = g.attrs["qstream"]
    return {
        "data": np.asarray(g["data"][...]),
        "scale": np.asarray(g["scale"][...]),
        "zero_point": np.asarray(g["zero_point"][...]),
        "complete": meta["complete"],
        "error": meta["error"],
        "calibration": meta["calibration"],
    }


def _same(a: dict, b: dict) -> None:
    for k in ("data", "scale", "zero_point"):
        np.testing.assert_array_equal(a[k], b[k])
        assert a[k].dtype == b[k].dtype
    assert a["complete"] is b["complete"] is True
    assert a["error"] == b["error"]  # float sums folded in the same order: same bits
    assert a["calibration"] == b["calibration"]


def _no_leftovers(dst: Path) -> None:
    left = [p for p in dst.rglob("*") if p.name.endswith(".partial")]
    assert not left, left


@pytest.mark.parametrize("sweep", SWEEPS)
@pytest.mark.parametrize("name", list(CASES))
def test_sigkill_at_every_kind_of_moment_then_rerun_gives_the_uninterrupted_bytes_and_report(
    tmp_path, name, sweep
):
    spec, compression = CASES[name]
    src = _source(tmp_path)
    ref = _child(src, tmp_path / "ref.zarr", spec, compression=compression)
    assert ref.returncode == 0, ref.stderr
    events = json.loads(ref.stdout)["events"]
    want = _contents(tmp_path / "ref.zarr")
    ref_report = json.loads(ref.stdout)["report"]
    # the first events (the group's creation window), the last ones (after the last chunk,
    # around the final metadata write), and points spread over the passes between
    every = {0, 1, 2, 3, 4, 5, events // 3, events // 2, events - 3, events - 2, events - 1}
    if name == "per-axis":
        every |= set(range(6, events, max(1, events // 12)))
    points = kill_points(sweep, every, {3, events // 3, events // 2, events - 2})
    resumed = 0
    for n in points:
        dst = tmp_path / f"k{n}.zarr"
        killed = _child(src, dst, spec, kill_at=n, compression=compression)
        assert killed.returncode == -signal.SIGKILL, (n, killed.stderr[-2000:])
        finished = False
        if (dst / "zarr.json").exists():  # an output that is not finished says so
            meta = json.loads((dst / "zarr.json").read_text())["attributes"]["qstream"]
            finished = meta["complete"]  # killed after its last write
            if not finished:
                with pytest.raises(qs.StoreError, match=r"incomplete|interrupted"):
                    qs.open_quantized(dst)
        again = _child(src, dst, spec, compression=compression)
        assert again.returncode == 0, (n, again.stderr[-2000:])
        report = json.loads(again.stdout)["report"]
        assert report["already_complete"] == finished
        resumed += report["resumed_blocks"] > 0
        _same(_contents(dst), want)
        for key in ("error", "calibration", "bytes_written", "spec", "source"):
            assert report[key] == ref_report[key], (n, key)
        _no_leftovers(dst)
        if compression == "none":
            assert json.loads((dst / "data/zarr.json").read_text())["codecs"][1:] == []
    # some runs really started from a snapshot, not from scratch
    assert resumed >= (2 if sweep == "sweep" else 1)


def test_sigkill_at_random_times_then_rerun_gives_the_uninterrupted_bytes_and_report(tmp_path):
    _random_kills(tmp_path, int(os.environ.get("QSTREAM_RANDOM_KILLS", "2")))


@pytest.mark.slow
def test_sigkill_at_twenty_random_times(tmp_path):
    _random_kills(tmp_path, 20)


def _random_kills(tmp_path, n: int) -> None:
    spec = {"dtype": "int8", "axis": 0, "method": "percentile"}
    src = _source(tmp_path, shape=(2048, 2048), chunks=(64, 2048))
    t0 = time.perf_counter()
    ref = _child(src, tmp_path / "ref.zarr", spec)
    span = time.perf_counter() - t0
    assert ref.returncode == 0, ref.stderr
    want = _contents(tmp_path / "ref.zarr")
    rng = random.Random(7)
    env = _env()
    for i in range(n):
        dst = tmp_path / f"r{i}.zarr"
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, _args(src, dst, spec)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.0, span))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        again = _child(src, dst, spec)
        assert again.returncode == 0, again.stderr[-2000:]
        _same(_contents(dst), want)
        _no_leftovers(dst)


def test_two_processes_starting_one_job_end_with_the_same_complete_output(tmp_path):
    src = _source(tmp_path, shape=(1024, 1024), chunks=(32, 1024))
    spec = {"dtype": "int8", "axis": 0, "method": "percentile"}
    ref = _child(src, tmp_path / "ref.zarr", spec)
    want = _contents(tmp_path / "ref.zarr")
    dst = tmp_path / "both.zarr"
    args = _args(src, dst, spec)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, args],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = [p.returncode for p in procs]
    assert ref.returncode == 0 and 0 in codes, outs
    for code, (_, err) in zip(codes, outs, strict=True):
        if code:  # refused, with a message, not a raw zarr exception
            assert "being written by another qstream process" in err, err
            assert "zarr.errors" not in err
    _same(_contents(dst), want)


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    if os.name != "posix" or os.geteuid() != 0:
        return False
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    return r.returncode == 0


def test_full_disk_fails_clearly_leaves_nothing_complete_and_resumes_when_space_returns(tmp_path):
    src = _source(tmp_path, shape=(512, 1024), chunks=(32, 1024))  # 2 MiB, int8 output 512 KiB
    spec = {"dtype": "int8", "axis": 0}
    assert _child(src, tmp_path / "ref.zarr", spec).returncode == 0
    want = _contents(tmp_path / "ref.zarr")
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "300k"):
        pytest.skip("cannot mount a small tmpfs here (needs root): no full disk to test with")
    try:
        dst = disk / "q.zarr"
        full = _child(src, dst, spec)
        assert full.returncode == 1, full.stderr[-2000:]
        assert "No space left on device" in full.stderr and str(dst) in full.stderr
        assert "Traceback" in full.stderr  # the API raises; the message is the StoreError's
        assert "qstream.errors.StoreError" in full.stderr
        with pytest.raises(qs.StoreError, match=r"incomplete|interrupted"):
            qs.open_quantized(dst)
        r = subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], capture_output=True)
        assert r.returncode == 0, r.stderr
        again = _child(src, dst, spec)
        assert again.returncode == 0, again.stderr[-2000:]
        _same(_contents(dst), want)
        _no_leftovers(dst)
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


# A child that runs one checkpoint operation and SIGKILLs itself at its n-th write event.
CHECKPOINT_CHILD = KILL_HOOK + textwrap.dedent(
    """
    import json, sys
    import qstream as qs

    op, src, dst = sys.argv[1:4]
    if op == "to-safetensors":  # convert, then export in shards
        qs.convert_checkpoint(src, dst, max_shard_size=2000)
    elif op == "convert-many":  # many small tensors and a few that are jobs of their own
        # (each a group of its own; packed conversions: test_packs.py's SIGKILL test)
        r = qs.convert_checkpoint(src, dst, max_memory=1 << 20, packs=False)
        print(json.dumps({"rows": r["tensors"]}))
    else:  # restore a converted checkpoint
        qs.dequantize_store(src, dst)
    print(json.dumps({"events": count[0]}))
    """
)


def _checkpoint_child(op, src, dst, kill_at=None):
    env = _env()
    if kill_at is not None:
        env["KILL_AT"] = str(kill_at)
    return subprocess.run(
        [sys.executable, "-c", CHECKPOINT_CHILD, op, str(src), str(dst)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _files(root: Path, names) -> dict[str, bytes]:
    return {n: (root / n).read_bytes() for n in names}


@pytest.mark.parametrize("sweep", SWEEPS)
@pytest.mark.parametrize("op", ["to-safetensors", "restore"])
def test_sigkill_during_checkpoint_export_or_restore_then_rerun_gives_the_same_files(
    tmp_path, op, sweep
):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(4)
    ck = tmp_path / "m.safetensors"
    save_file(
        {
            "a.weight": rng.standard_normal((48, 40)).astype(np.float32),
            "a.bias": rng.standard_normal(40).astype(np.float32),
            "b.weight": rng.standard_normal((32, 48)).astype(np.float32),
        },
        str(ck),
    )
    if op == "restore":
        src = tmp_path / "q"
        qs.convert_checkpoint(ck, src)
    else:
        src = ck

    def target(d: Path) -> Path:
        return d / "out.safetensors" if op == "to-safetensors" else d / "restored"

    def contents(d: Path) -> dict:
        if op == "to-safetensors":
            names = sorted(p.name for p in d.iterdir() if p.name.startswith("out"))
            assert "out.safetensors.index.json" in names
            assert not any(n.endswith((".partial", ".qstream-work")) for n in names)
            return _files(d, names)
        g = zarr.open_group(str(d / "restored"), mode="r")
        return {n: np.asarray(g[n][...]).tobytes() for n in ("a.weight", "a.bias", "b.weight")}

    (tmp_path / "ref").mkdir()
    ref = _checkpoint_child(op, src, target(tmp_path / "ref"))
    assert ref.returncode == 0, ref.stderr[-2000:]
    events = json.loads(ref.stdout)["events"]
    want = contents(tmp_path / "ref")
    every = {0, 2, events // 3, events // 2, events - 3, events - 2, events - 1}
    for n in kill_points(sweep, every, {2, events // 2, events - 2}):
        d = tmp_path / f"k{n}"
        d.mkdir()
        killed = _checkpoint_child(op, src, target(d), kill_at=n)
        assert killed.returncode == -signal.SIGKILL, (n, killed.stderr[-2000:])
        again = _checkpoint_child(op, src, target(d))
        assert again.returncode == 0, (n, again.stderr[-2000:])
        assert contents(d) == want, n
        assert not [p for p in d.rglob("*") if p.name.endswith(".partial")], n


def _many_tensors(path: Path) -> list[str]:
    """A checkpoint of 60 small tensors (one block of their job each, under a 1 MiB bound),
    two that are several blocks, and kept rank-1 tensors."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(8)
    tensors = {}
    for i in range(60):
        tensors[f"model.layers.{i // 6}.mlp.experts.{i % 6}.up_proj.weight"] = (
            rng.standard_normal((32, 64)) * (1 + i % 5)
        ).astype(np.float32)
        if i % 20 == 0:
            tensors[f"model.layers.{i // 6}.norm.weight"] = rng.standard_normal(64).astype(
                np.float32
            )
            tensors[f"model.layers.{i // 6}.big.weight"] = rng.standard_normal((256, 256)).astype(
                np.float32
            )
    save_file(tensors, str(path))
    return list(tensors)


def _converted(root: Path, names) -> dict:
    """Every tensor's stored arrays and report, the root's listed rows and its metadata."""
    opened = qs.open_quantized(root)
    out = {"rows": json.dumps(opened.tensors, sort_keys=True)}
    root_doc = json.loads((root / "zarr.json").read_text())  # (the root's own metadata)
    out["root"] = json.dumps(root_doc["attributes"]["qstream_checkpoint"], sort_keys=True)
    for n in names:
        g = zarr.open(str(root / opened.key_of(n)), mode="r")
        if isinstance(g, zarr.Array):
            out[n] = np.asarray(g[...]).tobytes()
            continue
        out[n] = tuple(np.asarray(g[m][...]).tobytes() for m in ("data", "scale", "zero_point"))
        report = g.attrs["qstream"]["report"]  # (what it says of the output, not of the run)
        kept = ("spec", "source", "calibration", "error", "bytes_written", "missing_chunks")
        out[n + "/report"] = json.dumps({k: report[k] for k in kept}, sort_keys=True)
    return out


@pytest.mark.parametrize("sweep", SWEEPS)
def test_sigkill_during_a_many_tensor_conversion_then_rerun_gives_the_same_output(tmp_path, sweep):
    names = _many_tensors(tmp_path / "m.safetensors")
    ref = _checkpoint_child("convert-many", tmp_path / "m.safetensors", tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr[-2000:]
    lines = ref.stdout.strip().splitlines()
    events = json.loads(lines[-1])["events"]
    want = _converted(tmp_path / "ref", names)
    rng = random.Random(5)
    every = {0, 1, 2, events // 2, events - 2, events - 1, *rng.sample(range(events), 6)}
    for n in kill_points(sweep, every, {1, events // 2, events - 2}):
        d = tmp_path / f"k{n}"
        killed = _checkpoint_child("convert-many", tmp_path / "m.safetensors", d, kill_at=n)
        assert killed.returncode == -signal.SIGKILL, (n, killed.stderr[-2000:])
        again = _checkpoint_child("convert-many", tmp_path / "m.safetensors", d)
        assert again.returncode == 0, (n, again.stderr[-2000:])
        assert _converted(d, names) == want, n
        assert json.loads(again.stdout.splitlines()[0])["rows"] == json.loads(lines[0])["rows"], n
        assert not [p for p in d.iterdir() if p.name.startswith(".qstream-tmp-")], n
