"""Packaging: the library (``qstream/``) and the command line (``cli/``) are two top-level
packages; both import the same installed (editable: a plain path in its ``.pth``, no import finder)
or from the source tree, and a folder named ``qstream/`` in the working directory does not
shadow it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INIT = ROOT / "qstream" / "__init__.py"


def python(*args, cwd, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("contents", [[], ["notes.txt"]], ids=["empty", "unrelated-file"])
def test_a_qstream_folder_in_the_working_directory_does_not_shadow_the_package(tmp_path, contents):
    (tmp_path / "qstream").mkdir()
    for name in contents:
        (tmp_path / "qstream" / name).write_text("not a module\n")
    r = python("-c", "import qstream, cli.main; print(qstream.__file__)", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).resolve() == INIT
    r = python("-m", "cli.main", "--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Usage" in r.stdout and "dequantize" in r.stdout


def test_the_command_line_imports_from_the_source_tree(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # -S: no site-packages, so no installed copy (nor an editable install's .pth) helps
    code = "import sys, cli; print(cli.__file__); print('typer' in sys.modules)"
    r = python("-S", "-c", code, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    where, typer_loaded = r.stdout.split()
    assert Path(where).resolve() == ROOT / "cli" / "__init__.py"
    assert typer_loaded == "False"  # the package's __init__ imports no Typer
    r = python("-c", "import cli.main as m; print(m.__file__)", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).resolve() == ROOT / "cli" / "main.py"


def test_the_library_does_not_import_the_command_line(tmp_path):
    code = "import sys, qstream; print(sorted(m for m in sys.modules if m.split('.')[0] in"
    code += " ('typer', 'rich', 'click') or m.startswith('cli')))"
    r = python("-c", code, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_an_editable_install_adds_a_path_not_an_import_finder():
    import site

    pths = [
        p
        for d in [*site.getsitepackages(), site.getusersitepackages()]
        for p in Path(d).glob("__editable__*qstream_zarr*.pth")
    ]
    if not pths:
        pytest.skip("qstream-zarr is not installed in editable mode here")
    for pth in pths:
        lines = [s for s in pth.read_text().splitlines() if s.strip()]
        assert lines and not any(s.startswith("import") for s in lines), (pth, lines)
        assert (Path(lines[0]) / "cli" / "main.py").is_file(), (pth, lines)


def test_warm_up_writes_the_bytecode_python_then_loads(tmp_path):
    """An editable install under ``PYTHONDONTWRITEBYTECODE`` has no bytecode: every start
    compiles the modules. ``write_bytecode`` (run by ``qstream warm-up``) writes it, valid
    for the sources as they are (Python's own check: magic, source time and size)."""
    import importlib.util
    import shutil
    import struct

    package = tmp_path / "qstream"
    shutil.copytree(ROOT / "qstream", package, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    sources = [
        package / "engine" / "convert" / "pack_writer.py",
        package / "exports" / "gguf" / "export.py",
    ]
    r = python("-c", "import qstream.engine.convert.pack_writer", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert not any(Path(importlib.util.cache_from_source(str(s))).exists() for s in sources)

    code = "from qstream.workflows.warm_up import write_bytecode; print(write_bytecode())"
    r = python("-c", code, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True"]
    for source in sources:
        pyc = Path(importlib.util.cache_from_source(str(source))).read_bytes()
        magic, flags, mtime, size = struct.unpack("<4sIII", pyc[:16])
        st = source.stat()
        assert (magic, flags) == (importlib.util.MAGIC_NUMBER, 0)
        assert (mtime, size) == (int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF)
