"""After ``qstream warm-up``, the common jobs compile nothing: a checkpoint converted into
packs, a weight quantized per tensor (rows longer than a tile) and in several row blocks, a
GGUF K-quant mix (with its fallback types) and Q8_0. Slow: the warm-up compiles for ~1.5 min
on two cores (``pytest -m slow``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import zarr
from safetensors.numpy import save_file

LISTEN = textwrap.dedent(
    """
    import sys
    from numba.core import event
    class Seen(event.Listener):
        def on_start(self, ev):
            f = ev.data["dispatcher"].py_func
            if f.__module__.startswith("qstream."):
                print("COMPILED", f.__qualname__, file=sys.stderr)
        def on_end(self, ev):
            pass
    event.register("numba:compile", Seen())
    sys.argv = ["qstream", *sys.argv[1:]]
    from cli.main import console
    console()
    """
)

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
    "num_hidden_layers": 2, "vocab_size": 256, "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False, "max_position_embeddings": 128, "rope_theta": 10000.0,
}  # fmt: skip


@pytest.mark.slow
def test_after_warm_up_the_common_jobs_compile_no_kernel(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "cli", "warm-up", "--json"], env=env,
                       capture_output=True, text=True, timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["bytecode"] is not None
    rng = np.random.default_rng(1)
    experts = {f"model.layers.0.mlp.experts.{i}.up_proj.weight": rng.standard_normal(
        (256, 512)).astype(np.float32) for i in range(64)}  # fmt: skip
    experts["lm_head.weight"] = rng.standard_normal((2000, 512)).astype(np.float32)
    save_file(experts, str(tmp_path / "moe.safetensors"))
    zarr.save_array(str(tmp_path / "w.zarr"), rng.standard_normal((3000, 2000)).astype(np.float32))
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps(LLAMA))
    h, v = 64, 256
    weights = {
        "model.embed_tokens.weight": (v, h),
        "lm_head.weight": (v, h),
        "model.norm.weight": (h,),
    }
    for i in range(2):
        p = f"model.layers.{i}"
        weights.update({f"{p}.{n}.weight": (h, h) for n in (
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")})  # fmt: skip
        weights.update({f"{p}.input_layernorm.weight": (h,),
                        f"{p}.post_attention_layernorm.weight": (h,)})  # fmt: skip
    save_file({k: rng.standard_normal(s).astype(np.float32) for k, s in weights.items()},
              str(llama / "model.safetensors"))  # fmt: skip
    jobs = [
        ["convert", "moe.safetensors", "moe.zarr"],
        ["quantize", "w.zarr", "w8.zarr"],
        ["quantize", "w.zarr", "wc.zarr", "--axis", "0"],
        ["convert", "llama", "l.gguf", "--gguf-type", "Q4_K_M", "--no-tokenizer"],
        ["convert", "llama", "l8.gguf", "--gguf-type", "Q8_0", "--no-tokenizer"],
    ]
    for job in jobs:
        r = subprocess.run([sys.executable, "-c", LISTEN, *job, "-q"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)  # fmt: skip
        assert r.returncode == 0, (job, r.stderr)
        assert "COMPILED" not in r.stderr, (job, r.stderr)
