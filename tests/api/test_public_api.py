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


def test_every_module_behind_a_public_name_is_type_checked_strictly():
    """The third list of public modules, mypy's strict overrides, is checked against the one
    list (``_EXPORTS``): each module a public name loads from matches one of its patterns."""
    import fnmatch
    import tomllib

    config = tomllib.loads((INIT.parents[1] / "pyproject.toml").read_text())
    patterns = [
        p
        for o in config["tool"]["mypy"]["overrides"]
        if o.get("disallow_untyped_defs")
        for p in o["module"]
    ]
    for module in {"qstream", *qstream._EXPORTS.values()}:
        assert any(fnmatch.fnmatch(module, p) for p in patterns), module
