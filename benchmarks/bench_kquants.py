"""K-quants: qstream's Numba kernels against llama.cpp's C quantizer on the same rows.

For each of Q2_K..Q6_K, without and with an importance matrix, on ``--mib`` MiB of float32
weight-like rows (default 64: 4096 rows x 4096 columns, Student-t(5) values with log-normal
row scales): ``ggml_quantize_chunk`` called once, single-threaded (as llama-quantize calls it
per chunk on one thread), against ``qstream.compat.gguf_kquants.quantize`` with 1 and 2 Numba
threads. The best of ``--repeat`` runs of each; the bytes are compared (exit status 1 if any
differ). Printed: seconds, and qstream's time over ggml's (below 1: qstream is faster).

The ggml library is llama-cpp-python's ``lib/libggml-base.so``, else ``QSTREAM_GGML_LIB``.
Run ``python benchmarks/bench_kquants.py --help``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
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


def main() -> int:
    """Run the comparison; print a table (and JSON with ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=float, default=64, help="MiB of float32 rows (default 64)")
    ap.add_argument("--cols", type=int, default=4096, help="columns per row (default 4096)")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each, best kept (default 2)")
    ap.add_argument("--types", default="Q2_K,Q3_K,Q4_K,Q5_K,Q6_K")
    ap.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = ap.parse_args()

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
