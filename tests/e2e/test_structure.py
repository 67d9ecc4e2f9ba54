"""The package's structure (issues 28 and 45): no private names across modules, no import
circle between modules or folders, no import against the documented layers or past a folder's
face, folders of at most 20 modules and 4 levels, files of at most 500 lines, one meaning per
module name, a command line that uses only the public names. ``.ci/check_structure.py`` checks it;
these tests run it on qstream and
show on a small made-up package that it catches each kind of finding."""

import importlib.util
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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


def test_qstream_and_its_command_line_keep_every_rule_of_the_structure_check():
    checker = _checker()
    assert checker.findings() == []
    assert checker.findings(ROOT, "cli", rules={}, shared={}) == []
    assert checker.front_end_findings() == []


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


def _layered(tmp_path, files: dict[str, str]) -> list[str]:
    """Findings of a made-up package with two layers, top > low, each folder with a face."""
    base = {
        "__init__.py": "",
        "top/__init__.py": "",
        "low/__init__.py": '__all__ = ["f"]\nfrom .impl import f\n',
        "low/impl.py": "def f():\n    return 1\n\n\ndef g():\n    return 2\n",
    }
    _package(tmp_path, {**base, **files})
    rules = {"": ["top", "low", "base"]}
    return _checker().findings(tmp_path, "pkg", rules=rules, shared={})


def test_a_layered_package_importing_through_faces_has_no_finding(tmp_path):
    assert _layered(tmp_path, {"top/use.py": "from ..low import f\n"}) == []


def test_an_import_past_a_folders_face_is_found(tmp_path):
    found = _layered(tmp_path, {"top/use.py": "from ..low.impl import f\n"})
    assert found == [
        "pkg/top/use.py:1: imports from pkg.low.impl, past the face of pkg.low (import from"
        " pkg.low, or list the module in its __all__)"
    ]


def test_a_name_the_face_does_not_list_is_found(tmp_path):
    _package(tmp_path, {"low/__init__.py": '__all__ = ["f"]\nfrom .impl import f, g\n'})
    found = _layered(tmp_path, {"top/use.py": "from ..low import g\n"})
    assert found == [
        "pkg/top/use.py:1: imports pkg.low.g, which the face of pkg.low (its __all__) does not list"
    ]


def test_an_upward_import_against_the_layers_is_found(tmp_path):
    found = _layered(
        tmp_path,
        {
            "top/__init__.py": '__all__ = ["h"]\nfrom .api import h\n',
            "top/api.py": "def h():\n    return 3\n",
            "low/up.py": "def k():\n    from ..top import h\n    return h()\n",
        },
    )
    assert found == [
        "pkg/low/up.py: imports pkg.top upward (low may not import top; the layers of pkg:"
        " top > low > base)"
    ]


def test_a_circle_between_folders_is_found_though_no_module_circle_is(tmp_path):
    _package(
        tmp_path,
        {
            "__init__.py": "",
            "a/__init__.py": '__all__ = ["x"]\nfrom .one import x\n',
            "a/one.py": "x = 1\n",
            "a/two.py": "from ..b import y\n",
            "b/__init__.py": '__all__ = ["y"]\nfrom .one import y\n',
            "b/one.py": "y = 2\n",
            "b/two.py": "from ..a import x\n",
        },
    )
    found = _checker().findings(tmp_path, "pkg", rules={}, shared={"one": "", "two": ""})
    assert found == ["circle between folders: pkg.a -> pkg.b"]


def test_a_wide_folder_a_deep_module_and_a_name_used_twice_are_found(tmp_path):
    files = {"__init__.py": "", "wide/__init__.py": ""}
    files |= {f"wide/m{i:02d}.py": "" for i in range(20)}
    files |= {"a/__init__.py": "", "a/b/__init__.py": "", "a/b/c/__init__.py": ""}
    files |= {"a/b/c/deep.py": "", "a/errors.py": "", "errors.py": ""}
    _package(tmp_path, files)
    found = _checker().findings(tmp_path, "pkg", rules={}, shared={})
    assert found == [
        "pkg/wide/: 21 modules (limit 20)",
        "pkg/a/b/c/__init__.py: 5 levels deep (limit 4)",
        "pkg/a/b/c/deep.py: 5 levels deep (limit 4)",
        "module name 'errors' is used by pkg/a/errors.py, pkg/errors.py: rename one, or say in"
        " SHARED which concept they share",
    ]


def test_the_command_line_may_import_only_public_names_and_the_library_never_it(tmp_path):
    _package(
        tmp_path, {"__init__.py": '_EXPORTS = {"run": "pkg.api"}\n', "api.py": "import rich\n"}
    )
    front = tmp_path / "front"
    front.mkdir()
    (front / "__init__.py").write_text("")
    (front / "ok.py").write_text("import pkg\nfrom pkg import run\n")
    (front / "bad.py").write_text("from pkg import api\nfrom pkg.api import run\n")
    found = _checker().front_end_findings(tmp_path, "front", "pkg")
    assert found == [
        "front/bad.py:1: imports api, not a public name of pkg",
        "front/bad.py:2: imports from pkg.api",
        "pkg/api.py:1: the library imports rich",
    ]
