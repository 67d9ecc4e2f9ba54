"""Exports lock the folder they write, as conversions lock their destination: two real
``qstream export`` processes into one place at once, the first held at a chosen write (a pause
hook, the kill hook's twin) while the second runs. The second is refused (exit 75, naming the
destination); the first ends with the bytes of an uninterrupted run; a folder never ends with
an index whose shards are missing, whatever export stops where."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import qstream as qs

from ..support.kill_hook import KILL_HOOK

BUSY = 75  # EX_TEMPFAIL: cli.failures

# A child running the CLI that, with PAUSE_AT=n, stops just before its n-th atomic rename (a
# shard, a config.json, an index moved into place), writes the file READY and waits until the
# file GO exists: the export holds its lock, with part of its files written, for as long as
# the test needs.
PAUSE_HOOK = textwrap.dedent(
    """
    import os, time

    pause_at = int(os.environ.get("PAUSE_AT", "-1"))
    replaces = [0]
    _real_replace = os.replace

    def _replace(a, b, *args, **kw):
        if not str(b).endswith((".nbi", ".nbc")):  # (Numba's cache: not the export's)
            if replaces[0] == pause_at:
                open(os.environ["READY"], "w").close()
                end = time.monotonic() + 300
                while not os.path.exists(os.environ["GO"]) and time.monotonic() < end:
                    time.sleep(0.02)
            replaces[0] += 1
        return _real_replace(a, b, *args, **kw)

    os.replace = _replace
    """
)
CLI = textwrap.dedent(
    """
    import sys
    from cli.main import console

    sys.argv = ["qstream", *sys.argv[1:]]
    console()
    """
)


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **extra}
    for k in ("PAUSE_AT", "KILL_AT", "READY", "GO"):
        if k not in extra:
            env.pop(k, None)
    return env


def _cli(*args: object, hook: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", hook + CLI, *map(str, args)],
        capture_output=True,
        text=True,
        env=_env(**env),
        timeout=300,
    )


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """A converted checkpoint of six tensors (each ~16 KiB as int8)."""
    d = tmp_path_factory.mktemp("lock")
    rng = np.random.default_rng(5)
    save_file(
        {f"l{i}.weight": rng.standard_normal((128, 128)).astype(np.float32) for i in range(6)},
        str(d / "m.safetensors"),
    )
    qs.convert_checkpoint(d / "m.safetensors", d / "q.zarr")
    return d / "q.zarr"


SHARDED = ("--max-shard-size", "40000")  # 3 shards of two tensors (and their scales)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _consistent(folder: Path, stem: str = "model") -> None:
    """No index names a shard that is missing, and never an index beside a single file."""
    names = set(os.listdir(folder))
    index = f"{stem}.safetensors.index.json"
    if index in names:
        shards = set(json.loads((folder / index).read_text())["weight_map"].values())
        assert shards <= names, (sorted(shards - names), sorted(names))
        assert f"{stem}.safetensors" not in names, sorted(names)


@pytest.mark.parametrize(
    "first,second",
    [(SHARDED, ("--overwrite",)), ((), (*SHARDED, "--overwrite")), ((), ())],
    ids=["sharded-then-single", "single-then-sharded", "the-same-export"],
)
def test_a_second_export_into_a_folder_being_written_is_refused_and_the_first_completes(
    converted, tmp_path, first, second
):
    ref = tmp_path / "ref"
    ref.mkdir()
    r = _cli("export", converted, ref / "model.safetensors", *first)
    assert r.returncode == 0, r.stderr[-2000:]
    want = _files(ref)
    assert (len(want) > 3) == bool(first), sorted(want)  # (shards and an index, or one file)
    folder = tmp_path / "out"
    folder.mkdir()
    dst = folder / "model.safetensors"
    ready, go = tmp_path / "ready", tmp_path / "go"
    # the first holds its lock just before its second rename: one shard (or the config.json)
    # is in place, the rest not yet
    held = subprocess.Popen(
        [sys.executable, "-c", PAUSE_HOOK + CLI, "export", str(converted), str(dst), *first],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(PAUSE_AT="1", READY=str(ready), GO=str(go)),
    )
    try:
        end = time.monotonic() + 300
        while not ready.exists():
            assert held.poll() is None, held.communicate()
            assert time.monotonic() < end, "the first export never reached its second rename"
            time.sleep(0.02)
        assert ".qstream-lock" in os.listdir(folder)
        during = _files(folder)
        second_run = _cli("export", converted, dst, *second)
        assert second_run.returncode == BUSY, (second_run.returncode, second_run.stderr)
        err = second_run.stderr
        assert str(dst) in err and "being written by another qstream process" in err, err
        assert _files(folder) == during  # the refused export touched nothing
    finally:
        go.touch()
        _, err = held.communicate(timeout=300)
    assert held.returncode == 0, err[-2000:]
    got = _files(folder)
    assert got == want  # the first export's files, byte for byte those of an uninterrupted run
    _consistent(folder)
    # the second, once the first is done: its own form alone, whole
    again = _cli("export", converted, dst, *second)
    assert again.returncode == 0, again.stderr[-2000:]
    _consistent(folder)
    names = sorted(os.listdir(folder))
    if SHARDED[0] in second:
        assert "model.safetensors.index.json" in names and "model.safetensors" not in names
    else:
        assert names == ["config.json", "model.safetensors"]


def test_an_export_of_another_file_into_a_folder_being_written_is_refused_too(converted, tmp_path):
    """A second export into the folder, even of another file name, is refused: exports of
    a folder share its config.json (and a file's other form); the lock is the folder's."""
    folder = tmp_path / "out"
    folder.mkdir()
    ready, go = tmp_path / "ready", tmp_path / "go"
    held = subprocess.Popen(
        [sys.executable, "-c", PAUSE_HOOK + CLI, "export", str(converted),
         str(folder / "a.safetensors")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_env(PAUSE_AT="0", READY=str(ready), GO=str(go)),
    )  # fmt: skip
    try:
        end = time.monotonic() + 300
        while not ready.exists():
            assert held.poll() is None, held.communicate()
            assert time.monotonic() < end
            time.sleep(0.02)
        other = _cli("export", converted, folder / "b.safetensors", "--format", "qstream")
        assert other.returncode == BUSY and str(folder / "b.safetensors") in other.stderr, (
            other.stderr
        )
    finally:
        go.touch()
        _, err = held.communicate(timeout=300)
    assert held.returncode == 0, err[-2000:]
    assert sorted(os.listdir(folder)) == ["a.safetensors", "config.json"]


# A child killed (SIGKILL) at its n-th write event (tests/support/kill_hook.py), exporting.
KILLED = KILL_HOOK + CLI


@pytest.mark.parametrize(
    "before,after",
    [(SHARDED, ("--max-shard-size", "70000")), (SHARDED, ()), ((), SHARDED)],
    ids=["3-shards-to-2", "shards-to-one-file", "one-file-to-shards"],
)
def test_an_overwriting_export_killed_anywhere_leaves_no_index_naming_missing_shards(
    converted, tmp_path, before, after
):
    ref = tmp_path / "ref"  # the same two exports, uninterrupted
    ref.mkdir()
    assert _cli("export", converted, ref / "model.safetensors", *before).returncode == 0
    r = _cli("export", converted, ref / "model.safetensors", *after, "--overwrite")
    assert r.returncode == 0, r.stderr[-2000:]
    want = _files(ref)
    n = 0
    while True:  # every write event of the overwriting export, until one is not reached
        folder = tmp_path / f"k{n}"
        folder.mkdir()
        dst = folder / "model.safetensors"
        assert _cli("export", converted, dst, *before).returncode == 0
        killed = _cli("export", converted, dst, *after, "--overwrite", hook=KILL_HOOK,
                      KILL_AT=str(n))  # fmt: skip
        _consistent(folder)
        if killed.returncode == 0:  # past its last event: done
            assert _files(folder) == want
            break
        assert killed.returncode == -signal.SIGKILL, (n, killed.stderr[-2000:])
        # the same command again ends with the uninterrupted run's files
        again = _cli("export", converted, dst, *after, "--overwrite")
        assert again.returncode == 0, (n, again.stderr[-2000:])
        assert _files(folder) == want, n
        n += 1
    assert n >= 2  # (killed at least before and after its last rename)
