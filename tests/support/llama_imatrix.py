"""llama.cpp's own imatrix code for the tests: its loader (``common/imatrix-loader.cpp``,
compiled here against the ``libggml-base`` that llama-cpp-python ships), its GGUF writer
(``gguf_*`` through ctypes, in ``save_imatrix``'s calls), and ``llama_model_quantize`` given
the weights llama-quantize derives from a loaded file (``load_imatrix`` in
``tools/quantize/quantize.cpp``)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# (common.h and log.h stand in for the two things the loader takes from them)
_COMMON_H = """#pragma once
#include <string>
inline bool string_remove_suffix(std::string & s, const std::string & suffix) {
    if (s.size() < suffix.size() || s.compare(s.size() - suffix.size(), suffix.size(), suffix))
        return false;
    s.resize(s.size() - suffix.size());
    return true;
}
"""
_LOG_H = """#pragma once
#include <cstdio>
#define LOG_ERR(...) fprintf(stderr, __VA_ARGS__)
"""
_EXPORTS = r"""
#include "imatrix-loader.h"
#include <cstdint>
#include <vector>
static common_imatrix g;
static std::vector<const std::string *> names;
static std::vector<const common_imatrix_entry *> entries;
extern "C" {
int qs_load(const char * f) {
    g = common_imatrix(); names.clear(); entries.clear();
    if (!common_imatrix_load(f, g)) return 0;
    for (auto & kv : g.entries) { names.push_back(&kv.first); entries.push_back(&kv.second); }
    return 1;
}
int qs_n() { return (int) names.size(); }
const char * qs_name(int i) { return names[i]->c_str(); }
long qs_n_sums(int i) { return (long) entries[i]->sums.size(); }
const float * qs_sums(int i) { return entries[i]->sums.data(); }
long qs_n_counts(int i) { return (long) entries[i]->counts.size(); }
const int64_t * qs_counts(int i) { return entries[i]->counts.data(); }
int qs_legacy() { return g.is_legacy; }
int qs_metadata() { return g.has_metadata; }
int qs_chunk_count() { return g.chunk_count; }
int qs_chunk_size() { return g.chunk_size; }
int qs_n_datasets() { return (int) g.datasets.size(); }
const char * qs_dataset(int i) { return g.datasets[i].c_str(); }
}
"""


def lib_dir() -> Path:
    """The folder of llama-cpp-python's shared libraries."""
    import llama_cpp

    return Path(llama_cpp.__file__).parent / "lib"


def _need(what: str, ok: bool) -> None:
    if not ok:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(what)
        pytest.skip(what)


def build_loader(work: Path) -> ctypes.CDLL:
    """Compile llama.cpp's ``common/imatrix-loader.cpp`` (unchanged) with a C entry point."""
    from .gguf_models import llama_cpp_root

    root = llama_cpp_root()  # (the installed vendor tree, $QSTREAM_LLAMA_CPP_SRC, or the sdist's)
    _need("llama.cpp's source not found (see tests/support/gguf_models.py)", root is not None)
    assert root is not None
    src = root / "common" / "imatrix-loader.cpp"
    _need(f"llama.cpp source {src} not found", src.is_file())
    _need("no C++ compiler (g++)", shutil.which("g++") is not None)
    work.mkdir(parents=True, exist_ok=True)
    for name in ("imatrix-loader.cpp", "imatrix-loader.h"):
        shutil.copy(root / "common" / name, work / name)
    (work / "common.h").write_text(_COMMON_H)
    (work / "log.h").write_text(_LOG_H)
    (work / "exports.cpp").write_text(_EXPORTS)
    out = work / "libimatrix_loader.so"
    libs = lib_dir()
    cmd = ["g++", "-std=c++17", "-O1", "-shared", "-fPIC", f"-I{work}",
           f"-I{root / 'ggml' / 'include'}", str(work / "imatrix-loader.cpp"),
           str(work / "exports.cpp"), f"-L{libs}", "-l:libggml-base.so",
           f"-Wl,-rpath,{libs}", "-o", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lib = ctypes.CDLL(str(out))
    lib.qs_load.argtypes = [ctypes.c_char_p]
    for f, res in (("qs_name", ctypes.c_char_p), ("qs_dataset", ctypes.c_char_p),
                   ("qs_n_sums", ctypes.c_long), ("qs_n_counts", ctypes.c_long),
                   ("qs_sums", ctypes.POINTER(ctypes.c_float)),
                   ("qs_counts", ctypes.POINTER(ctypes.c_int64))):  # fmt: skip
        getattr(lib, f).restype = res
        getattr(lib, f).argtypes = [ctypes.c_int]
    return lib


def load(lib: ctypes.CDLL, path: Path) -> dict[str, Any]:
    """``common_imatrix_load`` of ``path``: entries (name -> (sums, counts)) and metadata."""
    assert lib.qs_load(str(path).encode()) == 1, f"llama.cpp's loader refused {path}"
    entries = {}
    for i in range(lib.qs_n()):
        sums = np.ctypeslib.as_array(lib.qs_sums(i), (lib.qs_n_sums(i),)).copy()
        counts = np.ctypeslib.as_array(lib.qs_counts(i), (lib.qs_n_counts(i),)).copy()
        entries[lib.qs_name(i).decode()] = (sums, counts)
    return {
        "entries": entries,
        "legacy": bool(lib.qs_legacy()),
        "metadata": bool(lib.qs_metadata()),
        "chunk_count": lib.qs_chunk_count(),
        "chunk_size": lib.qs_chunk_size(),
        "datasets": [lib.qs_dataset(i).decode() for i in range(lib.qs_n_datasets())],
    }


def quantize_weights(loaded: dict[str, Any]) -> dict[str, np.ndarray]:
    """What ``load_imatrix`` (tools/quantize/quantize.cpp) makes of a loaded file: GGUF
    ``sums / (float) count`` per matrix, 1 where the count is 0; legacy ``sums / ncall``."""
    out = {}
    for name, (sums, counts) in loaded["entries"].items():
        e = np.empty_like(sums)
        if not loaded["legacy"]:
            ne0 = sums.size // counts.size
            for j, c in enumerate(counts):
                part = slice(j * ne0, (j + 1) * ne0)
                e[part] = sums[part] / np.float32(c) if c > 0 else np.float32(1)
        else:
            ncall = counts[0] if counts.size else 0
            e[:] = sums / np.float32(ncall) if ncall > 0 else sums
        out[name] = e.astype(np.float32)
    return out


def llama_quantize(src: Path, dst: Path, ftype: int, weights: dict[str, np.ndarray] | None) -> int:
    """``llama_model_quantize`` of ``src`` into ``dst`` with ``params.imatrix`` built from
    ``weights`` as llama-quantize builds it (null-terminated); returns its status."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 1
    keep: list[Any] = []
    if weights is not None:
        arr = (llama_cpp.llama_model_imatrix_data * (len(weights) + 1))()
        for i, (name, w) in enumerate(weights.items()):
            w = np.ascontiguousarray(w, dtype=np.float32)
            keep += [name.encode(), w]
            arr[i].name = keep[-2]
            arr[i].data = w.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            arr[i].size = w.size
        params.imatrix = ctypes.cast(arr, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
        keep.append(arr)
    return int(llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params))


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]  # fmt: skip


def ggml_write_imatrix(
    path: Path,
    entries: dict[str, tuple[np.ndarray, np.ndarray]],
    datasets: list[str],
    chunk_count: int,
    chunk_size: int,
) -> None:
    """Write an imatrix file with ggml's own GGUF writer, making the calls ``save_imatrix``
    makes (keys, then per sorted name ``in_sum2`` [cols, nmat] and ``counts`` [1, nmat] F32)."""
    g = ctypes.CDLL(str(lib_dir() / "libggml-base.so"))
    vp, cp = ctypes.c_void_p, ctypes.c_char_p
    g.ggml_init.argtypes, g.ggml_init.restype = [_InitParams], vp
    g.gguf_init_empty.restype = vp
    g.gguf_set_val_str.argtypes = [vp, cp, cp]
    g.gguf_set_arr_str.argtypes = [vp, cp, ctypes.POINTER(cp), ctypes.c_size_t]
    g.gguf_set_val_u32.argtypes = [vp, cp, ctypes.c_uint32]
    g.ggml_new_tensor_2d.argtypes = [vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    g.ggml_new_tensor_2d.restype = vp
    g.ggml_set_name.argtypes, g.ggml_set_name.restype = [vp, cp], vp
    g.ggml_get_data.argtypes, g.ggml_get_data.restype = [vp], vp
    g.gguf_add_tensor.argtypes = [vp, vp]
    g.gguf_write_to_file.argtypes, g.gguf_write_to_file.restype = (
        [vp, cp, ctypes.c_bool],
        ctypes.c_bool,
    )
    g.gguf_free.argtypes = [vp]
    g.ggml_free.argtypes = [vp]
    size = sum(2048 + 4 * (s.size + c.size) for s, c in entries.values()) + 4096
    ctx = g.ggml_init(_InitParams(size, None, False))
    gctx = g.gguf_init_empty()
    g.gguf_set_val_str(gctx, b"general.type", b"imatrix")
    arr = (cp * len(datasets))(*[d.encode() for d in datasets])
    g.gguf_set_arr_str(gctx, b"imatrix.datasets", arr, len(datasets))
    g.gguf_set_val_u32(gctx, b"imatrix.chunk_count", chunk_count)
    g.gguf_set_val_u32(gctx, b"imatrix.chunk_size", chunk_size)
    for name in sorted(entries):
        sums, counts = entries[name]
        nmat, cols = sums.shape
        for suffix, values, ne0 in ((".in_sum2", sums, cols), (".counts", counts, 1)):
            t = g.ggml_new_tensor_2d(ctx, 0, ne0, nmat)
            g.ggml_set_name(t, (name + suffix).encode())
            flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
            ctypes.memmove(g.ggml_get_data(t), flat.ctypes.data, flat.nbytes)
            g.gguf_add_tensor(gctx, t)
    assert g.gguf_write_to_file(gctx, str(path).encode(), False)
    g.gguf_free(gctx)
    g.ggml_free(ctx)
