"""Peak resident memory of ``qstream.quantize_store`` against its ``max_memory`` bound.

Builds (once, cached under ``--workdir``) an uncompressed float32 Zarr v3 array shaped
(``--size-rows``, 4096) with (256, 4096) chunks, filled chunk row by chunk row from
``np.random.default_rng(0).standard_normal(...) * 0.02`` (the writer holds one chunk).
Then every case runs in a fresh interpreter (``subprocess.run([sys.executable, "-c", ...])``)
that calls ``quantize_store(SRC, DST, QuantSpec(**SPEC), max_memory=MAXMEM, overwrite=True)``
and prints its own ``VmHWM`` (from ``/proc/self/status``) and the call's wall time; the
output is deleted after each case. ``NUMBA_CACHE_DIR`` is a fixed folder, and before the
measured runs each spec is run once on a small in-memory array in a separate (unmeasured)
child so the kernels are compiled and cached (``--no-warmup`` skips that; the first measured
case using a kernel then includes the compile). A baseline child only imports qstream, zarr,
numba and the kernel modules and prints its VmHWM.

Memory figures are MiB (2**20 bytes). ``over`` = VmHWM - max_memory (None: the library
default, 1 GiB); ``!`` marks a case above max_memory + ``--slack`` MiB (default 250).

    python3 benchmarks/bench_memory.py --out /tmp/bench_memory.json
    python3 benchmarks/bench_memory.py --size-rows 8192 --cases minmax_axis0,explicit
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

COLS = 4096
CHUNK_ROWS = 256
MiB = 1 << 20
GiB = 1 << 30
DEFAULT_MAX_MEMORY = GiB  # qstream.budget.DEFAULT_MAX_MEMORY
NUMBA_CACHE = "/tmp/qstream-bench-numba"

CASES = {  # name -> QuantSpec kwargs
    **{
        f"{m}_axis0": {"dtype": "int8", "axis": 0, "symmetric": True, "method": m}
        for m in ("minmax", "percentile", "entropy", "mse", "l2")
    },
    "percentile_axis1": {"dtype": "int8", "axis": 1, "symmetric": True, "method": "percentile"},
    "minmax_tensor": {"dtype": "int8", "axis": None, "symmetric": True, "method": "minmax"},
    "percentile_tensor": {"dtype": "int8", "axis": None, "symmetric": True, "method": "percentile"},
    "dynamic_block32": {"dtype": "int8", "axis": 1, "block_size": 32, "method": "dynamic"},
    "explicit": {"dtype": "int8", "scale": 0.001},
}
MAXMEMS = (128 * MiB, 512 * MiB, None)

STATUS_SNIPPET = """
def _status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
"""

CHILD = (
    STATUS_SNIPPET
    + """
import json, time
t0 = time.perf_counter()
import qstream as qs
t_imp = time.perf_counter() - t0
spec = qs.QuantSpec(**{spec!r})
t0 = time.perf_counter()
rep = qs.quantize_store({src!r}, {dst!r}, spec, max_memory={maxmem!r}, overwrite=True)
el = time.perf_counter() - t0
print("RESULT " + json.dumps({{"vmhwm_kb": _status("VmHWM"), "vmrss_kb": _status("VmRSS"),
    "seconds": el, "import_s": t_imp, "passes": rep.passes, "report_seconds": rep.seconds,
    "bytes_read": rep.bytes_read, "bytes_written": rep.bytes_written}}))
"""
)

BASELINE = (
    STATUS_SNIPPET
    + """
import json
import qstream as qs, zarr, numba
import qstream.kernels.stats, qstream.kernels.affine, qstream.kernels.error_stats
print("RESULT " + json.dumps({"vmhwm_kb": _status("VmHWM"), "vmrss_kb": _status("VmRSS")}))
"""
)

WARMUP = """
import numpy as np, qstream as qs
x = (np.random.default_rng(1).standard_normal((1024, 4096)) * 0.02).astype(np.float32)
qs.quantize_store(x, {dst!r}, qs.QuantSpec(**{spec!r}), max_memory={maxmem!r}, overwrite=True)
print("RESULT {{}}")
"""


def child_env() -> dict:
    env = dict(os.environ)
    env["NUMBA_CACHE_DIR"] = NUMBA_CACHE
    return env


def run_child(code: str, timeout: float) -> dict:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timeout after {timeout} s", "wall_s": timeout}
    wall = time.perf_counter() - t0
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            d = json.loads(line[len("RESULT ") :])
            d.update(ok=True, wall_s=wall)
            return d
    err = p.stderr.strip().splitlines()
    return {
        "ok": False,
        "returncode": p.returncode,
        "error": err[-1] if err else f"no result (rc {p.returncode})",
        "stderr": p.stderr[-4000:],
        "wall_s": wall,
    }


def build_source(path: str, rows: int) -> float:
    """Write the source array once (a marker file says it is complete)."""
    marker = os.path.join(path, ".bench-complete")
    if os.path.exists(marker):
        return 0.0
    import numpy as np
    import zarr

    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    a = zarr.create_array(
        path, shape=(rows, COLS), chunks=(CHUNK_ROWS, COLS), dtype="float32", compressors=None
    )
    rng = np.random.default_rng(0)
    for i in range(0, rows, CHUNK_ROWS):
        n = min(CHUNK_ROWS, rows - i)
        a[i : i + n] = rng.standard_normal((n, COLS)).astype(np.float32) * 0.02
    with open(marker, "w") as f:
        f.write("ok\n")
    return time.perf_counter() - t0


def mib(x) -> str:
    return "default" if x is None else f"{x // MiB} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--size-rows", type=int, default=65536, help="rows of 4096 float32 (65536 = 1 GiB)"
    )
    ap.add_argument("--cases", default="", help=f"comma list of: {','.join(CASES)} (default all)")
    ap.add_argument("--out", default="", help="write all rows as JSON here")
    ap.add_argument("--workdir", default="/tmp/qstream-bench-mem", help="source data cache")
    ap.add_argument("--slack", type=float, default=250.0, help="MiB allowed above max_memory")
    ap.add_argument("--timeout", type=float, default=10800.0, help="seconds per child")
    ap.add_argument("--no-warmup", action="store_true", help="skip the kernel-compiling warm-up")
    args = ap.parse_args()

    names = [c.strip() for c in args.cases.split(",") if c.strip()] or list(CASES)
    unknown = [c for c in names if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; choose from {list(CASES)}")
    if args.size_rows % CHUNK_ROWS:
        ap.error(f"--size-rows must be a multiple of {CHUNK_ROWS}")

    os.makedirs(args.workdir, exist_ok=True)
    os.makedirs(NUMBA_CACHE, exist_ok=True)
    src = os.path.join(args.workdir, f"src-{args.size_rows}.zarr")
    nbytes = args.size_rows * COLS * 4
    t_start = time.perf_counter()
    build_s = build_source(src, args.size_rows)
    print(
        f"source {src}: ({args.size_rows}, {COLS}) float32, {nbytes / MiB:.0f} MiB"
        + (f", built in {build_s:.1f} s" if build_s else " (cached)"),
        flush=True,
    )

    if not args.no_warmup:
        for name in names:
            d = tempfile.mkdtemp(prefix="qstream-bench-warm-", dir="/tmp")
            r = run_child(
                WARMUP.format(dst=os.path.join(d, "out"), spec=CASES[name], maxmem=None),
                args.timeout,
            )
            shutil.rmtree(d, ignore_errors=True)
            print(
                f"warm-up {name}: {'ok' if r['ok'] else 'FAILED ' + r['error']} "
                f"({r['wall_s']:.1f} s)",
                flush=True,
            )

    base = run_child(BASELINE, args.timeout)
    base_mb = base["vmhwm_kb"] / 1024 if base.get("ok") else None
    print(
        "baseline (imports only): VmHWM "
        + (f"{base_mb:.1f} MiB" if base_mb is not None else "FAILED " + base["error"]),
        flush=True,
    )

    rows = []
    hdr = (
        f"{'case':<18} {'max_memory':>10} {'VmHWM MiB':>10} {'-max_mem':>9}"
        f" {'seconds':>8} {'passes':>6}"
    )
    print(hdr, flush=True)
    for name in names:
        for mm in MAXMEMS:
            d = tempfile.mkdtemp(prefix="qstream-bench-dst-", dir="/tmp")
            dst = os.path.join(d, "out.zarr")
            r = run_child(CHILD.format(src=src, dst=dst, spec=CASES[name], maxmem=mm), args.timeout)
            shutil.rmtree(d, ignore_errors=True)
            bound = DEFAULT_MAX_MEMORY if mm is None else mm
            row = {"case": name, "spec": CASES[name], "max_memory": mm, "bound_bytes": bound, **r}
            if r["ok"]:
                row["vmhwm_mb"] = r["vmhwm_kb"] / 1024
                row["over_mb"] = row["vmhwm_mb"] - bound / MiB
                row["exceeds_slack"] = row["over_mb"] > args.slack
                flag = " !" if row["exceeds_slack"] else ""
                print(
                    f"{name:<18} {mib(mm):>10} {row['vmhwm_mb']:>10.1f} {row['over_mb']:>9.1f} "
                    f"{r['seconds']:>8.1f} {r['passes']:>6}{flag}",
                    flush=True,
                )
            else:
                print(f"{name:<18} {mib(mm):>10} FAILED: {r['error']}", flush=True)
            rows.append(row)

    bad = [r for r in rows if r.get("exceeds_slack")]
    failed = [r for r in rows if not r["ok"]]
    print(
        f"\nabove max_memory + {args.slack:.0f} MiB: "
        + (", ".join(f"{r['case']}@{mib(r['max_memory'])}" for r in bad) or "none")
    )
    if failed:
        print("failed: " + ", ".join(f"{r['case']}@{mib(r['max_memory'])}" for r in failed))
    total = time.perf_counter() - t_start
    print(f"total {total:.0f} s")

    if args.out:
        import numba
        import numpy
        import zarr
        from _common import git_state

        meta = {
            "python": sys.version,
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "numpy": numpy.__version__,
            "numba": numba.__version__,
            "zarr": zarr.__version__,
            "git": git_state(),
            "args": vars(args),
            "source": src,
            "source_bytes": nbytes,
            "shape": [args.size_rows, COLS],
            "chunks": [CHUNK_ROWS, COLS],
            "numba_cache_dir": NUMBA_CACHE,
            "warmup": not args.no_warmup,
            "units": "MiB (2**20 bytes); *_kb as in /proc (KiB)",
        }
        with open(args.out, "w") as f:
            json.dump(
                {
                    "meta": meta,
                    "baseline": {**base, "vmhwm_mb": base_mb},
                    "rows": rows,
                    "exceeding": [[r["case"], r["max_memory"]] for r in bad],
                    "total_seconds": total,
                },
                f,
                indent=1,
            )
        print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
