"""Which GGUF block type holds a quantization spec exactly (:func:`spec_type`), the rule each
type's values follow (:data:`RULES`), and how the plan words a spec and a kept tensor."""

from __future__ import annotations

import fnmatch
import math
import unicodedata
from typing import Any

import numpy as np

from ...compat import gguf as q
from ...errors import InvalidParameterError
from ...qtypes import did_you_mean
from ...spec import DEFAULT_SPEC, QuantSpec, Recipe

#: how each GGUF type makes its values (what the plan states for every tensor of that type)
RULES = {
    "Q8_0": "gguf-py's Q8_0: blocks of 32 along the last axis, d = absmax / 127 (float32),"
    " codes round-half-away(x * (1 / d)) in -127..127, d stored as float16",
    "Q4_0": "gguf-py's Q4_0: blocks of 32 along the last axis, d = m / -8 (m: the value of"
    " largest magnitude; all 16 levels), nibbles trunc(x * (1 / d) + 8.5) clipped to 0..15,"
    " d stored as float16 (with an importance matrix: ggml's weighted scale search)",
    "Q4_1": "gguf-py's Q4_1: blocks of 32 along the last axis, d = (max - min) / 15, m = min,"
    " nibbles trunc((x - m) * (1 / d) + 0.5) clipped to 0..15, d and m stored as float16"
    " (with an importance matrix: ggml's weighted scale and min search)",
    "Q5_0": "llama.cpp's Q5_0: blocks of 32 along the last axis, d = m / -16 (m: the value of"
    " largest magnitude), 5-bit codes trunc(x * (1 / d) + 16.5) up to 31, d stored as"
    " float16, bit for bit as ggml_quantize_chunk writes them (weighted by the importance"
    " matrix when given)",
    "Q5_1": "llama.cpp's Q5_1: blocks of 32 along the last axis, d = (max - min) / 31, m ="
    " min, 5-bit codes trunc((x - m) * (1 / d) + 0.5), d and m stored as float16, bit for bit"
    " as ggml_quantize_chunk writes them (weighted by the importance matrix when given)",
    **{
        k: f"llama.cpp's {k}: super-blocks of 256 along the last axis ({bits}), bit for bit as"
        " ggml_quantize_chunk writes them (weighted by the importance matrix when given)"
        for k, bits in (
            ("Q2_K", "16 blocks of 16, 2-bit codes, 4-bit scales and mins"),
            ("Q3_K", "16 blocks of 16, 3-bit codes, 6-bit scales"),
            ("Q4_K", "8 blocks of 32, 4-bit codes, 6-bit scales and mins"),
            ("Q5_K", "8 blocks of 32, 5-bit codes, 6-bit scales and mins"),
            ("Q6_K", "16 blocks of 16, 6-bit codes, 8-bit scales"),
        )
    },
    "F32": "float32 values",
    "F16": "values rounded to float16 (nearest even)",
    "BF16": "values rounded to bfloat16 (nearest even, as gguf-py)",
}


def spec_type(spec: QuantSpec, shape: tuple[int, ...]) -> str:
    """The GGUF block type that holds ``spec`` on a tensor of ``shape`` as asked (module
    docstring), else :class:`InvalidParameterError` saying what was asked, why no type
    holds it, the nearest type and ``--gguf-type``."""
    if is_default(spec):
        return "Q8_0"
    qt = spec.qtype
    bits = getattr(qt, "bits", 8)
    integer = qt.name in ("int8", "uint8", "int4", "uint4")
    nearest = ("Q4_0" if spec.symmetric else "Q4_1") if bits <= 4 else "Q8_0"
    why: list[str] = []
    if not integer:
        why.append(f"GGUF has no block type of {qt.name} codes")
    elif qt.name in ("int8", "uint8") and not spec.symmetric:
        why.append("an asymmetric range (Q8_0 is symmetric; Q4_1, asymmetric, is 4-bit)")
    ndim = len(shape)
    last = ndim - 1
    axis = None if spec.axis is None else spec.axis % ndim if ndim else spec.axis
    if spec.float_offset:
        why.append("a float offset (GGUF's blocks carry their own scales)")
    if spec.axis is None:
        why.append("one scale for the whole tensor (GGUF: one a block of 32 values)")
    elif not spec.block_size:
        why.append(f"one scale per channel on axis {spec.axis} (GGUF: one a block of 32 values)")
    else:
        if spec.block_size != q.BLOCK:
            why.append(f"blocks of {spec.block_size} (GGUF's are {q.BLOCK})")
        if axis != last:
            why.append(f"blocks along axis {spec.axis} (GGUF's run along the last axis)")
    if spec.scale is not None or spec.zero_point is not None:
        why.append("given scales / zero points (GGUF computes each block's own)")
    elif spec.method not in ("dynamic", "minmax"):
        why.append(f"method {spec.method} (GGUF takes each block's whole range: dynamic)")
    if spec.round_mode != QuantSpec.round_mode:
        why.append(f"round_mode {spec.round_mode} (GGUF's types round their own way)")
    if spec.symmetric_levels != QuantSpec.symmetric_levels:
        why.append(f"symmetric_levels {spec.symmetric_levels} (GGUF's types set their levels)")
    if spec.narrow_range and nearest != "Q8_0":
        why.append(f"narrow_range ({nearest} uses every code)")
    if spec.nan_policy != QuantSpec.nan_policy:
        why.append(f"nan_policy {spec.nan_policy} (GGUF blocks hold no NaN)")
    if why:
        raise InvalidParameterError(
            f"{describe(spec, shape)} has no GGUF type: {'; '.join(why)}. The nearest type"
            f" is {nearest} ({_SHAPES[nearest]}): ask for that spec, or pass --gguf-type"
            f" {nearest} (type='{nearest}') to take GGUF's own rule for every quantized tensor"
        )
    return nearest


_SHAPES = {
    "Q8_0": "int8, symmetric, blocks of 32 along the last axis",
    "Q4_0": "int4, symmetric, blocks of 32 along the last axis",
    "Q4_1": "4-bit, asymmetric, blocks of 32 along the last axis",
}


def explicit_type(type: str | None) -> str | None:
    """``type`` upper-cased: a GGUF type (:data:`qstream.compat.gguf.TYPES`, a K type) or one
    of llama-quantize's mixes (:mod:`qstream.exports.gguf.mixes`); None stays None."""
    from .mixes import FTYPE

    if type is None:
        return None
    gtype = str(type).upper()
    known = tuple(dict.fromkeys((*q.TYPES, *q.K_TYPES, *FTYPE)))
    if gtype not in known:
        raise InvalidParameterError(
            f"unknown GGUF type {type!r}{did_you_mean(str(type), known)};"
            f" expected one of: {', '.join(known)}"
        )
    return gtype


def is_default(spec: QuantSpec) -> bool:
    """Whether ``spec`` is the recipe's default (no spec asked: GGUF's default type)."""
    return bool(spec.to_dict() == QuantSpec(**DEFAULT_SPEC).to_dict())


def describe(spec: QuantSpec, shape: tuple[int, ...]) -> str:
    """What ``spec`` asks, in a few words: ``int8 symmetric, blocks of 128 along axis -1,
    method dynamic``."""
    if spec.axis is None:
        grain = "per tensor"
    elif spec.block_size:
        grain = f"blocks of {spec.block_size} along axis {spec.axis}"
    else:
        grain = f"per channel on axis {spec.axis}"
    sym = "symmetric" if spec.symmetric else "asymmetric"
    method = "given scales" if spec.scale is not None else f"method {spec.method}"
    return f"{spec.qtype.name} {sym}, {grain}, {method}"


def rule_index(recipe: Recipe, name: str) -> int:
    """The index of the recipe rule that gives ``name`` its spec; -1: the defaults."""
    return next((i for i, r in enumerate(recipe.rules) if fnmatch.fnmatchcase(name, r.pattern)), -1)


def rule_where(recipe: Recipe, index: int) -> str:
    if index < 0:
        return "recipe [defaults] / the spec flags"
    return f"recipe rule {index + 1} ({recipe.rules[index].pattern!r})"


def kept_why(recipe: Recipe, name: str, shape: tuple[int, ...], dtype: Any) -> str:
    from ...qtypes import is_float_dtype

    if not is_float_dtype(np.dtype(dtype)):
        return f"{np.dtype(dtype).name} values"
    if len(shape) < recipe.min_rank:
        return f"rank {len(shape)} < {recipe.min_rank}"
    index = rule_index(recipe, name)
    if index >= 0:
        keep = recipe.rules[index].dtype
        return f"{rule_where(recipe, index)}" + (f", as {keep}" if keep else "")
    return "not in the recipe's include patterns"


def check_heads(hf: str, shape: tuple[int, ...], heads: int | None) -> int | None:
    """``heads`` (the rows of ``hf`` are permuted over them), its rows checked against it."""
    if heads is None:
        return None
    rows = shape[0] if shape else 0
    if len(shape) not in (1, 2) or rows % (2 * heads):
        field = "num_attention_heads" if "q_proj" in hf else "num_key_value_heads"
        raise InvalidParameterError(
            f"{hf}: shape {list(shape)} cannot be split into {heads} heads of two rotary halves"
            f" (its rows must be a multiple of 2 x {heads}); the config's {field} does not"
            " match the checkpoint"
        )
    return heads


def check_name(name: Any) -> None:
    """Refuse a tensor name a GGUF file cannot hold (not UTF-8: lone surrogates) or that
    llama.cpp would cut (NUL, control characters); no checkpoint writer makes them."""
    if not isinstance(name, str) or not name:
        raise InvalidParameterError(f"tensor name {name!r} is empty or not a string")
    if name.isascii() and name.isprintable():  # (every name a writer makes: no look-ups)
        return
    bad = next((c for c in name if unicodedata.category(c) in ("Cc", "Cs")), None)
    if bad is not None:
        what = "a lone surrogate" if unicodedata.category(bad) == "Cs" else "a control character"
        raise InvalidParameterError(
            f"tensor name {name!r} holds {what}"
            f" (U+{ord(bad):04X}), which a GGUF file cannot hold; no checkpoint writer makes"
            " such names: the checkpoint is damaged or crafted"
        )


_ELEMENT_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


def gguf_bytes(shape: tuple[int, ...], kind: str) -> int:
    """Bytes of a tensor of ``shape`` as ``kind`` in the file (alignment not counted)."""
    if not shape:
        return 4 if kind == "F32" else 2
    n = math.prod(shape)
    if kind in q.TYPE_SIZE:
        return n // q.BLOCK * q.TYPE_SIZE[kind]
    if kind in q.K_TYPE_SIZE:
        return n // q.K_BLOCK * q.K_TYPE_SIZE[kind]
    return n * _ELEMENT_BYTES[kind]
