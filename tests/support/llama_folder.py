"""A small Llama-shaped model folder as Hugging Face ships one (``model.safetensors`` and
``config.json``), made with NumPy alone: bf16 by default, an MLP of 704 columns (not a
multiple of 128), untied embeddings."""

from __future__ import annotations

import json
import os
from typing import Any

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file


def llama_tensors(hidden: int = 256, intermediate: int = 704, layers: int = 2, vocab: int = 512):
    """Tensor names and shapes of the model, in Hugging Face's order."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (hidden,),
                p + "self_attn.q_proj.weight": (hidden, hidden),
                p + "self_attn.k_proj.weight": (hidden // 2, hidden),
                p + "self_attn.v_proj.weight": (hidden // 2, hidden),
                p + "self_attn.o_proj.weight": (hidden, hidden),
                p + "post_attention_layernorm.weight": (hidden,),
                p + "mlp.gate_proj.weight": (intermediate, hidden),
                p + "mlp.up_proj.weight": (intermediate, hidden),
                p + "mlp.down_proj.weight": (hidden, intermediate),
            }
        )
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def write_llama(
    folder: str,
    *,
    dtype: Any = ml_dtypes.bfloat16,
    hidden: int = 256,
    intermediate: int = 704,
    config: dict[str, Any] | None = None,
) -> str:
    """Write the model into ``folder`` (made if absent); returns ``folder``."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = {
        name: (rng.standard_normal(shape) * 0.05).astype(dtype)
        for name, shape in llama_tensors(hidden, intermediate).items()
    }
    save_file(arrays, os.path.join(folder, "model.safetensors"))
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        **(config or {}),
    }
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    return folder
