"""First runs: how long a job takes in a fresh process with an empty Numba cache (its kernels
compiled), for one or more qstream trees side by side.

Every case runs in a process of its own with an empty ``NUMBA_CACHE_DIR`` of its own (what a
user's first run of that job meets); the trees (``--tree PATH``: a checkout whose ``qstream``
is imported first, e.g. a ``git worktree`` of another commit; default this checkout) take
turns case by case, ``--rounds`` times. Reported: each case's median seconds per tree (the job
itself, timed inside its process: imports not included) and the ratio to the first tree.

Cases (``--cases``, comma list): ``quantize_store`` (``compression="none"``, the NumPy path
for small jobs off: ``QSTREAM_NUMPY_JOB=0``) of a 64 x 256 float32 array (serial builds) and
of a 1024 x 1024 one (parallel builds) for int8 per channel, uint8 asymmetric per tensor, int4
groups of 32 (dynamic) and int8 percentile; the K-quant kernel's serial build (Q4_K, 4
super-blocks); and ``qstream convert`` of the bundled sample to int4 groups of 32 (the whole
command's wall time, as a newcomer's first group-wise run; its background warm-up included).

    python benchmarks/bench_first_run.py                                  # this checkout
    git worktree add /tmp/base HEAD~1
    python benchmarks/bench_first_run.py --tree /tmp/base --tree . --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import git_state

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "tiny-transformer.safetensors"

SPECS = {
    "int8-channel": 'qs.QuantSpec(dtype="int8", axis=0)',
    "uint8-asym": 'qs.QuantSpec(dtype="uint8", symmetric=False)',
    "int4-g32": 'qs.QuantSpec(dtype="int4", axis=1, block_size=32, method="dynamic")',
    "int8-pct": 'qs.QuantSpec(dtype="int8", method="percentile", percentile=99.9)',
}
SHAPES = {"small": (64, 256), "big": (1024, 1024)}

STORE_JOB = """
import sys, time, tempfile, numpy as np
import qstream as qs
x = np.random.default_rng(0).standard_normal({shape}).astype(np.float32)
d = tempfile.mkdtemp()
t = time.perf_counter()
qs.quantize_store(x, d + "/o.zarr", {spec}, compression="none")
print(time.perf_counter() - t)
"""

KQUANT_JOB = """
import time, numpy as np
from qstream.kernels import kquants
x = np.random.default_rng(1).standard_normal(4 * 256).astype(np.float32)
x.flags.writeable = False
t = time.perf_counter()
kquants.quantize_blocks.serial(x, x[:0], False, 1, kquants.Q4_K, np.zeros(4 * 144, np.uint8))
print(time.perf_counter() - t)
"""


def cases() -> dict[str, str | None]:
    """Each case's Python source (None: the CLI command)."""
    out: dict[str, str | None] = {}
    for name, spec in SPECS.items():
        for size, shape in SHAPES.items():
            out[f"{name}/{size}"] = STORE_JOB.format(shape=shape, spec=spec)
    out["kquant-serial"] = KQUANT_JOB
    out["cli-int4-sample"] = None
    return out


def run_case(tree: Path, source: str | None) -> float:
    """Seconds of one case in a fresh process with an empty Numba cache."""
    cache = tempfile.mkdtemp(prefix="qstream-first-run-")
    work = tempfile.mkdtemp(prefix="qstream-first-out-")
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "NUMBA_CACHE_DIR": cache,
        "QSTREAM_NUMPY_JOB": "0",
    }
    try:
        if source is not None:
            done = subprocess.run(
                [sys.executable, "-c", source], env=env, capture_output=True, text=True, check=False
            )
            if done.returncode:
                raise RuntimeError(done.stderr[-2000:])
            return float(done.stdout.split()[-1])
        env.pop("QSTREAM_NUMPY_JOB")  # (the command as a user runs it)
        args = ["--dtype", "int4", "--block-size", "32", "--method", "dynamic", "--axis", "1"]
        command = [sys.executable, "-m", "cli.main", "convert", str(SAMPLE), f"{work}/o.zarr"]
        t = time.perf_counter()
        subprocess.run([*command, *args], env=env, capture_output=True, check=True)
        return time.perf_counter() - t
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", type=Path, help="a qstream checkout (repeat)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", help="comma list of case names (default all)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    trees = [t.resolve() for t in (args.tree or [ROOT])]
    every = cases()
    names = args.cases.split(",") if args.cases else list(every)
    times: dict[str, dict[str, list[float]]] = {n: {str(t): [] for t in trees} for n in names}
    for r in range(args.rounds):
        for name in names:
            for tree in trees if r % 2 == 0 else trees[::-1]:
                times[name][str(tree)].append(run_case(tree, every[name]))
            print(f"round {r + 1} {name}: " + ", ".join(
                f"{times[name][str(t)][-1]:.2f}" for t in trees), flush=True)  # fmt: skip
    print()
    head = "case".ljust(20) + "".join(f"{t.name[:14]:>16}" for t in trees)
    print(head + ("".join(f"{'/' + trees[0].name[:12]:>16}" for _ in trees[1:])))
    summary = {}
    for name in names:
        med = [statistics.median(times[name][str(t)]) for t in trees]
        summary[name] = med
        ratios = "".join(f"{m / med[0]:>16.2f}" for m in med[1:])
        print(name.ljust(20) + "".join(f"{m:>16.2f}" for m in med) + ratios)
    total = [sum(summary[n][i] for n in names) for i in range(len(trees))]
    print("sum".ljust(20) + "".join(f"{m:>16.2f}" for m in total)
          + "".join(f"{m / total[0]:>16.2f}" for m in total[1:]))  # fmt: skip
    if args.json:
        record = {"trees": [str(t) for t in trees], "times": times, **git_state()}
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
