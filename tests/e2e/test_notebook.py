"""The notebook sample: samples/notebook.ipynb holds the cells of samples/notebook.py, and it
runs in a real Jupyter kernel (this Python, through nbclient) with the rich views as HTML."""

import importlib.util
import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"
SVG = "{http://www.w3.org/2000/svg}"


def _make_notebook():
    spec = importlib.util.spec_from_file_location("make_notebook", SAMPLES / "make_notebook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_notebook_is_the_script_cell_for_cell():
    nbformat = pytest.importorskip("nbformat")
    make = _make_notebook()
    source = (SAMPLES / "notebook.py").read_text()
    shipped = (SAMPLES / "notebook.ipynb").read_text()
    # (if this fails: python samples/make_notebook.py)
    assert shipped == make.dumps(make.notebook(source))
    nb = nbformat.reads(shipped, as_version=4)
    nbformat.validate(nb)
    kinds = [c.cell_type for c in nb.cells]
    assert kinds[0] == "markdown" and set(kinds[1:]) == {"code"}
    assert len(kinds) - 1 == source.count("\n# %%")  # one code cell per "# %%" cell
    body = "\n".join(c.source.split("\n", 1)[1] for c in nb.cells[1:])  # titles dropped
    script = source.split('"""', 2)[2].splitlines()
    assert [ln for ln in body.splitlines() if ln.strip()] == [
        make.jupyter_line(ln) for ln in script if ln.strip() and not ln.startswith("# %%")
    ]  # every line of code, in order
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")


def _html(cell) -> str | None:
    for out in cell.get("outputs", ()):
        if out.get("output_type") == "execute_result" and "text/html" in out.get("data", {}):
            return out["data"]["text/html"]
    return None


def _text(cell) -> str:
    outputs = cell.get("outputs", ())
    return "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")


def test_the_notebook_runs_in_a_jupyter_kernel_with_html_views(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(SAMPLES / "notebook.ipynb", as_version=4)
    # which Python the kernel runs (a cell added to this copy only)
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.executable)", id="which"))
    # as a user starts Jupyter: in a folder holding samples/ (and nothing else of the repo)
    (tmp_path / "samples").symlink_to(SAMPLES, target_is_directory=True)
    t0 = time.perf_counter()
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError on the first cell that fails
    seconds = time.perf_counter() - t0
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not [o for o in cell.outputs if o["output_type"] == "error"], cell.source
            assert cell.execution_count is not None
    assert Path(_text(nb.cells[-1]).strip()).resolve() == Path(sys.executable).resolve()
    texts = "".join(_text(c) for c in nb.cells)
    assert "entropy calibration" in texts and "int4 groups: SQNR" in texts

    html = {i: _html(c) for i, c in enumerate(nb.cells)}
    shown = {i: h for i, h in html.items() if h}
    assert len(shown) == 3, [c.source.splitlines()[0] for c in nb.cells]  # cal, q4, ck
    cal, q4, ck = (shown[i] for i in sorted(shown))
    for h in (cal, q4, ck):
        root = ET.fromstring(f"<root>{h}</root>")  # well-formed, with inline SVG charts
        assert list(root.iter(SVG + "svg"))
    assert "predicted SQNR dB" in cal
    assert "per-group SQNR (4096 groups of 32" in q4 and "worst group" in q4
    assert "SQNR per tensor (25 quantized tensors)" in ck and "worst tensor" in ck
    assert "34 tensors: 25 quantized, 9 kept" in ck
    # the plain repr next to the HTML (what a console or a text-only front end shows)
    last = [c for i, c in enumerate(nb.cells) if i in shown][-1]
    (result,) = [o for o in last.outputs if o["output_type"] == "execute_result"]
    assert result["data"]["text/plain"].startswith("QuantizedCheckpoint(")
    json.dumps(nb)  # the executed notebook saves as it is
    print(f"notebook executed in {seconds:.1f} s")
