"""A small Llama-shaped model folder as Hugging Face ships one (``model.safetensors``,
``config.json`` and a SentencePiece ``tokenizer.model``), made with NumPy and sentencepiece: bf16
by default, an MLP of 704 columns (not a multiple of 128), untied embeddings."""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
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


@functools.cache
def _trained_tokenizer() -> str:
    """A Llama-2 style SentencePiece BPE model of 256 pieces (<unk>, <s>, </s>), trained
    once per process; its path."""
    import random

    import sentencepiece as spm

    where = tempfile.mkdtemp(prefix="qstream-sp-")
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 8))) for _ in range(400)]
    text = [" ".join(rng.choices(words, k=20)) for _ in range(200)]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_prefix=os.path.join(where, "sp"), vocab_size=256,
        model_type="bpe", character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        minloglevel=2,
    )  # fmt: skip
    return os.path.join(where, "sp.model")


def write_tokenizer(folder: str) -> str:
    """Put the tiny SentencePiece ``tokenizer.model`` into ``folder``; returns its path."""
    os.makedirs(folder, exist_ok=True)
    return shutil.copy(_trained_tokenizer(), os.path.join(folder, "tokenizer.model"))


def write_llama(
    folder: str,
    *,
    dtype: Any = ml_dtypes.bfloat16,
    hidden: int = 256,
    intermediate: int = 704,
    config: dict[str, Any] | None = None,
    tokenizer: bool = True,
) -> str:
    """Write the model into ``folder`` (made if absent), with its tokenizer unless not
    ``tokenizer``; returns ``folder``."""
    os.makedirs(folder, exist_ok=True)
    if tokenizer:
        write_tokenizer(folder)
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
