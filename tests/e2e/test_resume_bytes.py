"""A conversion to Zarr interrupted (SIGKILL at any kind of write, or Ctrl-C), then re-run with
the same command, leaves the bytes of an uninterrupted run: every file of both outputs is
compared byte for byte, but the timing figures the README names (``README.md``, "Crash-exact
resume"), which are compared as the rest of their JSON document."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from ..support.kill_hook import KILL_HOOK, SWEEPS, kill_points

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "samples" / "tiny-transformer.safetensors"
RECIPE = ROOT / "samples" / "recipe-int8.toml"

# What README.md says may differ between a resumed output and an uninterrupted one: in each
# tensor's group document, the report's figures of the run that wrote it (not of its data)
RUN_FIGURES = ("seconds", "passes", "bytes_read", "resumed_blocks")

# The child runs the command line's convert; at its KILL_AT-th write event it sends itself
# KILL_SIGNAL (SIGKILL: dies there; SIGINT: Ctrl-C, which the command handles, exit 130)
_SIGNALLED = "os.kill(os.getpid(), signal.SIGKILL)"
assert _SIGNALLED in KILL_HOOK
CHILD = KILL_HOOK.replace(
    _SIGNALLED, "os.kill(os.getpid(), getattr(signal, os.environ['KILL_SIGNAL']))"
) + textwrap.dedent(
    """
    import atexit, sys
    from cli.main import console

    # Ctrl-C as a terminal gives it: SIGINT at its default, not blocked (a process of the
    # test run may have left it ignored or blocked, which a child inherits over exec)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)

    atexit.register(lambda: print(f"events={count[0]}", file=sys.stderr))
    sys.argv = ["qstream", *sys.argv[1:]]
    console()
    """
)


def _many_small(path: Path) -> Path:
    """A checkpoint of 220 small tensors: 2 layers of 12 experts alike (packed: a pack's rows
    are a batch of the index of their own) after 150 and 50 tensors each of its own shape
    (listed 128 to a batch)."""
    rng = np.random.default_rng(5)
    tensors = {}
    width = 8
    for layer, extras in enumerate((150, 50)):
        for k in range(extras):
            tensors[f"layers.{layer}.extra.{k}.weight"] = rng.standard_normal((4, width))
            width += 1
        for e in range(12):
            x = rng.standard_normal((16, 24)) * (1 + e % 5)
            tensors[f"layers.{layer}.mlp.experts.{e}.up_proj.weight"] = x
        tensors[f"layers.{layer}.norm.weight"] = rng.standard_normal(24)
        tensors[f"layers.{layer}.router.weight"] = rng.standard_normal((8, 24))
    save_file({k: v.astype(np.float32) for k, v in tensors.items()}, str(path))
    return path


def _convert(dst: Path, kill_at: int | None = None, sig: str = "SIGKILL", src: Path = SAMPLE):
    env = {**os.environ, "QSTREAM_PROGRESS_EVERY": "0", "KILL_SIGNAL": sig}
    env.pop("KILL_AT", None)
    if kill_at is not None:
        env["KILL_AT"] = str(kill_at)
    args = ["convert", src, dst, "--recipe", RECIPE, "--max-memory", "1MiB", "-q"]
    return subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )


def _events(run: subprocess.CompletedProcess) -> int:
    return int(run.stderr.strip().splitlines()[-1].removeprefix("events="))


def _without_run_figures(doc: Any) -> Any:
    """A tensor group's document without the report's :data:`RUN_FIGURES`."""
    report = doc.get("attributes", {}).get("qstream", {}).get("report")
    if isinstance(report, dict):
        for k in RUN_FIGURES:
            report.pop(k, None)
    return doc


def assert_same_output(got: Path, want: Path) -> None:
    """Every file and folder below ``want`` is below ``got`` and no other; each file has the
    same bytes, or is a JSON document equal but for the :data:`RUN_FIGURES`."""
    paths = {p.relative_to(want).as_posix(): p for p in sorted(want.rglob("*"))}
    found = {p.relative_to(got).as_posix() for p in got.rglob("*")}
    assert found == set(paths), (sorted(found - set(paths)), sorted(set(paths) - found))
    differing = []
    for rel, p in paths.items():
        if not p.is_file():
            assert (got / rel).is_dir(), rel
            continue
        a, b = (got / rel).read_bytes(), p.read_bytes()
        if a == b:
            continue
        differing.append(rel)
        assert rel.endswith("zarr.json") and not rel.startswith("_index/"), rel
        assert _without_run_figures(json.loads(a)) == _without_run_figures(json.loads(b)), rel
    # (only tensors' group documents may differ, in their run figures)
    assert all("/" in rel and rel.count("/") == 1 for rel in differing), differing


@pytest.fixture(scope="module", params=["sample", "packs"])
def reference(request, tmp_path_factory) -> tuple[Path, Path, int]:
    """The source (the bundled sample, or many small tensors, packed), an uninterrupted run's
    output (made at the path the tests re-run at, then moved, so that the destination the
    reports name is the same) in the folder returned, and the run's write events."""
    base = tmp_path_factory.mktemp("resume")
    src = SAMPLE if request.param == "sample" else _many_small(base / "many.safetensors")
    ref = _convert(base / "out.zarr", src=src)
    assert ref.returncode == 0, ref.stderr[-2000:]
    shutil.move(base / "out.zarr", base / "ref.zarr")
    if request.param == "packs":  # (the case this source is for)
        batches = [
            json.loads(p.read_bytes())["attributes"]
            for p in sorted((base / "ref.zarr" / "_index").glob("b*/zarr.json"))
        ]
        sizes = [len(b["rows"]) if "rows" in b else len(b["columns"]["name"]) for b in batches]
        packed = ["pack" in b.get("columns", {}) for b in batches]
        assert sizes[0] == 128 and sum(packed) >= 2 and len(batches) > 4, (sizes, packed)
    return src, base, _events(ref)


def _interrupted_then_rerun(src: Path, base: Path, n: int, sig: str) -> None:
    dst = base / "out.zarr"
    shutil.rmtree(dst, ignore_errors=True)
    stopped = _convert(dst, kill_at=n, sig=sig, src=src)
    code = -signal.SIGKILL if sig == "SIGKILL" else 130
    assert stopped.returncode == code, (n, stopped.stderr[-2000:])
    again = _convert(dst, src=src)
    assert again.returncode == 0, (n, again.stderr[-2000:])
    assert_same_output(dst, base / "ref.zarr")


@pytest.mark.parametrize("sweep", SWEEPS)
def test_a_conversion_killed_at_any_kind_of_write_then_rerun_has_the_uninterrupted_bytes(
    reference, sweep
):
    src, base, events = reference
    spot = {1, events // 3, events // 2, (2 * events) // 3, events - 2}
    every = set(range(1, events - 1, max(1, events // 24))) | spot
    for n in kill_points(sweep, every, spot):
        _interrupted_then_rerun(src, base, n, "SIGKILL")


def test_a_conversion_stopped_by_ctrl_c_then_rerun_has_the_uninterrupted_bytes(reference):
    src, base, events = reference
    for n in (events // 4, events // 2):
        _interrupted_then_rerun(src, base, n, "SIGINT")


def test_the_comparison_lets_only_the_run_figures_differ(reference, tmp_path):
    """The comparison itself: a tensor's run figures may differ; a byte of the index, or any
    other figure of a tensor's document, may not."""
    _, base, _ = reference
    other = tmp_path / "out.zarr"
    shutil.copytree(base / "ref.zarr", other)
    assert_same_output(other, base / "ref.zarr")
    tensor = next(p for p in sorted(other.glob("*/zarr.json")) if b'"report"' in p.read_bytes())
    doc = json.loads(tensor.read_bytes())
    doc["attributes"]["qstream"]["report"]["seconds"] += 1.0
    tensor.write_text(json.dumps(doc))
    assert_same_output(other, base / "ref.zarr")
    doc["attributes"]["qstream"]["report"]["error"]["mse"] = 0.5
    tensor.write_text(json.dumps(doc))
    with pytest.raises(AssertionError):
        assert_same_output(other, base / "ref.zarr")
    shutil.rmtree(other)
    shutil.copytree(base / "ref.zarr", other)
    index = other / "_index" / "b000000" / "zarr.json"
    index.write_bytes(index.read_bytes() + b" ")  # (the same JSON, not the same bytes)
    with pytest.raises(AssertionError):
        assert_same_output(other, base / "ref.zarr")
