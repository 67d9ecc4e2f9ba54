"""Tensor names, transforms and plain types of GGUF files as llama.cpp's converter writes them,
per architecture (data and small functions for the writer): :func:`gguf_name`,
:func:`transform_of`, :func:`plain_type`, :func:`size_label`."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidParameterError

_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_LAYER = {
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
_QK_NORM = {"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
_GEMMA = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
_MOE = {
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}
#: the per-layer Hugging Face name -> GGUF name of each architecture
LAYER_NAMES: dict[str, dict[str, str]] = {
    "llama": {**_LAYER, "block_sparse_moe.gate": "ffn_gate_inp", "mlp.gate": "ffn_gate_inp"},
    "qwen2": _LAYER,
    "qwen3": {**_LAYER, **_QK_NORM},
    "qwen2moe": {**_LAYER, **_MOE},
    "qwen3moe": {**_LAYER, **_QK_NORM, **_MOE},
    "gemma2": {**_LAYER, **_GEMMA},
    "gemma3": {**_LAYER, **_GEMMA, **_QK_NORM},
    "phi3": {
        "input_layernorm": "attn_norm",
        "self_attn.qkv_proj": "attn_qkv",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    },
}
#: per-expert tensors (``experts.{i}.{w}``) merged into one 3-D tensor per layer: the GGUF name
EXPERTS = {
    "w1": "ffn_gate_exps", "w2": "ffn_down_exps", "w3": "ffn_up_exps",
    "gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps",
}  # fmt: skip
_EXPERT = re.compile(
    r"model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(\w+)\.weight"
)
_FUSED_EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)")


@dataclass(frozen=True)
class Transform:
    """What the converter does to a tensor's values: ``add`` (Gemma norms: +1), ``heads``
    (llama q/k rows permuted over that many heads), ``rows`` (Gemma 3's embedding: the
    first ``rows`` rows kept)."""

    add: float = 0.0
    heads: int | None = None
    rows: int | None = None


def skipped(arch: str, hf: str) -> bool:
    """Whether the converter leaves the Hugging Face tensor ``hf`` out (Gemma 2's lm_head;
    rotary caches)."""
    return (arch == "gemma2" and hf == "lm_head.weight") or hf.endswith("rotary_emb.inv_freq")


def gguf_name(arch: str, hf: str) -> str:
    """The GGUF name of the Hugging Face tensor ``hf`` in architecture ``arch``; a merged
    expert tensor: ``blk.N.ffn_{gate,up,down}_exps.weight`` (see :func:`expert_of`); a name
    llama.cpp would not know is refused."""
    m = _EXPERT.fullmatch(hf)
    if m and m.group(3) in EXPERTS:
        return f"blk.{m.group(1)}.{EXPERTS[m.group(3)]}.weight"
    base, dot, suffix = hf.rpartition(".")
    if suffix not in ("weight", "bias"):
        base, dot, suffix = hf, "", ""
    if base in _TOP:
        return _TOP[base] + dot + suffix
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", base)
    if m and m.group(2) in LAYER_NAMES[arch]:
        return f"blk.{m.group(1)}.{LAYER_NAMES[arch][m.group(2)]}{dot}{suffix}"
    raise InvalidParameterError(f"{hf}: a tensor llama.cpp's {arch} loader does not know")


def expert_of(hf: str) -> tuple[int, int, str] | None:
    """(layer, expert, projection) of a per-expert tensor, else None: the writer stacks the
    experts 0..n-1 of a layer and projection along a new first axis, in expert order."""
    m = _EXPERT.fullmatch(hf)
    return (int(m.group(1)), int(m.group(2)), m.group(3)) if m else None


def fused_experts(hf: str) -> bool:
    """Whether ``hf`` holds all of a layer's experts already (transformers 5's fused
    ``mlp.experts.gate_up_proj`` / ``down_proj``): not supported by these maps yet."""
    return _FUSED_EXPERT.match(hf) is not None


def transform_of(
    arch: str, hf: str, heads: int, kv_heads: int, n_vocab: int | None = None
) -> Transform:
    """The converter's value transform of tensor ``hf`` (see :class:`Transform`)."""
    add = 1.0 if arch in ("gemma2", "gemma3") and hf.endswith("norm.weight") else 0.0
    rows = n_vocab if arch == "gemma3" and "embed_tokens.weight" in hf else None
    permute = None
    if arch == "llama":
        if hf.endswith(("q_proj.weight", "q_proj.bias")):
            permute = heads
        elif hf.endswith(("k_proj.weight", "k_proj.bias")):
            permute = kv_heads
    return Transform(add, permute, rows)


def plain_type(name: str, shape: tuple[int, ...], asked: str) -> str:
    """The GGUF type of a tensor written unquantized, as the converter chooses it: 1-D
    tensors, norms and MoE router gates F32 whatever the source dtype; else ``asked``
    (F32, F16 or BF16)."""
    if len(shape) <= 1 or name.endswith(("_norm.weight", "ffn_gate_inp.weight",
                                         "ffn_gate_inp_shexp.weight")):  # fmt: skip
        return "F32"
    return asked


def weight_count(params: int, min_digits: int = 2) -> str:
    """A parameter count in the converter's rounded notation (``113K``, ``8.3M``, ``1.2B``)."""
    scale, suffix = 1e-3, "K"
    for limit, s, x in ((1e12, 1e-12, "T"), (1e9, 1e-9, "B"), (1e6, 1e-6, "M")):
        if params > limit:
            scale, suffix = s, x
            break
    scaled = params * scale
    digits = max(min_digits - len(str(round(scaled)).lstrip("0")), 0)
    return f"{scaled:.{digits}f}{suffix}"


def size_label(tensors: Iterable[tuple[str, tuple[int, ...]]]) -> str | None:
    """``general.size_label`` of a file of ``tensors`` (GGUF name, shape as written; merged
    experts 3-D): the total count, or ``{experts}x{per-expert + shared}`` for an MoE; None
    for no parameters."""
    total = shared = expert = expert_sum = n_expert = 0
    for name, shape in tensors:
        size = math.prod(shape)
        if "_exps." in name and len(shape) >= 3:
            count = shape[-2 if ".bias" in name else -3]
            expert += size // count
            expert_sum += count
            n_expert += 1
        else:
            shared += size
        total += size
    if total <= 0:
        return None
    if n_expert:
        return f"{expert_sum // n_expert}x{weight_count(shared + expert)}"
    return weight_count(total)


def row_order(rows: int, heads: int) -> np.ndarray:
    """llama.cpp's q/k permutation of rows: within each head, the two rotary halves
    interleaved (``reshape(heads, 2, d/2).swapaxes(1, 2)``)."""
    return np.arange(rows).reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(-1)
