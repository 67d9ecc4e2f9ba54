"""Checkpoints of many tensors: conversion costs per byte, not per tensor.

The same bytes of float32 (1 GiB by default) as 16, 1024 and 16384 tensors, with the names of
a mixture-of-experts model (``model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight``), in
one safetensors file each. For each, in fresh processes, one run after another:

- ``qstream``: ``qstream convert CK OUT --quiet --compression none`` (the default recipe:
  int8, symmetric, per channel on axis 0), timed from outside, with its peak RSS;
- ``numpy``: the peer, a NumPy + safetensors loop that reads each tensor, quantizes it per
  channel in memory (absmax / 127, round half to even, int8) and writes the codes and scales
  with ``safetensors.numpy.save_file`` (one file, so it holds them all until the end);
- ``inspect`` and ``export`` of qstream's output (``qstream inspect OUT --json``, ``qstream
  export OUT X.safetensors``).

- ``--extras``: each layer of the checkpoint also holds what a real model's layer holds
  between its experts, each alone among other tensors: two norms (4096 values; qstream keeps
  them, and so does the loop) and a router gate (64 x 4096, quantized);
- kept tensors: ``--kept`` small 1-D float32 tensors (norms: the default recipe keeps them as
  they are) converted the same way, against a plain safetensors copy of them (``load_file``,
  ``save_file``).

Reported: medians of ``--rounds`` (after ``qstream warm-up`` and one warm-up conversion: the
kernels compiled and qstream's modules in bytecode, as an installed machine or image has them),
the ratio of each count's conversion to the 16-tensor one, and to the NumPy loop, the root
metadata's bytes per tensor.

    python benchmarks/bench_checkpoint.py --json /tmp/checkpoint.json
    python benchmarks/bench_checkpoint.py --counts 16 1024 --size 256MiB --rounds 1
    python benchmarks/bench_checkpoint.py --size 16GiB --rounds 1 --clean --kept
    python benchmarks/bench_checkpoint.py --counts 1024 16384 --extras --kept

At 16 GiB each count needs ~29 GiB of disk while it runs (``--clean`` removes its files
after it), and the loop, which holds every tensor's codes until it writes them, reaches a
peak RSS of ~22 GB.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PEER = """
import sys, time
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file
src, dst = sys.argv[1], sys.argv[2]
t = time.perf_counter()
out = {}
with safe_open(src, framework="np") as f:
    for name in f.keys():
        x = f.get_tensor(name)
        if x.ndim < 2:  # (norms: kept as they are, as qstream's default recipe keeps them)
            out[name] = x
            continue
        amax = np.abs(x).max(axis=1, keepdims=True)
        scale = np.where(amax > 0, amax / 127, 1).astype(np.float32)
        out[name] = np.clip(np.rint(x / scale), -128, 127).astype(np.int8)
        out[name + "_scale"] = scale
save_file(out, dst)
print(time.perf_counter() - t)
"""

COPY = """
import sys
from safetensors.numpy import load_file, save_file
save_file(load_file(sys.argv[1]), sys.argv[2])
"""


def parse_bytes(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if text.endswith(u):
            return int(float(text[: -len(u)]) * m)
    return int(text)


def expert_names(count: int) -> list[str]:
    """``count`` tensor names shaped like a mixture-of-experts checkpoint's."""
    names = []
    layer = 0
    while len(names) < count:
        for e in range(64):
            for p in ("gate_proj", "up_proj", "down_proj"):
                names.append(f"model.layers.{layer}.mlp.experts.{e}.{p}.weight")
        layer += 1
    return names[:count]


def make_checkpoint(path: str, total: int, count: int, extras: bool = False) -> None:
    """``count`` float32 tensors of ``total / count`` bytes each (square-ish matrices), made
    by a child process (this one stays small: its children's peak RSS would count it)."""
    if not os.path.exists(path):
        subprocess.run(
            [sys.executable, __file__, "--make", path, str(total), str(count), str(int(extras))],
            check=True,
        )


def _make(path: str, total: int, count: int, extras: bool = False) -> None:
    """Write the checkpoint tensor by tensor (a 16 GiB one does not fit in memory twice, as
    ``save_file`` of a dict of them would need): the bytes ``safetensors.numpy.save_file``
    writes (tensors in the order of their names, the header's JSON compact and padded with
    spaces to 8 bytes). ``extras``: each layer also has what a real model's layer has
    between its experts: two norms (4096 float32 values, kept as they are) and a router
    gate (64 x 4096 float32, quantized), each alone among other tensors."""
    import numpy as np

    per = total // count // 4
    rows = 1 << max(0, (per.bit_length() - 1) // 2)
    cols = per // rows
    rng = np.random.default_rng(0)
    base = (rng.standard_normal(rows * cols) * 0.02).astype(np.float32).reshape(rows, cols)
    # each tensor: a template times a factor (made when it is written)
    made = {n: (base, np.float32(1 + (i % 7) / 10)) for i, n in enumerate(expert_names(count))}
    if extras:
        norm = np.linspace(0.5, 1.5, 4096, dtype=np.float32)
        gate = (rng.standard_normal((64, 4096)) * 0.02).astype(np.float32)
        for layer in sorted({int(n.split(".")[2]) for n in made}):
            at = f"model.layers.{layer}"
            made[f"{at}.input_layernorm.weight"] = (norm, np.float32(1))
            made[f"{at}.post_attention_layernorm.weight"] = (norm, np.float32(1))
            made[f"{at}.mlp.gate.weight"] = (gate, np.float32(layer + 1))
    names = sorted(made)
    header, at = {}, 0
    for n in names:
        shape = made[n][0].shape
        nbytes = math.prod(shape) * 4
        header[n] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, at + nbytes]}
        at += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for n in names:
            template, factor = made[n]
            f.write((template * factor).tobytes())
    os.replace(path + ".tmp", path)


def _make_norms(path: str, count: int) -> None:
    """``count`` float32 tensors of 4096 values, named like a model's norms."""
    if not os.path.exists(path):
        code = (
            "import sys, numpy as np; from safetensors.numpy import save_file;"
            " n = int(sys.argv[2]); x = np.linspace(-1, 1, 4096, dtype=np.float32);"
            " save_file({f'model.layers.{i // 2}.norm{i % 2}.weight': x * (1 + i % 5)"
            " for i in range(n)}, sys.argv[1] + '.tmp')"
        )
        subprocess.run([sys.executable, "-c", code, path, str(count)], check=True)
        os.replace(path + ".tmp", path)


def kept_rows(workdir: str, count: int, rounds: int) -> dict:
    """qstream's conversion of ``count`` kept norms against a safetensors copy of them."""
    ck = os.path.join(workdir, f"norms-{count}.safetensors")
    _make_norms(ck, count)
    out = os.path.join(workdir, f"norms-{count}.zarr")
    copy = os.path.join(workdir, f"norms-{count}-copy.safetensors")
    q, c = [], []
    for _ in range(rounds):
        shutil.rmtree(out, ignore_errors=True)
        q.append(timed(qstream("convert", ck, out, "--quiet", "--compression", "none")))
        c.append(timed([sys.executable, "-c", COPY, ck, copy]))
    qs_s = statistics.median(s for s, _ in q)
    copy_s = statistics.median(s for s, _ in c)
    return {"kept_tensors": count, "qstream_s": qs_s, "copy_s": copy_s, "vs_copy": qs_s / copy_s}


def check_space(workdir: str, ck: str, total: int) -> None:
    """Exit naming the shortfall unless ``workdir`` has room for one count: its checkpoint
    (unless made already) and three outputs of int8 codes (qstream's, the loop's, the
    export), each a quarter of ``total`` and a little more."""
    need = (0 if os.path.exists(ck) else total) + 3 * (total // 4 + total // 64)
    free = shutil.disk_usage(workdir).free
    if free < need:
        sys.exit(
            f"bench_checkpoint: {workdir} has {free / 2**30:.1f} GiB free, a count of"
            f" {total / 2**30:.1f} GiB needs {need / 2**30:.1f} GiB (--workdir elsewhere, or"
            " --clean to remove each count's files once measured)"
        )


def timed(cmd: list[str]) -> tuple[float, float]:
    """Run ``cmd``; (seconds, peak RSS in MB) from GNU time."""
    t = time.perf_counter()
    r = subprocess.run(
        ["/usr/bin/time", "-f", "%M", *cmd], capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - t
    if r.returncode:
        raise RuntimeError(f"{cmd} failed: {r.stderr[-2000:]}")
    return seconds, int(r.stderr.strip().splitlines()[-1]) / 1024


def root_bytes(out: str) -> int:
    """Bytes of the root's own metadata: its files, and the metadata documents below its
    entries that are not tensors (names starting with ``_`` or ``.``: the index, and the packs'
    documents, which list their tensors; not the packs' arrays, which are tensor data)."""
    n = 0
    for entry in os.scandir(out):
        if entry.is_file():
            n += entry.stat().st_size
        elif entry.name == "_packs":
            n += sum(
                os.path.getsize(os.path.join(h, f))
                for h, _, fs in os.walk(entry.path)
                for f in fs
                if f == "zarr.json" and os.path.dirname(h) in (out, entry.path)
            )
        elif entry.name.startswith(("_", ".")):
            n += sum(
                os.path.getsize(os.path.join(h, f)) for h, _, fs in os.walk(entry.path) for f in fs
            )
    return n


def qstream(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli", *args]  # (what the installed script runs)


def main() -> None:
    from _common import git_state

    if sys.argv[1:2] == ["--make"]:
        _make(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:6] == ["1"])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--counts", type=int, nargs="+", default=[16, 1024, 16384])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", default="/tmp/qstream-bench-checkpoint")
    ap.add_argument("--kept", type=int, nargs="*", default=[2000])
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--extras",
        action="store_true",
        help="each layer also holds two norms and a router gate, alone among other tensors",
    )
    ap.add_argument(
        "--clean",
        action="store_true",
        help="remove each count's checkpoint and outputs once it is measured (large --size)",
    )
    args = ap.parse_args()
    total = parse_bytes(args.size)
    os.makedirs(args.workdir, exist_ok=True)
    rows = []
    # (an editable install under PYTHONDONTWRITEBYTECODE would compile qstream's modules at
    # every start, ~0.2 s a run that an installed wheel does not pay)
    subprocess.run(qstream("warm-up", "--quiet"), check=True)
    warm = os.path.join(args.workdir, "warm.safetensors")
    make_checkpoint(warm, 1 << 20, 4)
    shutil.rmtree(os.path.join(args.workdir, "warm.zarr"), ignore_errors=True)
    timed(qstream("convert", warm, os.path.join(args.workdir, "warm.zarr"), "--quiet"))
    for count in args.counts:
        tail = "-extras" if args.extras else ""
        ck = os.path.join(args.workdir, f"ck-{args.size}-{count}{tail}.safetensors")
        check_space(args.workdir, ck, total)
        make_checkpoint(ck, total, count, args.extras)
        out = os.path.join(args.workdir, f"out-{count}.zarr")
        exp_dir = os.path.join(args.workdir, f"exp-{count}")  # a model folder (config.json)
        exp = os.path.join(exp_dir, "model.safetensors")
        peer_out = os.path.join(args.workdir, f"peer-{count}.safetensors")
        q, p, ins, ex = [], [], [], []
        for _ in range(args.rounds):
            shutil.rmtree(out, ignore_errors=True)
            q.append(timed(qstream("convert", ck, out, "--quiet", "--compression", "none")))
            p.append(timed([sys.executable, "-c", PEER, ck, peer_out]))
            ins.append(timed(qstream("inspect", out, "--json")))
            shutil.rmtree(exp_dir, ignore_errors=True)
            os.makedirs(exp_dir)
            ex.append(timed(qstream("export", out, exp, "--quiet")))
        root = os.path.getsize(os.path.join(out, "zarr.json"))
        meta = root_bytes(out)
        row = {
            "tensors": count,
            "bytes": total,
            "qstream_s": statistics.median(s for s, _ in q),
            "qstream_rss_mb": max(m for _, m in q),
            "numpy_s": statistics.median(s for s, _ in p),
            "numpy_rss_mb": max(m for _, m in p),
            "inspect_s": statistics.median(s for s, _ in ins),
            "export_s": statistics.median(s for s, _ in ex),
            "root_bytes_per_tensor": meta / count,
            "root_zarr_json_bytes": root,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        for f in (ck, peer_out) if args.clean else (peer_out,):
            if os.path.exists(f):
                os.unlink(f)
        if args.clean:
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(exp_dir, ignore_errors=True)
    base = rows[0]
    for r in rows:
        r["vs_first_count"] = r["qstream_s"] / base["qstream_s"]
        r["vs_numpy"] = r["qstream_s"] / r["numpy_s"]
        r["export_vs_first_count"] = r["export_s"] / base["export_s"]
    print(
        f"{'tensors':>8} {'qstream s':>10} {'numpy s':>8} {'x16':>6} {'x numpy':>8} {'RSS MB':>7}"
        f" {'inspect s':>9} {'export s':>9} {'root B/t':>9}"
    )
    for r in rows:
        print(
            f"{r['tensors']:>8} {r['qstream_s']:>10.2f} {r['numpy_s']:>8.2f}"
            f" {r['vs_first_count']:>6.2f} {r['vs_numpy']:>8.2f} {r['qstream_rss_mb']:>7.0f}"
            f" {r['inspect_s']:>9.2f} {r['export_s']:>9.2f} {r['root_bytes_per_tensor']:>9.0f}"
        )
    kept = [kept_rows(args.workdir, n, args.rounds) for n in args.kept]
    for r in kept:
        print(
            f"{r['kept_tensors']:>8} kept norms: qstream {r['qstream_s']:.2f} s, safetensors"
            f" copy {r['copy_s']:.2f} s ({r['vs_copy']:.2f}x)"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"git": git_state(), "rows": rows, "kept": kept}, f, indent=1)


if __name__ == "__main__":
    main()
