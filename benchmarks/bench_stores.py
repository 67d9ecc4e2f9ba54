"""qstream's Zarr store path (quantize_store, dequantize_store) against plain Zarr reads.

Builds (once, cached under ``--workdir``) a float32 Zarr v3 array shaped (N, 4096) with
(256, 4096) chunks (4 MiB), N * 4096 * 4 bytes = ``--size``, filled chunk by chunk with
``standard_normal * 0.02``, in two variants: uncompressed (``compressors=None``) and zstd
(``ZstdCodec(level=3)``). Then, each measured case in its own subprocess (peak RSS from
``os.wait4``'s rusage of that child, cross-checked with its ``VmHWM``):

* baselines: (a) zarr-python reading chunk by chunk ``a[i:i+256]``; (b) the same chunk files
  read with ``open().read()`` (+ ``numcodecs.Zstd`` decode); (c) (a) on a 4-worker
  ThreadPoolExecutor; (d) zarr reading 16 MiB slabs ``a[i:i+1024]`` (qstream's block size);
  (e) (b) on a 4-worker ThreadPoolExecutor;
* qstream (uncompressed source; explicit and minmax also zstd): ``quantize_store`` with
  explicit parameters (1 pass), minmax (2), per-axis minmax, percentile and entropy (3),
  blocked dynamic (1), and ``dequantize_store``; the explicit case also with 4 MiB and 64 MiB
  blocks (``max_memory``); with ``--rss-size 8GiB`` explicit and minmax again at 8 GiB;
* a read matrix: qstream's own reader (``pipeline.run`` + ``Source.read``) for block budgets of
  4/16/64 MiB and 0 (a plain loop)/1/3/8 blocks in flight;
* a profile of the explicit case: cProfile of the compute thread, a stack sampler over every
  thread (``sys._current_frames``, observation only) and per-thread CPU time from /proc;
* the entropy threshold search: ``qstream.kernels.search.entropy_search`` on a 2048-bin |x|
  histogram vs ONNX Runtime's ``HistogramCollector.get_entropy_threshold`` (num_bins=2048).

Every case runs ``--repeat`` times (default 2); the table reports the last (warm) run and the
first run's time beside it. Targets are reported, never asserted. See benchmarks/README.md.
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
    # block size: quantize_store turns max_memory into a block budget of max_memory / 14
    "q_explicit_b4": ({"dtype": "int8", "scale": 0.001}, {"max_memory": 14 * 4 * MiB}),
    "q_explicit_b64": ({"dtype": "int8", "scale": 0.001}, {"max_memory": 14 * 64 * MiB}),
}
BASELINES = ("zarr_chunks", "files", "zarr_threads4", "zarr_slab16", "files_threads4")
ALL_CASES = (
    *BASELINES,
    *[c for c in QSPECS if not c.startswith("q_explicit_b")],
    "dequant",
    "q_explicit_b4",
    "q_explicit_b64",
    "read_matrix",
    "profile",
    "profile_dequant",
    "entropy_search",
)
PER_VARIANT = (*BASELINES, *QSPECS, "dequant", "read_matrix")
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


def child_read_matrix(a: dict) -> dict:
    """qstream's reader (Source.read on the planned blocks) through pipeline.run with a no-op
    compute: block budget x blocks in flight; each configuration twice, the second kept."""
    from qstream.engine import pipeline
    from qstream.engine.plan import plan_blocks
    from qstream.io.stores import open_source

    src = open_source(a["src"])
    rows = []
    for budget in (4 * MiB, 16 * MiB, 64 * MiB):
        blocks = plan_blocks(src.shape, src.chunks, 4, budget)
        for inflight in (0, 1, 3, 8):
            times = []
            for _ in range(2):
                t0 = time.perf_counter()
                if inflight == 0:  # no pipeline: read the blocks one after the other
                    for b in blocks:
                        src.read(b.key)
                else:
                    pipeline.run(
                        blocks, lambda b: src.read(b.key), lambda b, x: None, inflight=inflight
                    )
                times.append(time.perf_counter() - t0)
            rows.append(
                {
                    "budget_mib": budget // MiB,
                    "block_rows": blocks[0].shape[0],
                    "inflight": inflight,
                    "first_s": times[0],
                    "seconds": times[-1],
                    "gbps": a["src_bytes"] / times[-1] / 1e9,
                }
            )
    return {"matrix": rows, "seconds": sum(r["seconds"] for r in rows)}


class StackSampler:
    """Samples every thread's Python stack (``sys._current_frames``) every ``interval`` s and
    counts (role, state) pairs; also per-thread CPU time from /proc/self/task. Observation
    only: nothing in qstream or zarr is patched."""

    MAIN_STAGES = (  # innermost first match wins, searched from the innermost frame outward
        "block_errors_fused",
        "block_errors",
        "affine_quantize",
        "affine_dequantize",
        "_block_params",
        "_check_nonfinite",
    )

    def __init__(self, interval: float = 0.004):
        self.interval = interval
        self.counts: collections.Counter = collections.Counter()
        self.innermost: collections.Counter = collections.Counter()
        self.cpu: dict[int, tuple[str, float]] = {}
        self.ticks = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, name="bench-sampler", daemon=True)

    @staticmethod
    def role(name: str) -> str:
        if name == "MainThread":
            return "main (compute)"
        if name.startswith("qstream-io"):
            return "qstream-io (read/write)"
        if name == "zarr_io":
            return "zarr_io (event loop)"
        if name.startswith(("asyncio_", "zarr_pool")):
            return "zarr executor (file I/O, codecs)"
        if name == "bench-sampler":
            return "bench sampler"
        return "other"

    @staticmethod
    def _frames(frame):
        out = []
        while frame is not None:
            co = frame.f_code
            out.append((co.co_filename, co.co_name))
            frame = frame.f_back
        return out  # innermost first

    @staticmethod
    def _idle(fn: str, name: str) -> bool:
        base = os.path.basename(fn)
        return (base, name) in {
            ("threading.py", "wait"),
            ("threading.py", "_wait_for_tstate_lock"),
            ("thread.py", "_worker"),
            ("selectors.py", "select"),
            ("queue.py", "get"),
            ("_base.py", "result"),
            ("_base.py", "wait"),
            ("threading.py", "join"),
        }

    def classify(self, role: str, frames) -> str:
        waiting = bool(frames) and self._idle(*frames[0])
        qs_frames = [(f, n) for f, n in frames if f"{os.sep}qstream{os.sep}" in f]
        names = [n for _, n in qs_frames]
        if role.startswith("main"):
            for stage in self.MAIN_STAGES:
                if stage in names:
                    return stage
            if "compute" in names:
                return "compute (other numpy)"
            if "run" in names and any(
                f.endswith(os.path.join("engine", "pipeline.py")) for f, _ in qs_frames
            ):
                return "waiting for a read/write"
            return "outside the pipeline (setup, calibration, finish)"
        if role.startswith("qstream-io"):
            stage = (
                "read"
                if ("_read" in names or "read" in names)
                else "write"
                if "write" in names
                else None
            )
            if stage is None:
                return "idle"
            if waiting:
                return f"{stage} (waiting for zarr)"
            if qs_frames and frames[0] == qs_frames[0]:  # a qstream kernel or qstream's numpy
                return f"{stage} (in qstream {qs_frames[0][1]})"
            return f"{stage} (own CPU)"
        if waiting or role == "bench sampler":
            return "idle"
        fn, name = frames[0] if frames else ("?", "?")
        return f"busy in {os.path.basename(fn)}:{name}"

    def _cpu_snapshot(self):
        """CPU seconds of every thread of the process; threads unknown to Python (Numba's
        OpenMP / workqueue workers) count as native."""
        tck = os.sysconf("SC_CLK_TCK")
        roles = {
            t.native_id: self.role(t.name)
            for t in threading.enumerate()
            if getattr(t, "native_id", None) is not None
        }
        try:
            tids = os.listdir("/proc/self/task")
        except OSError:
            return
        for tid in tids:
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    v = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            nid = int(tid)
            role = roles.get(nid) or self.cpu.get(nid, ("native (Numba workers)", 0))[0]
            self.cpu[nid] = (role, (int(v[11]) + int(v[12])) / tck)

    def _loop(self):
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            names = {t.ident: t.name for t in threading.enumerate()}
            for tid, frame in sys._current_frames().items():
                if tid == me:
                    continue
                role = self.role(names.get(tid, "?"))
                fr = self._frames(frame)
                self.counts[(role, self.classify(role, fr))] += 1
                if fr and not self._idle(*fr[0]):
                    self.innermost[(role, f"{os.path.basename(fr[0][0])}:{fr[0][1]}")] += 1
            self.ticks += 1
            if self.ticks % 10 == 0:
                self._cpu_snapshot()

    def __enter__(self):
        self._t0 = time.perf_counter()
        self._t.start()
        self._cpu_snapshot()
        self.cpu0 = dict(self.cpu)
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self._cpu_snapshot()
        self.wall = time.perf_counter() - self._t0

    def summary(self) -> dict:
        """Thread-seconds per (role, state): samples x (wall / ticks); a role with several
        threads (pools) can exceed the wall time."""
        per_tick = self.wall / max(1, self.ticks)
        by_role: dict[str, dict] = collections.defaultdict(dict)
        for (role, state), n in sorted(self.counts.items(), key=lambda kv: -kv[1]):
            by_role[role][state] = round(n * per_tick, 3)
        cpu: dict[str, float] = collections.defaultdict(float)
        for nid, (role, s) in self.cpu.items():
            cpu[role] += s - self.cpu0.get(nid, (role, 0.0))[1]
        hot = collections.defaultdict(dict)
        for (role, where), n in self.innermost.most_common(60):
            if len(hot[role]) < 5:
                hot[role][where] = round(n * per_tick, 3)
        return {
            "ticks": self.ticks,
            "interval_s": self.interval,
            "wall_s": self.wall,
            "thread_seconds_by_role_and_state": dict(by_role),
            "cpu_seconds_by_thread_role": {k: round(v, 2) for k, v in cpu.items()},
            "hottest_innermost_frames_thread_seconds": dict(hot),
        }


def _time_writes(path, shape, chunks, dtype, compressors, blocks, block, config=None) -> float:
    """Write ``block`` (cut to each block's shape) into a fresh array: the write cost alone."""
    import zarr

    shutil.rmtree(path, ignore_errors=True)
    kw = {"config": config} if config else {}
    arr = zarr.create_array(
        path, shape=shape, chunks=chunks, dtype=dtype, fill_value=0, compressors=compressors, **kw
    )
    t = time.perf_counter()
    for b in blocks:
        arr[b.key] = block[: b.shape[0]]
    dt = time.perf_counter() - t
    shutil.rmtree(path, ignore_errors=True)
    return dt


def child_profile(a: dict) -> dict:
    """``a["target"]`` (q_explicit or dequant) under a stack sampler over every thread and
    cProfile of the calling thread; then standalone phases with the same block plan: read
    only, write only (as qstream writes: same chunks and compressors; with
    ``write_empty_chunks``; with one chunk per block), the compute without file I/O, and the
    public kernels on one in-memory block. Observation only."""
    import cProfile
    import pstats
    import resource

    import numpy as np
    import zarr

    import qstream as qs
    from qstream.engine.plan import plan_blocks

    target = "dequant" if a["case"] == "profile_dequant" else "q_explicit"
    spec_kwargs = QSPECS["q_explicit"][0]
    spec = qs.QuantSpec(**spec_kwargs)
    warm = _warm_qstream(spec_kwargs)
    if target == "dequant":
        qs.dequantize_store("memory://bench-warm", "memory://bench-warm-d", overwrite=True)
    dst = a["dst"]
    shutil.rmtree(dst, ignore_errors=True)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    with StackSampler() as sampler:
        prof.enable()
        if target == "dequant":
            qs.dequantize_store(a["q"], dst)
        else:
            qs.quantize_store(a["src"], dst, spec)
        prof.disable()
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    out_arr = zarr.open_array(dst if target == "dequant" else os.path.join(dst, "data"), mode="r")
    out_chunks, out_dtype = tuple(out_arr.chunks), np.dtype(out_arr.dtype)
    out_comp = tuple(out_arr.compressors)
    shutil.rmtree(dst, ignore_errors=True)
    st = pstats.Stats(prof)
    funcs = []
    for (fn, line, name), (_cc, nc, tt, ct, _) in st.stats.items():
        funcs.append(
            {
                "function": f"{os.path.relpath(fn) if fn.startswith('/') else fn}:{line}({name})",
                "calls": nc,
                "tottime": tt,
                "cumtime": ct,
            }
        )
    top_cum = sorted(funcs, key=lambda r: -r["cumtime"])[:25]
    top_tot = sorted(funcs, key=lambda r: -r["tottime"])[:15]

    # standalone phases over the same blocks (quantize_store's default 16 MiB budget)
    src_arr = zarr.open_array(a["src"], mode="r")
    shape = tuple(src_arr.shape)
    blocks = plan_blocks(shape, out_chunks, 4, 16 * MiB)
    nblk = len(blocks)
    phases: dict = {
        "blocks": nblk,
        "block_shape": list(blocks[0].shape),
        "output": {
            "chunks": list(out_chunks),
            "dtype": out_dtype.name,
            "compressors": [repr(c) for c in out_comp],
        },
    }
    read_arr = (
        src_arr if target != "dequant" else zarr.open_array(os.path.join(a["q"], "data"), mode="r")
    )
    t = time.perf_counter()
    for b in blocks:
        np.ascontiguousarray(read_arr[b.key])
    phases["read_only_s"] = time.perf_counter() - t
    x = np.ascontiguousarray(src_arr[blocks[0].key])
    q = np.asarray(qs.quantize(x, 0.001, dtype="int8"))
    block = q if target != "dequant" else np.asarray(qs.dequantize(q, 0.001))
    wpath = dst + "-write-only"
    writes = {}
    writes["as qstream writes"] = _time_writes(
        wpath, shape, out_chunks, out_dtype, out_comp, blocks, block.view(out_dtype)
    )
    writes["write_empty_chunks=True"] = _time_writes(
        wpath,
        shape,
        out_chunks,
        out_dtype,
        out_comp,
        blocks,
        block.view(out_dtype),
        config={"write_empty_chunks": True},
    )
    writes["one chunk per block"] = _time_writes(
        wpath, shape, tuple(blocks[0].shape), out_dtype, out_comp, blocks, block.view(out_dtype)
    )
    if out_comp:
        writes["uncompressed"] = _time_writes(
            wpath, shape, out_chunks, out_dtype, None, blocks, block.view(out_dtype)
        )
    phases["write_only_s"] = writes
    reps = 5
    per = collections.defaultdict(float)
    for _ in range(reps):
        t = time.perf_counter()
        qk = qs.quantize(x, 0.001, dtype="int8")
        per["qstream.quantize"] += time.perf_counter() - t
        t = time.perf_counter()
        qs.dequantize(qk, 0.001)
        per["qstream.dequantize"] += time.perf_counter() - t
    phases["kernels_alone_extrapolated_s"] = {k: v / reps * nblk for k, v in per.items()}
    if target != "dequant":
        # the whole quantize pass without file I/O: a NumPy source of 16 blocks into memory://
        k = min(16, nblk)
        xs = np.ascontiguousarray(src_arr[0 : k * blocks[0].shape[0]])
        qs.quantize_store(xs, "memory://bench-nofile", spec, overwrite=True)  # warm
        t = time.perf_counter()
        qs.quantize_store(xs, "memory://bench-nofile", spec, overwrite=True)
        phases["pass_without_file_io_extrapolated_s"] = (time.perf_counter() - t) * nblk / k
        del xs
    # what compute() spent its time in (cProfile callees, calling thread)
    ckeys = [
        k for k in st.stats if k[2] == "compute" and k[0].endswith(os.path.join("api", "stores.py"))
    ]
    callees = []
    for (fn, line, name), v in st.stats.items():
        for ck in ckeys:
            if ck in v[4]:
                edge = v[4][ck]
                callees.append(
                    {
                        "function": f"{os.path.basename(fn)}:{line}({name})",
                        "calls": edge[0],
                        "cumtime": edge[3],
                    }
                )
    phases["compute_total_s"] = sum(st.stats[k][3] for k in ckeys)
    phases["compute_callees"] = sorted(callees, key=lambda r: -r["cumtime"])[:10]
    return {
        "target": target,
        "seconds": wall,
        "warmup_s": warm,
        "bytes": a["src_bytes"],
        "cpu_s": (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime),
        "sampler": sampler.summary(),
        "cprofile_main_thread_top_cumtime": top_cum,
        "cprofile_main_thread_top_tottime": top_tot,
        "phases": phases,
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
    "read_matrix": child_read_matrix,
    "profile": child_profile,
    "profile_dequant": child_profile,
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
    """Run one case in a fresh interpreter; peak RSS from os.wait4 (that child only); CPU used
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
            res["peak_rss_mb"] = ru.ru_maxrss / 1024
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
    case: str, variant: str, data: dict, workdir: str, repeat: int, retry_busy: int = 1
) -> dict:
    """``repeat`` runs of a case; the reported run is the last one, or, when that was disturbed
    by other processes, the least disturbed of up to ``retry_busy`` extra warm runs."""
    paths = data["paths"]
    src_bytes = data["rows"] * COLS * 4
    a = {
        "case": case,
        "variant": variant,
        "src": paths[variant],
        "src_bytes": src_bytes,
        "dst": os.path.join(workdir, "out", f"{case}-{variant}.zarr"),
        "q": paths[f"q_{variant}"],
    }
    runs = []
    n = repeat if case not in ("read_matrix", "profile", "profile_dequant", "entropy_search") else 1
    while True:
        runs.append(run_child(a))
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
        f"{'GB/s':>6} {'x (a)':>7} {'RSS MB':>7} {'CPU s':>7} {'busy':>5} {'code':>4}  what"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if r["case"] in ("read_matrix", "profile", "profile_dequant", "entropy_search"):
            continue
        s = r.get("seconds")
        b = base.get((r["variant"], r["size_bytes"]))
        ratio = s / b if (s and b) else None
        gbps = r["size_bytes"] / s / 1e9 if s else None
        r["gbps"], r["ratio_to_zarr_chunks"] = gbps, ratio
        busy = None if r.get("other_cpu_frac") is None else 100 * r["other_cpu_frac"]
        print(
            f"{r['case']:<15} {r['variant']:<5} {size_label(r['size_bytes']):>6} "
            f"{fmt(r.get('passes'), 'd'):>6} {fmt(s, '.3f'):>8} {fmt(r.get('first_s'), '.3f'):>8} "
            f"{fmt(gbps):>6} {fmt(ratio):>7} {fmt(r.get('peak_rss_mb'), '.0f'):>7} "
            f"{fmt(r.get('cpu_total_s'), '.1f'):>7} {fmt(busy, '.0f'):>4}%"
            f"{'!' if (busy or 0) > 100 * BUSY else ' '} "
            f"{letters.get(r.get('qstream_code'), '') if r['case'][:1] in 'qdp' else '':>4}"
            f"  {DESCRIPTIONS.get(r['case'], '')}"
            + (f"  ERROR: {r['error'].splitlines()[-1]}" if r.get("error") else "")
        )


def print_profile(p: dict, letters: dict) -> None:
    what = "dequantize_store" if p.get("target") == "dequant" else "the explicit-params quantize"
    print(
        f"\n## where {what} spends its time ({p['variant']}, code "
        f"{letters.get(p.get('qstream_code'), '?')}: {fmt(p['seconds'])} s wall, "
        f"{fmt(p['cpu_s'])} s CPU on {os.cpu_count()} cores; stack samples every "
        f"{p['sampler']['interval_s'] * 1e3:.0f} ms, {p['sampler']['ticks']} ticks)"
    )
    print("  thread-seconds by thread role and state (stack samples):")
    for role, states in p["sampler"]["thread_seconds_by_role_and_state"].items():
        items = ", ".join(f"{k} {v:.2f}" for k, v in list(states.items())[:7])
        print(f"    {role:<34} {items}")
    print(
        "  CPU seconds by thread role (/proc/self/task): "
        + ", ".join(f"{k} {v:.1f}" for k, v in p["sampler"]["cpu_seconds_by_thread_role"].items())
    )
    for role, frames in p["sampler"]["hottest_innermost_frames_thread_seconds"].items():
        print(
            f"  busiest innermost frames, {role}: "
            + ", ".join(f"{k} {v:.2f} s" for k, v in frames.items())
        )
    print("  cProfile (calling thread), top tottime:")
    for r in p["cprofile_main_thread_top_tottime"][:8]:
        print(f"    {r['tottime']:8.2f} s  {r['calls']:>6}  {r['function']}")
    ph = p["phases"]
    if ph["compute_callees"]:
        print(
            f"  compute() total {ph['compute_total_s']:.2f} s; its callees: "
            + ", ".join(f"{c['function']} {c['cumtime']:.2f} s" for c in ph["compute_callees"][:6])
        )
    o = ph["output"]
    print(
        f"  standalone phases, same plan ({ph['blocks']} blocks of {ph['block_shape']}; output "
        f"{o['dtype']} chunks {o['chunks']}, compressors {o['compressors'] or 'none'}):"
    )
    print(f"    {'read only (sequential)':<36}{ph['read_only_s']:6.2f} s")
    for k, v in ph["write_only_s"].items():
        print(f"    write only, {k:<24}{v:6.2f} s")
    for k, v in ph["kernels_alone_extrapolated_s"].items():
        print(f"    {k + ' alone, x' + str(ph['blocks']) + ' blocks':<36}{v:6.2f} s")
    if "pass_without_file_io_extrapolated_s" in ph:
        print(
            "    the quantize pass without file I/O (NumPy source -> memory://), "
            f"extrapolated {ph['pass_without_file_io_extrapolated_s']:.2f} s"
        )


def print_matrix(r: dict) -> None:
    print(
        f"\n## qstream reader only ({r['variant']}): Source.read via pipeline.run, no-op compute"
        " (inflight 0 = plain loop), warm second run"
    )
    print(f"  {'budget':>7} {'rows':>5} " + " ".join(f"{'if=' + str(i):>12}" for i in (0, 1, 3, 8)))
    rows = r["matrix"]
    for budget in sorted({m["budget_mib"] for m in rows}):
        ms = [m for m in rows if m["budget_mib"] == budget]
        print(
            f"  {str(budget) + ' MiB':>7} {ms[0]['block_rows']:>5} "
            + " ".join(f"{m['seconds']:6.2f}s {m['gbps']:4.1f}" for m in ms)
        )


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
    if "dequant" in cases or "profile_dequant" in cases:
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
        if case in ("profile", "profile_dequant", "entropy_search"):
            continue
        vs = variants if case in BASELINES else qvariants
        if case in zstd_q and "zstd" in variants and "zstd" not in vs:
            vs = [*vs, "zstd"]
        if case in ("q_explicit_b4", "q_explicit_b64"):
            vs = qvariants[:1]
        if case == "read_matrix":
            vs = variants
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
            if case == "read_matrix":
                extras.setdefault("read_matrix", []).append(r)
            else:
                results.append(r)
    for case in ("profile", "profile_dequant"):
        if case in cases:
            print(f"# {case} [{qvariants[0]}] ...", flush=True)
            extras[case] = measure(case, qvariants[0], data, args.workdir, 1)
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
        "process; x (a) = time / zarr chunk-by-chunk read time of the same variant and size; "
        "GB/s = source bytes / time; RSS = peak of that process)"
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
    for r in extras.get("read_matrix", []):
        print_matrix(r)
    for case in ("profile", "profile_dequant"):
        if extras.get(case) and not extras[case].get("error"):
            print_profile(extras[case], letters)
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
