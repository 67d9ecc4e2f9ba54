"""Start-up as a budget: small jobs of qstream, each in a fresh process (start-up included,
Numba's cache warm), against plain peers doing the same work.

Cases (each side a new ``python`` process, timed from outside; the sides' order rotates from
round to round, so a change in the machine's load falls on all of them):

- ``first_touch``: open an output and read a 4x8 slice. qstream: ``qs.open_quantized(OUT)``
  then ``arr[1000:1004, 0:8]`` (float32 values). Peer: zarr-python opens the same group and
  decodes the same bytes by hand, ``(float32(data) - zero_point) * scale`` per row. The
  output is ``qs.quantize_store`` of a 4096 x 4096 float32 array, int8, per channel on axis
  0 (``--touch-shape``). Both sides print the values' bytes, which must be the same.
- ``convert_sample``: README's first command, ``qstream convert
  samples/tiny-transformer.safetensors OUT --recipe samples/recipe-int8.toml --quiet``.
  Peer: a NumPy + safetensors script that reads the sample (bf16 widened to float32 by hand,
  as ``safetensors.numpy`` cannot read it), quantizes every float tensor of rank >= 2 whose
  name has no ``norm`` (the tensors the recipe quantizes) per channel on axis 0, symmetric
  min/max (``absmax / 127``, round half to even, int8), and writes codes, scales and the
  kept tensors with ``safetensors.numpy.save_file``.
- ``quantize_small``: ``qstream quantize SMALL.zarr OUT --axis 0 --quiet`` of a float32 Zarr
  array of ``--small-shape`` (1024 x 1024, chunks of 256 rows: a small array's job, which
  runs the NumPy twins of the kernels and loads no Numba). Peer: a zarr-python + NumPy
  script that reads the array, quantizes it the same way (int8, per channel on axis 0,
  ``absmax / 127``) and writes the codes and scales as Zarr arrays (zarr's default zstd).
- ``read_small``: ``qs.open_quantized(OUT)[...]``, the whole of a small output
  (``qs.quantize_store`` of a ``--small-shape`` float32 array, int8 per channel on axis 0),
  against zarr-python decoding the same bytes by hand; both print a digest of the values,
  which must be equal.
- ``checkpoint`` (with ``--checkpoint``): ``bench_checkpoint.py``'s 1 GiB checkpoint of 1024
  tensors (``--checkpoint-size``, ``--checkpoint-count``), ``qstream convert CK OUT --quiet
  --compression none`` against that script's NumPy loop.

``--baseline DIR`` adds, for every case, qstream from another checkout (a ``git archive`` of
an earlier commit, say) run the same way, alternated with the others: before and after
measured side by side. Every qstream process runs what the installed ``qstream`` script runs
(its two lines, :data:`CONSOLE`; ``python -m cli.main`` for a checkout from before
``cli/launch.py``) with ``PYTHONPATH`` set to its checkout and its working directory outside
both (``python -c`` and ``-m`` put the working directory first);
every process may write bytecode (``PYTHONDONTWRITEBYTECODE`` is dropped: a checkout then
runs from bytecode, as an installed package does). Each run writes a new output, and all
are removed after the last round, not just before the next run (see :func:`output`;
``--same-outputs``: one output per side, removed just before each of its runs).

Reported per case and side: the median and range of ``--rounds`` rounds of wall time (after
one warm-up run of each side, which fills Numba's cache and writes the bytecode), the ratio
of each qstream side's median to the peer's (and its range over the rounds), and the median
CPU time (user + system) with its ratio: on a machine shared with other work the wall times
move by a factor of 2 from run to run, the CPU times much less. Also printed, before and after
the rounds: how long making 100 folders and 100 small files takes where the outputs go
(:func:`inode_cost`), which on this VM's ext4 took 4 to 55 ms in one afternoon, depending on
the folder and the hour.

    python benchmarks/bench_startup.py --rounds 7 --json /tmp/startup.json
    python benchmarks/bench_startup.py --baseline /tmp/qstream-old --checkpoint
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

TOUCH_QSTREAM = """
import sys
import qstream as qs
arr = qs.open_quantized(sys.argv[1])
y = arr[1000:1004, 0:8]
sys.stdout.write(y.dtype.str + y.tobytes().hex())
"""

TOUCH_ZARR = """
import sys
import numpy as np
import zarr
g = zarr.open_group(sys.argv[1], mode="r")
rows = slice(1000, 1004)
codes = g["data"][rows, 0:8]
scale = g["scale"][rows]
zp = g["zero_point"][rows] if "zero_point" in g else np.zeros(4, np.float32)
y = (codes.astype(np.float32) - zp.astype(np.float32)[:, None]) * scale[:, None]
sys.stdout.write(y.dtype.str + y.tobytes().hex())
"""

CONVERT_NUMPY = """
import json, struct, sys
import numpy as np
from safetensors.numpy import save_file
src, dst = sys.argv[1], sys.argv[2]
with open(src, "rb") as f:
    raw = f.read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8 : 8 + n])
header.pop("__metadata__", None)
types = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
out = {}
for name, h in header.items():
    a, b = h["data_offsets"]
    x = np.frombuffer(raw, types[h["dtype"]], (b - a) // np.dtype(types[h["dtype"]]).itemsize,
                      8 + n + a).reshape(h["shape"])
    if h["dtype"] == "BF16":  # bfloat16: the high half of a float32
        x = (x.astype(np.uint32) << 16).view(np.float32)
    x = x.astype(np.float32, copy=False)
    if x.ndim < 2 or "norm" in name:  # kept as they are, as the recipe keeps them
        out[name] = np.ascontiguousarray(x)
        continue
    amax = np.abs(x).max(axis=1, keepdims=True)
    scale = np.where(amax > 0, amax / 127, 1).astype(np.float32)
    out[name] = np.clip(np.rint(x / scale), -128, 127).astype(np.int8)
    out[name + "_scale"] = scale
save_file(out, dst)
"""

READ_QSTREAM = """
import hashlib, sys
import qstream as qs
y = qs.open_quantized(sys.argv[1])[...]
sys.stdout.write(y.dtype.str + hashlib.sha256(y.tobytes()).hexdigest())
"""

READ_ZARR = """
import hashlib, sys
import numpy as np
import zarr
g = zarr.open_group(sys.argv[1], mode="r")
codes = g["data"][...]
scale = g["scale"][...]
zp = g["zero_point"][...] if "zero_point" in g else np.zeros(scale.shape, np.float32)
y = (codes.astype(np.float32) - zp.astype(np.float32)[:, None]) * scale[:, None]
sys.stdout.write(y.dtype.str + hashlib.sha256(y.tobytes()).hexdigest())
"""

QUANTIZE_ZARR = """
import sys
import numpy as np
import zarr
src = zarr.open_array(sys.argv[1], mode="r")
x = src[...]
amax = np.abs(x).max(axis=1, keepdims=True)
scale = np.where(amax > 0, amax / 127, 1).astype(np.float32)
q = np.clip(np.rint(x / scale), -128, 127).astype(np.int8)
out = zarr.open_group(sys.argv[2], mode="w")
out.create_array("data", data=q, chunks=src.chunks)
out.create_array("scale", data=scale[:, 0], chunks=(src.chunks[0],))
"""

SAMPLE = os.path.join(ROOT, "samples", "tiny-transformer.safetensors")
RECIPE = os.path.join(ROOT, "samples", "recipe-int8.toml")


def run(cmd: list[str], env: dict[str, str], cwd: str) -> tuple[float, float, str]:
    """Run ``cmd`` in a new process; (wall seconds from outside, its CPU seconds: user +
    system, its stdout). What it wrote is then flushed to disk (``sync``, not timed), so the
    next run does not wait for this one's writeback."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    seconds = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        raise RuntimeError(f"{cmd} failed ({r.returncode}): {r.stderr[-2000:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    os.sync()
    return seconds, cpu, r.stdout


def plain_env() -> dict[str, str]:
    """This process's environment, with Python writing bytecode: under
    ``PYTHONDONTWRITEBYTECODE`` a checkout's modules are compiled from source at every start
    (~80 of qstream's in a conversion, 0.2 s), which an installed package never is."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def qstream_env(root: str) -> dict[str, str]:
    """The environment of a qstream process run from the checkout ``root``."""
    env = plain_env()
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


# what the installed ``qstream`` console script runs (pip's wrapper: import, then call)
CONSOLE = "import sys; from cli.launch import console; sys.argv[0] = 'qstream'; sys.exit(console())"


def qstream_command(root: str) -> list[str]:
    """How the checkout ``root`` runs its ``qstream`` console script: the script's own two
    lines (:data:`CONSOLE`; ``python -m cli`` would add runpy's import, 2-4 ms the script
    does not pay), or ``python -m cli.main`` in a checkout from before :mod:`cli.launch`."""
    if os.path.exists(os.path.join(root, "cli", "launch.py")):
        return [sys.executable, "-c", CONSOLE]
    return [sys.executable, "-m", "cli.main"]


def output(work: str, name: str, r: int, same: bool = False) -> str:
    """A new output path for round ``r``, removed with the others after the last round (see
    :func:`remove_outputs`), as a user converting a checkpoint writes a new output. Each
    run's writes reach the disk before the next starts (:func:`run`).

    ``same`` (``--same-outputs``): one path per side for every round, removed just before
    each run (the peer's file is then overwritten: on this VM writing into memory the process
    freed a moment ago is faster than into memory not touched for a while, which the peer,
    holding 1.3 GB, feels most; ``benchmarks/README.md``)."""
    os.makedirs(os.path.join(work, "rounds"), exist_ok=True)
    path = os.path.join(work, "rounds", name if same else f"{name}-{r + 1}")
    if not (same and name.endswith(".st")):  # (the peer's file: overwritten in place)
        shutil.rmtree(path, ignore_errors=True)  # (else left by an earlier benchmark run)
    return path


def remove_outputs(work: str) -> None:
    """Remove every round's outputs (:func:`output`)."""
    shutil.rmtree(os.path.join(work, "rounds"), ignore_errors=True)


def make_touch_output(path: str, shape: tuple[int, int]) -> None:
    """``qs.quantize_store`` of a float32 array of ``shape`` (int8, per channel on axis 0)
    at ``path``, by this checkout's qstream, unless it is there already."""
    if os.path.exists(os.path.join(path, "zarr.json")):
        return
    code = f"""
import numpy as np, qstream as qs
x = np.random.default_rng(0).standard_normal({shape!r}).astype(np.float32)
qs.quantize_store(x, {path!r}, qs.QuantSpec(dtype="int8", axis=0, symmetric=True))
"""
    subprocess.run([sys.executable, "-c", code], env=qstream_env(ROOT), check=True)


def make_small_array(path: str, shape: tuple[int, int]) -> None:
    """A float32 Zarr array of ``shape`` (chunks of a quarter of its rows) at ``path``,
    unless it is there already."""
    if os.path.exists(os.path.join(path, "zarr.json")):
        return
    code = f"""
import numpy as np, zarr
x = (np.random.default_rng(1).standard_normal({shape!r}) * 0.05).astype(np.float32)
a = zarr.create_array({path!r}, shape=x.shape, chunks=(max(1, x.shape[0] // 4), x.shape[1]),
                      dtype="float32")
a[...] = x
"""
    subprocess.run([sys.executable, "-c", code], env=plain_env(), check=True)


def cases(args: argparse.Namespace, sides: dict[str, str]) -> dict[str, dict[str, object]]:
    """For each case, each side's command maker: ``(round) -> (command, env)``."""
    work = args.workdir
    touch = os.path.join(work, "touch.zarr")

    def output_of(name: str, r: int) -> str:
        return output(work, name, r, args.same_outputs)

    make_touch_output(touch, tuple(args.touch_shape))
    small = os.path.join(work, "small-{}x{}.zarr".format(*args.small_shape))
    make_small_array(small, tuple(args.small_shape))
    small_out = os.path.join(work, "small-out-{}x{}.zarr".format(*args.small_shape))
    make_touch_output(small_out, tuple(args.small_shape))
    plain = plain_env()
    out: dict[str, dict[str, object]] = {"first_touch": {}, "convert_sample": {}}
    out["quantize_small"] = {}
    out["read_small"] = {}
    for side, root in sides.items():
        env = qstream_env(root)
        out["first_touch"][side] = lambda r, env=env: (
            [sys.executable, "-c", TOUCH_QSTREAM, touch],
            env,
        )

        def convert(r: int, env=env, side=side, root=root) -> tuple[list[str], dict[str, str]]:
            dst = output_of(f"sample-{side}.zarr", r)
            cmd = [*qstream_command(root), "convert", SAMPLE, dst]
            return [*cmd, "--recipe", RECIPE, "--quiet"], env

        out["convert_sample"][side] = convert

        def quantize(r: int, env=env, side=side, root=root) -> tuple[list[str], dict[str, str]]:
            dst = output_of(f"small-{side}.zarr", r)
            return [*qstream_command(root), "quantize", small, dst, "--axis", "0", "-q"], env

        out["quantize_small"][side] = quantize
        out["read_small"][side] = lambda r, env=env: (
            [sys.executable, "-c", READ_QSTREAM, small_out],
            env,
        )
    out["first_touch"]["zarr"] = lambda r: ([sys.executable, "-c", TOUCH_ZARR, touch], plain)
    out["convert_sample"]["numpy"] = lambda r: (
        [sys.executable, "-c", CONVERT_NUMPY, SAMPLE, output_of("sample-numpy.st", r)],
        plain,
    )
    out["read_small"]["zarr"] = lambda r: ([sys.executable, "-c", READ_ZARR, small_out], plain)
    out["quantize_small"]["zarr"] = lambda r: (
        [sys.executable, "-c", QUANTIZE_ZARR, small, output_of("small-zarr.zarr", r)],
        plain,
    )
    if args.checkpoint:
        from bench_checkpoint import PEER, make_checkpoint, parse_bytes

        size = parse_bytes(args.checkpoint_size)
        ck = os.path.join(work, f"ck-{args.checkpoint_size}-{args.checkpoint_count}.safetensors")
        make_checkpoint(ck, size, args.checkpoint_count)
        out["checkpoint"] = {}
        for side, root in sides.items():
            ck_env = qstream_env(root)

            def conv(r: int, env=ck_env, side=side, root=root) -> tuple[list[str], dict]:
                dst = output_of(f"ck-{side}.zarr", r)
                cmd = [*qstream_command(root), "convert", ck, dst, "--quiet"]
                return [*cmd, "--compression", "none"], env

            out["checkpoint"][side] = conv
        out["checkpoint"]["numpy"] = lambda r: (
            [sys.executable, "-c", PEER, ck, output_of("ck-numpy.st", r)],
            plain,
        )
    return out


def inode_cost(work: str, n: int = 100) -> float:
    """Milliseconds to make ``n`` folders with a 300-byte file in each below ``work`` (then
    removed): what the sample's output (112 folders, 167 files) costs where the runs write,
    apart from the work. It moves by 10x between folders of one file system on some VMs."""
    probe = os.path.join(work, "inode-probe")
    shutil.rmtree(probe, ignore_errors=True)
    os.makedirs(probe)
    t = time.perf_counter()
    for i in range(n):
        d = os.path.join(probe, f"d{i}")
        os.mkdir(d)
        with open(os.path.join(d, "zarr.json"), "wb") as f:
            f.write(b"x" * 300)
    took = time.perf_counter() - t
    shutil.rmtree(probe, ignore_errors=True)
    return took * 1e3


def summary(times: list[float]) -> dict[str, float]:
    return {"median": statistics.median(times), "min": min(times), "max": max(times)}


def main() -> None:
    from _common import git_state

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the results to this file")
    ap.add_argument("--workdir", default="/tmp/qstream-bench-startup")
    ap.add_argument("--baseline", default=None, help="another qstream checkout, run alongside")
    ap.add_argument("--touch-shape", type=int, nargs=2, default=[4096, 4096])
    ap.add_argument("--small-shape", type=int, nargs=2, default=[1024, 1024])
    ap.add_argument("--checkpoint", action="store_true", help="also the 1 GiB checkpoint")
    ap.add_argument("--checkpoint-size", default="1GiB")
    ap.add_argument("--checkpoint-count", type=int, default=1024)
    ap.add_argument("--cases", nargs="+", default=None, help="only these cases")
    ap.add_argument(
        "--same-outputs",
        action="store_true",
        help="one output per side, removed (the peer's overwritten) just before each run",
    )
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    sides = {"qstream": ROOT}
    if args.baseline:
        sides["baseline"] = os.path.abspath(args.baseline)
    plan = cases(args, sides)
    inodes = [inode_cost(os.path.join(args.workdir, "rounds"))]
    print(f"making 100 folders and 100 files under {args.workdir}: {inodes[0]:.1f} ms", flush=True)
    if args.cases:
        plan = {k: v for k, v in plan.items() if k in args.cases}
    cwd = args.workdir  # (outside every checkout)
    for makers in plan.values():  # warm-up: Numba's cache, bytecode, page cache
        for make in makers.values():
            run(*make(-1), cwd=cwd)
    times: dict[str, dict[str, list[float]]] = {c: {s: [] for s in m} for c, m in plan.items()}
    cpus: dict[str, dict[str, list[float]]] = {c: {s: [] for s in m} for c, m in plan.items()}
    for r in range(args.rounds):
        for case, makers in plan.items():
            names = list(makers)
            k = r % len(names)
            outputs = {}
            for side in names[k:] + names[:k]:
                seconds, cpu, stdout = run(*makers[side](r), cwd=cwd)
                times[case][side].append(seconds)
                cpus[case][side].append(cpu)
                outputs[side] = stdout
            if case in ("first_touch", "read_small") and len(set(outputs.values())) != 1:
                raise RuntimeError(f"{case}: the sides read different values: {outputs}")
        line = "  ".join(
            f"{case} " + " ".join(f"{s}={t[-1]:.2f}" for s, t in sides_t.items())
            for case, sides_t in times.items()
        )
        print(f"round {r + 1}: {line}", flush=True)
    inodes.append(inode_cost(os.path.join(args.workdir, "rounds")))
    remove_outputs(args.workdir)
    print(f"the same after the rounds: {inodes[1]:.1f} ms")
    peers = {
        "first_touch": "zarr",
        "convert_sample": "numpy",
        "quantize_small": "zarr",
        "read_small": "zarr",
        "checkpoint": "numpy",
    }
    rows = []
    for case, sides_t in times.items():
        peer = statistics.median(sides_t[peers[case]])
        peer_cpu = statistics.median(cpus[case][peers[case]])
        for side, t in sides_t.items():
            cpu = cpus[case][side]
            row = {"case": case, "side": side, **summary(t), "seconds": t, "cpu_seconds": cpu}
            row["cpu_median"] = statistics.median(cpu)
            if side != peers[case]:
                row["vs_peer"] = row["median"] / peer
                row["cpu_vs_peer"] = row["cpu_median"] / peer_cpu
                row["vs_peer_per_round"] = [
                    a / b for a, b in zip(t, sides_t[peers[case]], strict=True)
                ]
            rows.append(row)
    print(
        f"{'case':<15} {'side':<9} {'median s':>9} {'range s':>13} {'x peer':>7} {'per round':>13}"
    )
    for row in rows:
        ratio = f"{row['vs_peer']:.2f}x" if "vs_peer" in row else ""
        cpu_ratio = f"{row['cpu_vs_peer']:.2f}x" if "cpu_vs_peer" in row else ""
        span = (
            f"{min(row['vs_peer_per_round']):.2f}-{max(row['vs_peer_per_round']):.2f}"
            if "vs_peer" in row
            else ""
        )
        print(
            f"{row['case']:<15} {row['side']:<9} {row['median']:>9.2f}"
            f" {row['min']:>6.2f}-{row['max']:<6.2f} {ratio:>7} {span:>13}"
            f" {row['cpu_median']:>6.2f} {cpu_ratio:>10}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "git": git_state(),
                    "args": vars(args),
                    "sides": sides,
                    "rows": rows,
                    "inode_ms": inodes,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
