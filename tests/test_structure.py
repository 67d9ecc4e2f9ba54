"""The package's structure (issue 28): no private names across modules, no import circle, no
file over 500 lines. ``.ci/check_structure.py`` checks it; these tests run it on qstream and
show on a small made-up package that it catches each kind of finding."""

import importlib.util
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _checker():
    spec = importlib.util.spec_from_file_location(
        "check_structure", ROOT / ".ci/check_structure.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_qstream_has_no_private_crossing_no_import_circle_and_no_long_file():
    assert _checker().findings() == []


def test_a_private_name_imported_from_another_module_is_found(tmp_path):
    _package(
        tmp_path,
        {
            "__init__.py": "",
            "low.py": "def _helper():\n    return 1\n",
            "high.py": "from .low import _helper\n",
        },
    )
    found = _checker().findings(tmp_path, "pkg")
    assert found == ["pkg/high.py:1: imports private pkg.low._helper"]


def test_a_private_method_called_on_another_modules_object_is_found(tmp_path):
    _package(
        tmp_path,
        {
            "__init__.py": "",
            "job.py": "class Job:\n    def _scan(self):\n        return self\n",
            "use.py": "def run(job):\n    return job._scan()\n",
        },
    )
    found = _checker().findings(tmp_path, "pkg")
    assert found == ["pkg/use.py:2: uses private job._scan defined elsewhere"]


def test_a_circle_closed_by_a_lazy_import_is_found(tmp_path):
    _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from . import b\n",
            "b.py": "def f():\n    from .a import x\n    return x\n",
        },
    )
    found = _checker().findings(tmp_path, "pkg")
    assert found == ["import circle: pkg.a -> pkg.b"]


def test_a_file_over_500_lines_is_found_and_a_third_party_private_is_not(tmp_path):
    _package(
        tmp_path,
        {
            "__init__.py": "",
            "big.py": "import numpy\nx = numpy._NoValue\n" + "y = 1\n" * 500,
        },
    )
    found = _checker().findings(tmp_path, "pkg")
    assert found == ["pkg/big.py: 502 lines (limit 500)"]
