"""qstream's Zarr store path (quantize_store, dequantize_store) against plain Zarr reads.

Builds (once, cached under ``--workdir``) a float32 Zarr v3 array shaped (N, 4096) with
(256, 4096) chunks (4 MiB), N * 4096 * 4 bytes = ``--size``, filled chunk by chunk with
``standard_normal * 0.02``, in two variants: uncompressed (``compressors=None``) and zstd
(``ZstdCodec(level=3)``). Then, each measured case in its own subprocess (peak RSS from
the child's own ``VmHWM``, ``os.wait4``'s ``ru_maxrss`` beside it):

* baselines: (a) zarr-python reading chunk by chunk ``a[i:i+256]``; (b) the same chunk files
  read with ``open().read()`` (+ ``numcodecs.Zstd`` decode); (c) (a) on a 4-worker
  ThreadPoolExecutor; (d) zarr reading 16 MiB slabs ``a[i:i+1024]``; (e) (b) on a 4-worker
  ThreadPoolExecutor;
* qstream (uncompressed source; ``--zstd-qcases`` also zstd): ``quantize_store`` with
  explicit parameters (1 pass), minmax (2), per-axis minmax, percentile and entropy (3),
  blocked dynamic (1), and ``dequantize_store``; the explicit case also with 4 MiB and 64 MiB
  blocks (``max_memory``); with ``--rss-size 8GiB`` explicit and minmax again at 8 GiB. Each
  qstream run is paired with a run of (a) just before it, and its ratio is to that run;
* a profile of the explicit and percentile cases: wall seconds per pass and thread-seconds per
  engine step (timers around the engine's functions, which run unchanged);
* the entropy threshold search: ``qstream.kernels.search.entropy_search`` on a 2048-bin |x|
  histogram vs ONNX Runtime's ``HistogramCollector.get_entropy_threshold`` (num_bins=2048).

Every case runs ``--repeat`` times (default 2); the table reports the last (warm) run and the
first run's time beside it. The source is read once, untimed, before every run (a warm page
cache on a VM that pages out idle file cache). Targets are reported, never asserted. See
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time

from _common import git_state

COLS = 4096
CHUNK_ROWS = 256
SCALE_STD = 0.02
SEED = 20240601
MiB = 1 << 20
GiB = 1 << 30

QSPECS = {  # case -> (QuantSpec kwargs, quantize_store kwargs)
    "q_explicit": ({"dtype": "int8", "scale": 0.001}, {}),
    "q_minmax": ({"dtype": "int8"}, {}),
    "q_axis0": ({"dtype": "int8", "axis": 0}, {}),
    "q_percentile": ({"dtype": "int8", "method": "percentile"}, {}),
    "q_entropy": ({"dtype": "int8", "method": "entropy"}, {}),
    "q_blocked": ({"dtype": "int8", "axis": 1, "block_size": 32}, {}),
    "q_blocked_u4": (
        {"dtype": "uint4", "axis": 1, "block_size": 128, "symmetric": False},
        {},
    ),
    # block size: quantize_store turns max_memory into blocks of max_memory / 16 source bytes
    "q_explicit_b4": ({"dtype": "int8", "scale": 0.001}, {"max_memory": 16 * 4 * MiB}),
    "q_explicit_b64": ({"dtype": "int8", "scale": 0.001}, {"max_memory": 16 * 64 * MiB}),
}
BASELINES = ("zarr_chunks", "files", "zarr_threads4", "zarr_slab16", "files_threads4")
ALL_CASES = (
    *BASELINES,
    *[c for c in QSPECS if not c.startswith("q_explicit_b")],
    "dequant",
    "q_explicit_b4",
    "q_explicit_b64",
    "profile",
    "entropy_search",
)
PER_VARIANT = (*BASELINES, *QSPECS, "dequant")
QSTREAM_CASES = (*QSPECS, "dequant")  # each run is paired with a zarr_chunks run just before
DESCRIPTIONS = {
    "zarr_chunks": "(a) zarr a[i:i+256], chunk by chunk",
    "files": "(b) open().read() of the chunk files",
    "zarr_threads4": "(c) (a) on 4 threads",
    "zarr_slab16": "(d) zarr a[i:i+1024] (16 MiB slabs)",
    "files_threads4": "(e) (b) on 4 threads",
    "q_explicit": "quantize, explicit scale",
    "q_minmax": "quantize, minmax",
    "q_axis0": "quantize, minmax axis=0",
    "q_percentile": "quantize, percentile",
    "q_entropy": "quantize, entropy",
    "q_blocked": "quantize, axis=1 block 32",
    "q_blocked_u4": "quantize, uint4 asym, axis=1 group 128",
    "dequant": "dequantize_store (int8->f32)",
    "q_explicit_b4": "explicit, 4 MiB blocks",
    "q_explicit_b64": "explicit, 64 MiB blocks",
}
# targets: qstream time / baseline (a) time (<=), peak RSS (<=), entropy speed-up (>=)
TARGETS = {
    "q_explicit": 1.0,
    "q_minmax": 2.1,
    "q_percentile": 2.3,
    "q_entropy": 2.3,
    "rss_mb": 600.0,
    "entropy_speedup": 20.0,
}


# --------------------------------------------------------------------------- small helpers


def parse_bytes(text: str) -> int:
    t = text.strip()
    for suf, mult in (
        ("GiB", GiB),
        ("MiB", MiB),
        ("KiB", 1 << 10),
        ("Gi", GiB),
        ("Mi", MiB),
        ("Ki", 1 << 10),
        ("GB", 10**9),
        ("MB", 10**6),
        ("G", GiB),
        ("M", MiB),
    ):
        if t.endswith(suf):
            return int(float(t[: -len(suf)]) * mult)
    return int(float(t))


def size_label(nbytes: int) -> str:
    if nbytes % GiB == 0:
        return f"{nbytes // GiB}GiB"
    if nbytes % MiB == 0:
        return f"{nbytes // MiB}MiB"
    return f"{nbytes}B"


def rows_for(nbytes: int) -> int:
    rows = nbytes // (COLS * 4) // CHUNK_ROWS * CHUNK_ROWS
    if rows < CHUNK_ROWS:
        raise SystemExit(f"--size {nbytes} is below one chunk ({CHUNK_ROWS * COLS * 4} bytes)")
    return rows


def proc_status(key: str) -> float | None:
    """A /proc/self/status field in MB (VmHWM, VmRSS)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def data_paths(workdir: str, nbytes: int) -> dict:
    d = os.path.join(workdir, f"data-{size_label(nbytes)}")
    return {
        "dir": d,
        "raw": os.path.join(d, "raw.zarr"),
        "zstd": os.path.join(d, "zstd.zarr"),
        "q_raw": os.path.join(d, "q-explicit-raw.zarr"),
        "q_zstd": os.path.join(d, "q-explicit-zstd.zarr"),
    }


# --------------------------------------------------------------------------- child: cases


def _warm_qstream(spec_kwargs: dict) -> float:
    """Load (or compile) the kernels the spec uses, on a small in-memory array; not timed."""
    import numpy as np

    import qstream as qs

    t = time.perf_counter()
    x = np.random.default_rng(1).standard_normal((2 * CHUNK_ROWS, COLS), np.float32) * 0.02
    qs.quantize_store(x, "memory://bench-warm", qs.QuantSpec(**spec_kwargs), overwrite=True)
    return time.perf_counter() - t


def child_build(a: dict) -> dict:
    """Write both variants chunk by chunk (one 4 MiB chunk in memory at a time)."""
    import numpy as np
    import zarr
    from zarr.codecs import ZstdCodec

    rows = a["rows"]
    out = {}
    arrays = {}
    for variant in a["variants"]:
        comp = None if variant == "raw" else ZstdCodec(level=3)
        arrays[variant] = zarr.create_array(
            a["paths"][variant],
            shape=(rows, COLS),
            chunks=(CHUNK_ROWS, COLS),
            dtype="float32",
            compressors=comp,
            fill_value=0.0,
            overwrite=True,
        )
    t0 = time.perf_counter()
    for k in range(rows // CHUNK_ROWS):
        rng = np.random.default_rng([SEED, k])
        x = rng.standard_normal((CHUNK_ROWS, COLS), dtype=np.float32)
        x *= np.float32(SCALE_STD)
        for arr in arrays.values():
            arr[k * CHUNK_ROWS : (k + 1) * CHUNK_ROWS] = x
    out["seconds"] = time.perf_counter() - t0
    for variant in a["variants"]:
        p = a["paths"][variant]
        du = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(p) for f in fs)
        info = {
            "rows": rows,
            "cols": COLS,
            "bytes_on_disk": du,
            "seed": SEED,
            "codec": "none" if variant == "raw" else "zstd level 3",
        }
        with open(os.path.join(p, ".bench-complete"), "w") as f:
            json.dump(info, f)
        out[variant] = info
    return out


def child_zarr_read(a: dict) -> dict:
    import zarr

    arr = zarr.open_array(a["src"], mode="r")
    rows = arr.shape[0]
    case = a["case"]
    n = 0
    t0 = time.perf_counter()
    if case == "zarr_chunks":
        for i in range(0, rows, CHUNK_ROWS):
            n += arr[i : i + CHUNK_ROWS].nbytes
    elif case == "zarr_slab16":
        for i in range(0, rows, 4 * CHUNK_ROWS):
            n += arr[i : i + 4 * CHUNK_ROWS].nbytes
    elif case == "zarr_threads4":
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(4) as ex:
            for x in ex.map(lambda i: arr[i : i + CHUNK_ROWS], range(0, rows, CHUNK_ROWS)):
                n += x.nbytes
    else:
        raise ValueError(case)
    dt = time.perf_counter() - t0
    return {"seconds": dt, "bytes": n}


def child_files(a: dict) -> dict:
    import numpy as np
    import zarr

    arr = zarr.open_array(a["src"], mode="r")
    rows = arr.shape[0]
    enc = arr.metadata.chunk_key_encoding
    paths = [
        os.path.join(a["src"], enc.encode_chunk_key((k, 0))) for k in range(rows // CHUNK_ROWS)
    ]
    zstd = a["variant"] == "zstd"
    if zstd:
        import numcodecs

        codec = numcodecs.Zstd()

    def load(p):
        with open(p, "rb") as f:
            buf = f.read()
        if zstd:
            buf = codec.decode(buf)
        return np.frombuffer(buf, np.float32).reshape(CHUNK_ROWS, COLS)

    # the files hold exactly what zarr returns (checked once, untimed)
    if not np.array_equal(load(paths[-1]), arr[rows - CHUNK_ROWS :]):
        raise AssertionError("chunk file contents differ from zarr's read")
    n = 0
    t0 = time.perf_counter()
    if a["case"] == "files_threads4":
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(4) as ex:
            for x in ex.map(load, paths):
                n += x.nbytes
    else:
        for p in paths:
            n += load(p).nbytes
    dt = time.perf_counter() - t0
    return {"seconds": dt, "bytes": n}


def child_quantize(a: dict) -> dict:
    import qstream as qs

    spec_kwargs, kw = QSPECS[a["case"]]
    warm = _warm_qstream(spec_kwargs)
    rss_warm = proc_status("VmRSS")
    dst = a["dst"]
    shutil.rmtree(dst, ignore_errors=True)
    t0 = time.perf_counter()
    rep = qs.quantize_store(a["src"], dst, qs.QuantSpec(**spec_kwargs), **kw)
    dt = time.perf_counter() - t0
    err = rep.error or {}
    out = {
        "seconds": dt,
        "passes": rep.passes,
        "bytes_read": rep.bytes_read,
        "bytes": a["src_bytes"],
        "warmup_s": warm,
        "sqnr_db": err.get("sqnr_db"),
        "report_seconds": rep.seconds,
        "rss_after_warmup_mb": rss_warm,
    }
    shutil.rmtree(dst, ignore_errors=True)
    return out


def child_prep_q(a: dict) -> dict:
    """The quantized input of the dequantize cases (explicit int8), rewritten on every run so
    that it is what the current qstream writes (its chunks and compressors: the dequantized
    output inherits them)."""
    import zarr

    import qstream as qs

    spec = qs.QuantSpec(**QSPECS["q_explicit"][0])
    t0 = time.perf_counter()
    qs.quantize_store(a["src"], a["dst"], spec, overwrite=True)
    data = zarr.open_array(os.path.join(a["dst"], "data"), mode="r")
    return {
        "seconds": time.perf_counter() - t0,
        "chunks": list(data.chunks),
        "compressors": [repr(c) for c in data.compressors],
    }


def child_dequant(a: dict) -> dict:
    import numpy as np

    import qstream as qs

    t = time.perf_counter()
    x = np.random.default_rng(1).standard_normal((2 * CHUNK_ROWS, COLS), np.float32) * 0.02
    qs.quantize_store(
        x, "memory://bench-wq", qs.QuantSpec(**QSPECS["q_explicit"][0]), overwrite=True
    )
    qs.dequantize_store("memory://bench-wq", "memory://bench-wd", overwrite=True)
    warm = time.perf_counter() - t
    rss_warm = proc_status("VmRSS")
    dst = a["dst"]
    shutil.rmtree(dst, ignore_errors=True)
    t0 = time.perf_counter()
    info = qs.dequantize_store(a["q"], dst)
    dt = time.perf_counter() - t0
    shutil.rmtree(dst, ignore_errors=True)
    return {
        "seconds": dt,
        "passes": 1,
        "bytes": info["bytes_written"],
        "warmup_s": warm,
        "rss_after_warmup_mb": rss_warm,
    }


def child_profile(a: dict) -> dict:
    """Where a job's time goes: ``quantize_store`` run twice (the second kept) with timers
    around the engine's steps (observation only: the wrapped functions are called unchanged).

    Per pass: wall seconds. Per step: thread-seconds summed over the workers (they overlap, so
    the sum can exceed the wall time): mapping or reading source pieces, the range, histogram,
    quantize and error kernels, chunk writes and progress marks.
    """
    import collections

    import numba

    import qstream as qs
    from qstream.core import affine
    from qstream.engine.blocks import quantize_work, stats_work
    from qstream.engine.jobs import calibration_passes, job
    from qstream.engine.run import pipeline
    from qstream.io.outputs.progress_log import ProgressLog
    from qstream.io.storage import stores as io_stores
    from qstream.kernels import stats

    spec_kwargs, kw = QSPECS[a["target"]]
    _warm_qstream(spec_kwargs)
    steps: collections.Counter = collections.Counter()
    lock = threading.Lock()

    def timed(owner, name, label, bucket=steps):
        f = getattr(owner, name)

        def g(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                with lock:
                    bucket[label] += time.perf_counter() - t0

        setattr(owner, name, g)

    passes: collections.Counter = collections.Counter()
    timed(io_stores.Source, "view", "map source piece")
    timed(io_stores.Source, "read", "read/decode source piece")
    timed(stats_work, "block_ranges", "range kernel")
    timed(affine, "affine_quantize", "quantize kernel")
    timed(quantize_work, "block_errors_fused", "error kernel")
    timed(io_stores.ArrayWriter, "__setitem__", "write chunk")
    timed(ProgressLog, "save", "progress snapshot")
    timed(calibration_passes, "ranges", "pass: ranges", passes)
    timed(calibration_passes, "histogram_ranges", "pass: histograms", passes)
    timed(job, "quantize_pass", "pass: quantize", passes)
    timed(stats, "channel_histograms", "histogram kernel")
    dst = a["dst"]
    for _ in range(2):
        steps.clear()
        passes.clear()
        shutil.rmtree(dst, ignore_errors=True)
        t0 = time.perf_counter()
        c0 = time.process_time()
        rep = qs.quantize_store(a["src"], dst, qs.QuantSpec(**spec_kwargs), **kw)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
    shutil.rmtree(dst, ignore_errors=True)
    return {
        "seconds": wall,
        "cpu_s": cpu,
        "target": a["target"],
        "passes": rep.passes,
        "workers": pipeline.default_workers(),
        "kernel_threads": numba.get_num_threads(),
        "pass_seconds": dict(passes),
        "step_thread_seconds": dict(steps.most_common()),
    }


def child_entropy(a: dict) -> dict:
    """qstream's KL threshold search vs ONNX Runtime's, same 4 Mi Student-t(4) values."""
    import statistics

    import numpy as np
    from onnxruntime.quantization.calibrate import HistogramCollector

    from qstream.kernels.search import entropy_search

    x = np.random.default_rng(7).standard_t(4, size=4 * 2**20).astype(np.float32)
    ax = np.abs(x)
    hist, edges = np.histogram(ax, bins=2048, range=(0.0, float(ax.max())))
    entropy_search(hist, 128, 128, 1)  # load / compile the kernel
    tq = []
    for _ in range(a.get("reps_q", 15)):
        t = time.perf_counter()
        i = entropy_search(hist, 128, 128, 1)
        tq.append(time.perf_counter() - t)
    coll = HistogramCollector(
        method="entropy",
        symmetric=False,
        num_bins=2048,
        num_quantized_bins=128,
        percentile=99.999,
        scenario="same",
    )
    with contextlib.redirect_stdout(io.StringIO()):
        coll.collect({"x": x})
    h = coll.histogram_dict["x"]
    to = []
    thr = None
    for _ in range(a.get("reps_ort", 3)):
        t = time.perf_counter()
        thr = coll.get_entropy_threshold(h, 128)
        to.append(time.perf_counter() - t)
    mq, mo = statistics.median(tq), statistics.median(to)
    n_bins_ort = h[0].size
    cand_q = len(range(128, 2048 + 1))
    cand_o = len(range(128 // 2, n_bins_ort // 2 + 1))
    return {
        "seconds": mq + mo,
        "qstream": {
            "call": "entropy_search(hist, 128, 128, 1)",
            "median_s": mq,
            "min_s": min(tq),
            "histogram": "2048 bins of |x| over [0, max|x|]",
            "candidates": cand_q,
            "threshold": float(edges[i]),
            "bin": int(i),
        },
        "onnxruntime": {
            "call": "HistogramCollector(method='entropy', num_bins=2048, "
            "num_quantized_bins=128).get_entropy_threshold(hist, 128)",
            "median_s": mo,
            "min_s": min(to),
            "times": to,
            "histogram": f"{n_bins_ort} bins of x over [-max|x|, max|x|]",
            "candidates": cand_o,
            "threshold": [float(thr[0]), float(thr[1])],
        },
        "speedup_median": mo / mq,
        "speedup_per_candidate": (mo / cand_o) / (mq / cand_q),
    }


CHILDREN = {
    "build": child_build,
    "prep_q": child_prep_q,
    "zarr_chunks": child_zarr_read,
    "zarr_slab16": child_zarr_read,
    "zarr_threads4": child_zarr_read,
    "files": child_files,
    "files_threads4": child_files,
    "dequant": child_dequant,
    "profile": child_profile,
    "entropy_search": child_entropy,
    **{c: child_quantize for c in QSPECS},
}


def qstream_fingerprint() -> str:
    """sha256 (12 hex) of the qstream package's .py sources, to tell runs on different code
    apart (qstream may change between cases)."""
    import hashlib
    import importlib.util

    spec = importlib.util.find_spec("qstream")
    root = os.path.dirname(spec.origin) if spec and spec.origin else None
    h = hashlib.sha256()
    if root:
        for d, dirs, files in sorted(os.walk(root)):
            dirs.sort()
            for f in sorted(files):
                if f.endswith(".py"):
                    h.update(os.path.relpath(os.path.join(d, f), root).encode())
                    with open(os.path.join(d, f), "rb") as fh:
                        h.update(fh.read())
    return h.hexdigest()[:12]


def child_main(arg: str) -> int:
    import resource

    a = json.loads(arg)
    rss_start = proc_status("VmRSS")
    code = qstream_fingerprint()
    head = git_state()["commit"]
    res = CHILDREN[a["case"]](a)
    code_after = qstream_fingerprint()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    res.update(
        {
            "rss_start_mb": rss_start,
            "qstream_code": code if code == code_after else f"{code}->{code_after}",
            "git_head": head,
            "vmhwm_mb": proc_status("VmHWM"),
            "ru_maxrss_mb": ru.ru_maxrss / 1024,
            "cpu_total_s": ru.ru_utime + ru.ru_stime,
        }
    )
    sys.stdout.write("\n@@RESULT " + json.dumps(res, default=float) + "\n")
    sys.stdout.flush()
    return 0


# --------------------------------------------------------------------------- parent


def cpu_busy_s() -> float | None:
    """Whole-machine busy CPU seconds (all but idle and iowait) from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            v = [int(t) for t in f.readline().split()[1:]]
        return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


WAIT_IDLE = [0.0]  # --wait-idle: seconds to wait (at most) for an idle machine before each run


def wait_idle(max_s: float) -> float:
    """Wait (at most ``max_s``) until other processes use < BUSY of the CPUs over 1 s."""
    t0 = time.perf_counter()
    while max_s > 0:
        b0 = cpu_busy_s()
        time.sleep(1.0)
        b1 = cpu_busy_s()
        if b0 is None or b1 is None or (b1 - b0) / (os.cpu_count() or 1) < BUSY:
            break
        if time.perf_counter() - t0 > max_s:
            break
    return time.perf_counter() - t0


def warm_cache(path: str) -> float:
    """Read every file under ``path`` once (untimed), so the case finds it in the page cache.

    Needed on VMs that page out file cache left idle (here DAMON pages out page cache not
    touched for ~60 s, at up to 128 MiB/s): without it a case may read part of its source from
    disk, depending on how long ago the previous case touched it.
    """
    t0 = time.perf_counter()
    buf = bytearray(8 << 20)
    for root, _, files in os.walk(path):
        for f in files:
            with open(os.path.join(root, f), "rb", buffering=0) as fh:
                while fh.readinto(buf):
                    pass
    return time.perf_counter() - t0


def run_child(args: dict, *, retries: int = 1) -> dict:
    """Run one case in a fresh interpreter; peak RSS from its VmHWM (os.wait4's beside it); CPU used
    meanwhile by other processes from /proc/stat minus the child's own CPU time. The case's
    source (and quantized input) are read once beforehand, untimed (see ``warm_cache``)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(args)]
    for attempt in range(retries + 1):
        os.sync()  # flush earlier cases' writes so their write-back does not land in this one
        warmed = sum(
            warm_cache(args[k]) for k in ("src", "q") if args.get(k) and os.path.isdir(args[k])
        )
        waited = wait_idle(WAIT_IDLE[0])
        b0 = cpu_busy_s()
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = _read_both(p)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        b1 = cpu_busy_s()
        line = next((ln for ln in reversed(out.splitlines()) if ln.startswith("@@RESULT ")), None)
        if p.returncode == 0 and line:
            res = json.loads(line[len("@@RESULT ") :])
            # VmHWM is the child's own peak; wait4's ru_maxrss would also count this parent's
            # RSS at fork (Linux keeps the larger across exec): kept beside it
            res["wait4_maxrss_mb"] = ru.ru_maxrss / 1024
            res["peak_rss_mb"] = res.get("vmhwm_mb") or ru.ru_maxrss / 1024
            res["process_wall_s"] = wall
            res["waited_for_idle_s"] = waited
            res["cache_warm_s"] = warmed
            if b0 is not None and b1 is not None:
                foreign = max(0.0, (b1 - b0) - (ru.ru_utime + ru.ru_stime))
                res["other_cpu_frac"] = foreign / (wall * (os.cpu_count() or 1))
            return res
        msg = (err or out).strip().splitlines()[-12:]
        print(
            f"  ! case {args['case']} failed (exit {p.returncode}), attempt {attempt + 1}:\n    "
            + "\n    ".join(msg),
            flush=True,
        )
        if attempt < retries:
            time.sleep(30)  # qstream is edited concurrently: a half-written module, re-run later
    return {"error": "\n".join(msg), "seconds": None}


def _read_both(p):
    """communicate() without its wait(), so os.wait4 can collect the child's rusage."""
    out_chunks, err_chunks = [], []

    def pump(stream, sink):
        for line in stream:
            sink.append(line)

    ts = [
        threading.Thread(target=pump, args=(p.stdout, out_chunks)),
        threading.Thread(target=pump, args=(p.stderr, err_chunks)),
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return "".join(out_chunks), "".join(err_chunks)


def ensure_data(workdir: str, nbytes: int, variants: list[str]) -> dict:
    paths = data_paths(workdir, nbytes)
    rows = rows_for(nbytes)
    missing = []
    for v in variants:
        mark = os.path.join(paths[v], ".bench-complete")
        ok = False
        if os.path.exists(mark):
            with open(mark) as f:
                info = json.load(f)
            ok = info.get("rows") == rows and info.get("seed") == SEED
        if not ok:
            missing.append(v)
    info = {"paths": paths, "rows": rows, "built": None}
    if missing:
        os.makedirs(paths["dir"], exist_ok=True)
        print(
            f"# building {', '.join(missing)} ({rows} x {COLS} float32, "
            f"{size_label(rows * COLS * 4)}) under {paths['dir']} ...",
            flush=True,
        )
        res = run_child(
            {"case": "build", "rows": rows, "variants": missing, "paths": paths}, retries=0
        )
        if res.get("error"):
            raise SystemExit("building the data failed:\n" + res["error"])
        info["built"] = res
        print(
            f"#   built in {res['seconds']:.1f} s (peak RSS {res['peak_rss_mb']:.0f} MB)",
            flush=True,
        )
    for v in variants:
        with open(os.path.join(paths[v], ".bench-complete")) as f:
            info[v] = json.load(f)
    return info


BUSY = 0.10  # other processes used more than this share of the CPUs during a run: disturbed


def measure(
    case: str,
    variant: str,
    data: dict,
    workdir: str,
    repeat: int,
    retry_busy: int = 1,
    *,
    target: str | None = None,
) -> dict:
    """``repeat`` runs of a case; the reported run is the last one, or, when that was disturbed
    by other processes, the least disturbed of up to ``retry_busy`` extra warm runs.

    Every run of a qstream case is paired with a ``zarr_chunks`` run on the same data just
    before it (``paired_base_s``): this machine's speed drifts between runs (fresh memory
    costs a host fault on this VM, more or less often), and the ratio of two adjacent runs is
    steadier than either time.
    """
    paths = data["paths"]
    src_bytes = data["rows"] * COLS * 4
    a = {
        "case": case,
        "variant": variant,
        "src": paths[variant],
        "src_bytes": src_bytes,
        "dst": os.path.join(workdir, "out", f"{case}-{variant}.zarr"),
        "q": paths[f"q_{variant}"],
        "target": target,
    }
    paired = case in QSTREAM_CASES
    runs = []
    n = repeat if case not in ("profile", "entropy_search") else 1
    while True:
        base = run_child({**a, "case": "zarr_chunks"}) if paired else None
        runs.append(run_child(a))
        if base is not None:
            runs[-1]["paired_base_s"] = base.get("seconds")
        if runs[-1].get("error"):
            break
        if len(runs) < n:
            continue
        if runs[-1].get("other_cpu_frac", 0) <= BUSY or len(runs) >= n + retry_busy:
            break
        print(
            f"#   disturbed ({100 * runs[-1]['other_cpu_frac']:.0f}% CPU used by other "
            "processes): re-run",
            flush=True,
        )
    warm = runs[n - 1 :] if len(runs) >= n else runs[-1:]
    best = min(warm, key=lambda r: (r.get("error") is not None, r.get("other_cpu_frac", 0)))
    last = dict(best)
    last["case"], last["variant"], last["size_bytes"] = case, variant, src_bytes
    last["first_s"] = runs[0].get("seconds")
    last["all_s"] = [r.get("seconds") for r in runs]
    last["paired_base_all_s"] = [r.get("paired_base_s") for r in runs]
    last["peak_rss_all_mb"] = [r.get("peak_rss_mb") for r in runs]
    return last


def fmt(v, spec=".2f", dash="–"):
    return dash if v is None else format(v, spec)


def code_letters(rows: list[dict]) -> dict:
    """One letter per distinct qstream source fingerprint seen by the qstream cases."""
    seen: dict[str, str] = {}
    for r in rows:
        c = r.get("qstream_code")
        if c and not r["case"].startswith(("zarr_", "files")) and c not in seen:
            seen[c] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[min(len(seen), 25)]
    return seen


def print_table(rows: list[dict], base: dict, letters: dict) -> None:
    hdr = (
        f"{'case':<15} {'variant':<5} {'size':>6} {'passes':>6} {'warm s':>8} {'1st s':>8} "
        f"{'GB/s':>6} {'(a) s':>6} {'x (a)':>7} {'RSS MB':>7} {'CPU s':>7} {'busy':>5} "
        f"{'code':>4}  what"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if r["case"] in ("profile", "entropy_search"):
            continue
        s = r.get("seconds")
        b = r.get("paired_base_s") or base.get((r["variant"], r["size_bytes"]))
        ratio = s / b if (s and b) else None
        gbps = r["size_bytes"] / s / 1e9 if s else None
        r["gbps"], r["ratio_to_zarr_chunks"] = gbps, ratio
        busy = None if r.get("other_cpu_frac") is None else 100 * r["other_cpu_frac"]
        print(
            f"{r['case']:<15} {r['variant']:<5} {size_label(r['size_bytes']):>6} "
            f"{fmt(r.get('passes'), 'd'):>6} {fmt(s, '.3f'):>8} {fmt(r.get('first_s'), '.3f'):>8} "
            f"{fmt(gbps):>6} {fmt(b, '.3f'):>6} {fmt(ratio):>7} "
            f"{fmt(r.get('peak_rss_mb'), '.0f'):>7} "
            f"{fmt(r.get('cpu_total_s'), '.1f'):>7} {fmt(busy, '.0f'):>4}%"
            f"{'!' if (busy or 0) > 100 * BUSY else ' '} "
            f"{letters.get(r.get('qstream_code'), '') if r['case'][:1] in 'qdp' else '':>4}"
            f"  {DESCRIPTIONS.get(r['case'], '')}"
            + (f"  ERROR: {r['error'].splitlines()[-1]}" if r.get("error") else "")
        )


def print_profile(p: dict) -> None:
    print(
        f"\n## where {p['target']} spends its time ({p['variant']}): {p['seconds']:.2f} s wall,"
        f" {p['cpu_s']:.2f} s CPU; {p['workers']} workers on {p['kernel_threads']} kernel threads"
    )
    print("  passes (wall s): " + ", ".join(f"{k} {v:.2f}" for k, v in p["pass_seconds"].items()))
    print("  steps (thread-seconds, summed over workers):")
    for k, v in p["step_thread_seconds"].items():
        print(f"    {k:<28}{v:6.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="2GiB", help="source array size (default 2GiB; 8GiB, 256MiB)")
    ap.add_argument("--quick", action="store_true", help="--size 256MiB")
    ap.add_argument("--workdir", default="/tmp/qstream-bench", help="data cache + scratch dir")
    ap.add_argument(
        "--cases", default=",".join(ALL_CASES), help="comma list of: " + ", ".join(ALL_CASES)
    )
    ap.add_argument("--variants", default="raw,zstd", help="raw,zstd (default both)")
    ap.add_argument(
        "--qstream-variants",
        default="raw",
        help="variants every q_*/dequant case runs on (default raw)",
    )
    ap.add_argument(
        "--zstd-qcases",
        default="q_explicit,q_minmax",
        help="q_* cases also run on the zstd variant (default q_explicit,q_minmax)",
    )
    ap.add_argument("--repeat", type=int, default=2, help="runs per case, the last reported")
    ap.add_argument(
        "--retry-busy",
        type=int,
        default=1,
        metavar="N",
        help="extra runs when other processes used > 10%% of the CPUs (default 1)",
    )
    ap.add_argument(
        "--rss-size",
        default=None,
        metavar="SIZE",
        help="also run zarr_chunks, q_explicit and q_minmax at SIZE (e.g. 8GiB, "
        "uncompressed) to compare peak RSS; that data is deleted afterwards unless "
        "--keep-rss-data",
    )
    ap.add_argument("--rss-cases", default="zarr_chunks,q_explicit,q_minmax")
    ap.add_argument(
        "--rss-repeat",
        type=int,
        default=1,
        help="runs per q_* case at --rss-size (default 1; baselines use --repeat)",
    )
    ap.add_argument("--keep-rss-data", action="store_true")
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each run wait up to SECONDS for other processes to use < 10%% "
        "of the CPUs (default 0: do not wait)",
    )
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child_main(args.child)

    nbytes = parse_bytes("256MiB" if args.quick else args.size)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in ALL_CASES]
    if bad:
        ap.error(f"unknown cases {bad}; choose from {ALL_CASES}")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    qvariants = [v.strip() for v in args.qstream_variants.split(",") if v.strip()]
    zstd_q = {c.strip() for c in args.zstd_qcases.split(",") if c.strip()}
    if any(v not in ("raw", "zstd") for v in variants + qvariants):
        ap.error("variants are raw and zstd")
    os.makedirs(os.path.join(args.workdir, "out"), exist_ok=True)
    WAIT_IDLE[0] = args.wait_idle

    import numcodecs
    import numpy
    import zarr

    import qstream

    t_start = time.perf_counter()
    meta = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "zarr": zarr.__version__,
        "numcodecs": numcodecs.__version__,
        "numpy": numpy.__version__,
        "qstream": getattr(qstream, "__version__", None),
        "git": git_state(),
        "size_bytes": nbytes,
        "workdir": args.workdir,
        "zarr_config": {k: zarr.config.get(k) for k in ("async", "threading", "codec_pipeline")},
        "zstd_note": "ZstdCodec(level=3); zarr's default ZstdCodec() is level=0, which libzstd "
        "maps to its default level 3 (identical bytes)",
        "argv": sys.argv[1:],
    }
    print(
        f"# bench_stores: {size_label(nbytes)} float32 (N, {COLS}), chunks ({CHUNK_ROWS}, {COLS});"
        f" zarr {zarr.__version__}, {os.cpu_count()} CPUs, repeat {args.repeat}",
        flush=True,
    )
    all_variants = sorted(set(variants) | set(qvariants), key=["raw", "zstd"].index)
    data = ensure_data(args.workdir, nbytes, all_variants)
    if "dequant" in cases:
        for v in qvariants + (["zstd"] if "dequant" in zstd_q and "zstd" in variants else []):
            r = run_child(
                {"case": "prep_q", "src": data["paths"][v], "dst": data["paths"][f"q_{v}"]}
            )
            if r.get("error"):
                print(f"  ! preparing the dequantize input failed: {r['error']}")
            else:
                data.setdefault("dequant_input", {})[v] = r
                print(
                    f"# dequantize input [{v}]: int8 chunks {r['chunks']}, compressors "
                    f"{r['compressors'] or 'none'} ({r['seconds']:.1f} s)",
                    flush=True,
                )

    results: list[dict] = []
    base: dict = {}
    extras: dict = {}
    for case in cases:
        if case in ("profile", "entropy_search"):
            continue
        vs = variants if case in BASELINES else qvariants
        if case in zstd_q and "zstd" in variants and "zstd" not in vs:
            vs = [*vs, "zstd"]
        if case in ("q_explicit_b4", "q_explicit_b64"):
            vs = qvariants[:1]
        for v in vs:
            print(f"# {case} [{v}] ...", flush=True)
            r = measure(case, v, data, args.workdir, args.repeat, args.retry_busy)
            print(
                f"#   {fmt(r.get('seconds'), '.3f')} s (first {fmt(r.get('first_s'), '.3f')} s), "
                f"peak RSS {fmt(r.get('peak_rss_mb'), '.0f')} MB",
                flush=True,
            )
            if case == "zarr_chunks" and r.get("seconds"):
                base[(v, nbytes)] = r["seconds"]
            results.append(r)
    if "profile" in cases:
        for target in ("q_explicit", "q_percentile"):
            print(f"# profile {target} [{qvariants[0]}] ...", flush=True)
            extras[f"profile_{target}"] = measure(
                "profile", qvariants[0], data, args.workdir, 1, target=target
            )
    if "entropy_search" in cases:
        print("# entropy_search ...", flush=True)
        extras["entropy"] = measure("entropy_search", "raw", data, args.workdir, 1)

    rss_rows: list[dict] = []
    big = None
    if args.rss_size:
        big = parse_bytes(args.rss_size)
        bdata = ensure_data(args.workdir, big, ["raw"])
        for case in [c.strip() for c in args.rss_cases.split(",") if c.strip()]:
            rep = args.repeat if case in BASELINES else args.rss_repeat
            print(f"# {case} [raw, {size_label(big)}] ...", flush=True)
            r = measure(case, "raw", bdata, args.workdir, rep, args.retry_busy)
            print(
                f"#   {fmt(r.get('seconds'), '.3f')} s, peak RSS "
                f"{fmt(r.get('peak_rss_mb'), '.0f')} MB",
                flush=True,
            )
            if case == "zarr_chunks" and r.get("seconds"):
                base[("raw", big)] = r["seconds"]
            rss_rows.append(r)
        if not args.keep_rss_data:
            shutil.rmtree(bdata["paths"]["dir"], ignore_errors=True)
            print(f"# deleted {bdata['paths']['dir']}", flush=True)
    shutil.rmtree(os.path.join(args.workdir, "out"), ignore_errors=True)

    # ------------------------------------------------------------------ report
    print(
        f"\n## results ({size_label(nbytes)}; warm = last of {args.repeat} runs, each in a fresh "
        "process; (a) s = zarr's chunk-by-chunk read of the same data, run just before (qstream "
        "rows) or the row itself (baselines); x (a) = time / (a) s; GB/s = source bytes / time; "
        "RSS = peak of that process)"
    )
    letters = code_letters(results + rss_rows + [v for v in extras.values() if isinstance(v, dict)])
    print_table(results + rss_rows, base, letters)
    allr = results + rss_rows + [v for v in extras.values() if isinstance(v, dict)]
    for code, letter in letters.items():
        heads = sorted(
            {(r.get("git_head") or "?")[:9] for r in allr if r.get("qstream_code") == code}
        )
        cases = [r["case"] for r in allr if r.get("qstream_code") == code]
        print(
            f"  code {letter}: qstream sources sha256 {code} (git HEAD {', '.join(heads)};"
            f" {len(cases)} cases)"
        )
    if len(letters) > 1:
        print("  ! qstream changed during the run: compare only rows with the same code letter")
    for target in ("q_explicit", "q_percentile"):
        p = extras.get(f"profile_{target}")
        if p and not p.get("error"):
            print_profile(p)
    ent = extras.get("entropy")
    if ent and not ent.get("error"):
        print(
            f"\n## entropy threshold search (4 Mi Student-t(4) float32 values)\n"
            f"  qstream entropy_search: {ent['qstream']['median_s'] * 1e3:.1f} ms "
            f"({ent['qstream']['candidates']} candidates, |x| histogram, threshold "
            f"{ent['qstream']['threshold']:.4f})\n"
            f"  ORT get_entropy_threshold: {ent['onnxruntime']['median_s'] * 1e3:.0f} ms "
            f"({ent['onnxruntime']['candidates']} candidates, signed histogram, threshold "
            f"{ent['onnxruntime']['threshold'][1]:.4f})\n"
            f"  speed-up {ent['speedup_median']:.0f}x (per candidate "
            f"{ent['speedup_per_candidate']:.0f}x)"
        )

    targets = []
    by = {(r["case"], r["variant"], r["size_bytes"]): r for r in results + rss_rows}
    for case in ("q_explicit", "q_minmax", "q_percentile", "q_entropy"):
        for (c, v, sz), r in by.items():
            if c == case and r.get("ratio_to_zarr_chunks") is not None:
                targets.append(
                    {
                        "target": f"{case} [{v}, {size_label(sz)}] <= {TARGETS[case]}x (a)",
                        "value": r["ratio_to_zarr_chunks"],
                        "met": r["ratio_to_zarr_chunks"] <= TARGETS[case],
                    }
                )
    for (c, v, sz), r in by.items():
        if c in ("q_explicit", "q_minmax") and r.get("peak_rss_mb") and sz in (nbytes, big):
            targets.append(
                {
                    "target": f"peak RSS {c} [{v}, {size_label(sz)}] <= {TARGETS['rss_mb']:.0f} MB",
                    "value": r["peak_rss_mb"],
                    "met": r["peak_rss_mb"] <= TARGETS["rss_mb"],
                }
            )
    if ent and not ent.get("error"):
        targets.append(
            {
                "target": f"entropy search >= {TARGETS['entropy_speedup']:.0f}x ORT",
                "value": ent["speedup_median"],
                "met": ent["speedup_median"] >= TARGETS["entropy_speedup"],
            }
        )
    print("\n## targets (reported, not asserted)")
    for t in targets:
        print(f"  {'met   ' if t['met'] else 'MISSED'} {t['target']}: {t['value']:.2f}")
    total = time.perf_counter() - t_start
    print(f"\n# total {total / 60:.1f} min")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "meta": meta,
                    "data": {k: v for k, v in data.items() if k != "paths"},
                    "results": results,
                    "rss_check": rss_rows,
                    "extras": extras,
                    "targets": targets,
                    "total_seconds": total,
                },
                f,
                indent=1,
                default=float,
            )
        print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
