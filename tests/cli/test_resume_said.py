"""A conversion re-run after an interruption says so: ``resuming: K of N tensors already done``
before its progress (and ``resumed`` in ``--json``), and lists only the tensors it converts."""

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import qstream as qs
from cli.main import app

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "tiny-transformer.safetensors"
runner = CliRunner()
STOP_AFTER = 12


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def interrupted(dst: Path) -> tuple[set[str], int]:
    """Convert the sample into ``dst`` as the command line does (its default recipe), Ctrl-C
    after STOP_AFTER tensors; the names the output lists as finished, and the tensor count."""
    seen: list[str] = []

    def stop(ev: qs.TensorEvent) -> None:
        if ev.result is not None:
            seen.append(ev.name)
            if len(seen) == STOP_AFTER:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        qs.convert_checkpoint(
            SAMPLE, dst, qs.Recipe.from_dict({"defaults": {}, "rules": []}), on_tensor=stop
        )
    ck = qs.open_quantized(dst, allow_incomplete=True)
    assert not ck.meta["complete"]
    return set(ck.tensors), len(qs.open_checkpoint(SAMPLE))


def test_a_resumed_conversion_says_how_much_was_done_and_lists_the_rest(tmp_path):
    dst = tmp_path / "out.zarr"
    done, total = interrupted(dst)
    assert 0 < len(done) < total
    r = run("convert", SAMPLE, dst)
    assert r.exit_code == 0, r.output
    assert r.stderr.splitlines()[0] == f"resuming: {len(done)} of {total} tensors already done"
    lines = [ln for ln in r.stdout.splitlines() if re.match(r"\[\s*\d+/\d+\]", ln)]
    numbers = [int(re.match(r"\[\s*(\d+)/", ln).group(1)) for ln in lines]
    assert len(lines) == total - len(done) and min(numbers) > 0
    assert not [ln for ln in lines if ln.split()[1] in done]  # (done ones are not listed again)
    assert qs.open_quantized(dst).meta["complete"]


def test_json_reports_resumed_counts_and_null_for_a_fresh_run(tmp_path):
    dst = tmp_path / "out.zarr"
    done, total = interrupted(dst)
    r = run("convert", SAMPLE, dst, "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["resumed"] == {"done": len(done), "total": total}
    assert report["summary"]["resumed"] == report["resumed"]
    assert "resuming" not in r.stderr  # (--json: the report says it)
    fresh = json.loads(run("convert", SAMPLE, tmp_path / "fresh.zarr", "--json").stdout)
    assert fresh["resumed"] is None and set(fresh["tensors"]) == set(report["tensors"])
    r = run("convert", SAMPLE, tmp_path / "fresh.zarr")  # finished: nothing resumed
    assert r.exit_code == 0 and "resuming" not in r.output


KILLED = """
import os, signal, sys
import qstream as qs

seen = []

def stop(ev):
    if ev.result is not None:
        seen.append(ev.name)
        if len(seen) == int(sys.argv[3]):  # (finished, and not listed yet: a kill loses no work)
            os.kill(os.getpid(), signal.SIGKILL)

qs.convert_checkpoint(sys.argv[1], sys.argv[2], qs.Recipe.from_dict({"defaults": {}, "rules": []}),
                      on_tensor=stop, packs=False)
"""


def _files(root: Path) -> dict[str, object]:
    """Every file of an output, a document without the run's own timing and path."""
    out: dict[str, object] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            raw = p.read_bytes()
            if p.name == "zarr.json":
                doc = json.loads(raw)
                report = doc.get("attributes", {}).get("qstream", {}).get("report")
                if isinstance(report, dict):
                    report.pop("seconds", None)
                    report.pop("destination", None)
                raw = doc
            out[str(p.relative_to(root))] = raw
    return out


def _killed_after(tmp_path: Path, count: int, done: int) -> Path:
    """A checkpoint of ``count`` small tensors at ``tmp_path/m.safetensors``, converted one by
    one into ``tmp_path/out.zarr`` by a process killed (SIGKILL) once ``done`` were finished."""
    import subprocess
    import sys

    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(5)
    tensors = {f"layers.{i}.w.weight": rng.standard_normal((8, 16 + i)).astype(np.float32)
               for i in range(count)}  # fmt: skip
    save_file(tensors, str(tmp_path / "m.safetensors"))
    dst = tmp_path / "out.zarr"
    killed = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path / "m.safetensors"),
                             str(dst), str(done)], capture_output=True, text=True)  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    return dst


def test_after_a_kill_the_tensors_finished_but_not_listed_are_counted_done_and_reused(tmp_path):
    dst = _killed_after(tmp_path, 180, 150)
    listed = set(qs.open_quantized(dst, allow_incomplete=True).tensors)
    assert len(listed) == 128  # (the rows of one batch; the rest was pending when killed)
    unlisted = qs.open_quantized(dst, allow_incomplete=True).unlisted()
    assert len(unlisted) == 22 and not set(unlisted) & listed  # (inspect shows them too)
    seen = run("inspect", dst)
    assert seen.exit_code == 0 and "and 22 more finished but not listed" in seen.stdout
    plan = run("convert", tmp_path / "m.safetensors", dst, "--dry-run")
    assert "resume (150 of 180 tensors already done)" in plan.stdout
    r = run("convert", tmp_path / "m.safetensors", dst)
    assert r.exit_code == 0, r.output
    assert r.stderr.splitlines()[0] == "resuming: 150 of 180 tensors already done"
    lines = [ln for ln in r.stdout.splitlines() if re.match(r"\[\s*\d+/\d+\]", ln)]
    assert len(lines) == 30
    fresh = run("convert", tmp_path / "m.safetensors", tmp_path / "fresh.zarr", "-q", "--no-packs")
    assert fresh.exit_code == 0, fresh.output
    assert _files(dst) == _files(tmp_path / "fresh.zarr")  # (the bytes of an uninterrupted run)


def test_a_resumed_conversion_into_safetensors_says_so_and_ends_byte_identical(tmp_path):
    import subprocess
    import sys

    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(6)
    tensors = {f"layers.{i}.w.weight": rng.standard_normal((8, 16 + i)).astype(np.float32)
               for i in range(180)}  # fmt: skip
    src = str(tmp_path / "m.safetensors")
    save_file(tensors, src)
    dst = tmp_path / "out" / "model.safetensors"
    dst.parent.mkdir()
    killed = subprocess.run([sys.executable, "-c", KILLED, src, f"{dst}.qstream-work", "150"],
                            capture_output=True, text=True)  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    r = run("convert", src, dst, "--format", "qstream", "--dry-run", "--json")
    assert json.loads(r.stdout)["action"] == "resume"
    r = run("convert", src, dst, "--format", "qstream")
    assert r.exit_code == 0, r.output
    assert r.stderr.splitlines()[0] == "resuming: 150 of 180 tensors already done"
    fresh = tmp_path / "fresh" / "model.safetensors"
    r = run("convert", src, fresh, "--format", "qstream", "-q", "--no-packs")
    assert r.exit_code == 0, r.output
    assert dst.read_bytes() == fresh.read_bytes()


def test_an_interrupted_conversion_that_listed_nothing_names_the_compression_it_wrote(tmp_path):
    # killed before its first batch of index rows: the compression comes from a tensor (or a
    # pack) it finished, as a finished checkpoint's does, not "auto"
    dst = _killed_after(tmp_path, 40, 20)
    ck = qs.open_quantized(dst, allow_incomplete=True)
    assert not ck.tensors and len(ck.unlisted()) == 20
    done = tmp_path / "done.zarr"
    assert run("convert", tmp_path / "m.safetensors", done, "-q", "--no-packs").exit_code == 0
    want = qs.open_quantized(done).summary()["compression"]
    assert want not in (None, "auto")
    assert ck.summary()["compression"] == want
    seen = run("inspect", dst)
    assert seen.exit_code == 0 and "auto" not in seen.stdout, seen.stdout
    # a pack planted as a link (to a gzip one written elsewhere) is not read through
    import numpy as np
    from safetensors.numpy import save_file

    alike = {f"e.{i}.weight": np.ones((8, 16), np.float32) * (i + 1) for i in range(4)}
    save_file(alike, str(tmp_path / "alike.safetensors"))
    other = tmp_path / "other.zarr"
    made = run(
        "convert", tmp_path / "alike.safetensors", other, "-q", "--compression", "gzip", "--packs"
    )
    assert made.exit_code == 0, made.output
    (pack,) = sorted((other / "_packs").glob("p*"))[:1]
    (dst / "_packs").mkdir()
    (dst / "_packs" / "p000000").symlink_to(pack)
    assert qs.open_quantized(dst, allow_incomplete=True).summary()["compression"] == want
