"""A transformers ``config.json`` rebuilt from a GGUF file's metadata: :func:`gguf_config`.

The inverse of what llama.cpp's converter writes (:mod:`qstream.exports.gguf.arch`) for the
architectures :func:`qstream.io.checkpoints.gguf_source.open_gguf` names back (llama, and Mixtral
written as llama; qwen2, qwen3, qwen2moe, qwen3moe, gemma2, gemma3, phi3): enough for
transformers to build the model and load the decoded weights under their Hugging Face
names. Every key read is checked (an integer where an integer is due); a missing required
key or another architecture is refused in one line naming it.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from ...errors import StoreError
from .gguf_source import KNOWN, GGUFHeader, architecture, read_header

#: GGUF architecture -> (Hugging Face class, model_type)
MODELS = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "qwen2moe": ("Qwen2MoeForCausalLM", "qwen2_moe"),
    "qwen3moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
    "gemma2": ("Gemma2ForCausalLM", "gemma2"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
    "phi3": ("Phi3ForCausalLM", "phi3"),
}
_MIXTRAL = ("MixtralForCausalLM", "mixtral")
# llama.cpp scales Gemma's queries by 1/sqrt(hidden / heads) in these depths (the 27B
# models), else by 1/sqrt(head_dim): transformers' query_pre_attn_scalar
_GEMMA_27B = {"gemma2": 46, "gemma3": 62}


class _Meta:
    """Checked reads of ``{arch}.*`` and other keys of a header."""

    def __init__(self, header: GGUFHeader, arch: str) -> None:
        self.kv, self.arch, self.path = header.kv, arch, header.path

    def _get(self, key: str, want: type | tuple[type, ...], what: str, required: bool) -> Any:
        full = key.format(arch=self.arch)
        v = self.kv.get(full)
        if v is None:
            if required:
                raise StoreError(f"GGUF file {self.path}: {full} is missing (the config needs it)")
            return None
        if isinstance(v, bool) or not isinstance(v, want):
            raise StoreError(f"GGUF file {self.path}: {full} must be {what}, got {v!r:.60}")
        return v

    def int(self, key: str, required: bool = True) -> int | None:
        """A positive integer key (None when absent and not required)."""
        v = self._get(key, int, "a positive integer", required)
        if v is not None and v < 1:
            raise StoreError(f"GGUF file {self.path}: {key.format(arch=self.arch)} must be a"
                             f" positive integer, got {v}")  # fmt: skip
        return v

    def float(self, key: str, required: bool = False) -> float | None:
        """A number key (None when absent and not required)."""
        v = self._get(key, (int, float), "a number", required)
        # (a float32 key: its shortest decimal, 1e-06 rather than 9.99999997e-07)
        return None if v is None else float(str(np.float32(v)))


def _vocab(header: GGUFHeader, m: _Meta) -> int:
    """The vocabulary size: ``{arch}.vocab_size``, else the embedding's rows, else the
    tokenizer's token count."""
    v = m.int("{arch}.vocab_size", required=False)
    if v is not None:
        return v
    for t in header.tensors:
        if t.name == "token_embd.weight" and len(t.shape) == 2:
            return t.shape[0]
    tokens = header.kv.get("tokenizer.ggml.tokens")
    if tokens is not None and len(tokens):
        return len(tokens)
    raise StoreError(f"GGUF file {header.path}: no vocabulary size ({m.arch}.vocab_size, a"
                     " token_embd.weight tensor or tokenizer.ggml.tokens)")  # fmt: skip


def gguf_config(
    path: str,
    *,
    dtype: str = "float32",
    storage_options: dict[str, Any] | None = None,
    store: str | None = None,
) -> dict[str, Any]:
    """The transformers config.json of the model in the GGUF file ``path`` (a known
    architecture; see the module's text), for its weights decoded to ``dtype``. ``path`` may
    be a URL (its header read by ranges through ``store`` with ``storage_options``)."""
    header = read_header(path, storage_options=storage_options, store=store)
    return config_of(header, dtype=dtype)


def config_of(header: GGUFHeader, *, dtype: str = "float32") -> dict[str, Any]:
    """:func:`gguf_config` of an already parsed header."""
    arch = architecture(header)
    if arch not in KNOWN:
        raise StoreError(
            f"GGUF file {header.path}: no config.json for architecture {arch!r} (known:"
            f" {', '.join(KNOWN)}), so its tensors cannot become a model folder; dequantize"
            " it into a Zarr group instead (a DST not ending in .safetensors), which keeps"
            " every tensor under its name"
        )
    m = _Meta(header, arch)
    names = {t.name for t in header.tensors}
    heads = m.int("{arch}.attention.head_count")
    hidden = m.int("{arch}.embedding_length")
    assert heads is not None and hidden is not None
    layers = m.int("{arch}.block_count")
    experts = m.int("{arch}.expert_count", required=False)
    cls, model_type = _MIXTRAL if arch == "llama" and experts else MODELS[arch]
    cfg: dict[str, Any] = {
        "architectures": [cls],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": m.int("{arch}.feed_forward_length"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": m.int("{arch}.attention.head_count_kv", False) or heads,
        "vocab_size": _vocab(header, m),
        "max_position_embeddings": m.int("{arch}.context_length", False) or 2048,
        "rms_norm_eps": m.float("{arch}.attention.layer_norm_rms_epsilon") or 1e-6,
        "tie_word_embeddings": "output.weight" not in names,
        "torch_dtype": dtype,
    }
    theta = m.float("{arch}.rope.freq_base")
    cfg["rope_theta"] = theta or (1_000_000.0 if arch == "gemma3" else 10000.0)
    head_dim = m.int("{arch}.attention.key_length", required=False)
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    for key, field in (("tokenizer.ggml.bos_token_id", "bos_token_id"),
                       ("tokenizer.ggml.eos_token_id", "eos_token_id"),
                       ("tokenizer.ggml.padding_token_id", "pad_token_id")):  # fmt: skip
        v = header.kv.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            cfg[field] = v
    if experts:
        used = m.int("{arch}.expert_used_count")
        if arch == "llama":
            cfg.update(num_local_experts=experts, num_experts_per_tok=used)
        else:
            cfg.update(num_experts=experts, num_experts_per_tok=used)
    if arch in ("qwen2moe", "qwen3moe"):
        ff = m.int("{arch}.expert_feed_forward_length", required=False)
        if ff is not None:
            cfg["moe_intermediate_size"] = ff
        shared = m.int("{arch}.expert_shared_feed_forward_length", required=False)
        if shared is not None:
            cfg["shared_expert_intermediate_size"] = shared
    if arch in ("gemma2", "gemma3"):
        _gemma(cfg, m, arch, layers or 0, hidden // heads)
    if arch == "phi3":
        orig = m.int("{arch}.rope.scaling.original_context_length", required=False)
        if orig is not None:
            cfg["original_max_position_embeddings"] = orig
        rot = m.int("{arch}.rope.dimension_count", required=False)
        if rot is not None:
            cfg["partial_rotary_factor"] = rot * heads / hidden
        window = m._get("{arch}.attention.sliding_window", int, "an integer", False)
        cfg["sliding_window"] = window or None
    if arch == "llama" and (scale := m.float("{arch}.rope.scaling.factor")) is not None:
        kind = header.kv.get(f"{arch}.rope.scaling.type")
        if kind == "linear":
            cfg["rope_scaling"] = {"rope_type": "linear", "factor": scale}
    return cfg


def _gemma(cfg: dict[str, Any], m: _Meta, arch: str, layers: int, per_head: int) -> None:
    """Gemma's extra fields: soft-capping, sliding window, query scaling, local rope base."""
    head_dim = cfg.get("head_dim") or per_head
    cfg["head_dim"] = head_dim
    cfg["query_pre_attn_scalar"] = per_head if layers == _GEMMA_27B[arch] else head_dim
    for key, field in (("{arch}.attn_logit_softcapping", "attn_logit_softcapping"),
                       ("{arch}.final_logit_softcapping", "final_logit_softcapping")):  # fmt: skip
        cfg[field] = m.float(key)
    window = m.int("{arch}.attention.sliding_window", required=False)
    if window is not None:
        cfg["sliding_window"] = window
    swa = m.float("{arch}.rope.freq_base_swa")
    if arch == "gemma3" and swa is not None:
        cfg["rope_local_base_freq"] = swa


def describe_gguf(
    path: str, *, storage_options: dict[str, Any] | None = None, store: str | None = None
) -> dict[str, Any]:
    """What any GGUF file holds, from its checked header alone (for ``qstream inspect``):
    its architecture, whether its tensors are named back to Hugging Face names, the tensor
    count per GGML type, the parameter count, the file's size, the tokenizer and model
    summary (tokenizer model, vocabulary size, context length, block count, expert count;
    None where the file does not say) and ``tensor_list``: every tensor's name, GGML type,
    shape (NumPy order, slowest axis first: gguf-py's ``shape`` reversed) and stored bytes,
    in file order. ``path`` may be a URL (its header read by ranges through ``store`` with
    ``storage_options``)."""
    header = read_header(path, storage_options=storage_options, store=store)
    arch = architecture(header)
    types: dict[str, int] = {}
    params = 0
    listed = []
    kv = header.kv
    measured = _recorded_sqnr(kv.get("qstream.sqnr_db"))
    for t in header.tensors:
        types[t.type] = types.get(t.type, 0) + 1
        params += t.rows * t.shape[-1]
        listed.append({"name": t.name, "type": t.type, "shape": list(t.shape), "bytes": t.nbytes})
        if t.name in measured:
            listed[-1]["sqnr_db"] = measured[t.name]

    def count(key: str) -> int | None:
        v = kv.get(f"{arch}.{key}") if arch else None
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    name = kv.get("general.name")
    tokenizer = kv.get("tokenizer.ggml.model")
    tokens = kv.get("tokenizer.ggml.tokens")
    vocab = count("vocab_size")
    if vocab is None and tokens is not None and not isinstance(tokens, str):
        vocab = len(tokens)
    return {
        "file": path,
        "format": "gguf",
        "version": header.version,
        "architecture": arch,
        "name": name if isinstance(name, str) else None,
        "hf_names": arch in KNOWN,
        "tensors": len(header.tensors),
        "types": dict(sorted(types.items(), key=lambda item: -item[1])),
        "parameters": params,
        "bytes": sum(t["bytes"] for t in listed),  # (its tensors', as convert counts them)
        "file_bytes": header.size,  # (the tensors, the header and the alignment padding)
        "tokenizer": tokenizer if isinstance(tokenizer, str) else None,
        "vocab_size": vocab,
        "context_length": count("context_length"),
        "block_count": count("block_count"),
        "expert_count": count("expert_count"),
        "written_by": "qstream" if "qstream.export" in kv else "another tool",
        "quantization": gguf_quantization(kv.get("general.file_type"), types),
        "tensor_list": listed,
    }


def _recorded_sqnr(text: object) -> dict[str, float]:
    """The SQNR (dB) qstream recorded for each tensor it quantized into a GGUF file
    (``qstream.sqnr_db``: JSON, GGUF name -> dB to 0.01, ``"inf"`` for an exact tensor);
    nothing for a file without it, or with anything else there."""
    try:
        found = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    out = {}
    for name, v in found.items():
        if v == "inf":
            out[name] = math.inf
        elif isinstance(v, int | float) and not isinstance(v, bool):
            out[name] = float(v)
    return out


# llama.cpp's ``general.file_type`` (enum llama_ftype) -> its name
_FILE_TYPES = dict(enumerate([
    "F32", "F16", "Q4_0", "Q4_1", "-", "-", "-", "Q8_0", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S",
    "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ2_XXS", "IQ2_XS",
    "Q2_K_S", "IQ3_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ3_M", "IQ2_S", "IQ2_M",
    "IQ4_XS", "IQ1_M", "BF16", "-", "-", "-", "TQ1_0", "TQ2_0", "MXFP4_MOE", "NVFP4", "Q1_0",
]))  # fmt: skip


def gguf_quantization(file_type: Any, types: dict[str, int]) -> str:
    """The GGUF file's quantization as llama.cpp names it (``GGUF Q4_K_M``: its
    ``general.file_type``), else its most common tensor type."""
    name = _FILE_TYPES.get(file_type) if isinstance(file_type, int) else None
    if name and name != "-":
        return f"GGUF {name}"
    return f"GGUF {max(types, key=lambda t: types[t])} (most tensors)" if types else "GGUF"
