"""What a GGUF export will write, decided before any tensor is read: :func:`plan_gguf`.

The plan reads the source's headers (names, shapes, dtypes; a qstream output's metadata and
parameters) and the model's ``config.json``, never a tensor's values, and refuses what a GGUF
file cannot hold as asked, naming the tensor (or the recipe rule), what was asked, the nearest
GGUF type and ``--gguf-type``:

- **The type.** An explicit ``type`` (``export_gguf(type=...)``, ``--gguf-type``) alone picks
  the type of every tensor the recipe quantizes, with that type's own rule. Without one, each
  tensor's spec must be one a GGUF block type holds: integer codes of its width and symmetry
  (int8 symmetric -> Q8_0, int4 symmetric -> Q4_0, 4-bit asymmetric -> Q4_1; a symmetric
  unsigned type stands for its signed twin, the same values), in blocks of 32 along the last
  axis, each block its own range (``method`` dynamic, or minmax: the same per block), with the
  default round mode, levels and NaN policy; the values then follow the type's rule (stated
  in the plan: GGUF's rounding, not qstream's). Anything else is refused: GGUF never changes a
  spec silently. The recipe's default spec (no spec asked) stands for GGUF's default, Q8_0.
- **Kept tensors** (rank < ``min_rank``, ``keep`` rules, non-float, a last axis that is not
  whole blocks of 32, as llama.cpp's converter keeps them) are written in their own float type
  (float64 as F32), or in a keep rule's ``dtype``.
- **A qstream output**: codes and scales a GGUF block type holds exactly are copied (see
  :func:`qstream.exports.gguf.tensors.copy_type`); an explicit ``type`` must be that type.
- **The model's config.json** (Llama-style: ``model_type`` llama / mistral): every field the
  writer reads is checked for presence, type and range (:func:`check_config`), and the q/k
  projections' rows against the head counts; tensor names holding NUL, control characters
  or lone surrogates are refused, as are two tensors with one GGUF name.
"""

from __future__ import annotations

import math
import os
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...compat import gguf as q
from ...errors import InvalidParameterError
from ...io.checkpoints import source_config
from ...spec import DEFAULT_SPEC, QuantSpec, Recipe
from .llama import Llama, check_config, read_config
from .llama import llama as llama_of
from .tensors import copy_type, plain_type

__all__ = ["GGUFPlan", "GGUFTensorPlan", "check_config", "plan_gguf", "read_config"]

#: how each GGUF type makes its values (what the plan states for every tensor of that type)
RULES = {
    "Q8_0": "gguf-py's Q8_0: blocks of 32 along the last axis, d = absmax / 127 (float32),"
    " codes round-half-away(x * (1 / d)) in -127..127, d stored as float16",
    "Q4_0": "gguf-py's Q4_0: blocks of 32 along the last axis, d = m / -8 (m: the value of"
    " largest magnitude; all 16 levels), nibbles trunc(x * (1 / d) + 8.5) clipped to 0..15,"
    " d stored as float16",
    "Q4_1": "gguf-py's Q4_1: blocks of 32 along the last axis, d = (max - min) / 15, m = min,"
    " nibbles trunc((x - m) * (1 / d) + 0.5) clipped to 0..15, d and m stored as float16",
    "F32": "float32 values",
    "F16": "values rounded to float16 (nearest even)",
    "BF16": "values rounded to bfloat16 (nearest even, as gguf-py)",
}
_KEEP_TYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_ELEMENT_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


@dataclass(frozen=True)
class GGUFTensorPlan:
    """One tensor of a GGUF export: ``name`` in the source, ``gguf_name`` in the file, its
    ``shape`` and source ``dtype``, the GGUF ``type`` chosen and the ``rule`` its values
    follow, bytes before (as stored in the source) and after (in the file), whether it is
    ``kept`` (written in a float type as it is) or copied from a qstream output's codes, and
    the head count its rows are permuted over (q/k projections of a Llama)."""

    name: str
    gguf_name: str
    shape: tuple[int, ...]
    dtype: str
    type: str
    rule: str
    bytes_before: int
    bytes_after: int
    kept: bool = False
    copied: bool = False
    heads: int | None = None

    def row(self) -> dict[str, Any]:
        """The tensor as a JSON-ready row (the keys of :func:`qstream.plan_conversion`'s
        rows, ``target`` being the GGUF type, plus ``gguf_name``, ``rule`` and ``kept``)."""
        return {
            "name": self.name,
            "gguf_name": self.gguf_name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "target": self.type,
            "rule": self.rule,
            "kept": self.kept,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
        }


@dataclass(frozen=True)
class GGUFPlan:
    """A GGUF export decided: the tensors in file order and what the writer needs besides
    (the source, whether it is a qstream output, the explicit type, the recipe, the model
    config and where it was read, the architecture, the Llama naming when there is one) and
    the recipe's warnings (rules that match nothing; the caller shows them)."""

    source: str
    type: str | None
    recipe: Recipe
    config: dict[str, Any] | None
    config_path: str | None
    architecture: str
    llama: Llama | None
    output: bool  # the source is a qstream output (codes copied), not a float checkpoint
    tensors: tuple[GGUFTensorPlan, ...]
    warnings: tuple[str, ...] = field(default=())
    #: the opened source tensors by name (a reader's handles: nothing read yet)
    opened: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def rows(self) -> list[dict[str, Any]]:
        """Every tensor as :meth:`GGUFTensorPlan.row` gives it (for ``--dry-run``)."""
        return [t.row() for t in self.tensors]

    @property
    def bytes_before(self) -> int:
        return sum(t.bytes_before for t in self.tensors)

    @property
    def bytes_after(self) -> int:
        return sum(t.bytes_after for t in self.tensors)


def plan_gguf(
    src: str | os.PathLike[str],
    recipe: Recipe | str | os.PathLike[str] | None = None,
    type: str | None = None,
    config: str | os.PathLike[str] | dict[str, Any] | None = None,
    *,
    tensors: Mapping[str, Any] | None = None,
    max_memory: int | None = None,
) -> GGUFPlan:
    """Decide the GGUF export of ``src`` (a float checkpoint, or a qstream output) before any
    tensor is read (see the module docstring); raise :class:`InvalidParameterError` for what
    it cannot write as asked.

    ``recipe``: a :class:`Recipe`, the path of its TOML file, or None (the default recipe);
    ``type``: Q8_0, Q4_0, Q4_1, F16, BF16 or F32 for every tensor the recipe quantizes, or
    None (from each tensor's spec); ``config``: the model's config.json (a path or a dict),
    None: the one beside (or in) ``src``. ``tensors``: the float checkpoint's tensors when the
    caller has opened it already (name -> an object with ``shape`` and ``dtype``, FP8 scales
    paired as :func:`qstream.io.checkpoints.fp8.pair_scales` pairs them); None: opened here.
    ``max_memory``: the memory bound a qstream output's tensors are opened under."""
    from ...io.checkpoints import open_checkpoint, pair_scales
    from ...io.outputs import QuantizedArray, QuantizedCheckpoint, open_quantized

    gtype = _explicit_type(type)
    path = config if config is None or isinstance(config, dict) else os.fspath(config)
    if path is None:
        path = source_config(src)
    cfg = read_config(path)
    where = "config" if isinstance(path, dict) else str(path) if path is not None else None
    check_config(cfg, where or "config")
    llama = llama_of(cfg)
    if not isinstance(recipe, Recipe):
        recipe = Recipe.load(recipe) if recipe else Recipe()
    output = tensors is None and is_output(src)
    plans: list[GGUFTensorPlan] = []
    notes: tuple[str, ...] = ()
    opened_by_name: dict[str, Any] = {}
    if output:
        opened = open_quantized(src, max_memory=max_memory)
        items: list[tuple[str, Any]] = (
            [(n, opened[n]) for n in opened]
            if isinstance(opened, QuantizedCheckpoint)
            else [("weight", opened)]
        )
        for hf, a in items:
            _check_name(hf)
            opened_by_name[hf] = a
            name = llama.name(hf) if llama else hf
            heads = _heads(llama, hf, tuple(a.shape))
            shape = tuple(int(d) for d in a.shape)
            if isinstance(a, QuantizedArray):
                kind = copy_type(hf, a)
                if gtype is not None and gtype != kind:
                    raise InvalidParameterError(
                        f"{hf}: holds {a.qtype.name} codes, which GGUF holds exactly as {kind};"
                        f" type {gtype} (--gguf-type {gtype}) would quantize them again: leave"
                        f" the type out (or pass {kind}), or export the float checkpoint with"
                        f" --gguf-type {gtype}"
                    )
                before = _stored_bytes(a)
                rule = f"{a.qtype.name} codes and scales copied exactly into {kind} blocks"
                plans.append(
                    GGUFTensorPlan(hf, name, shape, a.qtype.name, kind, rule, before,
                                   _gguf_bytes(shape, kind), copied=True, heads=heads)
                )  # fmt: skip
            else:
                kind = plain_type(a, hf)
                dtype = _dtype_name(a)
                plans.append(_kept(hf, name, shape, dtype, kind, "kept", heads))
    else:
        if tensors is None:
            tensors = pair_scales(open_checkpoint(src), recipe.scales)
        notes = tuple(recipe.check(tensors))
        asked: dict[int, list[str]] = {}  # refusals: (first) rule -> tensor names
        refusals: dict[int, str] = {}
        opened_by_name = dict(tensors)
        for hf, v in tensors.items():
            _check_name(hf)
            shape = tuple(int(d) for d in v.shape)
            name = llama.name(hf) if llama else hf
            heads = _heads(llama, hf, shape)
            dtype = _dtype_name(v)
            spec = recipe.spec_for(hf, shape, v.dtype)
            if spec is None:
                keep = recipe.keep_dtype(hf, shape, v.dtype)
                kind = _KEEP_TYPES[keep] if keep else plain_type(v, hf)
                why = f"kept ({_kept_why(recipe, hf, shape, v.dtype)})"
                plans.append(_kept(hf, name, shape, dtype, kind, why, heads))
                continue
            if gtype is not None:
                kind, why = gtype, f"--gguf-type {gtype}"
            else:
                index = _rule_index(recipe, hf)
                try:
                    kind = spec_type(spec, shape)
                except InvalidParameterError as e:
                    refusals.setdefault(index, f"{hf} ({_where(recipe, index)}): {e}")
                    asked.setdefault(index, []).append(hf)
                    continue
                why = (
                    "no spec asked: GGUF's default Q8_0"
                    if _is_default(spec)
                    else f"{_describe(spec, shape)} ({_where(recipe, index)})"
                )
            if kind in q.TYPE_SIZE and (not shape or shape[-1] % q.BLOCK):
                last = shape[-1] if shape else 1
                why = (
                    f"kept: a last axis of {last} is not whole blocks of {q.BLOCK}, as"
                    " llama.cpp's converter keeps it"
                )
                plans.append(_kept(hf, name, shape, dtype, plain_type(v, hf), why, heads))
                continue
            before = _source_bytes(v, shape)
            plans.append(
                GGUFTensorPlan(hf, name, shape, dtype, kind, f"{why}: {RULES[kind]}", before,
                               _gguf_bytes(shape, kind), heads=heads)
            )  # fmt: skip
        if refusals:
            index, first = next(iter(refusals.items()))
            others = sum(len(v) for v in asked.values()) - 1
            more = f" (and {others} other tensor{'s' * (others != 1)})" if others else ""
            raise InvalidParameterError(first + more)
    seen: dict[str, str] = {}
    for t in plans:
        if t.gguf_name in seen:
            raise InvalidParameterError(
                f"{seen[t.gguf_name]} and {t.name} map to one GGUF name {t.gguf_name!r}"
            )
        seen[t.gguf_name] = t.name
    arch = "llama" if llama else str((cfg or {}).get("model_type") or "qstream")
    return GGUFPlan(
        source=str(src),
        type=gtype,
        recipe=recipe,
        config=cfg,
        config_path=where if isinstance(path, str) else None,
        architecture=arch,
        llama=llama,
        output=output,
        tensors=tuple(plans),
        warnings=notes,
        opened=opened_by_name,
    )


def spec_type(spec: QuantSpec, shape: tuple[int, ...]) -> str:
    """The GGUF block type that holds ``spec`` on a tensor of ``shape`` as asked (module
    docstring), else :class:`InvalidParameterError` saying what was asked, why no type
    holds it, the nearest type and ``--gguf-type``."""
    if _is_default(spec):
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
            f"{_describe(spec, shape)} has no GGUF type: {'; '.join(why)}. The nearest type"
            f" is {nearest} ({_SHAPES[nearest]}): ask for that spec, or pass --gguf-type"
            f" {nearest} (type='{nearest}') to take GGUF's own rule for every quantized tensor"
        )
    return nearest


_SHAPES = {
    "Q8_0": "int8, symmetric, blocks of 32 along the last axis",
    "Q4_0": "int4, symmetric, blocks of 32 along the last axis",
    "Q4_1": "4-bit, asymmetric, blocks of 32 along the last axis",
}


def _explicit_type(type: str | None) -> str | None:
    if type is None:
        return None
    gtype = str(type).upper()
    if gtype not in q.TYPE_ID:
        raise InvalidParameterError(
            f"unknown GGUF type {type!r}; expected one of: {', '.join(q.TYPES)}"
        )
    return gtype


def _is_default(spec: QuantSpec) -> bool:
    """Whether ``spec`` is the recipe's default (no spec asked: GGUF's default type)."""
    return bool(spec.to_dict() == QuantSpec(**DEFAULT_SPEC).to_dict())


def _describe(spec: QuantSpec, shape: tuple[int, ...]) -> str:
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


def _rule_index(recipe: Recipe, name: str) -> int:
    """The index of the recipe rule that gives ``name`` its spec; -1: the defaults."""
    import fnmatch

    return next((i for i, r in enumerate(recipe.rules) if fnmatch.fnmatchcase(name, r.pattern)), -1)


def _where(recipe: Recipe, index: int) -> str:
    if index < 0:
        return "recipe [defaults] / the spec flags"
    return f"recipe rule {index + 1} ({recipe.rules[index].pattern!r})"


def _kept_why(recipe: Recipe, name: str, shape: tuple[int, ...], dtype: Any) -> str:
    from ...qtypes import is_float_dtype

    if not is_float_dtype(np.dtype(dtype)):
        return f"{np.dtype(dtype).name} values"
    if len(shape) < recipe.min_rank:
        return f"rank {len(shape)} < {recipe.min_rank}"
    index = _rule_index(recipe, name)
    if index >= 0:
        keep = recipe.rules[index].dtype
        return f"{_where(recipe, index)}" + (f", as {keep}" if keep else "")
    return "not in the recipe's include patterns"


def _kept(
    hf: str, name: str, shape: tuple[int, ...], dtype: str, kind: str, why: str, heads: int | None
) -> GGUFTensorPlan:
    n = math.prod(shape)
    before = n * _itemsize(dtype)
    return GGUFTensorPlan(
        hf, name, shape, dtype, kind, f"{why}: {RULES[kind]}", before,
        _gguf_bytes(shape, kind), kept=True, heads=heads,
    )  # fmt: skip


def _itemsize(dtype: str) -> int:
    try:
        return int(np.dtype(dtype).itemsize)
    except TypeError:
        return 2 if dtype == "bfloat16" else 1


def _dtype_name(t: Any) -> str:
    return str(np.dtype(getattr(t, "source_dtype", t.dtype)).name)


def _source_bytes(t: Any, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * _itemsize(_dtype_name(t))


def _stored_bytes(a: Any) -> int:
    n = math.prod(a.shape)
    params = int(np.asarray(a.scale).size)
    return math.ceil(n * a.qtype.bits / 8) + params * (
        a.scale_dtype.itemsize + (0 if a.spec.symmetric else math.ceil(a.qtype.bits / 8))
    )


def _gguf_bytes(shape: tuple[int, ...], kind: str) -> int:
    """Bytes of a tensor of ``shape`` as ``kind`` in the file (alignment not counted)."""
    if not shape:
        return 4 if kind == "F32" else 2
    n = math.prod(shape)
    if kind in q.TYPE_SIZE:
        return n // q.BLOCK * q.TYPE_SIZE[kind]
    return n * _ELEMENT_BYTES[kind]


def _heads(llama: Llama | None, hf: str, shape: tuple[int, ...]) -> int | None:
    """How many heads the rows of ``hf`` are permuted over, its rows checked against it."""
    heads = llama.heads_of(hf) if llama else None
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


def _check_name(name: Any) -> None:
    """Refuse a tensor name a GGUF file cannot hold (not UTF-8: lone surrogates) or that
    llama.cpp would cut (NUL, control characters); no checkpoint writer makes them."""
    if not isinstance(name, str) or not name:
        raise InvalidParameterError(f"tensor name {name!r} is empty or not a string")
    bad = next((c for c in name if unicodedata.category(c) in ("Cc", "Cs")), None)
    if bad is not None:
        what = "a lone surrogate" if unicodedata.category(bad) == "Cs" else "a control character"
        raise InvalidParameterError(
            f"tensor name {name!r} holds {what}"
            f" (U+{ord(bad):04X}), which a GGUF file cannot hold; no checkpoint writer makes"
            " such names: the checkpoint is damaged or crafted"
        )


# --- where the source and its config are ---------------------------------------------------


def is_output(src: str | os.PathLike[str]) -> bool:
    """Whether ``src`` is a qstream output (a converted checkpoint or one quantized group)."""
    from ...io.checkpoints import read_json

    path = os.path.join(os.fspath(src), "zarr.json")
    if not os.path.isfile(path):
        return False
    attrs = (read_json(path) or {}).get("attributes") or {}
    return isinstance(attrs, dict) and ("qstream_checkpoint" in attrs or "qstream" in attrs)
