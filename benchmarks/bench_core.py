"""qstream core kernels against ONNX Runtime and PyTorch, side by side in one process.

Cases (int8, 2 threads for every library):

* per-tensor quantize   ``qstream.quantize(x, 0.37, 3)``  vs ORT QuantizeLinear vs
  ``torch.quantize_per_tensor``
* per-tensor dequantize ``qstream.dequantize(q, 0.37, 3)`` vs ORT DequantizeLinear vs
  ``torch.Tensor.dequantize``
* per-channel (axis 0 of a square matrix, 8192 x 8192 by default) quantize and dequantize vs
  ORT (axis=0) and ``torch.quantize_per_channel``
* the same with a preallocated output (qstream ``out=``, ORT IOBinding into a preallocated
  OrtValue; torch has no out= variant)
* per-call overhead on a 1 Ki-element array
* a copy bandwidth baseline (NumPy ``copyto`` and a Numba parallel copy)
* a cold-start check (first call compiles, second loads from a fresh NUMBA_CACHE_DIR)

qstream's results are asserted equal to ONNX Runtime's bit for bit before anything is timed.
Targets are reported, never asserted.

Run ``python3 benchmarks/bench_core.py --help``; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from _common import git_state

THREADS = 2
BUSY = 0.05  # other processes using more than this fraction of the CPUs: timings are disturbed
SCALE = 0.37
ZERO_POINT = 3

# Targets: ORT time / qstream time (medians), on the default calls (no out=).
TARGETS = {
    "quantize per-tensor": 1.0,
    "dequantize per-tensor": 2.0,
    "quantize per-channel axis=0": 1.5,
}

COLD_START_CODE = (
    "import time; t=time.perf_counter(); import numpy as np, qstream; "
    "qstream.quantize(np.ones(10, np.float32), 1.0, dtype='int8'); "
    "print(time.perf_counter()-t)"
)


# --------------------------------------------------------------------------- helpers


def parse_size(text: str) -> int:
    """``67108864``, ``64Mi``, ``4Ki``, ``1Gi`` or ``1e6`` -> number of elements."""
    t = text.strip()
    for suffix, mult in (("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30)):
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * mult)
    return int(float(t))


def timeit_interleaved(
    impls: dict, reps: int, warmup: int, inner: int = 1, gap: float = 0.0
) -> dict:
    """Time every callable in ``impls`` ``reps`` times, interleaved (the order rotates each
    repetition), sleeping ``gap`` seconds before each timed call so that idle worker threads
    of the previous library (libgomp spins for a few ms after a parallel region) have gone
    to sleep. Returns per-call seconds: {name: {"min", "median", "times"}}."""
    import resource

    names = list(impls)
    for name in names:
        for _ in range(warmup):
            r = impls[name]()
            del r
    times = {n: [] for n in names}
    faults = {n: [] for n in names}  # minor page faults (fresh memory being touched)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for rep in range(reps):
            k = rep % len(names)
            for name in names[k:] + names[:k]:
                fn = impls[name]
                if gap:
                    time.sleep(gap)
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                if inner == 1:
                    t0 = time.perf_counter()
                    r = fn()
                    t1 = time.perf_counter()
                    del r
                else:
                    t0 = time.perf_counter()
                    for _ in range(inner):
                        fn()
                    t1 = time.perf_counter()
                f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                times[name].append((t1 - t0) / inner)
                faults[name].append((f1 - f0) / inner)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {
        n: {
            "min": min(v),
            "median": statistics.median(v),
            "times": v,
            "minor_faults_median": statistics.median(faults[n]),
        }
        for n, v in times.items()
    }


def bits_equal(a, b) -> bool:
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype.itemsize != b.dtype.itemsize:
        return False
    u = f"u{a.dtype.itemsize}"
    return bool(np.array_equal(a.view(u), b.view(u)))


def n_mismatch(a, b) -> int:
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    u = f"u{a.dtype.itemsize}"
    return int(np.count_nonzero(a.view(u) != b.view(u)))


class CpuMonitor:
    """Whole-machine busy CPU time (/proc/stat) minus this process's own CPU time: how much
    other processes ran while we measured (on a 2-core machine that skews 2-thread timings)."""

    def __init__(self):
        self.start = self._snap()

    @staticmethod
    def _snap():
        import resource

        busy = steal = None
        try:
            with open("/proc/stat") as f:
                v = [int(t) for t in f.readline().split()[1:]]
            tck = os.sysconf("SC_CLK_TCK")
            busy = (sum(v[:8]) - v[3] - v[4]) / tck  # all but idle and iowait
            steal = v[7] / tck if len(v) > 7 else 0.0
        except (OSError, ValueError, IndexError):
            pass
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return time.perf_counter(), busy, steal, ru.ru_utime + ru.ru_stime

    def report(self) -> dict:
        t1, b1, st1, own1 = self._snap()
        t0, b0, st0, own0 = self.start
        wall = t1 - t0
        out = {"wall_s": wall, "own_cpu_s": own1 - own0, "loadavg": list(os.getloadavg())}
        if b0 is not None and b1 is not None:
            foreign = max(0.0, (b1 - b0) - (own1 - own0))
            out["foreign_cpu_s"] = foreign
            out["foreign_cpu_frac"] = foreign / (wall * (os.cpu_count() or 1))
            out["steal_s"] = st1 - st0
        return out


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


# --------------------------------------------------------------------------- ONNX Runtime


def ort_session(op: str, x_elem: int, out_elem: int, scale, zero_point, axis=None):
    """One QuantizeLinear / DequantizeLinear node (opset 21, IR 10): x is the graph input,
    scale and zero point are initializers."""
    import numpy as np
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.asarray(scale, np.float32), "scale"),
        numpy_helper.from_array(np.asarray(zero_point, np.int8), "zp"),
    ]
    attrs = {} if axis is None else {"axis": axis}
    node = helper.make_node(op, ["x", "scale", "zp"], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        op,
        [helper.make_tensor_value_info("x", x_elem, None)],
        [helper.make_tensor_value_info("y", out_elem, None)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10  # ORT 1.31 rejects the IR version onnx 1.23 writes by default
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # ORT's idle workers would otherwise spin between runs and steal a core from the peers
    # timed right after them (only 2 cores); a single large op does not need spinning.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def ort_run(sess, x):
    return lambda: sess.run(None, {"x": x})[0]


def ort_run_into(sess, x, out):
    """Run with IOBinding: input bound in place, output written into the preallocated ``out``."""
    import onnxruntime as ort

    io = sess.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy(out))

    def run():
        sess.run_with_iobinding(io)
        return out

    return run


# --------------------------------------------------------------------------- baseline


def copy_baseline(x, reps: int, gap: float) -> dict:
    """Copy bandwidth of ``x`` (read + write bytes / time): NumPy copyto (one thread) and a
    Numba parallel copy (THREADS threads). Returns per-variant seconds and GB/s."""
    import numba
    import numpy as np

    @numba.njit(parallel=True, nogil=True)
    def par_copy(src, dst):
        for i in numba.prange(src.size):
            dst[i] = src[i]

    src = x.reshape(-1)
    dst = np.empty_like(src)
    dst.fill(0)  # fault the pages in once
    res = timeit_interleaved(
        {
            "numpy copyto (1 thread)": lambda: np.copyto(dst, src),
            f"numba prange copy ({THREADS} threads)": lambda: par_copy(src, dst),
        },
        reps=reps,
        warmup=2,
        gap=gap,
    )
    assert np.array_equal(dst, src)
    nbytes = 2 * src.nbytes
    for v in res.values():
        v["bytes"] = nbytes
        v["gbps_median"] = nbytes / v["median"] / 1e9
        v["gbps_best"] = nbytes / v["min"] / 1e9
    return res


# --------------------------------------------------------------------------- cold start


def cold_start() -> dict:
    """The documented snippet, twice, with one fresh NUMBA_CACHE_DIR."""
    with tempfile.TemporaryDirectory(prefix="qstream-bench-numba-cache-") as d:
        env = dict(os.environ, NUMBA_CACHE_DIR=d)
        runs = []
        for label in ("first (compiles)", "second (cache)"):
            t0 = time.perf_counter()
            p = subprocess.run(
                [sys.executable, "-c", COLD_START_CODE],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            wall = time.perf_counter() - t0
            n_files = sum(len(f) for _, _, f in os.walk(d))
            runs.append(
                {
                    "run": label,
                    "reported_s": float(p.stdout.strip().splitlines()[-1]),
                    "process_wall_s": wall,
                    "cache_files_after": n_files,
                }
            )
    return {"code": COLD_START_CODE, "python": sys.executable, "runs": runs}


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--size",
        default="64Mi",
        help="elements of the per-tensor problem (e.g. 64Mi, 4Mi, 1000000); the per-channel "
        "matrix is isqrt(size) x isqrt(size). Default 64Mi (8192 x 8192).",
    )
    ap.add_argument("--reps", type=int, default=11, help="timed repetitions (>= 7), default 11")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls per function first")
    ap.add_argument(
        "--gap",
        type=float,
        default=0.02,
        metavar="SECONDS",
        help="sleep before each timed call (default 0.02): Numba's OpenMP workers spin for a "
        "few ms after each kernel and would slow down whichever peer is timed next",
    )
    ap.add_argument(
        "--retry-busy",
        type=int,
        default=3,
        metavar="N",
        help="re-time a case up to N times when other processes used more than 5%% of the CPUs "
        "meanwhile; the least disturbed attempt is kept (default 3)",
    )
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    ap.add_argument("--no-cold-start", action="store_true", help="skip the cold-start check")
    ap.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to SECONDS for other processes to use < 5%% of the CPUs",
    )
    args = ap.parse_args(argv)
    if args.reps < 7:
        ap.error("--reps must be >= 7")
    n = parse_size(args.size)
    side = math.isqrt(n)
    if side < 2:
        ap.error("--size too small")

    if args.wait_idle > 0:
        deadline = time.perf_counter() + args.wait_idle
        while True:
            probe = CpuMonitor()
            time.sleep(2.0)
            frac = probe.report().get("foreign_cpu_frac")
            if frac is None or frac < BUSY or time.perf_counter() > deadline:
                break
            print(f"# waiting for an idle machine (other processes: {100 * frac:.0f}%)", flush=True)

    t_start = time.perf_counter()

    # Cold start first, before this process has touched the cache or warmed anything.
    cold = None if args.no_cold_start else cold_start()

    # How busy the machine is before we start (other processes compete for the 2 cores).
    idle_probe = CpuMonitor()
    time.sleep(1.0)
    before = idle_probe.report()

    import numba
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto

    import qstream

    numba.set_num_threads(THREADS)
    torch = None
    if not args.no_torch:
        import warnings

        import torch

        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")

        torch.set_num_threads(THREADS)

    f32, i8 = TensorProto.FLOAT, TensorProto.INT8
    s32, z8 = np.float32(SCALE), np.int8(ZERO_POINT)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(n) * 50).astype(np.float32)
    x2 = x[: side * side].reshape(side, side)  # per-channel input (a view, no copy)
    s_ch = rng.uniform(0.01, 1.0, side).astype(np.float32)
    z_ch = np.zeros(side, np.int8)

    # Compile / load the kernels once, outside any timing.
    qstream.quantize(x[:16], s32, z8)
    qstream.dequantize(qstream.quantize(x[:16], s32, z8), s32, z8)
    threading_layer = numba.threading_layer()

    meta = {
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "numba": numba.__version__,
        "numba_threading_layer": threading_layer,
        "onnxruntime": ort.__version__,
        "torch": None if torch is None else torch.__version__,
        "qstream": qstream.__version__,
        "cpu": cpu_model(),
        "os_cpu_count": os.cpu_count(),
        "threads": THREADS,
        "numba_num_threads": numba.get_num_threads(),
        "torch_num_threads": None if torch is None else torch.get_num_threads(),
        "elements": n,
        "per_channel_shape": [side, side],
        "reps": args.reps,
        "warmup": args.warmup,
        "gap_s": args.gap,
        "scale": SCALE,
        "zero_point": ZERO_POINT,
        **git_state(),
        "machine_before": before,
    }
    print(
        f"# qstream {qstream.__version__} | numba {numba.__version__} ({threading_layer}) | "
        f"onnxruntime {ort.__version__} | torch {meta['torch']} | numpy {np.__version__}"
    )
    print(f"# {meta['cpu']}, {os.cpu_count()} CPUs; {THREADS} threads for every library")
    fb = before.get("foreign_cpu_frac")
    print(
        f"# machine before start: loadavg {before['loadavg'][0]:.2f}, other processes used "
        + ("?" if fb is None else f"{100 * fb:.0f}%")
        + " of the CPUs over 1 s"
    )
    if fb is not None and fb > 0.1:
        print("# WARNING: the machine is not idle; timings with 2 threads will be noisy")
    print(
        f"# per-tensor: {n} float32 ({x.nbytes / 2**20:.0f} MiB); per-channel: {side}x{side}; "
        f"{args.reps} reps (interleaved), {args.warmup} warm-up calls, {args.gap * 1e3:.0f} ms "
        "sleep before each timed call"
    )

    monitor = CpuMonitor()
    print("\n## copy baseline", flush=True)
    baseline = copy_baseline(x, args.reps, args.gap)
    for name, v in baseline.items():
        print(
            f"  {name:28s} {v['median'] * 1e3:8.2f} ms median ({v['min'] * 1e3:.2f} min)  "
            f"{v['gbps_median']:6.2f} GB/s median"
        )
    ref_name = max(baseline, key=lambda k: baseline[k]["gbps_median"])
    ref_gbps = baseline[ref_name]["gbps_median"]
    ref_copy_s = baseline[ref_name]["median"]  # time to copy x (n float32 elements)
    print(f"  reference: {ref_name}, {ref_gbps:.2f} GB/s")

    checks = {}
    rows = []

    def run_case(name, nbytes, impls, *, inner=1, note=""):
        best = None
        for attempt in range(1 + max(0, args.retry_busy)):
            case_monitor = CpuMonitor()
            res = timeit_interleaved(impls, args.reps, args.warmup, inner=inner, gap=args.gap)
            load = case_monitor.report()
            fl = load.get("foreign_cpu_frac")
            print(
                f"  {name:38s} timed in {load['wall_s']:5.1f} s; other processes: "
                + ("?" if fl is None else f"{100 * fl:3.0f}% of the CPUs")
                + (f" (attempt {attempt + 1})" if attempt else ""),
                flush=True,
            )
            if best is None or (fl or 0.0) < (best[1].get("foreign_cpu_frac") or 0.0):
                best = (res, load)
            if fl is None or fl <= BUSY:
                break
            time.sleep(1.0)
        res, load = best
        row = {"case": name, "bytes": nbytes, "note": note, "results": {}, "machine": load}
        for impl, v in res.items():
            v = dict(v)
            v["gbps_median"] = nbytes / v["median"] / 1e9
            v["frac_of_copy_bw"] = v["gbps_median"] / ref_gbps
            v["time_over_copy_of_x"] = v["median"] / ref_copy_s
            row["results"][impl] = v
        q = res.get("qstream")
        for peer in ("ORT", "torch"):
            if q and peer in res:
                row[f"{peer}/qstream"] = res[peer]["median"] / q["median"]
                row[f"{peer}/qstream_min"] = res[peer]["min"] / q["min"]
        rows.append(row)
        return row

    # ------------------------------------------------------------------ per-tensor
    print("\n## checks and timings", flush=True)
    sess_q = ort_session("QuantizeLinear", f32, i8, s32, z8)
    sess_dq = ort_session("DequantizeLinear", i8, f32, s32, z8)

    q_qs = qstream.quantize(x, s32, z8)
    q_ort = sess_q.run(None, {"x": x})[0]
    assert q_qs.dtype == np.int8 and q_ort.dtype == np.int8
    assert bits_equal(q_qs, q_ort), "per-tensor quantize differs from ORT"
    checks["quantize per-tensor: qstream == ORT"] = True
    q_out = np.zeros(n, np.int8)
    assert bits_equal(qstream.quantize(x, s32, z8, out=q_out), q_ort)
    checks["quantize per-tensor out=: qstream == ORT"] = True
    q_ort_buf = np.zeros(n, np.int8)
    assert bits_equal(ort_run_into(sess_q, x, q_ort_buf)(), q_ort)
    del q_ort

    d_qs = qstream.dequantize(q_qs, s32, z8)
    d_ort = sess_dq.run(None, {"x": q_qs})[0]
    assert bits_equal(d_qs, d_ort), "per-tensor dequantize differs from ORT"
    checks["dequantize per-tensor: qstream == ORT"] = True
    d_out = np.zeros(n, np.float32)
    assert bits_equal(qstream.dequantize(q_qs, s32, z8, out=d_out), d_ort)
    checks["dequantize per-tensor out=: qstream == ORT"] = True
    d_ort_buf = np.zeros(n, np.float32)
    assert bits_equal(ort_run_into(sess_dq, q_qs, d_ort_buf)(), d_ort)

    if torch is not None:
        xt = torch.from_numpy(x)
        ts = float(s32)  # the same value as the float32 scale
        tq = torch.quantize_per_tensor(xt, ts, ZERO_POINT, torch.qint8)
        checks["torch quantize per-tensor: elements != ORT (info)"] = n_mismatch(
            tq.int_repr().numpy(), q_qs
        )
        tq_in = torch._make_per_tensor_quantized_tensor(torch.from_numpy(q_qs), ts, ZERO_POINT)
        checks["torch dequantize per-tensor: elements != ORT (info)"] = n_mismatch(
            tq_in.dequantize().numpy(), d_ort
        )
        del tq
    del d_ort, d_qs

    impls = {
        "qstream": lambda: qstream.quantize(x, s32, z8),
        "ORT": ort_run(sess_q, x),
    }
    if torch is not None:
        impls["torch"] = lambda: torch.quantize_per_tensor(xt, ts, ZERO_POINT, torch.qint8)
    run_case("quantize per-tensor", 5 * n, impls)
    run_case(
        "quantize per-tensor, out=",
        5 * n,
        {
            "qstream": lambda: qstream.quantize(x, s32, z8, out=q_out),
            "ORT": ort_run_into(sess_q, x, q_ort_buf),
        },
        note="qstream out=; ORT IOBinding into a preallocated output",
    )
    impls = {
        "qstream": lambda: qstream.dequantize(q_qs, s32, z8),
        "ORT": ort_run(sess_dq, q_qs),
    }
    if torch is not None:
        impls["torch"] = lambda: tq_in.dequantize()
    run_case("dequantize per-tensor", 5 * n, impls)
    run_case(
        "dequantize per-tensor, out=",
        5 * n,
        {
            "qstream": lambda: qstream.dequantize(q_qs, s32, z8, out=d_out),
            "ORT": ort_run_into(sess_dq, q_qs, d_ort_buf),
        },
        note="qstream out=; ORT IOBinding into a preallocated output",
    )
    # Release the big buffers (the closures above refer to these names).
    q_out = q_ort_buf = d_out = d_ort_buf = tq_in = None

    # ------------------------------------------------------------------ per-channel, axis 0
    m = side * side
    sess_qc = ort_session("QuantizeLinear", f32, i8, s_ch, z_ch, axis=0)
    sess_dqc = ort_session("DequantizeLinear", i8, f32, s_ch, z_ch, axis=0)
    qc_qs = qstream.quantize(x2, s_ch, z_ch, axis=0)
    qc_ort = sess_qc.run(None, {"x": x2})[0]
    assert bits_equal(qc_qs, qc_ort), "per-channel quantize differs from ORT"
    checks["quantize per-channel axis=0: qstream == ORT"] = True
    qc_out = np.zeros((side, side), np.int8)
    assert bits_equal(qstream.quantize(x2, s_ch, z_ch, axis=0, out=qc_out), qc_ort)
    qc_ort_buf = np.zeros((side, side), np.int8)
    assert bits_equal(ort_run_into(sess_qc, x2, qc_ort_buf)(), qc_ort)
    del qc_ort
    dc_qs = qstream.dequantize(qc_qs, s_ch, z_ch, axis=0)
    dc_ort = sess_dqc.run(None, {"x": qc_qs})[0]
    assert bits_equal(dc_qs, dc_ort), "per-channel dequantize differs from ORT"
    checks["dequantize per-channel axis=0: qstream == ORT"] = True
    dc_out = np.zeros((side, side), np.float32)
    assert bits_equal(qstream.dequantize(qc_qs, s_ch, z_ch, axis=0, out=dc_out), dc_ort)
    dc_ort_buf = np.zeros((side, side), np.float32)
    assert bits_equal(ort_run_into(sess_dqc, qc_qs, dc_ort_buf)(), dc_ort)
    if torch is not None:
        x2t = torch.from_numpy(x2)
        ts_ch = torch.from_numpy(s_ch.astype(np.float64))
        tz_ch = torch.zeros(side, dtype=torch.int64)
        tqc = torch.quantize_per_channel(x2t, ts_ch, tz_ch, 0, torch.qint8)
        checks["torch quantize per-channel axis=0: elements != ORT (info)"] = n_mismatch(
            tqc.int_repr().numpy(), qc_qs
        )
        del tqc
        tqc_in = torch._make_per_channel_quantized_tensor(torch.from_numpy(qc_qs), ts_ch, tz_ch, 0)
        checks["torch dequantize per-channel axis=0: elements != ORT (info)"] = n_mismatch(
            tqc_in.dequantize().numpy(), dc_ort
        )
    del dc_ort, dc_qs

    impls = {
        "qstream": lambda: qstream.quantize(x2, s_ch, z_ch, axis=0),
        "ORT": ort_run(sess_qc, x2),
    }
    if torch is not None:
        impls["torch"] = lambda: torch.quantize_per_channel(x2t, ts_ch, tz_ch, 0, torch.qint8)
    run_case("quantize per-channel axis=0", 5 * m, impls, note=f"{side}x{side}")
    run_case(
        "quantize per-channel axis=0, out=",
        5 * m,
        {
            "qstream": lambda: qstream.quantize(x2, s_ch, z_ch, axis=0, out=qc_out),
            "ORT": ort_run_into(sess_qc, x2, qc_ort_buf),
        },
        note="qstream out=; ORT IOBinding into a preallocated output",
    )
    impls = {
        "qstream": lambda: qstream.dequantize(qc_qs, s_ch, z_ch, axis=0),
        "ORT": ort_run(sess_dqc, qc_qs),
    }
    if torch is not None:
        impls["torch"] = lambda: tqc_in.dequantize()
    run_case("dequantize per-channel axis=0", 5 * m, impls, note=f"{side}x{side}")
    run_case(
        "dequantize per-channel axis=0, out=",
        5 * m,
        {
            "qstream": lambda: qstream.dequantize(qc_qs, s_ch, z_ch, axis=0, out=dc_out),
            "ORT": ort_run_into(sess_dqc, qc_qs, dc_ort_buf),
        },
        note="qstream out=; ORT IOBinding into a preallocated output",
    )
    qc_out = qc_ort_buf = dc_out = dc_ort_buf = qc_qs = tqc_in = None

    # ------------------------------------------------------------------ per-call overhead
    xs = x[:1024].copy()
    qs_small = qstream.quantize(xs, s32, z8)
    assert bits_equal(qs_small, sess_q.run(None, {"x": xs})[0])
    impls = {"qstream": lambda: qstream.quantize(xs, s32, z8), "ORT": ort_run(sess_q, xs)}
    if torch is not None:
        xst = torch.from_numpy(xs)
        impls["torch"] = lambda: torch.quantize_per_tensor(xst, ts, ZERO_POINT, torch.qint8)
    run_case("overhead: quantize 1Ki per-tensor", 5 * 1024, impls, inner=200)
    impls = {
        "qstream": lambda: qstream.dequantize(qs_small, s32, z8),
        "ORT": ort_run(sess_dq, qs_small),
    }
    if torch is not None:
        tqs = torch._make_per_tensor_quantized_tensor(torch.from_numpy(qs_small), ts, ZERO_POINT)
        impls["torch"] = lambda: tqs.dequantize()
    run_case("overhead: dequantize 1Ki per-tensor", 5 * 1024, impls, inner=200)

    # ------------------------------------------------------------------ report
    def fmt_t(v, small):
        if v is None:
            return "-"
        if small:
            return f"{v['median'] * 1e6:.1f} us ({v['min'] * 1e6:.1f})"
        return f"{v['median'] * 1e3:.2f} ({v['min'] * 1e3:.2f})"

    print("\n## results: median (min) per call; ratios: of medians (of mins); GB/s from medians")
    print(
        "| case | qstream ms | ORT ms | torch ms | ORT/qstream | torch/qstream "
        "| qstream GB/s | ORT GB/s | torch GB/s | qstream: % of copy BW | qstream: x copy(x) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        r = row["results"]
        small = row["case"].startswith("overhead")
        busy = row["machine"].get("foreign_cpu_frac") or 0.0
        cells = [row["case"] + (f" [!{100 * busy:.0f}% busy]" if busy > BUSY else "")]
        cells += [fmt_t(r.get(k), small) for k in ("qstream", "ORT", "torch")]
        cells += [
            f"{row[k]:.2f}x ({row[k + '_min']:.2f}x)" if k in row else "-"
            for k in ("ORT/qstream", "torch/qstream")
        ]
        cells += [
            "-" if small or k not in r else f"{r[k]['gbps_median']:.2f}"
            for k in ("qstream", "ORT", "torch")
        ]
        q = r["qstream"]
        cells += (
            ["-", "-"]
            if small
            else [f"{100 * q['frac_of_copy_bw']:.0f}%", f"{q['time_over_copy_of_x']:.2f}"]
        )
        print("| " + " | ".join(cells) + " |")
    print(
        f"\nGB/s = (bytes read + bytes written) / median time (5 bytes per element: 4 float32 +"
        f" 1 int8). Copy baseline ({ref_name}): {ref_gbps:.2f} GB/s, "
        f"{ref_copy_s * 1e3:.2f} ms to copy x ({x.nbytes / 2**20:.0f} MiB read + written); "
        f"'x copy(x)' = case time / that copy time. [!N% busy]: other processes used N% of "
        "the CPUs while that case was timed (not trustworthy)."
    )

    print("\n## minor page faults per call (median): fresh output memory being touched")
    for row in rows:
        r = row["results"]
        print(
            f"  {row['case']:38s} "
            + "  ".join(f"{k} {v['minor_faults_median']:g}" for k, v in r.items())
        )

    print("\n## checks")
    for k, v in checks.items():
        print(f"  {k}: {v}")

    targets = []
    print("\n## targets (ORT median / qstream median; reported, not asserted)")
    by_case = {row["case"]: row for row in rows}
    for case, want in TARGETS.items():
        got = by_case[case]["ORT/qstream"]
        got_out = by_case.get(case + ", out=", {}).get("ORT/qstream")
        ok = got >= want
        targets.append(
            {"case": case, "target": want, "ratio": got, "ratio_out": got_out, "met": ok}
        )
        extra = "" if got_out is None else f" (out= variants: {got_out:.2f}x)"
        print(f"  {case}: {got:.2f}x, target >= {want:.1f}x -> {'met' if ok else 'NOT met'}{extra}")

    if cold is not None:
        print("\n## cold start (fresh NUMBA_CACHE_DIR)")
        for run in cold["runs"]:
            print(
                f"  {run['run']:18s} {run['reported_s']:7.3f} s in-process "
                f"({run['process_wall_s']:.3f} s wall incl. interpreter), "
                f"{run['cache_files_after']} cache files"
            )

    during = monitor.report()
    fd = during.get("foreign_cpu_frac")
    print(
        "\n## machine during the timings: other processes used "
        + ("?" if fd is None else f"{during['foreign_cpu_s']:.1f} CPU-s = {100 * fd:.0f}%")
        + f" of the CPUs over {during['wall_s']:.1f} s; steal {during.get('steal_s', 0):.1f} s"
    )
    disturbed = [r["case"] for r in rows if (r["machine"].get("foreign_cpu_frac") or 0.0) > BUSY]
    if disturbed:
        print(
            "  WARNING: these cases were timed while other processes competed for the cores;"
            " rerun on an idle machine: " + ", ".join(disturbed)
        )
    elif fd is not None and fd > BUSY:
        print("  (disturbed attempts were re-timed; every reported case ran undisturbed)")

    total = time.perf_counter() - t_start
    print(f"\ntotal benchmark time: {total:.1f} s")

    if args.json:
        result = {
            "meta": meta,
            "baseline": {"reference": ref_name, "variants": baseline},
            "rows": rows,
            "checks": checks,
            "targets": targets,
            "cold_start": cold,
            "machine_during": during,
            "total_seconds": total,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
