"""A K-quant GGUF conversion out of core: ``qstream convert MODEL x.gguf --gguf-type Q4_K_M``
(with and without ``--imatrix``) killed by SIGKILL in a child process mid-write leaves no
file that looks complete, and the same command run again writes the bytes of an
uninterrupted run; its peak memory stays within ``--max-memory`` plus a stated overhead on a
model several times bigger than the bound.

The kills are real: the child (the command line itself) counts the writes to its partial
file and, at the chosen one, writes half of that write's bytes, flushes them and sends itself
SIGKILL (or dies just before the rename that makes the file whole). Peak memory is the
child's own VmHWM (``tests/support/memory_peak.py``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from qstream.exports.gguf.imatrix import write_imatrix
from tests.support.gguf_models import sentencepiece_tokenizer
from tests.support.memory_peak import run_child

pytest.importorskip("sentencepiece")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]

# The child: the command line, whose writes to ``*.partial`` files are counted; at write
# number KILL_AT it writes the first half of that write's bytes, flushes and SIGKILLs
# itself; KILL_AT = "rename" kills it just before the partial file is renamed into place.
CHILD = textwrap.dedent(
    """
    import atexit, builtins, os, signal, sys

    kill_at = os.environ.get("KILL_AT", "")
    count = [0]
    _open = builtins.open
    _replace = os.replace

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    class Killing:
        def __init__(self, f):
            self._f = f

        def write(self, b):
            n = count[0]
            count[0] += 1
            if str(n) == kill_at:
                raw = memoryview(b).cast("B")
                self._f.write(raw[: len(raw) // 2])
                self._f.flush()
                die()
            return self._f.write(b)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self._f.__exit__(*exc)

        def __getattr__(self, name):
            return getattr(self._f, name)

    def opening(file, mode="r", *args, **kw):
        f = _open(file, mode, *args, **kw)
        return Killing(f) if str(file).endswith(".partial") and "w" in mode else f

    def replacing(a, b, *args, **kw):
        if kill_at == "rename" and str(a).endswith(".partial"):
            die()
        return _replace(a, b, *args, **kw)

    builtins.open = opening
    os.replace = replacing
    atexit.register(lambda: print(f"writes={count[0]}", file=sys.stderr))
    from cli.main import main
    sys.argv[0] = "qstream"
    main()
    """
)

# the kill test's model: 2 layers of rows of whole super-blocks (Q4_K_M gives its tensors
# Q4_K, Q6_K and Q5_0/Q8_0 fallbacks), written in slabs of 1 MiB (--max-memory 8MiB)
HIDDEN, INTER, LAYERS = 256, 512, 2
# the memory test's model: 395 MiB of float32 against a bound of 32 MiB
BIG_HIDDEN, BIG_INTER, BIG_LAYERS, BOUND = 1024, 2816, 8, 32 << 20
# what a run may hold besides the bound: the interpreter with numpy, numba's kernels and its
# two threads, safetensors, the tokenizer (180-190 MiB measured, warm Numba cache, for this
# model and for a tiny one), and LLVM compiling the kernels when the cache is cold (269 MiB)
OVERHEAD = 320 << 20


def _llama(folder: Path, hidden: int, inter: int, layers: int) -> Path:
    """A Llama-style float32 checkpoint (one safetensors file, a config, a tokenizer)."""
    sentencepiece_tokenizer(folder)
    rng = np.random.default_rng(0)

    def w(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), np.float32) * np.float32(0.05)).astype(np.float32)

    t = {"model.embed_tokens.weight": w(400, hidden), "lm_head.weight": w(400, hidden),
         "model.norm.weight": np.ones(hidden, np.float32)}  # fmt: skip
    for i in range(layers):
        p = f"model.layers.{i}."
        for k in "qkvo":
            t[f"{p}self_attn.{k}_proj.weight"] = w(hidden, hidden)
        t[f"{p}mlp.gate_proj.weight"] = w(inter, hidden)
        t[f"{p}mlp.up_proj.weight"] = w(inter, hidden)
        t[f"{p}mlp.down_proj.weight"] = w(hidden, inter)
        t[f"{p}input_layernorm.weight"] = np.ones(hidden, np.float32)
        t[f"{p}post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": 4,
        "num_key_value_heads": 4, "vocab_size": 400, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _imatrix(path: Path, hidden: int, inter: int, layers: int) -> Path:
    """An importance matrix for the model's Linear weights (random positive sums)."""
    rng = np.random.default_rng(5)
    entries = {}
    for i in range(layers):
        cols = {"attn_q": hidden, "attn_k": hidden, "attn_v": hidden, "attn_output": hidden,
                "ffn_gate": hidden, "ffn_up": hidden, "ffn_down": inter}  # fmt: skip
        for name, n in cols.items():
            sums = rng.lognormal(0, 1, (1, n)).astype(np.float32) * np.float32(10)
            entries[f"blk.{i}.{name}.weight"] = (sums, np.array([10]))
    write_imatrix(path, entries, ["random"], 10, 512)
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("kquant_kill")
    model = _llama(base / "model", HIDDEN, INTER, LAYERS)
    return model, _imatrix(base / "model.imatrix", HIDDEN, INTER, LAYERS)


def _convert(model: Path, out: Path, extra: list[str], kill_at: str | None = None):
    env = {**os.environ, "KILL_AT": kill_at or "", "QSTREAM_PROGRESS_EVERY": "0"}
    args = ["convert", model, out, "--gguf-type", "Q4_K_M", "--max-memory", "8MiB", "-q"]
    return subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, [*args, *extra])],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )


def _files(folder: Path) -> list[str]:
    """The files in ``folder`` but the export lock's (which a run leaves, unlocked)."""
    return sorted(p.name for p in folder.iterdir() if p.name != ".qstream-lock")


def _unmeasured(gguf: bytes) -> bytes:
    """``gguf`` with the SQNR text qstream writes in its header once the tensors are written
    back to the spaces reserved for it."""
    key = b"qstream.sqnr_db"
    at = gguf.index(struct.pack("<Q", len(key)) + key) + 8 + len(key) + 4
    (size,) = struct.unpack("<Q", gguf[at : at + 8])
    return gguf[: at + 8] + b" " * size + gguf[at + 8 + size :]


def _writes(run: subprocess.CompletedProcess) -> int:
    return int(run.stderr.strip().splitlines()[-1].removeprefix("writes="))


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "imatrix"])
def test_a_kquant_gguf_killed_mid_write_leaves_no_complete_looking_file_and_reruns_exactly(
    small, tmp_path, weighted
):
    model, imatrix = small
    extra = ["--imatrix", str(imatrix)] if weighted else []
    out = tmp_path / "x.gguf"
    ref = _convert(model, out, extra)
    assert ref.returncode == 0, ref.stderr[-2000:]
    want = out.read_bytes()
    torn = _unmeasured(want)  # (what a torn file holds: the SQNR is written last, in place)
    writes = _writes(ref)
    assert writes > 10, writes  # the header, then the tensors' slabs
    out.unlink()
    # (the last writes: the last tensor's data, its padding (empty here), then the SQNR text
    # in the header)
    for at in [str(n) for n in (0, writes // 2, writes - 3, writes - 1)] + ["rename"]:
        stopped = _convert(model, out, extra, kill_at=at)
        assert stopped.returncode == -signal.SIGKILL, (at, stopped.stderr[-2000:])
        left = _files(tmp_path)
        # nothing at the destination; only the dead process's partial file, torn short
        # (or, killed before the rename, whole but under its partial name)
        assert not out.exists(), at
        assert len(left) == 1 and left[0].startswith("x.gguf.") and left[0].endswith(".partial"), (
            at,
            left,
        )
        partial = (tmp_path / left[0]).read_bytes()
        if at == "rename":
            assert partial == want
        else:
            # (torn short; or, killed writing the SQNR text, whole but for it)
            whole = len(partial) == len(want)
            assert partial != want and torn.startswith(_unmeasured(partial) if whole else partial)
        again = _convert(model, out, extra)
        assert again.returncode == 0, (at, again.stderr[-2000:])
        assert out.read_bytes() == want, at
        assert _files(tmp_path) == ["x.gguf"], at
        out.unlink()


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("kquant_memory")
    model = _llama(base / "model", BIG_HIDDEN, BIG_INTER, BIG_LAYERS)
    yield model
    shutil.rmtree(base, ignore_errors=True)


def test_a_kquant_gguf_conversion_stays_within_its_memory_bound(big, tmp_path):
    size = (big / "model.safetensors").stat().st_size
    assert size > BOUND + OVERHEAD, size  # holding the model would fail the test
    out = tmp_path / "x.gguf"
    args = ["convert", big, out, "--gguf-type", "Q4_K_M", "--max-memory", f"{BOUND >> 20}MiB"]
    r = run_child([*args, "-q"], address_space=3 << 30, timeout=1200)
    assert r.returncode == 0, r.stderr[-2000:]
    print(f"model {size >> 20} MiB, --max-memory {BOUND >> 20} MiB: peak {r.peak >> 20} MiB")
    assert r.peak < BOUND + OVERHEAD, r.peak >> 20
    assert out.stat().st_size > size // 8  # (Q4_K/Q6_K: ~4.5-6.6 bits per weight)
