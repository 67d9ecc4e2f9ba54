"""Regenerate the README's views of the samples. Run: python samples/make_figures.py

- docs/inspect-activations.png: ``qstream inspect OUT --plot`` of samples/activations.zarr
  quantized to int8 with ``--method mse`` (needs matplotlib: pip install 'qstream-zarr[plot]').
- the README's terminal capture of ``qstream calibrate samples/activations.zarr --compare
  --method mse`` (plain text, as printed into a pipe), between its ``<!-- capture -->``
  markers.

Both come from running the real commands; ``tests/cli/test_cli_views.py`` checks that the README's
capture is what the command prints today.
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CAPTURE = ["calibrate", "samples/activations.zarr", "--compare", "--method", "mse"]
BEGIN, END = "<!-- capture: calibrate --compare -->", "<!-- end capture -->"


def qstream(*args: str, cwd=ROOT) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "100"},
    )
    return out.stdout


def main() -> None:
    (ROOT / "docs").mkdir(exist_ok=True)
    png = ROOT / "docs" / "inspect-activations.png"
    with tempfile.TemporaryDirectory() as tmp:  # a relative output: the figure's title
        src = str(ROOT / "samples" / "activations.zarr")
        qstream("quantize", src, "activations-int8.zarr", "--method", "mse", "-q", cwd=tmp)
        qstream("inspect", "activations-int8.zarr", "--plot", str(png), cwd=tmp)
    print(f"wrote {png.relative_to(ROOT)} ({png.stat().st_size // 1024} KiB)")

    text = qstream(*CAPTURE)
    block = f"{BEGIN}\n```text\n$ qstream {' '.join(CAPTURE)}\n{text.rstrip()}\n```\n{END}"
    readme = ROOT / "README.md"
    doc = readme.read_text()
    start, stop = doc.index(BEGIN), doc.index(END) + len(END)
    readme.write_text(doc[:start] + block + doc[stop:])
    print(f"updated the capture in README.md ({len(text.splitlines())} lines)")


if __name__ == "__main__":
    main()
