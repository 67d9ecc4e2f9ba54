"""The compressed-tensors layout: what transformers (through ``compressed-tensors``) and vLLM
load as quantized weights.

A quantized weight ``M.weight`` (2-D, ``[out, in]``) becomes, for the module ``M``:

- 8 bits, ``int-quantized``: ``M.weight`` int8 codes;
- 4 bits, ``pack-quantized``: ``M.weight_packed`` int32 ``[out, ceil(in / 8)]`` (code ``c`` of
  a row, offset by +8, in bits ``4 * (c % 8)`` of word ``c // 8``) and ``M.weight_shape``
  int64 ``[out, in]``;
- ``M.weight_scale``: ``[1]`` per tensor, ``[out, 1]`` per channel (axis 0), ``[out, in /
  group]`` in groups along ``in`` (float32, or float16 or bfloat16 when stored so: a
  bfloat16 or float16 model loaded in its own dtype then gets qstream's values bit for bit);
- asymmetric specs: ``M.weight_zero_point``, int8 shaped like the scale (8 bits), or packed
  along the output axis, int32 ``[ceil(out / 8), groups]`` (4 bits), as compressed-tensors'
  own compressor writes it.

Unsigned codes are stored signed (``q - 2**(bits-1)``, the zero point likewise): the
difference ``q - zero_point`` is unchanged, so ``(q - zp) * scale`` is qstream's dequantization
bit for bit. The config's ``quantization_config`` carries one config group per (bits,
symmetric, strategy, group size) with ``format`` inside the group, as the loader requires.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidParameterError
from ..spec import QuantSpec

INT_QUANTIZED = "int-quantized"
PACK_QUANTIZED = "pack-quantized"
_INT_TYPES = {"int8": 8, "uint8": 8, "int4": 4, "uint4": 4}


@dataclass(frozen=True)
class Layout:
    """How one quantized weight is written (see the module docstring)."""

    module: str  # the tensor's name without its trailing "weight" ("model.x.q_proj.")
    bits: int
    symmetric: bool
    strategy: str  # tensor | channel | group
    group_size: int | None
    unsigned: bool

    @property
    def format(self) -> str:
        """The compressed-tensors format of the weight: packed for 4 bits, plain for 8."""
        return PACK_QUANTIZED if self.bits == 4 else INT_QUANTIZED

    @property
    def offset(self) -> int:
        """What is subtracted from unsigned codes and zero points to make them signed."""
        return 1 << (self.bits - 1) if self.unsigned else 0

    def group_key(self) -> tuple[str, int, bool, str, int | None]:
        """The layouts one config group of ``quantization_config`` holds have one key."""
        return (self.format, self.bits, self.symmetric, self.strategy, self.group_size)


def layout(name: str, shape: Sequence[int], spec: QuantSpec) -> Layout:
    """The layout of the tensor ``name`` quantized by ``spec``, or an
    :class:`InvalidParameterError` naming what compressed-tensors cannot express."""
    qt = spec.qtype

    def refuse(why: str) -> InvalidParameterError:
        return InvalidParameterError(
            f"{name}: {why}, which compressed-tensors (transformers, vLLM) cannot load; keep"
            " the tensor (a keep rule), change its spec, or export with format='qstream'"
            " (read by qstream only)"
        )

    if qt.name not in _INT_TYPES:
        raise refuse(f"{qt.name} codes (int8, uint8, int4 and uint4 load)")
    if len(shape) != 2:
        raise refuse(f"a {len(shape)}-D weight (2-D Linear weights load)")
    if not name.endswith("weight"):
        raise refuse("a name that is not a module's weight (…weight)")
    axis = None if spec.axis is None else spec.axis % 2
    if spec.block_size:
        if axis != 1:
            raise refuse("groups along the output axis (groups along axis 1, the input, load)")
        if shape[1] % spec.block_size:
            raise refuse(f"groups of {spec.block_size} that do not divide {shape[1]} columns")
        strategy, group = "group", int(spec.block_size)
    elif axis == 1:
        raise refuse("one scale per input column (per channel on axis 0 loads)")
    else:
        strategy, group = ("tensor" if axis is None else "channel"), None
    bits = _INT_TYPES[qt.name]
    if bits == 4 and "embed" in name.lower():
        raise refuse(
            "a 4-bit embedding (pack-quantized is for Linear weights: transformers fails on a"
            " packed Embedding; 8-bit embeddings load)"
        )
    if bits == 4 and not spec.symmetric and strategy == "tensor":
        raise refuse("an asymmetric per-tensor 4-bit spec")
    return Layout(name[: -len("weight")], bits, spec.symmetric, strategy, group, not qt.signed)


#: the names of input embeddings an output layer is tied to, and of that output layer
EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")
HEAD = "lm_head.weight"


def tied_embedding(
    quantized: Sequence[str], names: Sequence[str], config: dict[str, Any] | None
) -> str | None:
    """The quantized input embedding a model ties its output layer to, which an export
    unties (as llm-compressor's ``untie_word_embeddings`` does before quantizing a tied
    embedding): the checkpoint holds no ``lm_head.weight`` and the config ties them
    (``tie_word_embeddings`` true or absent). None when nothing is tied or the embedding is
    kept (transformers ties a float embedding itself)."""
    if config is None or config.get("tie_word_embeddings", True) is not True or HEAD in names:
        return None
    found = [n for n in quantized if n.endswith(EMBEDDINGS)]
    return found[0] if len(found) == 1 else None


_EXPERT = re.compile(r"\.experts\.\d+\.")
#: MoE model types measured with transformers 5.24 + compressed-tensors 0.20: it fuses their
#: experts into 3-D ``experts.gate_up_proj`` / ``experts.down_proj`` and, loading a
#: compressed-tensors folder, dequantizes the per-expert tensors before the merge
MOE_MEASURED = ("mixtral", "qwen2_moe", "qwen3_moe")
#: the presets whose per-expert weights that load gives exactly (compressed-tensors' own export
#: and qstream's load alike, logits equal)
EXPERT_PRESETS = ("W8A16", "W4A16", "FP8_DYNAMIC")
_PRESET_WHY = {
    "FP8_BLOCK": "it folds an FP8 expert's scale into its weight by broadcasting, which 128x128"
    " block scales do not fit (compressed-tensors' own FP8_BLOCK export fails to load: a"
    " CONVERSION error on experts.gate_up_proj)",
    "NVFP4A16": "it dequantizes a packed expert without its weight_global_scale"
    " (compressed-tensors' own NVFP4A16 export gives non-finite logits in bfloat16)",
    "MXFP4A16": "its expert dequantization of MXFP4 is not measured exact (compressed-tensors'"
    " own MXFP4A16 export fails in float32: a bfloat16/float32 matmul mismatch)",
    "MXFP8A16": "it dequantizes experts only from weight_packed or FP8 codes (compressed-tensors'"
    " own MXFP8A16 export fails to load: a CONVERSION error on experts.gate_up_proj)",
}


def expert_layouts(tensors: dict[str, Any], recipe: Any, quantized: Sequence[str]) -> list[Layout]:
    """The layouts of the quantized expert weights among ``quantized`` (``recipe.spec_for``
    on each tensor's shape and dtype)."""
    out = []
    for n in quantized:
        if _EXPERT.search(n):
            t = tensors[n]
            out.append(layout(n, t.shape, recipe.spec_for(n, t.shape, t.dtype)))
    return out


def refuse_recipe_experts(
    tensors: dict[str, Any], recipe: Any, quantized: Sequence[str], config: dict[str, Any] | None
) -> None:
    """:func:`refuse_experts` for a qstream recipe's export of ``tensors``."""
    layouts = expert_layouts(tensors, recipe, quantized)
    refuse_experts(quantized, config, None, list(tensors), layouts)


def refuse_experts(
    quantized: Sequence[str],
    config: dict[str, Any] | None,
    scheme: str | None = None,
    names: Sequence[str] = (),
    layouts: Sequence[Layout] = (),
) -> None:
    """Refuse, naming the model type and the measured reason, a compressed-tensors export of
    a mixture-of-experts checkpoint (per-expert ``...experts.N....weight`` tensors) that
    transformers 5.24 would not load exactly. ``scheme``: the ``--scheme`` preset (None: a
    qstream recipe); ``names``: every tensor of the checkpoint (kept experts are checked too).

    Measured on tiny Mixtral, Qwen2-MoE and Qwen3-MoE models: transformers fuses the experts
    into 3-D parameters and dequantizes the per-expert tensors of a compressed-tensors folder
    while merging them, for the ``EXPERT_PRESETS`` (qstream's folder and compressed-tensors'
    own give the same bytes, weights and logits); float experts in a folder with an integer
    scheme go through the same dequantization and fail (compressed-tensors' own W4A16 export
    with the experts ignored fails too; only FP8 schemes pass float experts through). A
    recipe's experts load when ``layouts`` (theirs, :func:`expert_layouts`) are one symmetric
    4-bit layout: packed, as W4A16's (measured bit-exact for Mixtral and Qwen3-MoE)."""
    expert = next((n for n in quantized if _EXPERT.search(n)), None)
    kept = next((n for n in names if _EXPERT.search(n) and n not in set(quantized)), None)
    if expert is None and kept is None:
        return
    kind = (config or {}).get("model_type") or "a mixture-of-experts model"
    fuses = f"transformers 5.24 fuses {kind}'s experts into 3-D experts.gate_up_proj/down_proj"
    if kind not in MOE_MEASURED:
        why = (
            f"{fuses}; loading per-expert compressed tensors is measured for"
            f" {', '.join(MOE_MEASURED)} only"
        )
    elif scheme is None and kept is None and _packed_alike(layouts):
        return  # (one symmetric 4-bit layout: pack-quantized experts, loaded like W4A16's)
    elif scheme is None and expert is not None:
        why = (
            f"{fuses} and dequantizes per-expert weights only from packed or FP8 tensors,"
            " without zero points: a recipe's experts load only as one symmetric 4-bit layout"
            " (int8 int-quantized experts fail even from compressed-tensors' own export: a"
            " CONVERSION error)"
        )
    elif scheme is None:
        expert = kept
        why = (
            f"{fuses} and sends kept float experts through compressed-tensors' dequantization,"
            " which for an integer scheme yields nothing (compressed-tensors' own W4A16 export"
            " with its experts ignored fails to load too: a CONVERSION error)"
        )
    elif scheme in EXPERT_PRESETS:
        return
    else:
        why = f"{fuses}, and with {scheme} experts {_PRESET_WHY.get(scheme, 'are not measured')}"
    raise InvalidParameterError(
        f"{kind}: {expert} is an expert weight of a compressed-tensors folder, and {why}:"
        f" the folder would not load; use --scheme {'/'.join(EXPERT_PRESETS)} or export"
        " with format='qstream'"
    )


def _packed_alike(layouts: Sequence[Layout]) -> bool:
    """Whether the experts' layouts are one symmetric 4-bit (pack-quantized) config group."""
    keys = {lay.group_key() for lay in layouts}
    return len(keys) == 1 and all(
        lay.bits == 4 and lay.symmetric and not lay.unsigned for lay in layouts
    )


def signed_codes(q: np.ndarray, lay: Layout) -> np.ndarray:
    """Rows of codes as int8 in the signed range of their bits."""
    return (q.astype(np.int16) - lay.offset).astype(np.int8)


def pack_rows(q: np.ndarray, bits: int = 4) -> np.ndarray:
    """``[R, C]`` signed codes -> ``[R, ceil(C * bits / 32)]`` int32 words, each code offset by
    ``2**(bits-1)`` and packed from the low bits up (compressed-tensors' ``pack_to_int32``);
    the last word padded with (offset) zeros."""
    per = 32 // bits
    rows, cols = q.shape
    u = (q.astype(np.int32) + (1 << (bits - 1))).astype(np.uint32)
    pad = -cols % per
    if pad:
        u = np.concatenate([u, np.zeros((rows, pad), np.uint32)], axis=1)
    u = u.reshape(rows, -1, per)
    words = np.zeros(u.shape[:2], np.uint32)
    for i in range(per):
        words |= u[:, :, i] << np.uint32(bits * i)
    return words.view(np.int32)


def pack_columns(zp: np.ndarray, bits: int = 4) -> np.ndarray:
    """``[out, G]`` signed zero points packed along the output axis: ``[ceil(out * bits /
    32), G]`` int32 (how compressed-tensors packs a 4-bit zero point)."""
    return np.ascontiguousarray(pack_rows(np.ascontiguousarray(zp.T), bits).T)


def _template(module: str) -> str:
    """A regex for ``module`` with its layer numbers generalised (``layers.12.`` ->
    ``layers.\\d+.``)."""
    return re.sub(r"\d+", r"\\d+", re.escape(module))


def _targets(mine: list[str], others: list[str]) -> list[str]:
    """Few ``re:`` targets that match every module of ``mine`` and none of ``others``: one per
    name template (layer numbers generalised) where no other module fits it, else the exact
    name."""
    out: dict[str, None] = {}
    templates: dict[str, list[str]] = {}
    for m in mine:
        templates.setdefault(_template(m), []).append(m)
    for t, names in templates.items():
        rx = re.compile(t)
        if any(rx.fullmatch(o) for o in others):
            out.update({f"re:^{re.escape(n)}$": None for n in names})
        else:
            out[f"re:^{t}$"] = None
    return list(out)


def quantization_config(layouts: list[Layout], kept_weights: list[str]) -> dict[str, Any]:
    """The ``quantization_config`` of an export: one config group per kind of layout, its
    ``targets`` naming exactly its modules; ``ignore``: the kept 2-D weights' modules."""
    groups: dict[tuple[str, int, bool, str, int | None], list[str]] = {}
    for lay in layouts:
        groups.setdefault(lay.group_key(), []).append(lay.module.rstrip("."))
    everyone = [m.rstrip(".") for m in kept_weights]
    config_groups = {}
    for i, (key, modules) in enumerate(groups.items()):
        fmt, bits, symmetric, strategy, group = key
        others = everyone + [m for k, ms in groups.items() if k != key for m in ms]
        weights = {
            "num_bits": bits,
            "type": "int",
            "symmetric": symmetric,
            "strategy": strategy,
            "dynamic": False,
        }
        if group:
            weights["group_size"] = group
        config_groups[f"group_{i}"] = {
            "targets": _targets(modules, others),
            "format": fmt,
            "weights": weights,
            "input_activations": None,
            "output_activations": None,
        }
    formats = {key[0] for key in groups}
    return {
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "format": formats.pop() if len(formats) == 1 else "mixed-precision",
        "config_groups": config_groups,
        "ignore": sorted(m.rstrip(".") for m in kept_weights),
    }
