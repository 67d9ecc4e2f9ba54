"""qstream's kernels load from Numba's cache without Numba's compiler set-up
(:func:`qstream.kernels.runtime.lean_load`): the same machine code, so a conversion writes the same
files, and only where every symbol a kernel links to is there already."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from qstream.kernels.runtime import links_as_it_is, undefined_symbols

IR = """
declare double @qstream_test_{name}(double)
declare double @llvm.sqrt.f64(double)

define double @outer(double %x) {{
  %a = call double @qstream_test_{name}(double %x)
  %b = call double @llvm.sqrt.f64(double %a)
  ret double %b
}}
"""


def _object(name: str) -> bytes:
    """An object file (the host's format) whose one function calls ``qstream_test_<name>``."""
    import llvmlite.binding as ll

    ll.initialize_native_target()
    ll.initialize_native_asmprinter()
    machine = ll.Target.from_default_triple().create_target_machine(reloc="static")
    module = ll.parse_assembly(IR.format(name=name))
    return machine.emit_object(module)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF objects")
def test_undefined_symbols_are_those_nm_lists():
    obj = _object("absent")
    names = undefined_symbols(obj)
    assert names is not None and "qstream_test_absent" in names
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm to compare with")
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"qstream-lean-{os.getpid()}.o")
    with open(path, "wb") as f:
        f.write(obj)
    try:
        listed = subprocess.run([nm, "-u", path], capture_output=True, text=True, check=True)
    finally:
        os.unlink(path)
    assert sorted(names) == sorted(line.split()[-1] for line in listed.stdout.splitlines())


def test_other_bytes_have_no_symbol_list():
    assert undefined_symbols(b"not an object file" * 8) is None
    assert undefined_symbols(b"\x7fELF\x02\x01" + b"\0" * 10) is None  # cut short


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF objects")
def test_a_kernel_is_loaded_lean_only_when_the_process_has_its_symbols():
    import llvmlite.binding as ll

    ran = []
    payload = [("k", "object", (_object("later"), b"")), *[None] * 6, [lambda: ran.append(1)]]
    payload += [()]
    assert not links_as_it_is(payload)  # qstream_test_later: not in the process yet
    assert ran == [1]  # (the kernel's own load-time set-up ran before the look-up)
    ll.add_symbol("qstream_test_later", ctypes.cast(ctypes.CDLL(None).abs, ctypes.c_void_p).value)
    assert links_as_it_is(payload)
    assert not links_as_it_is([("k", "bitcode", b""), *[None] * 8])  # another form


def _convert(tmp_path, out: str, lean: bool) -> dict:
    """Convert ``tmp_path/m.safetensors`` to ``out`` with the console script in a new
    process, with or without lean loads; what the process imported of Numba's compiler."""
    seen = tmp_path / f"{out}.json"
    code = textwrap.dedent(f"""
        import atexit, json, sys
        import qstream.kernels.runtime
        qstream.kernels.runtime.LEAN = {lean!r}
        def seen():
            with open({str(seen)!r}, "w") as f:
                json.dump({{"arraymath": "numba.np.arraymath" in sys.modules}}, f)
        atexit.register(seen)
        sys.argv = ["qstream", "convert", "m.safetensors", {out!r}, "--quiet",
                    "--recipe", "r.toml"]
        from cli.main import console
        console()
        """)
    env = {**os.environ, "QSTREAM_NUMPY_JOB": "0"}  # (a job this small would run no kernel)
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(seen.read_text())


def _files(root) -> dict[str, object]:
    """Every file of an output: bytes, or for JSON documents the document without its
    timings and with its own name set aside."""

    def norm(o):
        if isinstance(o, dict):
            return {k: norm(v) for k, v in o.items() if k != "seconds"}
        if isinstance(o, list):
            return [norm(v) for v in o]
        return o.replace(os.path.basename(root), "<out>") if isinstance(o, str) else o

    files: dict[str, object] = {}
    for here, _, names in os.walk(root):
        for n in names:
            path = os.path.join(here, n)
            with open(path, "rb") as f:
                data = f.read()
            key = os.path.relpath(path, root)
            files[key] = norm(json.loads(data)) if n.endswith(".json") else data
    return files


def test_a_conversion_loaded_lean_writes_the_same_files(tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    x[3, 7] = -0.0
    save_file(
        {
            "embed_tokens.weight": rng.standard_normal((200, 32)).astype(np.float32),
            "layers.0.q_proj.weight": x,
            "layers.0.big_proj.weight": rng.standard_normal((1024, 512)).astype(np.float32),
            "layers.0.norm.weight": np.ones(96, np.float32),
        },
        str(tmp_path / "m.safetensors"),
    )
    (tmp_path / "r.toml").write_text(
        textwrap.dedent("""
        [defaults]
        dtype = "int8"
        axis = 0
        [[rules]]
        pattern = "*embed_tokens*"
        spec = { method = "percentile", percentile = 99.9 }
        """)
    )
    whole = _convert(tmp_path, "whole.zarr", lean=False)  # (also fills Numba's cache)
    lean = _convert(tmp_path, "lean.zarr", lean=True)
    assert whole["arraymath"]  # Numba's whole set-up ran...
    assert not lean["arraymath"]  # ...and the lean loads skipped it
    a, b = _files(tmp_path / "whole.zarr"), _files(tmp_path / "lean.zarr")
    assert a.keys() == b.keys() and len(a) > 10
    assert [k for k in a if a[k] != b[k]] == []
