"""Per-channel histogram threshold searches: qstream now, the direct searches before, ORT.

Cases (2 Numba threads), on 65536 channels x 2048 bins by default:

* qstream ``search_range`` (entropy, mse, l2; 8 and 4 bits) and ``percentile_range`` over
  every channel; entropy once more with a progress callback (its overhead)
* the searches the fast ones replaced (``entropy_search_reference``, ``mse_search_reference``,
  ``l2_search_reference``), in the same parallel loop over channels the old kernel had, on an
  evenly spaced subset of channels (``--old-channels``, default 64) and extrapolated per
  channel; their chosen bins are compared with the fast searches' (exit status 1 if any differ)
* ONNX Runtime's per-tensor entropy search: ``HistogramCollector(method="entropy",
  num_bins=2048, num_quantized_bins=128)`` collects one tensor, then
  ``get_entropy_threshold(hist, 128)`` is timed

The histograms come from weight-like rows of ``--width`` float32 values (default 4096, i.e.
the channels of a 65536 x 4096 matrix quantized along axis 0): Student-t(5) / normal / Laplace
rows with log-normal row scales and a few outliers, histogrammed by qstream's own kernel
(``|x|`` over ``[0, max|x|]`` for entropy, mse and percentile; ``x`` over ``[min, max]`` for l2).

Run ``python3 benchmarks/bench_search.py --help``; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import time

from _common import git_state
from bench_core import CpuMonitor, cpu_model

THREADS = 2
TARGET_ENTROPY_S = 10.0  # 65536 channels x 2048 bins
TARGET_SPEEDUP = 100.0


def make_histograms(channels: int, width: int, nbins: int, seed: int):
    """(abs histograms, signed histograms, lo, hi) of ``channels`` weight-like rows."""
    import numpy as np

    from qstream.kernels.stats import channel_histograms

    rng = np.random.default_rng(seed)
    habs = np.zeros((channels, nbins), np.int64)
    hsig = np.zeros((channels, nbins), np.int64)
    lo = np.empty(channels)
    hi = np.empty(channels)
    step = 2048
    for c0 in range(0, channels, step):
        c1 = min(channels, c0 + step)
        n = c1 - c0
        kind = rng.integers(0, 3, n)
        x = np.where(
            (kind == 0)[:, None],
            rng.standard_t(5, (n, width)),
            np.where(
                (kind == 1)[:, None], rng.standard_normal((n, width)), rng.laplace(size=(n, width))
            ),
        )
        x *= rng.lognormal(-4.0, 0.5, n)[:, None]
        out = rng.random((n, width)) < 1e-4  # a few outliers
        x[out] *= 20
        x = x.astype(np.float32)
        lo[c0:c1] = x.min(1)
        hi[c0:c1] = x.max(1)
        amax = np.maximum(-lo[c0:c1], hi[c0:c1])
        channel_histograms(x[None], np.zeros(n), amax, True, habs[c0:c1])
        channel_histograms(x[None], lo[c0:c1], hi[c0:c1], False, hsig[c0:c1])
    return habs, hsig, lo, hi


def old_kernel():
    """The per-channel kernel as it was: the direct searches in a parallel loop."""
    from numba import njit, prange

    from qstream.kernels import search as S

    @njit(parallel=True, nogil=True)
    def old_channel_searches(counts, method, hlo, hhi, nlevels, start, max_bound, a, b):
        for c in prange(counts.shape[0]):
            if method == 0:
                a[c] = S.entropy_search_reference(counts[c], nlevels, start, 1)
            elif method == 1:
                a[c] = S.mse_search_reference(counts[c], hhi[c], max_bound, start, 1)
            else:
                a[c], b[c] = S.l2_search_reference(counts[c], hlo[c], hhi[c], 2 * nlevels)

    return old_channel_searches


def timed(fn, reps: int) -> dict:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return {"median": statistics.median(times), "min": min(times), "times": times}


def ort_entropy(values, reps: int) -> dict:
    """ONNX Runtime's per-tensor entropy threshold search on a 2048-bin histogram."""
    from onnxruntime.quantization.calibrate import HistogramCollector

    coll = HistogramCollector(
        method="entropy",
        symmetric=False,
        num_bins=2048,
        num_quantized_bins=128,
        percentile=99.999,
        scenario="same",
    )
    with contextlib.redirect_stdout(io.StringIO()):
        coll.collect({"x": values})
    h = coll.histogram_dict["x"]
    thr = []
    r = timed(lambda: thr.append(coll.get_entropy_threshold(h, 128)), reps)
    r["bins"] = int(h[0].size)
    r["threshold"] = [float(thr[-1][0]), float(thr[-1][1])]
    r["values"] = int(values.size)
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--channels", type=int, default=65536, help="channels (default 65536)")
    ap.add_argument("--bins", type=int, default=2048, help="bins per histogram (default 2048)")
    ap.add_argument("--width", type=int, default=4096, help="values per channel (default 4096)")
    ap.add_argument("--reps", type=int, default=5, help="timed runs per case (default 5)")
    ap.add_argument("--old-channels", type=int, default=64, help="subset for the old searches")
    ap.add_argument("--ort-reps", type=int, default=3, help="timed ORT searches (default 3)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = ap.parse_args(argv)

    import numba
    import numpy as np
    import onnxruntime

    import qstream
    from qstream.calibration import histogram as H

    numba.set_num_threads(THREADS)
    t_start = time.perf_counter()
    idle = CpuMonitor()
    time.sleep(1.0)
    before = idle.report()

    t = time.perf_counter()
    habs, hsig, lo, hi = make_histograms(args.channels, args.width, args.bins, seed=0)
    build_s = time.perf_counter() - t
    c = args.channels
    amax = np.maximum(-lo, hi)
    absh = {"counts": habs, "lo": np.zeros(c), "hi": amax, "abs": True}
    sigh = {"counts": hsig, "lo": lo, "hi": hi, "abs": False}

    def run(method, hist, bits=8, n=None, progress=None):
        sl = slice(None) if n is None else slice(0, n)
        h = {k: (v[sl] if isinstance(v, np.ndarray) else v) for k, v in hist.items()}
        if method == "percentile":
            return H.percentile_range(h, lo[sl], hi[sl], 99.99, symmetric=True, progress=progress)
        return H.search_range(h, lo[sl], hi[sl], method, bits, symmetric=True, progress=progress)

    cases = [
        ("entropy", absh, 8),
        ("mse", absh, 8),
        ("l2", sigh, 8),
        ("percentile", absh, 8),
        ("entropy", absh, 4),
        ("mse", absh, 4),
        ("l2", sigh, 4),
    ]
    for method, hist, bits in cases:  # load / compile the kernels
        run(method, hist, bits, n=8)
    # interleaved: every repetition times every case once (the order rotates), so that load
    # from other processes hits the cases alike
    calls = []
    impls = {
        (m if b == 8 else f"{m} int4"): (lambda m=m, h=h, b=b: run(m, h, b)) for m, h, b in cases
    }
    impls["entropy with progress"] = lambda: run(
        "entropy", absh, progress=lambda d, n: calls.append(d)
    )
    names = list(impls)
    times = {n: [] for n in names}
    busy = {n: [] for n in names}
    for rep in range(args.reps):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            mon = CpuMonitor()
            t = time.perf_counter()
            impls[name]()
            times[name].append(time.perf_counter() - t)
            busy[name].append(mon.report().get("foreign_cpu_frac"))
        print(f"# repetition {rep + 1}/{args.reps} done", flush=True)
    rows = []
    for name in names:
        v = times[name]
        fb = [b for b in busy[name] if b is not None]
        rows.append(
            {
                "case": name,
                "median": statistics.median(v),
                "min": min(v),
                "times": v,
                "foreign_cpu_frac": busy[name],
                "busy_median": statistics.median(fb) if fb else None,
                "us_per_channel": statistics.median(v) / c * 1e6,
            }
        )
    prog = rows.pop()
    prog["calls_per_run"] = len(calls) // args.reps

    # the direct searches on a subset, in the old kernel's parallel loop
    old = old_kernel()
    pick = np.linspace(0, c - 1, args.old_channels).astype(np.int64)
    sub_abs = np.ascontiguousarray(habs[pick])
    sub_sig = np.ascontiguousarray(hsig[pick])
    hlos = {0: np.zeros(pick.size), 2: np.ascontiguousarray(lo[pick])}
    his = {0: np.ascontiguousarray(amax[pick]), 2: np.ascontiguousarray(hi[pick])}
    from qstream.kernels import search as S

    logt = S.log_table(S.LOG_TABLE_SIZE)
    olds = {}
    for code, method in ((0, "entropy"), (1, "mse"), (2, "l2")):
        for bits in (8, 4):
            nl, mb = 2 ** (bits - 1), float(2 ** (bits - 1) - 1)
            idx, off = S.entropy_groups(nl, args.bins)
            sub = sub_sig if code == 2 else sub_abs
            slo, shi = hlos[2 if code == 2 else 0], his[2 if code == 2 else 0]
            a_old = np.empty(pick.size, np.int64)
            b_old = np.zeros(pick.size, np.int64)
            args_old = (sub, code, slo, shi, nl, min(128, args.bins), mb, a_old, b_old)
            old(*(v[:2] if isinstance(v, np.ndarray) else v for v in args_old))
            mon = CpuMonitor()
            r = timed(lambda a=args_old: old(*a), max(1, args.reps))
            r["machine"] = mon.report()
            a_new = np.empty(pick.size, np.int64)
            b_new = np.zeros(pick.size, np.int64)
            S.channel_searches(
                sub, code, slo, shi, nl, min(128, args.bins), mb, 2 * nl, logt, idx, off,
                a_new, b_new,
            )  # fmt: skip
            r["same_bins"] = bool(np.array_equal(a_old, a_new) and np.array_equal(b_old, b_new))
            r["channels"] = int(pick.size)
            r["per_channel_s"] = r["median"] / pick.size
            r["extrapolated_s"] = r["per_channel_s"] * c
            olds[method if bits == 8 else f"{method} int4"] = r
            print(f"# old {method} {bits} bits: {r['per_channel_s'] * 1e3:.3f} ms/ch", flush=True)

    # ONNX Runtime, per tensor: one tensor of the same kind of values (4 Mi)
    rng = np.random.default_rng(7)
    values = (rng.standard_t(5, 4 * 2**20) * 0.02).astype(np.float32)
    ort_r = ort_entropy(values, args.ort_reps)

    after = idle.report()
    new = {r["case"]: r for r in rows}
    print()
    print(
        f"per-channel searches, {c} channels x {args.bins} bins ({args.width} values each), "
        f"{THREADS} threads; histograms built in {build_s:.1f} s"
    )
    print(
        f"{'method':<14}{'median s':>10}{'min s':>9}{'us/ch':>8}{'old s (extrap.)':>17}"
        f"{'old/new':>9}{'busy':>7}"
    )
    for r in rows:
        o = olds.get(r["case"])
        old_s = f"{o['extrapolated_s']:.1f}" if o else "-"
        ratio = f"{o['extrapolated_s'] / r['median']:.0f}x" if o else "-"
        busy = r["busy_median"]
        busy = "-" if busy is None else f"{100 * busy:.0f}%"
        print(
            f"{r['case']:<14}{r['median']:>10.2f}{r['min']:>9.2f}{r['us_per_channel']:>8.1f}"
            f"{old_s:>17}{ratio:>9}{busy:>7}"
        )
    ov = prog["median"] / new["entropy"]["median"] - 1
    print(
        f"entropy with progress: {prog['median']:.2f} s ({prog['calls_per_run']} calls, "
        f"{100 * ov:+.1f}% vs without)"
    )
    for m, o in olds.items():
        print(
            f"old {m}: {o['per_channel_s'] * 1e3:.3f} ms/channel on {o['channels']} channels, "
            f"same bins as new: {o['same_bins']}"
        )
    e = new["entropy"]["median"]
    print(
        f"ORT get_entropy_threshold, one tensor ({ort_r['values']} values, {ort_r['bins']} "
        f"bins): {ort_r['median']:.2f} s; qstream's {c} channels take {e / ort_r['median']:.2f}x "
        f"that, {ort_r['median'] / (e / c):.0f}x less per channel"
    )
    targets = [
        {
            "target": f"entropy {c} x {args.bins} <= {TARGET_ENTROPY_S:.0f} s",
            "value": e,
            "met": e <= TARGET_ENTROPY_S,
        },
        {
            "target": f"entropy >= {TARGET_SPEEDUP:.0f}x the direct search",
            "value": olds["entropy"]["extrapolated_s"] / e,
            "met": olds["entropy"]["extrapolated_s"] / e >= TARGET_SPEEDUP,
        },
    ]
    for tg in targets:
        print(f"target {tg['target']}: {tg['value']:.2f} -> {'met' if tg['met'] else 'NOT met'}")
    print(
        f"machine before: {before.get('foreign_cpu_frac', 0) * 100:.0f}% busy; "
        f"whole run: {after.get('foreign_cpu_frac', 0) * 100:.0f}% busy by other processes"
    )
    if args.json:
        out = {
            "meta": {
                "python": sys.version.split()[0],
                "numpy": np.__version__,
                "numba": numba.__version__,
                "numba_threading_layer": numba.threading_layer(),
                "onnxruntime": onnxruntime.__version__,
                "qstream": qstream.__version__,
                "cpu": cpu_model(),
                "os_cpu_count": os.cpu_count(),
                "threads": THREADS,
                "args": vars(args),
                "git": git_state(),
                "histograms_build_s": build_s,
            },
            "rows": rows,
            "progress": prog,
            "old": olds,
            "onnxruntime_entropy": ort_r,
            "targets": targets,
            "machine_before": before,
            "machine_during": after,
            "total_seconds": time.perf_counter() - t_start,
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if not all(o["same_bins"] for o in olds.values()):
        print("ERROR: the fast searches chose other bins than the direct ones", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
