"""Write samples/notebook.ipynb from samples/notebook.py. Run: python samples/make_notebook.py

notebook.py is a percent-format script (``# %% title`` starts a cell): it runs as a script and
cell by cell in editors that read the format. notebook.ipynb holds the same cells for Jupyter:
the module docstring as a Markdown cell, then one code cell per ``# %%`` cell (its title
kept as the first comment line; see :func:`jupyter_line`), no outputs, fixed cell ids (the
file is the same bytes each time). ``tests/e2e/test_notebook.py`` checks that the two agree and
executes the notebook with a Jupyter kernel.
"""

import ast
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
KERNEL = {"display_name": "Python 3", "language": "python", "name": "python3"}


def _lines(text: str) -> list[str]:
    """A cell's source as Jupyter stores it: lines, each but the last ending in a newline."""
    return text.splitlines(keepends=True)


def jupyter_line(line: str) -> str:
    """A line of the script as the notebook has it: a cell's last expression needs no
    ``# noqa: B018`` in a notebook (Jupyter displays it), so ``x  # noqa: B018  (note)``
    becomes ``x  # note``."""
    return re.sub(r"# noqa: B018 +\((.*)\)$", r"# \1", line)


def cells(source: str) -> list[tuple[str, str]]:
    """``(cell_type, text)`` of the percent-format script ``source``."""
    out: list[tuple[str, str]] = []
    head, *chunks = source.split("\n# %%")
    doc = ast.get_docstring(ast.parse(head))
    if doc:
        out.append(("markdown", doc.strip()))
    rest = head.split('"""', 2)[2] if doc else head
    if rest.strip():
        out.append(("code", rest.strip()))
    for chunk in chunks:
        title, _, body = chunk.partition("\n")
        body = "\n".join(jupyter_line(ln) for ln in body.strip().splitlines())
        out.append(("code", f"# {title.strip()}\n{body}" if title.strip() else body))
    return out


def notebook(source: str) -> dict:
    """The notebook (nbformat 4.5, as a JSON-ready dict) of the script ``source``."""
    nb_cells = []
    for i, (kind, text) in enumerate(cells(source)):
        cell = {"cell_type": kind, "id": f"cell-{i}", "metadata": {}, "source": _lines(text)}
        if kind == "code":
            cell = {**cell, "execution_count": None, "outputs": []}
        nb_cells.append(cell)
    return {
        "cells": nb_cells,
        "metadata": {"kernelspec": KERNEL, "language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def dumps(nb: dict) -> str:
    """The notebook's file text as Jupyter writes it (one-space indents, sorted keys)."""
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> None:
    nb = notebook((HERE / "notebook.py").read_text())
    (HERE / "notebook.ipynb").write_text(dumps(nb))
    print(f"wrote {HERE / 'notebook.ipynb'} ({len(nb['cells'])} cells)")


if __name__ == "__main__":
    main()
