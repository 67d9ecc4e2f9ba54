"""Library jobs called from a notebook show their progress as one line under the cell,
updated in place (a display handle), ending "done in" or "stopped after"; elsewhere the
library prints nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

CELLS = [
    "import numpy as np, qstream as qs\n"
    "import qstream.viz.cell_progress as cp\n"
    "cp.SHOW_AFTER = 0.0  # (show the line at once: the test's job is quick)\n"
    "x = np.random.default_rng(0).standard_normal((256, 4096)).astype(np.float32)",
    "report = qs.quantize_store(x, {dst!r}, max_memory=1 << 20)",
    "seen = []\n"
    "_ = qs.quantize_store(x, {dst2!r}, max_memory=1 << 20,"
    " progress=lambda d, t: seen.append((d, t)))\n"
    "print(len(seen) > 1, seen[-1][0] == seen[-1][1])",
    "qs.dequantize_store({dst!r}, {back!r}, max_memory=1 << 20)",
    "try:\n    qs.quantize_store(x, {dst!r}, qs.QuantSpec(dtype='int4'))\n"
    "except Exception as e:\n    print(type(e).__name__)",
]


def _displays(cell) -> list[str]:
    return [
        o["data"]["text/plain"]
        for o in cell.outputs
        if o["output_type"] == "display_data" and "text/plain" in o.get("data", {})
    ]


def test_a_job_in_a_notebook_shows_one_line_updated_in_place_to_done(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    paths = {"dst": str(tmp_path / "q"), "dst2": str(tmp_path / "q2"), "back": str(tmp_path / "b")}
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c.format(**paths)) for c in CELLS]
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3")
    client.execute()
    quantize, own, dequantize, refused = nb.cells[1:]
    lines = [t for t in _displays(quantize) if t.startswith("quantize:")]
    assert len(lines) == 1, quantize.outputs  # (one line, updated in place)
    assert lines[0].startswith("quantize: done in ") and lines[0].endswith(" s")
    # a progress of the caller's own: used, and no line drawn
    assert not _displays(own)
    assert "".join(o.get("text", "") for o in own.outputs).strip() == "True True"
    assert [t for t in _displays(dequantize) if t.startswith("dequantize: done in ")]
    # a job refused before its first block (another spec on the finished output): no line
    assert not _displays(refused)
    assert "Error" in "".join(o.get("text", "") for o in refused.outputs)


class _Handle:
    def __init__(self, shown: list[str], data: dict[str, str]) -> None:
        self.shown = shown
        shown.append(data["text/plain"])

    def update(self, data: dict[str, str], raw: bool) -> None:
        self.shown.append(data["text/plain"])


def test_the_line_counts_blocks_per_pass_and_ends_stopped_when_the_job_fails(monkeypatch):
    from qstream.viz import cell_progress

    monkeypatch.setattr(cell_progress, "SHOW_AFTER", 0.0)
    monkeypatch.setattr(cell_progress, "RATE", 1e9)
    shown: list[str] = []
    line = cell_progress.NotebookProgress("quantize", lambda d, raw, display_id: _Handle(shown, d))
    line.stage("ranges", 4)
    line(1, 4)
    line.stage("quantize", 4, 2)  # (a resumed pass: 2 of 4 done already)
    line(3, 4)
    line.close(ok=False)
    assert shown[0].startswith("quantize: ranges 0/4 blocks (0%), ")
    assert shown[1].startswith("quantize: ranges 1/4 blocks (25%), ")
    assert shown[2].startswith("quantize: quantize 2/4 blocks (50%), ")
    assert shown[3].startswith("quantize: quantize 3/4 blocks (75%), ")
    assert shown[4].startswith("quantize: stopped after ") and len(shown) == 5


def test_a_job_in_a_script_prints_nothing(tmp_path):
    code = (
        "import numpy as np, qstream as qs\n"
        "import qstream.viz.cell_progress as cp\n"
        "cp.SHOW_AFTER = 0.0\n"
        "x = np.random.default_rng(0).standard_normal((64, 1024)).astype(np.float32)\n"
        f"qs.quantize_store(x, {str(tmp_path / 'q')!r}, max_memory=1 << 20)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""
