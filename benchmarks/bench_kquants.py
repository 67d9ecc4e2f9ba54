"""K-quants: qstream's Numba kernels against llama.cpp's C quantizer on the same rows.

For each of Q2_K..Q6_K, without and with an importance matrix, on ``--mib`` MiB of float32
weight-like rows (default 64: 4096 rows x 4096 columns, Student-t(5) values with log-normal
row scales): ``ggml_quantize_chunk`` called once, single-threaded (as llama-quantize calls it
per chunk on one thread), against ``qstream.compat.gguf_kquants.quantize`` with 1 and 2 Numba
threads. The best of ``--repeat`` runs of each; the bytes are compared (exit status 1 if any
differ). Printed: seconds, and qstream's time over ggml's (below 1: qstream is faster).

The ggml library is llama-cpp-python's ``lib/libggml-base.so``, else ``QSTREAM_GGML_LIB``.
Run ``python benchmarks/bench_kquants.py --help``.

``--imatrix-gib G`` instead times importance-matrix collection: a dump of about ``G`` GiB of
float32 activations (a Zarr group, one uncompressed array per Linear input of a Llama-style
model of ``--imatrix-layers`` layers, hidden 1024, chunks of 1024 tokens; built once under
``--work``) read by ``qs.compute_imatrix(dump, model, out)`` and by a plain read of the same
arrays (zarr, chunk by chunk, nothing computed), each in a fresh process, alternated
``--rounds`` times (the dump stays in the page cache for both); medians of the wall time and
of the CPU time (user + system: on a machine others load, the work done), and the ratios.
The issue's size is ``--imatrix-gib 4`` (4 GiB of disk under ``--work``; remove it after).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
from _common import git_state


def ggml_library() -> ctypes.CDLL:
    """The ggml-base library llama-cpp-python ships, or the one QSTREAM_GGML_LIB names."""
    path = None
    try:
        import llama_cpp

        candidate = Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"
        path = str(candidate) if candidate.exists() else None
    except ImportError:
        pass
    path = path or os.environ.get("QSTREAM_GGML_LIB")
    if not path:
        sys.exit("no ggml library: install llama-cpp-python or set QSTREAM_GGML_LIB")
    lib = ctypes.CDLL(path)
    fn = lib.ggml_quantize_chunk
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 3
    fn.argtypes += [ctypes.c_void_p]
    return lib


def weight_rows(rows: int, cols: int, seed: int) -> np.ndarray:
    """Weight-like rows: Student-t(5) values, log-normal row scales."""
    rng = np.random.default_rng(seed)
    x = rng.standard_t(5, (rows, cols)).astype(np.float32)
    x *= (0.02 * rng.lognormal(0, 0.5, (rows, 1))).astype(np.float32)
    return x


def best_of(repeat: int, fn) -> float:
    """The shortest wall time of ``repeat`` calls of ``fn``."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


# the children of the imatrix benchmark: argv = dump model [out]
_COLLECT = """
import qstream as qs
qs.compute_imatrix(sys.argv[1], sys.argv[2], sys.argv[3])
"""
_PLAIN_READ = """
import zarr
g = zarr.open_group(sys.argv[1], mode="r")
for name, a in g.arrays():
    step = a.chunks[0]
    for r in range(0, a.shape[0], step):
        a[r : r + step]
"""
_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")  # fmt: skip


def build_dump(folder: Path, gib: float, layers: int, hidden: int = 1024) -> tuple[Path, Path]:
    """A Llama-style model folder (config and float32 safetensors) and a Zarr dump of about
    ``gib`` GiB of activations of its Linear inputs (tokens x in_features, 1024-token chunks)."""
    import zarr
    from safetensors.numpy import save_file

    inter = hidden * 11 // 4
    model, dump = folder / "model", folder / "acts.zarr"
    if (dump / "zarr.json").exists():
        return model, dump
    model.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    t = {"model.embed_tokens.weight": np.zeros((256, hidden), np.float32),
         "model.norm.weight": np.ones(hidden, np.float32),
         "lm_head.weight": np.zeros((256, hidden), np.float32)}  # fmt: skip
    widths = {}
    for i in range(layers):
        for name in _LINEARS:
            in_f = inter if name == "mlp.down_proj" else hidden
            out_f = inter if name in ("mlp.gate_proj", "mlp.up_proj") else hidden
            t[f"model.layers.{i}.{name}.weight"] = np.zeros((out_f, in_f), np.float32)
            widths[f"model.layers.{i}.{name}"] = in_f
    save_file(t, str(model / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
              "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 256,
              "rms_norm_eps": 1e-5, "tie_word_embeddings": False}  # fmt: skip
    (model / "config.json").write_text(json.dumps(config))
    tokens = max(1024, int(gib * 2**30 / 4 / sum(widths.values())) // 1024 * 1024)
    g = zarr.open_group(str(dump), mode="w")
    for name, width in widths.items():
        a = g.create_array(name, shape=(tokens, width), chunks=(1024, width), dtype="float32",
                           compressors=None)  # fmt: skip
        for r in range(0, tokens, 8192):
            n = min(8192, tokens - r)
            a[r : r + n] = rng.standard_normal((n, width), np.float32)
    return model, dump


def _children_cpu() -> float:
    """User + system seconds of this process's finished children."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def imatrix_bench(args: argparse.Namespace) -> int:
    """Time ``qs.compute_imatrix`` against a plain read of the same dump, alternated."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.support.memory_peak import PREAMBLE, run_child

    model, dump = build_dump(args.work / f"imatrix-{args.imatrix_gib}gib", args.imatrix_gib,
                             args.imatrix_layers)  # fmt: skip
    size = sum(f.stat().st_size for f in dump.rglob("*") if f.is_file())
    out = args.work / "bench.imatrix"
    times: dict[str, list[float]] = {"compute_imatrix": [], "plain read": []}
    cpus: dict[str, list[float]] = {"compute_imatrix": [], "plain read": []}
    peaks: dict[str, list[int]] = {"compute_imatrix": [], "plain read": []}
    for k in range(args.rounds):
        order = ["plain read", "compute_imatrix"]
        for side in order if k % 2 == 0 else order[::-1]:
            code, argv = (_COLLECT, [dump, model, out]) if side == "compute_imatrix" else (
                _PLAIN_READ, [dump])  # fmt: skip
            t, before = time.perf_counter(), _children_cpu()
            with contextlib.redirect_stdout(sys.stderr):  # (run_child prints a line)
                r = run_child(argv, code=PREAMBLE + code, timeout=3600)
            times[side].append(time.perf_counter() - t)
            cpus[side].append(_children_cpu() - before)
            peaks[side].append(r.peak)
            if r.returncode:
                sys.exit(f"{side} failed: {r.stderr[-2000:]}")
    med = {k: float(np.median(v)) for k, v in times.items()}
    cpu = {k: float(np.median(v)) for k, v in cpus.items()}
    result = {"git": git_state(), "dump_bytes": size, "rounds": args.rounds, "seconds": times,
              "median_seconds": med, "cpu_seconds": cpus, "median_cpu_seconds": cpu,
              "peak_mib": {k: [p >> 20 for p in v] for k, v in peaks.items()},
              "ratio": round(med["compute_imatrix"] / med["plain read"], 2),
              "cpu_ratio": round(cpu["compute_imatrix"] / cpu["plain read"], 2),
              "load": os.getloadavg()[0]}  # fmt: skip
    print(f"dump {size / 2**30:.2f} GiB: compute_imatrix {med['compute_imatrix']:.2f} s, "
          f"plain read {med['plain read']:.2f} s, ratio {result['ratio']:.2f} (CPU "
          f"{cpu['compute_imatrix']:.2f} / {cpu['plain read']:.2f} s)")  # fmt: skip
    print(json.dumps(result))
    return 0


def main() -> int:
    """Run the comparison; print a table (and JSON with ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--imatrix-gib", type=float, default=0, help="time imatrix collection")
    ap.add_argument("--imatrix-layers", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_kquants"))
    ap.add_argument("--rounds", type=int, default=3, help="imatrix: alternated runs")
    ap.add_argument("--mib", type=float, default=64, help="MiB of float32 rows (default 64)")
    ap.add_argument("--cols", type=int, default=4096, help="columns per row (default 4096)")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each, best kept (default 2)")
    ap.add_argument("--types", default="Q2_K,Q3_K,Q4_K,Q5_K,Q6_K")
    ap.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = ap.parse_args()
    if args.imatrix_gib > 0:
        return imatrix_bench(args)

    import numba

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's qstream
    from qstream.compat import gguf_kquants as kq

    lib = ggml_library()
    rows = max(1, int(args.mib * 2**20 / 4 / args.cols))
    x = weight_rows(rows, args.cols, 0)
    imatrix = np.random.default_rng(1).lognormal(0, 1, args.cols).astype(np.float32)
    # compile (or load from Numba's cache) before timing
    for qtype in args.types.split(","):
        for w in (None, imatrix):
            kq.quantize(x[:2], qtype, imatrix=w)
    top = numba.config.NUMBA_NUM_THREADS
    print(f"{rows} x {args.cols} float32 ({x.nbytes / 2**20:.0f} MiB), best of {args.repeat}")
    print(f"{'type':6} {'imatrix':8} {'ggml 1t':>9} {'qs 1t':>9} {'qs 2t':>9} {'1t/ggml':>8} "
          f"{'2t/ggml':>8}")  # fmt: skip
    results = []
    mismatch = False
    for qtype in args.types.split(","):
        for w in (None, imatrix):
            out = np.empty(kq.byte_shape(x.shape, qtype), np.uint8)
            wp = None if w is None else w.ctypes.data

            def ggml(out: np.ndarray = out, wp: int | None = wp, qtype: str = qtype) -> None:
                lib.ggml_quantize_chunk(
                    kq.TYPE_ID[qtype], x.ctypes.data, out.ctypes.data, 0, rows, args.cols, wp
                )

            t_ggml = best_of(args.repeat, ggml)
            row = {"type": qtype, "imatrix": w is not None, "ggml_1t": t_ggml}
            for threads in (1, 2):
                numba.set_num_threads(min(threads, top))
                mine: list[np.ndarray] = []
                row[f"qstream_{threads}t"] = best_of(
                    args.repeat, lambda w=w, qtype=qtype, mine=mine: mine.append(
                        kq.quantize(x, qtype, imatrix=w)
                    )
                )  # fmt: skip
                mismatch |= not np.array_equal(mine[-1], out)
            numba.set_num_threads(top)
            results.append(row)
            print(
                f"{qtype:6} {'yes' if w is not None else 'no':8} {t_ggml:9.3f} "
                f"{row['qstream_1t']:9.3f} {row['qstream_2t']:9.3f} "
                f"{row['qstream_1t'] / t_ggml:8.2f} {row['qstream_2t'] / t_ggml:8.2f}"
            )
    print("bytes identical to ggml:", "no" if mismatch else "yes")
    if args.json:
        print(json.dumps({"git": git_state(), "rows": rows, "cols": args.cols, "results": results}))
    return 1 if mismatch else 0


if __name__ == "__main__":
    sys.exit(main())
