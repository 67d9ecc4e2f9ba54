"""How a model's tensors and metadata become a GGUF file llama.cpp loads, decided in the plan
before any tensor byte is read: the architecture and its config (:func:`model_of`), each
source tensor's GGUF name and value transform (:meth:`Model.place`), per-expert tensors
merged into one 3-D tensor a layer (:func:`merge_experts`), and the ``general.*``,
architecture and ``tokenizer.*`` keys as llama.cpp's converter writes them
(:func:`metadata_items`)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from ...compat.gguf_names import (
    Transform,
    expert_of,
    gguf_name,
    skipped,
    transform_of,
)
from ...compat.gguf_names import size_label as label_of
from ...errors import InvalidParameterError
from .arch import ARCHITECTURES, arch_items, architecture_of, general_items
from .items import STRING, MetaItem

#: config.json ``model_type`` -> the model class, when a config names no ``architectures``
MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
}
#: architectures whose llama.cpp loader needs output.weight (no fallback to the embedding)
NEEDS_OUTPUT = frozenset({"qwen2moe"})
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
NO_TOKENIZER = (
    "the file holds tensors and hyperparameters only, no tokenizer: llama.cpp will not load"
    " it (key not found: tokenizer.ggml.model)"
)


@dataclass(frozen=True)
class Model:
    """A supported model: its GGUF ``arch``, ``config`` (read from ``where``), head counts,
    whether its embeddings are tied (no ``output.weight``, as llama.cpp writes it)."""

    arch: str
    config: dict[str, Any]
    where: str
    heads: int
    kv_heads: int
    tied: bool

    def place(self, hf: str, n_vocab: int | None = None) -> tuple[str, Transform] | None:
        """The GGUF name and value transform of source tensor ``hf``; None: left out (as the
        converter leaves it out: Gemma 2's lm_head, rotary caches, a tied lm_head)."""
        if skipped(self.arch, hf) or (self.tied and hf == "lm_head.weight"):
            return None
        name = gguf_name(self.arch, hf)
        return name, transform_of(self.arch, hf, self.heads, self.kv_heads, n_vocab)


def model_of(cfg: dict[str, Any] | None, where: str) -> Model | None:
    """The supported model ``cfg`` describes (its ``architectures[0]``, else its
    ``model_type``); None without a config; any other model is refused before any work,
    listing the supported ones."""
    if cfg is None:
        return None
    named = cfg
    if not cfg.get("architectures") and str(cfg.get("model_type")) in MODEL_TYPES:
        named = {**cfg, "architectures": [MODEL_TYPES[str(cfg["model_type"])]]}
    elif not cfg.get("architectures"):
        raise InvalidParameterError(
            f"{where}: names no architectures and a model_type"
            f" {str(cfg.get('model_type'))[:80]!r} GGUF export does not support; supported:"
            f" {', '.join(ARCHITECTURES)}"
        )
    arch = architecture_of(named, where)
    heads = cfg.get("num_attention_heads")
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise InvalidParameterError(f"{where}: num_attention_heads must be an integer >= 1")
    kv = cfg.get("num_key_value_heads") or heads
    if isinstance(kv, bool) or not isinstance(kv, int) or kv < 1:
        raise InvalidParameterError(f"{where}: num_key_value_heads must be an integer >= 1")
    tied = bool(cfg.get("tie_word_embeddings", False))
    if tied and arch in NEEDS_OUTPUT:
        raise InvalidParameterError(
            f"{where}: ties lm_head to the embedding (tie_word_embeddings), but llama.cpp's"
            f" {arch} needs its own output.weight: llama.cpp would not load the file"
        )
    return Model(arch, named, where, heads, kv, tied)


def tokenizer_folder(src: str, config_path: str | None) -> Path | None:
    """Where the model's tokenizer is: the source folder (or the folder of the source file),
    else the config file's folder; None when neither holds tokenizer.json / .model."""
    path = os.fspath(src)
    folders = [path if os.path.isdir(path) else os.path.dirname(path) or "."]
    if config_path:
        folders.append(os.path.dirname(config_path) or ".")
    for folder in folders:
        if any(os.path.isfile(os.path.join(folder, f)) for f in TOKENIZER_FILES):
            return Path(folder)
    return None


T = TypeVar("T")


def merge_experts(
    plans: Sequence[T],
    hf_of: Callable[[T], str],
    merge: Callable[[list[T]], T],
) -> list[T]:
    """``plans`` with each layer's per-expert tensors of one projection (experts 0..n-1,
    all present) replaced by ``merge(parts in expert order)``, placed where the first one
    was; experts missing from a layer are refused."""
    groups: dict[tuple[int, str], dict[int, T]] = {}
    for p in plans:
        e = expert_of(hf_of(p))
        if e is not None:
            groups.setdefault((e[0], e[2]), {})[e[1]] = p
    out: list[T] = []
    done: set[tuple[int, str]] = set()
    for p in plans:
        e = expert_of(hf_of(p))
        if e is None:
            out.append(p)
            continue
        key = (e[0], e[2])
        if key in done:
            continue
        done.add(key)
        found = groups[key]
        if sorted(found) != list(range(len(found))):
            missing = sorted(set(range(max(found) + 1)) - set(found))
            raise InvalidParameterError(
                f"layer {e[0]}'s {e[2]} experts: expert {missing[0]} is missing (GGUF holds a"
                " layer's experts as one tensor of experts 0..n-1)"
            )
        out.append(merge([found[i] for i in range(len(found))]))
    return out


def merged_name(hf: str) -> str:
    """The name a merged expert tensor has in the report: ``experts.*`` for the index."""
    e = expert_of(hf)
    return hf if e is None else hf.replace(f".experts.{e[1]}.", ".experts.*.", 1)


def metadata_items(
    model: Model,
    tensors: Sequence[tuple[str, tuple[int, ...]]],
    file_type: str,
    name: str,
    folder: Path | None,
    vocab: list[MetaItem] | None,
) -> list[MetaItem]:
    """The ``general.*``, architecture and tokenizer keys of a file of ``tensors`` (GGUF
    name, shape as written), mostly of ``file_type``, named ``name``: the converter's keys
    (``vocab``: the tokenizer's, from :func:`qstream.exports.gguf.vocab.tokenizer_items`;
    ``folder``: where generation_config.json is read)."""
    sampling: dict[str, Any] = {}
    gen = folder / "generation_config.json" if folder is not None else None
    if gen is not None and gen.is_file():
        try:
            loaded = json.loads(gen.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise InvalidParameterError(f"{gen}: cannot read it as JSON ({e})") from None
        sampling = loaded if isinstance(loaded, dict) else {}
    items = general_items(model.arch, name, label_of(tensors), sampling)
    items += arch_items(model.config, file_type, model.where)
    items.append(MetaItem("general.quantization_version", 4, 2))
    return items + list(vocab or [])


def vocab_count(vocab: list[MetaItem] | None) -> int | None:
    """How many tokens the tokenizer keys hold (None without them)."""
    for item in vocab or []:
        if item.key == "tokenizer.ggml.tokens":
            return len(item.value)
    return None


def name_item(value: str) -> MetaItem:
    """``general.name``."""
    return MetaItem("general.name", STRING, value)


__all__ = ["MODEL_TYPES", "NO_TOKENIZER", "Model", "merge_experts", "merged_name",
           "metadata_items", "model_of", "name_item", "replace", "tokenizer_folder",
           "vocab_count"]  # fmt: skip
