"""Llama-style models (``model_type`` llama / mistral) as llama.cpp's converter writes them
to GGUF: tensor names (``model.layers.0.self_attn.q_proj.weight`` -> ``blk.0.attn_q.weight``),
the rows of q/k projections permuted, the hyper-parameters as ``llama.*`` keys."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..errors import InvalidParameterError
from .gguf_file import F32, U32, Value

_LLAMA = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
}
_LLAMA_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


class Llama:
    """Names and q/k row order of a Llama-style model, as llama.cpp's converter writes them."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.heads = int(config["num_attention_heads"])
        self.kv_heads = int(config.get("num_key_value_heads") or self.heads)

    def name(self, hf: str) -> str:
        """The GGUF name of the Hugging Face tensor ``hf`` (refused when llama.cpp's Llama
        loader would not know it)."""
        base, dot, suffix = hf.rpartition(".")
        if suffix not in ("weight", "bias"):
            base, suffix = hf, ""
        if base in _LLAMA:
            return _LLAMA[base] + dot + suffix
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", base)
        if m and m.group(2) in _LLAMA_LAYER:
            return f"blk.{m.group(1)}.{_LLAMA_LAYER[m.group(2)]}{dot}{suffix}"
        raise InvalidParameterError(
            f"{hf}: a tensor llama.cpp's Llama loader does not know; keep it out of the"
            " checkpoint, or export without --config to keep the checkpoint's own names"
        )

    def heads_of(self, hf: str) -> int | None:
        """How many heads the rows of ``hf`` are permuted over (q and k projections)."""
        if re.search(r"self_attn\.q_proj\.(weight|bias)$", hf):
            return self.heads
        if re.search(r"self_attn\.k_proj\.(weight|bias)$", hf):
            return self.kv_heads
        return None

    def keys(self) -> dict[str, Value]:
        """The model's hyper-parameters as GGUF ``llama.*`` keys."""
        c = self.config
        hidden = int(c["hidden_size"])
        rope = c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta", 1e4)
        return {
            "llama.block_count": (U32, int(c["num_hidden_layers"])),
            "llama.context_length": (U32, int(c.get("max_position_embeddings", 2048))),
            "llama.embedding_length": (U32, hidden),
            "llama.feed_forward_length": (U32, int(c["intermediate_size"])),
            "llama.attention.head_count": (U32, self.heads),
            "llama.attention.head_count_kv": (U32, self.kv_heads),
            "llama.rope.freq_base": (F32, float(rope)),
            "llama.attention.layer_norm_rms_epsilon": (F32, float(c.get("rms_norm_eps", 1e-5))),
            "llama.vocab_size": (U32, int(c["vocab_size"])),
            "llama.rope.dimension_count": (
                U32,
                int(c.get("head_dim") or hidden // self.heads),
            ),
        }


def row_order(rows: int, heads: int) -> np.ndarray:
    """llama.cpp's q/k permutation of rows: within each head, the two rotary halves
    interleaved (``reshape(heads, 2, d/2).swapaxes(1, 2)``)."""
    return np.arange(rows).reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(-1)


def llama(config: dict[str, Any] | None) -> Llama | None:
    """The Llama naming of a model ``config`` of type llama or mistral, else None."""
    if not config:
        return None
    kind = str(config.get("model_type", "")).lower()
    return Llama(config) if kind in ("llama", "mistral") else None
