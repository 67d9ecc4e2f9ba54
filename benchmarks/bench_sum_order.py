"""Error sums in an order NumPy can reproduce: what it would cost the kernels.

The error-sum kernels (``qstream/kernels/error_stats.py``) are compiled with
``fastmath={"reassoc", "nsz"}`` so that LLVM vectorises their float64 sums; the order of the
additions is then LLVM's choice for the host CPU, so no NumPy code can be sure to give the
same bits, which blocks a Numba-free path for small jobs (``benchmarks/README.md``,
``bench_startup.py``). This script measures the alternative: sums in a defined order (8
lanes, lane j summing the elements i = j mod 8 in index order, the tail added to lanes 0..r-1,
the lanes folded ((0+1)+(2+3))+((4+5)+(6+7))), written as 32 scalar accumulators without
fast-math, against the fast-math loop the kernels use (the same four sums: x^2, e^2, x*y,
y^2 of int8 codes against float32 values, one row per call, one thread).

It checks first that NumPy reproduces the defined order bit for bit (``reshape(-1, 8)
.sum(axis=0)`` adds each lane's values in index order) on random rows of 1-3000 values, then
reports each version's throughput for rows of 128, 4096 and 1 Mi values.

    python benchmarks/bench_sum_order.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from numba import njit

LANES = 8
SUMS = ("x2", "e2", "xy", "y2")


@njit(fastmath={"reassoc", "nsz"})
def sums_fastmath(x, q, s, z):
    """The kernels' loop (``error_stats.sums_at``'s four sums)."""
    sx2 = 0.0
    se2 = 0.0
    sxy = 0.0
    sy2 = 0.0
    for i in range(x.shape[0]):
        xv = np.float64(x[i])
        y = np.float64(np.float32((q[i] - z) * s))
        e = xv - y
        sx2 += xv * xv
        se2 += e * e
        sxy += xv * y
        sy2 += y * y
    return sx2, se2, sxy, sy2


def _fold(k: str) -> str:
    return f"((({k}_0 + {k}_1) + ({k}_2 + {k}_3)) + (({k}_4 + {k}_5) + ({k}_6 + {k}_7)))"


def _lanes_source() -> str:
    """The defined-order loop, unrolled by hand (Numba has no fixed-size local arrays that
    LLVM keeps in registers; a heap array of accumulators measured slower still)."""
    body = [f"    {k}_{j} = 0.0" for k in SUMS for j in range(LANES)]
    body += ["    n = x.shape[0]", "    n8 = n - n % 8", "    for i in range(0, n8, 8):"]
    for j in range(LANES):
        body += [
            f"        xv{j} = np.float64(x[i + {j}])",
            f"        y{j} = np.float64(np.float32((q[i + {j}] - z) * s))",
            f"        e{j} = xv{j} - y{j}",
            f"        x2_{j} += xv{j} * xv{j}",
            f"        e2_{j} += e{j} * e{j}",
            f"        xy_{j} += xv{j} * y{j}",
            f"        y2_{j} += y{j} * y{j}",
        ]
    body.append("    r = n - n8")
    for j in range(LANES):
        body += [
            f"    if r > {j}:",
            f"        xv = np.float64(x[n8 + {j}])",
            f"        y = np.float64(np.float32((q[n8 + {j}] - z) * s))",
            "        e = xv - y",
            f"        x2_{j} += xv * xv",
            f"        e2_{j} += e * e",
            f"        xy_{j} += xv * y",
            f"        y2_{j} += y * y",
        ]
    body.append("    return " + ", ".join(_fold(k) for k in SUMS))
    return "def sums_lanes(x, q, s, z):\n" + "\n".join(body)


_namespace: dict = {"np": np}
exec(_lanes_source(), _namespace)
sums_lanes = njit(_namespace["sums_lanes"])


def sums_numpy(x, q, s, z):
    """The defined order in NumPy."""
    xv = x.astype(np.float64)
    y = ((q.astype(np.float64) - z) * s).astype(np.float32).astype(np.float64)
    e = xv - y
    n = x.shape[0]
    n8 = n - n % LANES
    out = []
    for t in (xv * xv, e * e, xv * y, y * y):
        acc = t[:n8].reshape(-1, LANES).sum(axis=0) if n8 else np.zeros(LANES)
        acc[: n - n8] += t[n8:]
        out.append(
            ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
        )
    return tuple(out)


def row(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, float]:
    x = (rng.standard_normal(n) * 10 ** rng.uniform(-3, 3)).astype(np.float32)
    s = float(np.abs(x).max() / 127) or 1.0
    q = np.clip(np.rint(x / np.float32(s)), -128, 127).astype(np.int8)
    return x, q, s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checks", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    mismatches = 0
    for _ in range(args.checks):
        x, q, s = row(rng, int(rng.integers(1, 3000)))
        mismatches += sums_lanes(x, q, s, 0.0) != sums_numpy(x, q, s, 0.0)
    print(f"NumPy against the defined-order kernel: {mismatches} of {args.checks} rows differ")
    print(f"{'row length':>10} {'fast-math GB/s':>15} {'defined order GB/s':>19} {'ratio':>6}")
    for n, rows in ((128, 65536), (4096, 2048), (1 << 20, 8)):
        x = rng.standard_normal((rows, n)).astype(np.float32)
        s = float(np.abs(x).max() / 127)
        q = np.clip(np.rint(x / np.float32(s)), -128, 127).astype(np.int8)
        speed = {}
        for f in (sums_fastmath, sums_lanes):
            f(x[0], q[0], s, 0.0)  # (compiled before timing)
            best = float("inf")
            for _ in range(args.rounds):
                t = time.perf_counter()
                for r in range(rows):
                    f(x[r], q[r], s, 0.0)
                best = min(best, time.perf_counter() - t)
            speed[f] = x.nbytes / best / 1e9
        fast, lanes = speed[sums_fastmath], speed[sums_lanes]
        print(f"{n:>10} {fast:>15.2f} {lanes:>19.2f} {fast / lanes:>5.1f}x")


if __name__ == "__main__":
    main()
