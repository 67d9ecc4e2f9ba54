"""qstream's GGUF exports against llama.cpp's converter (Q8_0) or quantizer (K-quant mixes).

Two synthetic checkpoints (random float32 weights, sharded safetensors with an index, a
config.json and a tiny SentencePiece tokenizer from ``tests/support/gguf_models.py``):

- ``moe``: Mixtral-style (``MixtralForCausalLM``), hidden size 32, ``--layers`` layers of
  ``--experts`` experts each (default 2 x 8192 = 16,384 experts, x3 projections);
- ``dense``: Llama-style (``LlamaForCausalLM``) of about ``--dense-gib`` GiB.

Each is converted by ``qstream convert SRC x.gguf --gguf-type Q8_0`` and by
``python convert_hf_to_gguf.py SRC --outtype q8_0`` (llama.cpp's vendored converter, with its
gguf-py on PYTHONPATH), each in a fresh process under ``/usr/bin/time -v``: wall time and peak
RSS, printed with qstream/llama.cpp ratios. A failed conversion is reported with its last
error line, not hidden. Run by hand::

    NUMBA_CACHE_DIR=/tmp/numba python benchmarks/bench_gguf_moe.py --work /tmp/bench_moe

With ``--gguf-type MIX`` for a K-quant mix (``Q4_K_M``, ``Q3_K_M``, ...; ``--imatrix FILE``
optional), llama.cpp's side is its quantizer, as a user runs ``llama-quantize``: an F32 GGUF
is made once by its converter (not timed), then ``llama_model_quantize`` (llama-cpp-python)
writes the mix with ``nthread`` = ``--threads``; qstream's side is ``qstream convert SRC
x.gguf --gguf-type MIX`` from the checkpoint with ``NUMBA_NUM_THREADS`` = ``--threads``. The
two alternate ``--rounds`` times, each run a fresh process whose own peak is its VmHWM
(``tests/support/memory_peak.py``); medians are reported, and the two files' tensors are
compared (names, types, bytes)::

    python benchmarks/bench_gguf_moe.py --gguf-type Q4_K_M --rounds 3 --dense-gib 0.25
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks._common import git_state  # noqa: E402


def vendor() -> Path:
    """llama.cpp's source tree with its converter, found as the tests find it (the installed
    vendor dir, ``$QSTREAM_LLAMA_CPP_SRC``, or the llama-cpp-python sdist fetched once)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.support.gguf_models import llama_cpp_root

    root = llama_cpp_root()
    if root is None:
        sys.exit("llama.cpp's converter not found: set QSTREAM_LLAMA_CPP_SRC")
    return root


def _write_sharded(folder: Path, tensors: dict[str, np.ndarray], shard_bytes: int) -> None:
    """``tensors`` as ``model-0000K-of-0000N.safetensors`` with their index, shards of about
    ``shard_bytes`` (every array is built by the caller: small tensors only)."""
    groups: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, a in tensors.items():
        if size and size + a.nbytes > shard_bytes:
            groups.append({})
            size = 0
        groups[-1][name] = a
        size += a.nbytes
    weight_map = {}
    for k, g in enumerate(groups, 1):
        fname = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
        save_file(g, str(folder / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(g, fname))
    total = sum(a.nbytes for a in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def _common(hidden: int, heads: int, layers: int, vocab: int, ffn: int) -> dict:
    return {
        "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": heads, "vocab_size": vocab,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 1,
        "eos_token_id": 2, "hidden_act": "silu",
    }  # fmt: skip


def _attention(rng: np.random.Generator, i: int, hidden: int) -> dict[str, np.ndarray]:
    p = f"model.layers.{i}."
    out = {f"{p}self_attn.{k}_proj.weight": rng.standard_normal((hidden, hidden), np.float32)
           for k in "qkvo"}  # fmt: skip
    out[f"{p}input_layernorm.weight"] = np.ones(hidden, np.float32)
    out[f"{p}post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
    return out


def build_moe(folder: Path, layers: int, experts: int, hidden: int = 32, vocab: int = 400) -> None:
    """A Mixtral-style checkpoint of ``layers`` x ``experts`` experts (w1, w2, w3 each)."""
    from tests.support.gguf_models import sentencepiece_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    sentencepiece_tokenizer(folder, vocab)
    rng = np.random.default_rng(0)
    ffn = hidden
    t: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.standard_normal((vocab, hidden), np.float32),
        "model.norm.weight": np.ones(hidden, np.float32),
        "lm_head.weight": rng.standard_normal((vocab, hidden), np.float32),
    }
    for i in range(layers):
        t.update(_attention(rng, i, hidden))
        p = f"model.layers.{i}.block_sparse_moe."
        t[f"{p}gate.weight"] = rng.standard_normal((experts, hidden), np.float32)
        for e in range(experts):
            t[f"{p}experts.{e}.w1.weight"] = rng.standard_normal((ffn, hidden), np.float32)
            t[f"{p}experts.{e}.w2.weight"] = rng.standard_normal((hidden, ffn), np.float32)
            t[f"{p}experts.{e}.w3.weight"] = rng.standard_normal((ffn, hidden), np.float32)
    cfg = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
           **_common(hidden, 4, layers, vocab, ffn),
           "num_local_experts": experts, "num_experts_per_tok": 2}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(cfg))
    _write_sharded(folder, t, 64 << 20)


def build_dense(folder: Path, gib: float, hidden: int = 2048, vocab: int = 400) -> None:
    """A Llama-style checkpoint of about ``gib`` GiB of float32 weights."""
    from tests.support.gguf_models import sentencepiece_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    sentencepiece_tokenizer(folder, vocab)
    ffn = hidden * 11 // 4
    per_layer = (4 * hidden * hidden + 3 * hidden * ffn) * 4
    layers = max(1, round(gib * 2**30 / per_layer))
    rng = np.random.default_rng(0)
    t: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.standard_normal((vocab, hidden), np.float32),
        "model.norm.weight": np.ones(hidden, np.float32),
        "lm_head.weight": rng.standard_normal((vocab, hidden), np.float32),
    }
    for i in range(layers):
        t.update(_attention(rng, i, hidden))
        p = f"model.layers.{i}.mlp."
        t[f"{p}gate_proj.weight"] = rng.standard_normal((ffn, hidden), np.float32)
        t[f"{p}up_proj.weight"] = rng.standard_normal((ffn, hidden), np.float32)
        t[f"{p}down_proj.weight"] = rng.standard_normal((hidden, ffn), np.float32)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           **_common(hidden, 16, layers, vocab, ffn)}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(cfg))
    _write_sharded(folder, t, 512 << 20)


def timed(cmd: list[str], env: dict[str, str]) -> dict:
    """Run ``cmd`` under ``/usr/bin/time -v``: exit code, wall seconds, peak RSS (MiB) of the
    process tree's largest process, and the last stderr line on failure."""
    t0 = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("\t")]
    return {"rc": r.returncode, "seconds": round(wall, 2),
            "peak_mib": round(int(m.group(1)) / 1024, 1) if m else None,
            "error": None if r.returncode == 0 else (lines[-1] if lines else "")[:300]}  # fmt: skip


def compare(src: Path, work: Path) -> dict:
    """Convert ``src`` by qstream and by llama.cpp's converter; both results and ratios."""
    env = dict(os.environ)
    qs_out, ll_out = work / f"{src.name}-qstream.gguf", work / f"{src.name}-llamacpp.gguf"
    for f in (qs_out, ll_out):
        f.unlink(missing_ok=True)
    ours = timed(["qstream", "convert", str(src), str(qs_out), "--gguf-type", "Q8_0",
                  "--overwrite"], env)  # fmt: skip
    tree = vendor()
    ll_env = {**env, "PYTHONPATH": str(tree / "gguf-py")}
    theirs = timed([sys.executable, str(tree / "convert_hf_to_gguf.py"), str(src),
                    "--outtype", "q8_0", "--outfile", str(ll_out)], ll_env)  # fmt: skip
    out = {"qstream": ours, "llama.cpp": theirs}
    if ours["rc"] == 0 and theirs["rc"] == 0:
        out["time_ratio"] = round(ours["seconds"] / theirs["seconds"], 2)
        out["rss_ratio"] = round(ours["peak_mib"] / theirs["peak_mib"], 2)
        out["bytes"] = {"qstream": qs_out.stat().st_size, "llama.cpp": ll_out.stat().st_size}
    return out


# llama.cpp's llama_ftype of each mix (llama.h)
FTYPE = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_S": 11,
         "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17,
         "Q6_K": 18}  # fmt: skip

# llama_model_quantize in a child: argv = f32.gguf out.gguf ftype threads [imatrix]
_QUANTIZE = """
import ctypes, numpy as np, llama_cpp
src, dst, ftype, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
params = llama_cpp.llama_model_quantize_default_params()
params.ftype, params.nthread = ftype, threads
keep = []
if len(sys.argv) > 5:
    from qstream.exports.gguf.imatrix import importance_weights, read_imatrix
    weights = importance_weights(read_imatrix(sys.argv[5]))
    arr = (llama_cpp.llama_model_imatrix_data * (len(weights) + 1))()
    for i, (name, w) in enumerate(weights.items()):
        w = np.ascontiguousarray(w, dtype=np.float32)
        keep += [name.encode(), w]
        arr[i].name, arr[i].size = keep[-2], w.size
        arr[i].data = w.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    params.imatrix = ctypes.cast(arr, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
sys.exit(llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params))
"""


def _child(args: list, code: str, env: dict[str, str]) -> dict:
    """Run a child (tests/support/memory_peak.py): exit code, wall seconds, own peak (MiB)."""
    from tests.support.memory_peak import PREAMBLE, run_child

    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # (run_child prints a line: keep stdout JSON)
        r = run_child(args, code=PREAMBLE + code, env=env, timeout=3600)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    return {"rc": r.returncode, "seconds": round(time.perf_counter() - t0, 2),
            "peak_mib": round(r.peak / 2**20, 1),
            "error": None if r.returncode == 0 else (lines[-1] if lines else "")[:300]}  # fmt: skip


def _same_tensors(a: Path, b: Path) -> str:
    """``"n/n"``: how many tensors of ``b`` ``a`` holds with the same type, shape and bytes."""
    from gguf import GGUFReader

    ta = {t.name: t for t in GGUFReader(str(a)).tensors}
    tb = GGUFReader(str(b)).tensors
    same = sum(
        1
        for t in tb
        if t.name in ta
        and ta[t.name].tensor_type == t.tensor_type
        and list(ta[t.name].shape) == list(t.shape)
        and np.array_equal(ta[t.name].data.view(np.uint8), t.data.view(np.uint8))
    )
    return f"{same}/{len(tb)}"


def _median(runs: list[dict], key: str) -> float:
    return float(np.median([r[key] for r in runs]))


def compare_kquant(src: Path, work: Path, mix: str, threads: int, rounds: int,
                   imatrix: Path | None) -> dict:  # fmt: skip
    """``qstream convert SRC --gguf-type MIX`` against ``llama_model_quantize`` of an F32
    GGUF of SRC (made once), alternated ``rounds`` times; medians and ratios."""
    from tests.support.gguf_models import run_converter

    f32 = work / f"{src.name}-f32.gguf"
    if not f32.exists():
        t0 = time.perf_counter()
        run_converter(src, f32)
        print(f"made {f32} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    qs_out, ll_out = work / f"{src.name}-{mix}-qstream.gguf", work / f"{src.name}-{mix}-ll.gguf"
    env = {"NUMBA_NUM_THREADS": str(threads), "QSTREAM_PROGRESS_EVERY": "0"}
    cli = "from cli.main import main\nsys.argv[0] = 'qstream'\nmain()\n"
    ours_args = ["convert", str(src), str(qs_out), "--gguf-type", mix, "--overwrite", "-q"]
    theirs_args = [str(f32), str(ll_out), str(FTYPE[mix]), str(threads)]
    if imatrix is not None:
        ours_args += ["--imatrix", str(imatrix)]
        theirs_args.append(str(imatrix))
    ours: list[dict] = []
    theirs: list[dict] = []
    for k in range(rounds):
        for side in ("q", "l") if k % 2 == 0 else ("l", "q"):
            if side == "q":
                qs_out.unlink(missing_ok=True)
                ours.append(_child(ours_args, cli, env))
            else:
                ll_out.unlink(missing_ok=True)
                theirs.append(_child(theirs_args, _QUANTIZE, env))
        print(f"round {k + 1}: qstream {ours[-1]}, llama.cpp {theirs[-1]}", file=sys.stderr)
    out: dict = {"mix": mix, "threads": threads, "imatrix": imatrix is not None,
                 "source_bytes": sum(f.stat().st_size for f in src.glob("*.safetensors")),
                 "qstream": ours, "llama.cpp": theirs}  # fmt: skip
    if all(r["rc"] == 0 for r in ours + theirs):
        for key in ("seconds", "peak_mib"):
            out[f"median_{key}"] = {
                "qstream": _median(ours, key),
                "llama.cpp": _median(theirs, key),
            }
        out["time_ratio"] = round(_median(ours, "seconds") / _median(theirs, "seconds"), 2)
        out["rss_ratio"] = round(_median(ours, "peak_mib") / _median(theirs, "peak_mib"), 2)
        out["same_tensors"] = _same_tensors(qs_out, ll_out)
    return out


def main() -> None:
    """Build the checkpoints (once) and print the side-by-side results as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_gguf_moe"))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=8192)
    ap.add_argument("--dense-gib", type=float, default=1.0, help="0: skip the dense model")
    ap.add_argument("--moe", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--gguf-type", default="Q8_0", help="Q8_0 (converter) or a K-quant mix")
    ap.add_argument("--imatrix", type=Path, default=None, help="K-quant mixes: an imatrix file")
    ap.add_argument("--threads", type=int, default=2, help="K-quant mixes: threads of each side")
    ap.add_argument("--rounds", type=int, default=3, help="K-quant mixes: alternated runs")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    cases = {"moe": args.work / f"moe-{args.layers}x{args.experts}"} if args.moe else {}
    if args.dense_gib > 0:
        cases["dense"] = args.work / f"dense-{args.dense_gib}gib"
    results = {"git": git_state()}
    for kind, src in cases.items():
        if not (src / "config.json").exists():
            t0 = time.perf_counter()
            if kind == "moe":
                build_moe(src, args.layers, args.experts)
            else:
                build_dense(src, args.dense_gib)
            print(f"built {src} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        if args.gguf_type == "Q8_0":
            results[kind] = compare(src, args.work)
        else:
            results[kind] = compare_kquant(src, args.work, args.gguf_type, args.threads,
                                           args.rounds, args.imatrix)  # fmt: skip
        print(kind, json.dumps(results[kind]), file=sys.stderr)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
