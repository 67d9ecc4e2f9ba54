"""The public names: every name of ``qstream.__all__`` loads, and type checkers see each with its
real type (the ``TYPE_CHECKING`` block of ``qstream/__init__.py`` names every lazy export)."""

import ast
import importlib
from pathlib import Path

import qstream

INIT = Path(qstream.__file__)


def test_every_public_name_loads_from_its_module():
    for name in qstream.__all__:
        assert getattr(qstream, name) is not None, name
    for name, module in qstream._EXPORTS.items():
        assert getattr(qstream, name) is getattr(importlib.import_module(module), name), name


def test_type_checkers_see_every_lazy_export():
    tree = ast.parse(INIT.read_text())
    block = next(
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    )
    seen = {
        (f"qstream.{node.module}" if node.level else node.module, alias.asname or alias.name)
        for node in ast.walk(block)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    for name, module in qstream._EXPORTS.items():
        assert (module, name) in seen, (module, name)
