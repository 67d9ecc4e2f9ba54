"""llama-quantize's standard mixes, as ``llama_tensor_get_type`` (``src/llama-quant.cpp``)
chooses each tensor's type by name, layer and shape: :func:`choose`.

A mix (``--gguf-type Q4_K_M``) starts from its default type (Q4_K) and moves some tensors up:
``output.weight`` (and a tied ``token_embd.weight``) to Q6_K, ``attn_v`` / ``attn_qkv`` and
``ffn_down`` of some layers (``use_more_bits``: the first and last eighth, every third layer
between) to Q6_K, ...; the rules below are the ones llama.cpp applies to these ftypes, in its
order, with its counters (tensors visited in its order: layer, then name). Then every type
falls back as llama.cpp's ``tensor_type_fallback`` does when a row is not whole blocks of it
(Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0; a row not whole blocks of 32
-> F16). ``pure`` keeps the default type everywhere (fallbacks still apply), as
``llama-quantize --pure``. Falcon's and the IQ ftypes' rules are left out (qstream writes
neither).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...errors import InvalidParameterError

#: llama.cpp's ``llama_ftype`` of each mix (``general.file_type``), and its default type
FTYPE = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_M": 12,
         "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18}  # fmt: skip
DEFAULT = {"Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q8_0": "Q8_0", "Q5_0": "Q5_0", "Q5_1": "Q5_1",
           "Q2_K": "Q2_K", "Q3_K_M": "Q3_K",
           "Q4_K_S": "Q4_K", "Q4_K_M": "Q4_K", "Q5_K_S": "Q5_K", "Q5_K_M": "Q5_K",
           "Q6_K": "Q6_K"}  # fmt: skip
#: one K type everywhere (``--gguf-type Q4_K``): the file type llama-quantize writes for it
#: (its alias of the type: Q4_K is Q4_K_M, Q5_K is Q5_K_M, Q3_K is Q3_K_M)
PURE_FTYPE = {"Q2_K": 10, "Q3_K": 12, "Q4_K": 15, "Q5_K": 17, "Q6_K": 18}
K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
BLOCK = {**{k: 256 for k in K_TYPES}, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32,
         "Q8_0": 32}  # fmt: skip
#: ``tensor_type_fallback``: the type of a row that is not whole super-blocks
FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
#: the types an importance matrix changes in ggml (``ggml_quantize_chunk`` with
#: ``quant_weights``), all quantized with it by qstream too (Q8_0 ignores it)
WEIGHTED = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1")

#: ``tensor_get_category``: (category, test) in llama.cpp's order
_CATEGORIES = (
    ("output", lambda n: n == "output.weight"),
    ("token_embd", lambda n: n in ("token_embd.weight", "per_layer_token_embd.weight")),
    ("attn_v", lambda n: "attn_qkv.weight" in n or "attn_kv_b.weight" in n
     or "attn_v.weight" in n),
    ("attn_k", lambda n: "attn_k.weight" in n),
    ("attn_q", lambda n: "attn_q.weight" in n),
    ("attn_output", lambda n: "attn_output.weight" in n),
    ("ffn_up", lambda n: "ffn_up" in n),
    ("ffn_gate", lambda n: "ffn_gate" in n),
    ("ffn_down", lambda n: "ffn_down" in n),
)  # fmt: skip
_LAYER = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class ModelFacts:
    """What the rules read of the model (its GGUF hyperparameters): ``arch``, ``n_layer``
    (``block_count``), ``n_expert`` (``expert_count``), ``n_head`` and ``n_head_kv``."""

    arch: str
    n_layer: int
    n_expert: int = 0
    n_head: int = 1
    n_head_kv: int = 1

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:  # (``LLM_TYPE_70B`` as llama.cpp's loaders set it)
        if self.n_layer != 80:
            return False
        return self.arch == "qwen2" or (self.arch == "llama" and self.n_head != self.n_head_kv)


def category(name: str) -> str:
    """llama.cpp's ``tensor_get_category`` of the GGUF tensor ``name``."""
    return next((c for c, test in _CATEGORIES if test(name)), "other")


def mix_name(type: str, pure: bool) -> tuple[str, str | None]:
    """``(type of every quantized tensor before the rules, mix or None)`` for ``--gguf-type
    type`` (upper-case) with or without ``--pure``: a mix name without ``pure`` is the mix."""
    if type in DEFAULT:
        return DEFAULT[type], None if pure else type
    return type, None


def file_type(asked: str) -> int | None:
    """``general.file_type`` as llama-quantize writes it for ``--gguf-type asked`` (its
    ftype, with or without ``--pure``); None: not a mix or K type."""
    return FTYPE.get(asked, PURE_FTYPE.get(asked))


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or _c_mod(i - n // 8, 3) == 2


def _c_mod(a: int, b: int) -> int:
    """C's ``%`` (the sign of the dividend)."""
    r = abs(a) % b
    return -r if a < 0 else r


def _order(name: str) -> tuple[int, str]:
    """llama.cpp's ``weight_name_comparer``: the layer (-1 outside blocks), then the name."""
    m = re.match(r"blk\.(-?\d+)\.", name)
    return (int(m.group(1)) if m else -1, name)


def choose(
    tensors: Sequence[tuple[str, tuple[int, ...]]],
    all_names: Sequence[str],
    type: str,
    mix: str | None,
    facts: ModelFacts,
    has_imatrix: bool = False,
) -> dict[str, str]:
    """The type of each quantized tensor ``(GGUF name, numpy shape)`` of ``tensors`` as
    llama-quantize writes it with ``mix`` (None: ``type`` everywhere, ``--pure``), fallbacks
    included (Q5_0, Q5_1 or F16 may come back); ``all_names``: every tensor of the file (the
    counters and the tied-embedding test read them)."""
    tied = "output.weight" not in all_names
    n_wv = sum(category(n) == "attn_v" for n in all_names)
    counters = {"attn_v": 0, "ffn_down": 0, "ffn_gate": 0, "ffn_up": 0}
    out: dict[str, str] = {}
    for name, shape in sorted(tensors, key=lambda t: _order(t[0])):
        new = type
        if mix is not None:
            new = _rule(name, shape, type, mix, facts, has_imatrix, tied, n_wv, counters)
        out[name] = fallback(new, shape[-1] if shape else 1)
    return out


def fallback(type: str, cols: int) -> str:
    """``tensor_type_fallback``: ``type``, or what llama.cpp writes instead when a row of
    ``cols`` values is not whole blocks of it."""
    if type not in BLOCK or cols % BLOCK[type] == 0:
        return type
    new = FALLBACK.get(type, type)
    return new if cols % BLOCK[new] == 0 else "F16"


def _layer(name: str, counter: int, facts: ModelFacts) -> int:
    if facts.n_expert > 1:  # (layer_info: experts' tensors by their name)
        m = _LAYER.match(name)
        if m is None:
            raise ValueError(f"failed to determine the layer of tensor {name}")
        return int(m.group(1))
    return counter


def _rule(
    name: str,
    shape: tuple[int, ...],
    new: str,
    mix: str,
    facts: ModelFacts,
    has_imatrix: bool,
    tied: bool,
    n_wv: int,
    counters: dict[str, int],
) -> str:
    """``llama_tensor_get_type_impl`` for the mixes of :data:`FTYPE` (non-Falcon models)."""
    cat = category(name)
    n_layer = facts.n_layer
    if cat == "output" or (tied and cat == "token_embd"):
        cols = shape[-1] if shape else 1
        if cols % BLOCK[new]:
            return "Q8_0"
        return "Q6_K" if new != "Q8_0" else new
    if cat == "token_embd":
        return new
    if cat == "attn_v":
        i = counters["attn_v"]
        if mix == "Q2_K":
            new = "Q4_K" if facts.n_gqa >= 4 else "Q3_K"
        elif mix == "Q3_K_M":
            new = "Q5_K" if i < 2 else "Q4_K"
        elif mix in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i, n_wv):
            new = "Q6_K"
        elif mix == "Q4_K_S" and i < 4:
            new = "Q5_K"
        if facts.is_70b and new in ("Q3_K", "Q4_K"):
            new = "Q5_K"
        if facts.n_expert == 8:
            new = "Q8_0"
        counters["attn_v"] += 1
        return new
    if cat == "attn_k":
        return "Q8_0" if facts.n_expert == 8 else new
    if cat == "ffn_down":
        i = _layer(name, counters["ffn_down"], facts)
        if mix == "Q2_K":
            new = "Q3_K"
        elif mix == "Q3_K_M":
            new = "Q5_K" if i < n_layer // 16 else "Q4_K"
        elif mix == "Q4_K_M":
            new = "Q6_K" if _use_more_bits(i, n_layer) else new
        elif mix == "Q5_K_M" and _use_more_bits(i, n_layer):
            new = "Q6_K"
        elif mix == "Q4_K_S" and i < n_layer // 8:
            new = "Q5_K"
        elif mix in ("Q4_0", "Q5_0") and has_imatrix and i < n_layer // 8:
            new = "Q4_1" if mix == "Q4_0" else "Q5_1"
        counters["ffn_down"] += 1
        return new
    if cat == "attn_output":
        if facts.n_expert == 8:
            return "Q5_K" if mix in ("Q2_K", "Q3_K_M", "Q4_K_S", "Q4_K_M") else new
        return {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K"}.get(mix, new)
    if cat in ("ffn_gate", "ffn_up"):
        _layer(name, counters[cat], facts)
        counters[cat] += 1
    return new


def facts_of(arch: str, config: Mapping[str, Any]) -> ModelFacts:
    """The :class:`ModelFacts` of a model of GGUF architecture ``arch`` and ``config``
    (config.json: the values its converter writes as ``block_count``, ``expert_count`` and
    the head counts)."""
    heads = int(config.get("num_attention_heads") or 1)
    experts = config.get("num_local_experts") or config.get("num_experts") or 0
    return ModelFacts(arch, int(config.get("num_hidden_layers") or 0), int(experts), heads,
                      int(config.get("num_key_value_heads") or heads))  # fmt: skip


def retype(
    plans: Sequence[Any],
    asked: str,
    base: str,
    mix: str | None,
    facts: ModelFacts | None,
    weights: Mapping[str, np.ndarray] | None,
    sized: Callable[[tuple[int, ...], str], int],
    rules: Mapping[str, str],
) -> tuple[list[Any], dict[str, np.ndarray]]:
    """The plan's tensors (:class:`~qstream.exports.gguf.plan.GGUFTensorPlan`) with the types
    of ``--gguf-type asked`` as llama-quantize chooses them (:func:`choose`: every tensor the
    plan quantizes as ``base``), and the importance weights each is quantized with (GGUF name
    -> the ``imatrix=`` argument; ``weights``: :func:`~qstream.exports.gguf.imatrix.
    importance_weights` of the file). Refused (one line): a mix or an importance matrix
    without the model's config, or an importance matrix of another size."""
    if facts is None and (mix is not None or weights is not None):
        what = f"mix {mix}" if mix is not None else "an importance matrix"
        raise InvalidParameterError(
            f"{what} needs the model's config.json (llama.cpp's tensor names): pass --config"
            + (f", or --pure for {base} everywhere" if mix is not None else "")
        )
    quantized = [t for t in plans if not t.kept and not t.copied and t.type == base]
    chosen = choose([(t.gguf_name, t.shape) for t in quantized], [t.gguf_name for t in plans],
                    base, mix, facts or ModelFacts("", 0), weights is not None)  # fmt: skip
    used: dict[str, np.ndarray] = {}
    out = []
    for t in plans:
        kind = chosen.get(t.gguf_name) if not t.kept and not t.copied else None
        if kind is None:
            out.append(t)
            continue
        how = f"llama-quantize's {mix}" if mix is not None else f"--pure {base}"
        if kind == "F16":
            why = f"kept: a last axis of {t.shape[-1]} is not whole blocks of 32 (F16, as {how})"
            out.append(replace(t, type="F16", kept=True, rule=f"{why}: {rules['F16']}",
                               bytes_after=sized(t.shape, "F16")))  # fmt: skip
            continue
        w = _weights(weights, t.gguf_name, t.shape) if weights is not None else None
        if w is not None and kind in WEIGHTED:
            used[t.gguf_name] = w
        why = f"--gguf-type {asked}" + (f" ({how}: {kind})" if kind != asked else "")
        why += " with the importance matrix" if t.gguf_name in used else ""
        out.append(replace(t, type=kind, rule=f"{why}: {rules[kind]}",
                           bytes_after=sized(t.shape, kind)))  # fmt: skip
    return out, used


def _weights(weights: Mapping[str, np.ndarray], name: str, shape: tuple[int, ...]) -> Any:
    """llama-quantize's lookup: the entry of ``name`` (None: none); another size is refused,
    except for the token embedding (llama.cpp quantizes it without one then)."""
    from .imatrix import weights_for

    try:
        return weights_for(weights, name, shape)
    except InvalidParameterError:
        if category(name) == "token_embd":
            return None
        raise


def read_weights(path: str | os.PathLike[str] | None) -> dict[str, np.ndarray] | None:
    """The importance weights of the imatrix file ``path`` as llama-quantize reads them
    (None: no file)."""
    if path is None:
        return None
    from .imatrix import importance_weights, read_imatrix

    return importance_weights(read_imatrix(path))
