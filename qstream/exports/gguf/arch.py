"""A model's ``general.*`` and architecture keys as llama.cpp's converter writes them to GGUF,
from its config.json, every field read checked first: :func:`architecture_of`,
:func:`arch_items`, :func:`general_items`.

Supported: llama (and Mistral, Mixtral: llama.cpp writes them as ``llama``), qwen2, qwen3,
qwen2moe, qwen3moe, gemma2, gemma3, phi3. Tensor names and transforms are in
:mod:`qstream.compat.gguf_names`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ...errors import InvalidParameterError
from .items import ARRAY, BOOL, FLOAT32, STRING, UINT32, MetaItem

#: Hugging Face architecture (config.json ``architectures[0]``) -> GGUF architecture
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "MixtralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2MoeForCausalLM": "qwen2moe",
    "Qwen3MoeForCausalLM": "qwen3moe",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
}
#: llama.cpp's ``LlamaFileType`` of a file mostly of each type
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "BF16": 32}
_U32 = (1 << 32) - 1
_F32_MAX = 3.4028234663852886e38

#: keys the converter writes in cases these functions do not produce yet, per architecture
NOT_PRODUCED = {
    "all": (
        "general.basename / finetune / version / organization and a size label parsed from the"
        " folder or _name_or_path (get_model_id_components); README model-card fields"
        " (license, tags, languages, base models, datasets)",
        "rope scaling keys of rope_type yarn with extrapolation/attention/beta factors",
        "rope.dimension_sections (mrope), pooling_type (sentence-transformers modules.json)",
        "expert_group_count / expert_group_used_count / expert_gating_func",
    ),
    "llama": ("rope_freqs.weight (an extra tensor for rope_type llama3)",),
    "phi3": ("rope_factors_long/short tensors and longrope attn factor (128k models)",),
    "qwen3": ("rerank models' pooling_type, classifier labels and rerank chat template",),
}


class Fields:
    """Checked reads of a config.json (``where``: its path, named in every refusal)."""

    def __init__(self, config: Any, where: str) -> None:
        if not isinstance(config, dict):
            raise InvalidParameterError(f"{where}: a model config is a JSON object")
        self.config, self.where = config, where

    def bad(self, key: str, want: str) -> InvalidParameterError:
        """The refusal of field ``key``, which must be ``want``."""
        got = "missing" if key not in self.config else f"{self.config[key]!r:.60}"
        return InvalidParameterError(f"{self.where}: {key} must be {want}, got {got}")

    def find(self, keys: Iterable[str]) -> tuple[str, Any] | None:
        """The first of ``keys`` present (its name and value), as the converter looks."""
        for k in keys:
            if k in self.config:
                return k, self.config[k]
        return None

    def int(self, keys: str | Iterable[str], *, required: bool = True, lo: int = 1,
            default: int | None = None) -> int | None:  # fmt: skip
        """An integer field in ``lo``..2**32-1 (the first of ``keys`` present)."""
        names = [keys] if isinstance(keys, str) else list(keys)
        found = self.find(names)
        if found is None or found[1] is None:
            if required and default is None:
                raise self.bad(names[0], f"an integer in {lo}..{_U32}")
            return default
        key, v = found
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= _U32:
            raise self.bad(key, f"an integer in {lo}..{_U32}")
        return v

    def float(self, keys: str | Iterable[str], *, required: bool = True,
              default: float | None = None) -> float | None:  # fmt: skip
        """A finite float32 field > 0 (the first of ``keys`` present)."""
        names = [keys] if isinstance(keys, str) else list(keys)
        found = self.find(names)
        if found is None or found[1] is None:
            if required and default is None:
                raise self.bad(names[0], "a finite number > 0")
            return default
        key, v = found
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.bad(key, "a finite number > 0")
        if not (math.isfinite(v) and 0 < v <= _F32_MAX):
            raise self.bad(key, "a finite number > 0 (a float32)")
        return float(v)


def architecture_of(config: dict[str, Any], where: str = "config.json") -> str:
    """The GGUF architecture of a model ``config`` (its ``architectures[0]``); any other is
    refused, listing the supported ones."""
    names = config.get("architectures")
    if not isinstance(names, list) or not names or not isinstance(names[0], str):
        raise InvalidParameterError(
            f"{where}: architectures must be a list naming the model class (one of"
            f" {', '.join(ARCHITECTURES)}), got {names!r:.80}"
        )
    if names[0] not in ARCHITECTURES:
        raise InvalidParameterError(
            f"{where}: a {names[0]:.80} is not supported for GGUF; supported:"
            f" {', '.join(ARCHITECTURES)}"
        )
    return ARCHITECTURES[names[0]]


class _Keys:
    """Keys in order; a key written again keeps its place and takes the new value (as
    gguf-py's writer does)."""

    def __init__(self, arch: str) -> None:
        self.arch = arch
        self.items: dict[str, MetaItem] = {}

    def add(self, key: str, kind: int, value: Any, element: int | None = None) -> None:
        full = key.format(arch=self.arch)
        self.items[full] = MetaItem(full, kind, value, element)


def _rope(c: Fields) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rope parameters as the converter gathers them: all, and those of full attention."""
    raw = c.config.get("rope_parameters", c.config.get("rope_scaling")) or {}
    if not isinstance(raw, dict):
        raise c.bad("rope_parameters", "an object")
    rope = dict(raw)
    if "full_attention" not in rope and "sliding_attention" not in rope:
        local = c.find(("local_rope_theta", "rope_local_theta", "rope_theta_local",
                        "swa_rope_theta", "rope_local_base_freq"))  # fmt: skip
        theta = c.find(("global_rope_theta", "rope_global_theta", "rope_theta_global",
                        "rope_theta", "rotary_emb_base"))  # fmt: skip
        if local is not None and local[1] is not None:
            rope["sliding_attention"] = {"rope_theta": local[1]}
        if "rope_theta" not in rope and theta is not None and theta[1] is not None:
            rope["rope_theta"] = theta[1]
        if "rope_type" not in rope and rope.get("type") is not None:
            rope["rope_type"] = rope["type"]
        for k in ("partial_rotary_factor", "original_max_position_embeddings"):
            if k not in rope and c.config.get(k) is not None:
                rope[k] = c.config[k]
    full = rope.get("full_attention", rope)
    if not isinstance(full, dict):
        raise c.bad("rope_parameters.full_attention", "an object")
    return rope, full


def _theta(c: Fields, params: dict[str, Any], name: str) -> float | None:
    v = params.get("rope_theta")
    if v is None:
        return None
    return Fields({name: v}, c.where).float(name)


def _base(k: _Keys, c: Fields) -> None:
    """The keys every text model gets (the converter's ``TextModel.set_gguf_parameters``)."""
    k.add("{arch}.block_count", UINT32, c.int(("n_layers", "num_hidden_layers", "n_layer",
                                               "num_layers")))  # fmt: skip
    pairs = (
        ("{arch}.context_length", ("max_position_embeddings", "n_ctx", "n_positions",
                                   "max_length", "max_sequence_length", "model_max_length")),
        ("{arch}.embedding_length", ("hidden_size", "n_embd", "dim")),
        ("{arch}.feed_forward_length", ("prefix_dense_intermediate_size",
                                        "dense_intermediate_size", "intermediate_size",
                                        "n_inner", "hidden_dim")),
        ("{arch}.attention.head_count", ("num_attention_heads", "n_head", "n_heads")),
        ("{arch}.attention.head_count_kv", ("num_key_value_heads", "n_kv_heads")),
    )  # fmt: skip
    for key, names in pairs:
        v = c.int(names, required=False)
        if v is not None:
            k.add(key, UINT32, v)
    if c.config.get("is_causal") is False:
        k.add("{arch}.attention.causal", BOOL, False)
    rope, full = _rope(c)
    kind = full.get("rope_type")
    factor = full.get("factor")
    if kind == "linear" and factor is not None:
        k.add("{arch}.rope.scaling.type", STRING, "linear")
        k.add("{arch}.rope.scaling.factor", FLOAT32, Fields(full, c.where).float("factor"))
    elif kind == "yarn" and factor is not None:
        k.add("{arch}.rope.scaling.type", STRING, "yarn")
        k.add("{arch}.rope.scaling.factor", FLOAT32, Fields(full, c.where).float("factor"))
        orig = Fields(full, c.where).int("original_max_position_embeddings")
        k.add("{arch}.rope.scaling.original_context_length", UINT32, orig)
    elif kind in ("su", "longrope"):
        k.add("{arch}.rope.scaling.type", STRING, "longrope")
    theta = _theta(c, full, "rope_theta")
    if theta is not None:
        k.add("{arch}.rope.freq_base", FLOAT32, theta)
    swa = rope.get("sliding_attention", {})
    if isinstance(swa, dict) and _theta(c, swa, "rope_theta") is not None:
        k.add("{arch}.rope.freq_base_swa", FLOAT32, _theta(c, swa, "rope_theta"))
    for key, names in (("{arch}.attention.layer_norm_rms_epsilon", ("rms_norm_eps", "norm_eps")),
                       ("{arch}.attention.layer_norm_epsilon", ("layer_norm_eps",
                        "layer_norm_epsilon", "norm_epsilon"))):  # fmt: skip
        eps = c.float(names, required=False)
        if eps is not None:
            k.add(key, FLOAT32, eps)
    experts = c.int(("num_local_experts", "num_experts", "n_routed_experts"), required=False)
    if experts is not None:
        k.add("{arch}.expert_count", UINT32, experts)
    used = c.int(("num_experts_per_tok", "num_experts_per_token", "top_k_experts"),
                 required=False)  # fmt: skip
    if used is not None:
        k.add("{arch}.expert_used_count", UINT32, used)
    head_dim = c.int("head_dim", required=False)
    if head_dim is not None:
        k.add("{arch}.attention.key_length", UINT32, head_dim)
        k.add("{arch}.attention.value_length", UINT32, head_dim)


def _gemma2(k: _Keys, c: Fields) -> None:
    k.add("{arch}.context_length", UINT32, c.int("max_position_embeddings"))
    k.add("{arch}.embedding_length", UINT32, c.int("hidden_size"))
    k.add("{arch}.block_count", UINT32, c.int("num_hidden_layers"))
    k.add("{arch}.feed_forward_length", UINT32, c.int("intermediate_size"))
    heads = c.int("num_attention_heads")
    k.add("{arch}.attention.head_count", UINT32, heads)
    kv = c.int("num_key_value_heads", required=False) or heads
    k.add("{arch}.attention.head_count_kv", UINT32, kv)
    k.add("{arch}.attention.layer_norm_rms_epsilon", FLOAT32, c.float("rms_norm_eps"))
    k.add("{arch}.attention.key_length", UINT32, c.int("head_dim"))
    k.add("{arch}.attention.value_length", UINT32, c.int("head_dim"))


def _phi3(k: _Keys, c: Fields) -> None:
    embd = c.int(("hidden_size", "n_embd"))
    heads = c.int(("num_attention_heads", "n_head"))
    rope, full = _rope(c)
    orig = Fields(rope, c.where + " (rope parameters)").int("original_max_position_embeddings")
    pct = rope.get("partial_rotary_factor", 1.0)
    if isinstance(pct, bool) or not isinstance(pct, int | float) or not 0 < pct <= 1:
        raise c.bad("partial_rotary_factor", "a number in (0, 1]")
    k.add("{arch}.context_length", UINT32, c.int(("n_positions", "max_position_embeddings")))
    k.add("{arch}.rope.scaling.original_context_length", UINT32, orig)
    k.add("{arch}.embedding_length", UINT32, embd)
    k.add("{arch}.feed_forward_length", UINT32, c.int("intermediate_size"))
    k.add("{arch}.block_count", UINT32, c.int(("n_layers", "num_hidden_layers", "n_layer",
                                               "num_layers")))  # fmt: skip
    k.add("{arch}.attention.head_count", UINT32, heads)
    k.add("{arch}.attention.head_count_kv", UINT32, c.int(("num_key_value_heads", "n_head_kv")))
    k.add("{arch}.attention.layer_norm_rms_epsilon", FLOAT32, c.float("rms_norm_eps"))
    k.add("{arch}.rope.dimension_count", UINT32, int(pct * (embd or 0)) // (heads or 1))
    theta = _theta(c, full, "rope_theta")
    if theta is None:
        raise c.bad("rope_theta", "a finite number > 0")
    k.add("{arch}.rope.freq_base", FLOAT32, theta)


def arch_items(
    config: dict[str, Any], file_type: str, where: str = "config.json"
) -> list[MetaItem]:
    """The architecture keys (``{arch}.*``) and ``general.file_type`` llama.cpp's converter
    writes for a model ``config`` (read from ``where``) in a file mostly of GGUF type
    ``file_type`` (F32, F16, BF16, Q8_0, Q4_0, Q4_1), in its order; every field read is
    checked first (:class:`InvalidParameterError` naming the field and ``where``)."""
    arch = architecture_of(config, where)
    if file_type not in FILE_TYPES:
        raise InvalidParameterError(f"file type {file_type!r}: one of {', '.join(FILE_TYPES)}")
    c, k = Fields(config, where), _Keys(arch)
    ftype = FILE_TYPES[file_type]
    if arch == "gemma2":
        _gemma2(k, c)
        k.add("general.file_type", UINT32, ftype)
        k.add("{arch}.attn_logit_softcapping", FLOAT32, c.float("attn_logit_softcapping"))
        k.add("{arch}.final_logit_softcapping", FLOAT32, c.float("final_logit_softcapping"))
        k.add("{arch}.attention.sliding_window", UINT32, c.int("sliding_window"))
        return list(k.items.values())
    if arch == "phi3":
        _phi3(k, c)
        k.add("general.file_type", UINT32, ftype)
        k.add("{arch}.attention.sliding_window", UINT32,
              c.int("sliding_window", required=False, lo=0, default=0))  # fmt: skip
        return list(k.items.values())
    _base(k, c)
    k.add("general.file_type", UINT32, ftype)
    if arch == "llama":
        k.add("{arch}.vocab_size", UINT32, c.int("vocab_size"))
        heads = c.int("num_attention_heads")
        dim = c.int("head_dim", required=False) or (c.int("hidden_size") or 0) // (heads or 1)
        k.add("{arch}.rope.dimension_count", UINT32, dim)
    elif arch in ("qwen2moe", "qwen3moe"):
        for key, name in (("{arch}.expert_feed_forward_length", "moe_intermediate_size"),
                          ("{arch}.expert_shared_feed_forward_length",
                           "shared_expert_intermediate_size")):  # fmt: skip
            v = c.int(name, required=False)
            if v is not None:
                k.add(key, UINT32, v)
    elif arch == "gemma3":
        _, full = _rope(c)
        k.add("{arch}.context_length", UINT32, c.int("max_position_embeddings", default=131072))
        k.add("{arch}.attention.head_count", UINT32, c.int("num_attention_heads", default=8))
        eps = c.float("rms_norm_eps", default=1e-6)
        k.add("{arch}.attention.layer_norm_rms_epsilon", FLOAT32, eps)
        k.add("{arch}.attention.key_length", UINT32, c.int("head_dim", default=256))
        k.add("{arch}.attention.value_length", UINT32, c.int("head_dim", default=256))
        k.add("{arch}.rope.freq_base", FLOAT32, _theta(c, full, "rope_theta") or 1_000_000.0)
        if config.get("attn_logit_softcapping") is not None:
            raise c.bad("attn_logit_softcapping", "absent (Gemma 3 has none)")
        if config.get("final_logit_softcapping"):
            soft = c.float("final_logit_softcapping")
            k.add("{arch}.final_logit_softcapping", FLOAT32, soft)
        if config.get("sliding_window_pattern") != 1:
            k.add("{arch}.attention.sliding_window", UINT32, c.int("sliding_window"))
        k.add("{arch}.attention.head_count_kv", UINT32, c.int("num_key_value_heads", default=4))
    return list(k.items.values())


def general_items(
    arch: str, name: str, size_label: str | None, sampling: dict[str, Any] | None = None
) -> list[MetaItem]:
    """``general.architecture``, ``general.type``, the sampling defaults of
    generation_config.json (see :func:`sampling_items`), ``general.name`` and
    ``general.size_label`` (:func:`qstream.compat.gguf_names.size_label`), in the
    converter's order."""
    items = [
        MetaItem("general.architecture", STRING, arch),
        MetaItem("general.type", STRING, "model"),
    ]
    items += sampling_items(sampling or {})
    items.append(MetaItem("general.name", STRING, name))
    if size_label is not None:
        items.append(MetaItem("general.size_label", STRING, size_label))
    return items


#: generation_config.json fields -> GGUF sampling keys (the converter's ``Metadata.load``)
_SAMPLING = (
    ("sequence", "general.sampling.sequence", STRING),
    ("top_k", "general.sampling.top_k", 5),  # INT32
    ("top_p", "general.sampling.top_p", FLOAT32),
    ("min_p", "general.sampling.min_p", FLOAT32),
    ("xtc_probability", "general.sampling.xtc_probability", FLOAT32),
    ("xtc_threshold", "general.sampling.xtc_threshold", FLOAT32),
    ("temperature", "general.sampling.temp", FLOAT32),
    ("penalty_last_n", "general.sampling.penalty_last_n", 5),
    ("repetition_penalty", "general.sampling.penalty_repeat", FLOAT32),
    ("mirostat", "general.sampling.mirostat", 5),
    ("mirostat_tau", "general.sampling.mirostat_tau", FLOAT32),
    ("mirostat_eta", "general.sampling.mirostat_eta", FLOAT32),
)


def sampling_items(gen: dict[str, Any]) -> list[MetaItem]:
    """The ``general.sampling.*`` keys of a generation_config.json ``gen``."""
    out = []
    for field, key, kind in _SAMPLING:
        v = gen.get("penalty_repeat", gen.get(field)) if field == "repetition_penalty" else (
            gen.get(field)
        )  # fmt: skip
        if v is not None and not isinstance(v, bool | list | dict):
            out.append(MetaItem(key, kind, v))
    return out


__all__ = ["ARCHITECTURES", "ARRAY", "FILE_TYPES", "NOT_PRODUCED", "Fields", "arch_items",
           "architecture_of", "general_items", "sampling_items"]  # fmt: skip
