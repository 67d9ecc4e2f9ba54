"""The Dask executor against the local executor on the store benchmark's source.

Same source as ``bench_stores.py`` (uncompressed float32 Zarr v3, 4096 columns, built once under
``--workdir``). For each case, the local executor (``quantize_store(src, dst, spec)``) and the
Dask executor on a ``LocalCluster(n_workers=2, threads_per_worker=2, processes=True)`` run
alternately ``--repeat`` times; medians are reported with their ratio, and every Dask output
is checked byte for byte (and its error report bit for bit) against the local one. Also
reported: the blocks per task the executor chose, and the per-task overhead measured with
empty tasks (throughput of 400 no-op submissions).

``--malloc-trim`` keeps the nanny's default ``MALLOC_TRIM_THRESHOLD_=65536`` in the workers
(by default it is unset, as ``qstream.DaskExecutor.local`` does and the README advises).
``--threads-per-worker`` (default 2; each task's kernels run on one Numba thread).

    python benchmarks/bench_dask.py                # 2 GiB
    python benchmarks/bench_dask.py --size 256MiB --repeat 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CASES = {
    "explicit": {"dtype": "int8", "scale": 0.001},
    "minmax": {"dtype": "int8", "method": "minmax"},
    "percentile-axis0": {"dtype": "int8", "axis": 0, "method": "percentile"},
    "dynamic-block32": {"dtype": "int8", "axis": 1, "block_size": 32, "method": "dynamic"},
}


def _digest(path: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    for member in ("data", "scale", "zero_point"):
        root = os.path.join(path, member)
        for dirpath, _, files in sorted(os.walk(root)):
            for f in sorted(files):
                if f == "zarr.json":
                    continue
                h.update(os.path.relpath(os.path.join(dirpath, f), root).encode())
                with open(os.path.join(dirpath, f), "rb") as fh:
                    h.update(fh.read())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="2GiB")
    ap.add_argument("--workdir", default="/tmp/qstream-bench")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--malloc-trim", action="store_true")
    ap.add_argument("--threads-per-worker", type=int, default=2)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()

    import bench_stores
    import distributed
    import numpy as np

    import qstream as qs

    nbytes = bench_stores.parse_bytes(args.size)
    info = bench_stores.ensure_data(args.workdir, nbytes, ["raw"])
    src = info["paths"]["raw"]
    out = os.path.join(args.workdir, "out-dask")
    os.makedirs(out, exist_ok=True)
    from qstream.engine.run.dask import local_client

    rows = []
    with local_client(
        2, threads_per_worker=args.threads_per_worker, trim_malloc=args.malloc_trim
    ) as client:
        t0 = time.perf_counter()
        futs = [client.submit(int, i, pure=False) for i in range(400)]
        client.gather(futs)
        per_task_ms = (time.perf_counter() - t0) / 400 * 1e3
        print(f"# source {src} ({args.size}); empty-task overhead {per_task_ms:.2f} ms/task")
        ex = qs.DaskExecutor(client)
        for name in [c for c in args.cases.split(",") if c]:
            spec = qs.QuantSpec.from_dict(CASES[name])
            times = {"local": [], "dask": []}
            digests, errors = {}, {}
            for i in range(args.repeat + 1):  # the first round warms caches and kernels
                for how in ("local", "dask"):
                    dst = os.path.join(out, f"{name}-{how}.zarr")
                    shutil.rmtree(dst, ignore_errors=True)
                    t = time.perf_counter()
                    r = qs.quantize_store(src, dst, spec, executor=None if how == "local" else ex)
                    dt = time.perf_counter() - t
                    if i:
                        times[how].append(dt)
                    digests[how] = _digest(dst)
                    errors[how] = json.dumps(r.error, sort_keys=True)
            same = digests["local"] == digests["dask"] and errors["local"] == errors["dask"]
            med = {k: statistics.median(v) for k, v in times.items()}
            row = {
                "case": name,
                "local_s": med["local"],
                "dask_s": med["dask"],
                "ratio": med["dask"] / med["local"],
                "blocks_per_task": ex.last_blocks_per_task,
                "same_bytes_and_report": same,
                "runs": times,
            }
            rows.append(row)
            print(
                f"{name:<18} local {med['local']:6.2f} s   dask {med['dask']:6.2f} s   "
                f"ratio {row['ratio']:.2f}x   blocks/task {row['blocks_per_task']}   "
                f"same bytes+report: {same}"
            )
            for how in ("local", "dask"):
                shutil.rmtree(os.path.join(out, f"{name}-{how}.zarr"), ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "size": args.size,
                    "malloc_trim": args.malloc_trim,
                    "per_task_ms": per_task_ms,
                    "rows": rows,
                    "numpy": np.__version__,
                    "distributed": distributed.__version__,
                },
                f,
                indent=1,
            )
    return 0 if all(r["same_bytes_and_report"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
