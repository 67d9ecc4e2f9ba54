"""Live progress on a terminal from the start of a job, and Ctrl-C acting promptly even while
Numba compiles (first run: an empty ``NUMBA_CACHE_DIR``). The command runs in a subprocess
under a pseudo-terminal, as a user's shell runs it, and gets a real SIGINT."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qstream.workflows.warm_up import _wait_reporting

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "samples" / "tiny-transformer.safetensors"
pytestmark = pytest.mark.skipif(os.name != "posix", reason="pseudo-terminals: POSIX only")


class Terminal:
    """``qstream ARGS`` in a subprocess whose stdin/stdout/stderr are a pseudo-terminal."""

    def __init__(self, args: list[str], cache: Path) -> None:
        env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "TERM": "xterm-256color"}
        env.pop("NO_COLOR", None)
        env["COLUMNS"] = "120"
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # (the child)
            os.chdir(ROOT)
            os.execve(sys.executable, [sys.executable, "-m", "cli.main", *args], env)
        self.start = time.monotonic()
        self.out = b""
        self.status: int | None = None

    def read_until(self, needle: bytes, timeout: float) -> float | None:
        """Seconds from the start until ``needle`` appeared in the output (None: it did not,
        within ``timeout`` seconds or before the process ended)."""
        end = time.monotonic() + timeout
        while needle not in self.out:
            if time.monotonic() > end or not self._read(0.05):
                return None
        return time.monotonic() - self.start

    def _read(self, wait: float) -> bool:
        r, _, _ = select.select([self.fd], [], [], wait)
        if r:
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # (the child closed the terminal)
                data = b""
            if not data:
                return False
            self.out += data
        return True

    def wait(self, timeout: float) -> float:
        """Seconds until the process ended (reading its output meanwhile); its exit code is
        ``self.status``. Fails the test past ``timeout``."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                took = time.monotonic() - t0
                while self._read(0.1):  # (what it wrote last)
                    pass
                self.status = os.waitstatus_to_exitcode(status)
                return took
            self._read(0.05)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        pytest.fail(f"still running {timeout} s later; output: {self.text()[-2000:]}")

    def text(self) -> str:
        return self.out.decode(errors="replace")


#: a recipe of many kinds of spec: its first run compiles for 10-20 s on 2 cores, mostly in
#: the job's worker threads, which Python's Ctrl-C does not reach
MIXED = """
[defaults]
dtype = "int8"
axis = 0
method = "percentile"
percentile = 99.9
[[rules]]
pattern = "*q_proj*"
spec = { dtype = "int4", axis = -1, block_size = 32, method = "dynamic" }
[[rules]]
pattern = "*k_proj*"
spec = { dtype = "uint4", axis = -1, block_size = 32, method = "dynamic", symmetric = false }
[[rules]]
pattern = "*v_proj*"
spec = { dtype = "float8_e4m3fn", axis = 0, method = "minmax" }
[[rules]]
pattern = "*o_proj*"
spec = { dtype = "uint8", symmetric = false }
[[rules]]
pattern = "*up_proj*"
spec = { dtype = "int8", method = "mse" }
"""


@pytest.mark.parametrize(
    ("signum", "code", "said"),
    [
        (signal.SIGINT, 130, "error: interrupted; run the same command again to resume"),
        (signal.SIGTERM, 143, "error: terminated (SIGTERM); run the same command again"),
    ],
    ids=["ctrl-c", "sigterm"],
)
def test_ctrl_c_while_kernels_compile_ends_the_command_promptly(tmp_path, signum, code, said):
    recipe = tmp_path / "mixed.toml"
    recipe.write_text(MIXED)
    args = ["convert", str(SAMPLE), str(tmp_path / "out.zarr"), "--recipe", str(recipe)]
    term = Terminal(args, tmp_path / "cold-cache")
    seen = term.read_until(b"compiling kernels", 60)
    assert seen is not None, term.text()[-2000:]
    time.sleep(2.0)  # (compiling in the worker threads by now)
    assert os.waitpid(term.pid, os.WNOHANG)[0] == 0, "finished before the Ctrl-C"
    os.kill(term.pid, signum)
    took = term.wait(30)
    print(f"compile line after {seen:.2f} s; exit {took:.2f} s after {signum.name}")
    assert term.status == code
    assert said in term.text()
    assert took < 2, f"{signum.name} took {took:.1f} s"  # (measured: 0.9 s; before: 2.6-21 s)
    assert "\x1b[?25h" in term.text()  # (the cursor the live display hid is shown again)


def test_a_terminal_shows_a_live_line_from_the_start_then_the_passes(tmp_path):
    cache = Path(os.environ.get("NUMBA_CACHE_DIR") or tmp_path / "cache")
    term = Terminal(["convert", str(SAMPLE), str(tmp_path / "out.zarr")], cache)
    first = term.read_until(b"convert: ", 30)
    assert first is not None, term.text()[-2000:]
    print(f"first live line after {first:.2f} s")
    assert first < 5  # (measured: about 1 s, Python's start and imports included)
    term.wait(120)
    assert term.status == 0, term.text()[-2000:]
    text = term.text()
    assert "convert: starting" in text or "compiling kernels" in text
    assert "\x1b[2K" in text  # (a line redrawn in place: Rich's live display)
    assert re.search(r"\[ *1/\d+\]", text) and "quantized tensors, worst SQNR first" in text
    # (the starting line gives way to the tensors' bar, counted as they finish)
    assert "convert: tensors" in text and "34/34 tensors" in text


@pytest.mark.parametrize("out", ["x.gguf", "x.safetensors", "restored/x.safetensors"])
def test_export_and_a_checkpoints_dequantize_show_the_bytes_they_write(tmp_path, out):
    recipe = tmp_path / "q8.toml"
    recipe.write_text(
        '[defaults]\ndtype = "int8"\nblock_size = 32\naxis = -1\nmethod = "dynamic"\n'
        'scale_dtype = "float16"\n'
    )
    cache = Path(os.environ.get("NUMBA_CACHE_DIR") or tmp_path / "cache")
    src = tmp_path / "q8.zarr"
    made = subprocess.run(
        [sys.executable, "-m", "cli.main", "convert", str(SAMPLE), str(src), "--recipe",
         str(recipe), "-q"], cwd=ROOT, env={**os.environ, "NUMBA_CACHE_DIR": str(cache)},
    )  # fmt: skip
    assert made.returncode == 0
    command = "dequantize" if out.startswith("restored") else "export"
    term = Terminal([command, str(src), str(tmp_path / out)], cache)
    term.wait(120)
    assert term.status == 0, term.text()[-2000:]
    assert re.search(rf"{command}: write .* of [0-9.]+ [KM]iB", term.text()), term.text()[-2000:]
    piped = subprocess.run(
        [sys.executable, "-m", "cli.main", command, str(src), str(tmp_path / f"p-{out}")],
        cwd=ROOT, env={**os.environ, "NUMBA_CACHE_DIR": str(cache)}, capture_output=True,
        text=True,
    )  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    lines = [ln for ln in piped.stderr.splitlines() if ln.startswith(f"{command}: write:")]
    assert lines[0].endswith("(0%)") and lines[-1].endswith("(100%)"), piped.stderr


def test_warm_up_reports_each_build_as_its_process_finishes_it():
    code = "import time\nfor i in range({n}):\n    time.sleep(0.05); print(i, flush=True)"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code.format(n=n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for n in (3, 2)
    ]
    seen: list[tuple[int, int]] = []
    assert _wait_reporting(procs, 5, lambda done, total: seen.append((done, total))) == []
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[-1] == (5, 5)
    assert len(seen) >= 2  # (as they land, not once at the end)


def test_warm_up_names_the_failure_of_a_process():
    bad = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('x', flush=True); sys.exit('no compiler')"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert _wait_reporting([bad], 2, None) == [["no compiler"]]


def test_a_notebook_cell_shows_one_compile_line_updated_in_place_on_a_first_run(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    job = (
        "import numpy as np\n"
        "import qstream as qs\n"
        "qs.quantize(np.linspace(-1, 1, 64, dtype=np.float32), 0.01, 0, dtype='int8')\n"
        "qs.quantize(np.linspace(-1, 1, 64, dtype=np.float64), 0.01, 0, dtype='int8');"
    )
    cache = tmp_path / "cold-cache"
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(f"import os; os.environ['NUMBA_CACHE_DIR'] = {str(cache)!r}"),
        nbformat.v4.new_code_cell(job),  # (first run: compiles)
        nbformat.v4.new_code_cell(job),  # (the same again: compiled, nothing to say)
    ]
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    shown = [o for o in nb.cells[1].outputs if o["output_type"] == "display_data"]
    assert len(shown) == 1, nb.cells[1].outputs  # (one line, updated: not one per kernel)
    text = shown[0]["data"]["text/plain"]
    assert text.startswith("compiling kernels (first run only")
    n = int(re.search(r": (\d+) so far", text).group(1))
    assert n >= 2  # (float32 and float64 builds: the line was updated in place)
    assert not [o for o in nb.cells[2].outputs if o["output_type"] == "display_data"]


def test_a_kernel_compiling_after_a_pass_finished_shows_a_live_compile_line_until_blocks_land():
    """A later pass's kernels compile after the bar of the pass before has finished (``quantize
    --method entropy``: ranges, then histograms, then the codes): a live "compiling kernels"
    line shows meanwhile, not a finished bar with its clock stopped, and goes when the next
    blocks land."""
    import io

    from rich.console import Console
    from rich.progress import Progress as Bars

    from cli.progress import COMPILING, Progress

    def live() -> list[str]:  # the descriptions of the lines still being timed
        return [t.description for t in bars.tasks if t.visible and not t.finished]

    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with Bars(console=console, transient=True, auto_refresh=False) as bars:
        reporter = Progress("quantize", bars)
        reporter.waiting = bars.add_task("quantize: starting", total=None)
        reporter.compiling()  # (the first pass's kernels)
        assert live() == [f"quantize: {COMPILING}"]
        reporter.stage("ranges", 1)
        reporter(1, 1)
        assert live() == []
        reporter.compiling()  # (the next pass's kernels, the bar of ranges finished)
        assert live() == [f"quantize: {COMPILING}"]
        reporter.compiling()  # (another kernel of it: still one line)
        assert live() == [f"quantize: {COMPILING}"]
        reporter.stage("histograms", 1)
        assert live() == ["quantize: histograms"]
        reporter.compiling()  # (compiling as its first block runs)
        assert live() == ["quantize: histograms", f"quantize: {COMPILING}"]
        reporter(1, 1)
        assert live() == []
