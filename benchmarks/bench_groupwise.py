"""Group-wise (blocked dynamic) quantization against the explicit-scale job and gguf-py.

1. Store: on the store benchmark's 2 GiB source (built by ``bench_stores.py`` if missing),
   the explicit-scale job, blocked int8 group 32 (symmetric) and blocked uint4 group 128
   (asymmetric) run in turn, each run in a fresh process timing its own
   ``quantize_store`` call, ``--rounds`` times after one warm round; medians and the ratio to
   the explicit job's median.
3. Checkpoint: ``convert`` of a safetensors checkpoint of the store's size (32 float32
   tensors of 4096 x 4096 for 2 GiB) with a blocked uint4 recipe, with its default
   compression (zstd) and with ``compression="none"`` (raw, like the store job's output from
   its raw source), against ``quantize_store`` of the store with the same spec, as throughput
   (GB/s); equal sizes, so the fixed start-up cost of a fresh process weighs the same on all.
2. In memory: a 16384 x 4096 float32 matrix (``standard_normal * 0.02``, seed 0), qstream's
   blocked int8 group 32 (``quantize_dynamic`` with float32 and with float16 scales, and
   ``quantize_store`` into ``memory://``) against gguf-py's ``gguf.quants.quantize(x, Q8_0)``
   (``pip install gguf``; skipped if missing), in interleaved rounds, medians of
   ``--rounds``, with the SQNR of each (10 log10 sum x^2 / sum (x - x_hat)^2, float64).

    python benchmarks/bench_groupwise.py --json /tmp/groupwise.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

STORE_CASES = {
    "explicit": {"dtype": "int8", "scale": 0.001},
    "int8-g32": {"dtype": "int8", "axis": 1, "block_size": 32, "method": "dynamic"},
    "uint4-g128-asym": {
        "dtype": "uint4",
        "axis": 1,
        "block_size": 128,
        "method": "dynamic",
        "symmetric": False,
    },
}

CHILD = """
import json, shutil, sys, time
import qstream as qs
src, dst, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
shutil.rmtree(dst, ignore_errors=True)
t = time.perf_counter()
qs.quantize_store(src, dst, qs.QuantSpec.from_dict(spec))
print(time.perf_counter() - t)
shutil.rmtree(dst, ignore_errors=True)
"""


def _child_seconds(code: str, *args: str) -> float:
    """Run ``code`` in a fresh interpreter; the seconds it printed last."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def _sqnr(x, xhat) -> float:
    import numpy as np

    x = x.astype(np.float64)
    e = x - xhat.astype(np.float64)
    return float(10 * np.log10((x * x).sum() / (e * e).sum()))


def store_part(args) -> list[dict]:
    import bench_stores

    info = bench_stores.ensure_data(args.workdir, bench_stores.parse_bytes(args.size), ["raw"])
    src = info["paths"]["raw"]
    dst = os.path.join(args.workdir, "out-groupwise.zarr")
    times: dict[str, list[float]] = {k: [] for k in STORE_CASES}
    for r in range(args.rounds + 1):
        for name, spec in STORE_CASES.items():
            seconds = _child_seconds(CHILD, src, dst, json.dumps(spec))
            if r:
                times[name].append(seconds)
    base = statistics.median(times["explicit"])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append({"case": name, "median_s": med, "ratio": med / base, "runs": ts})
        print(f"store {name:<16} median {med:6.3f} s  x explicit {med / base:5.2f}  runs {ts}")
    return rows


def memory_part(args) -> dict:
    """In memory, 16384 x 4096 float32: qstream's ``quantize_dynamic`` (float32 scales, and
    float16 scales as Q8_0 stores them) and ``quantize_store`` into ``memory://`` (with its
    error report and the zarr chunks) against gguf-py's Q8_0 quantizer, side by side."""
    import numpy as np

    import qstream as qs

    x = (np.random.default_rng(0).standard_normal((16384, 4096)) * 0.02).astype(np.float32)
    spec = qs.QuantSpec(dtype="int8", axis=1, block_size=32, method="dynamic")
    half = qs.QuantSpec(
        dtype="int8", axis=1, block_size=32, method="dynamic", scale_dtype="float16"
    )
    cases = {
        "quantize_dynamic": lambda: qs.quantize_dynamic(x, spec),
        "quantize_dynamic-f16-scales": lambda: qs.quantize_dynamic(x, half),
        "quantize_store-memory": lambda: qs.quantize_store(
            x, "memory://groupwise", spec, overwrite=True
        ),
    }
    sqnr = {
        "quantize_dynamic": lambda: _sqnr(x, qs.quantize_dynamic(x, spec).dequantize()),
        "quantize_dynamic-f16-scales": lambda: _sqnr(x, qs.quantize_dynamic(x, half).dequantize()),
        "quantize_store-memory": lambda: _sqnr(x, qs.open_quantized("memory://groupwise")[...]),
    }
    try:
        from gguf import GGMLQuantizationType, quants

        cases["gguf-py Q8_0"] = lambda: quants.quantize(x, GGMLQuantizationType.Q8_0)
        sqnr["gguf-py Q8_0"] = lambda: _sqnr(
            x,
            quants.dequantize(
                quants.quantize(x, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0
            ),
        )
    except ImportError:
        print("memory gguf-py: not installed (pip install gguf)")
    times = {name: [] for name in cases}
    for fn in cases.values():
        fn()  # compile / warm
    for _ in range(max(1, args.rounds)):  # interleaved rounds: drift hits every case alike
        for name, fn in cases.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    gguf = statistics.median(times["gguf-py Q8_0"]) if "gguf-py Q8_0" in times else None
    result = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        row = {"median_s": med, "runs": ts, "sqnr_db": sqnr[name]()}
        if gguf:
            row["x_faster_than_gguf"] = gguf / med
        result[name] = row
        vs = f", {gguf / med:5.1f}x gguf-py's speed" if gguf else ""
        print(f"memory {name:<28} median {med * 1e3:6.1f} ms  SQNR {row['sqnr_db']:.2f} dB{vs}")
    return result


CONVERT_CHILD = """
import shutil, sys, time
import qstream as qs
ckpt, dst, recipe, compression = sys.argv[1:5]
shutil.rmtree(dst, ignore_errors=True)
t = time.perf_counter()
qs.convert_checkpoint(ckpt, dst, recipe, compression=compression)
print(time.perf_counter() - t)
shutil.rmtree(dst, ignore_errors=True)
"""

CONVERT_RECIPE = """[defaults]
dtype = "uint4"
axis = 1
block_size = 128
symmetric = false
method = "dynamic"
"""


def checkpoint_part(args) -> dict:
    """``convert`` of a safetensors checkpoint (float32 tensors of 4096 x 4096, as many as
    make the store's size) with a blocked recipe (uint4, groups of 128 along axis 1,
    asymmetric) against ``quantize_store`` of the store with the same spec: throughput of
    each (GB/s of source read), fresh process per run."""
    import bench_stores
    import numpy as np
    from safetensors.numpy import save_file

    size = bench_stores.parse_bytes(args.size)
    n_tensors = max(1, size // (4096 * 4096 * 4))
    ckpt = os.path.join(args.workdir, f"ckpt-{n_tensors}x64MiB.safetensors")
    if not os.path.exists(ckpt):
        rng = np.random.default_rng(0)
        tensors = {
            f"layers.{i}.weight": (rng.standard_normal((4096, 4096)) * 0.02).astype(np.float32)
            for i in range(n_tensors)
        }
        save_file(tensors, ckpt + ".partial")
        del tensors
        os.replace(ckpt + ".partial", ckpt)
    recipe = os.path.join(args.workdir, "recipe-uint4-g128.toml")
    with open(recipe, "w") as f:
        f.write(CONVERT_RECIPE)
    info = bench_stores.ensure_data(args.workdir, bench_stores.parse_bytes(args.size), ["raw"])
    src = info["paths"]["raw"]
    dst = os.path.join(args.workdir, "out-groupwise-ckpt.zarr")
    spec = STORE_CASES["uint4-g128-asym"]
    conv, raw, store = [], [], []
    for r in range(args.rounds + 1):
        a = _child_seconds(CONVERT_CHILD, ckpt, dst, recipe, "auto")
        b = _child_seconds(CONVERT_CHILD, ckpt, dst, recipe, "none")
        c = _child_seconds(CHILD, src, dst, json.dumps(spec))
        if r:
            conv.append(a)
            raw.append(b)
            store.append(c)
    ckpt_bytes, store_bytes = n_tensors * 4096 * 4096 * 4, size
    c_gbps = ckpt_bytes / statistics.median(conv) / 1e9
    r_gbps = ckpt_bytes / statistics.median(raw) / 1e9
    s_gbps = store_bytes / statistics.median(store) / 1e9
    print(
        f"quantize_store uint4 g128 ({args.size}): median {statistics.median(store):.2f} s,"
        f" {s_gbps:.2f} GB/s"
    )
    for name, ts, gbps in (("zstd", conv, c_gbps), ("none", raw, r_gbps)):
        print(
            f"convert uint4 g128 ({n_tensors} x 64 MiB safetensors), compression {name}:"
            f" median {statistics.median(ts):.2f} s, {gbps:.2f} GB/s, {gbps / s_gbps:.2f}x"
            " the store job's throughput"
        )
    return {
        "convert_s": conv,
        "convert_raw_s": raw,
        "store_s": store,
        "convert_gbps": c_gbps,
        "convert_raw_gbps": r_gbps,
        "store_gbps": s_gbps,
        "throughput_ratio": c_gbps / s_gbps,
        "raw_throughput_ratio": r_gbps / s_gbps,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="2GiB")
    ap.add_argument("--workdir", default="/tmp/qstream-bench")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--skip-store", action="store_true")
    ap.add_argument("--skip-checkpoint", action="store_true")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    result = {"store": [] if args.skip_store else store_part(args), "memory": memory_part(args)}
    if not args.skip_checkpoint:
        result["checkpoint"] = checkpoint_part(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    shutil.rmtree(os.path.join(args.workdir, "out-groupwise.zarr"), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
