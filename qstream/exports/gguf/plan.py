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
- **The model** (its config.json: ``architectures[0]``, else ``model_type``): one of the
  architectures llama.cpp's converter writes as :mod:`qstream.exports.gguf.arch` lists them,
  any other refused listing the supported ones; every field read is checked (presence, type,
  range), the q/k projections' rows against the head counts. Tensors are named, transformed
  (q/k rows permuted, Gemma norms + 1, Gemma 3's embedding cut to the vocabulary) and typed
  as the converter does (1-D tensors, norms and router gates F32 whatever the source dtype),
  left out where it leaves them out (a tied lm_head), and per-expert tensors merged into one
  3-D ``ffn_{gate,up,down}_exps`` a layer; the ``general.*``, architecture and
  ``tokenizer.*`` keys are computed here (a tokenizer the converter would refuse is refused).
  Tensor names holding NUL, control characters or lone surrogates are refused, as are two
  tensors with one GGUF name. Without a config, the checkpoint's own names are kept.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ...compat import gguf as q
from ...compat.gguf_names import Transform
from ...compat.gguf_names import plain_type as converter_type
from ...errors import InvalidParameterError
from ...io.checkpoints import source_config
from ...spec import Recipe
from .arch import FILE_TYPES
from .block_types import (
    RULES,
    check_heads,
    check_name,
    describe,
    explicit_type,
    gguf_bytes,
    is_default,
    kept_why,
    rule_index,
    rule_where,
    spec_type,
)
from .items import STRING, UINT32, MetaItem
from .llama import check_config, read_config
from .mixes import facts_of, file_type, mix_name, read_weights, retype
from .model_map import (
    NO_TOKENIZER,
    Model,
    merge_experts,
    merged_name,
    metadata_items,
    model_of,
    tokenizer_folder,
    vocab_count,
)
from .tensors import copy_type, plain_type

__all__ = ["GGUFPlan", "GGUFTensorPlan", "check_config", "plan_gguf", "read_config",
           "spec_type"]  # fmt: skip

_KEEP_TYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_FORCED = "as llama.cpp's converter writes 1-D tensors, norms and router gates"


@dataclass(frozen=True)
class GGUFTensorPlan:
    """One tensor of a GGUF export: ``name`` in the source, ``gguf_name`` in the file, its
    ``shape`` (as written) and source ``dtype``, the GGUF ``type`` chosen and the ``rule``
    its values follow, bytes before (as stored in the source) and after (in the file),
    whether it is ``kept`` (written in a float type) or copied from a qstream output's codes;
    the converter's transforms: the head count its rows are permuted over (``heads``), a
    value ``add``-ed (Gemma norms), the first ``rows`` kept (Gemma 3's embedding); ``parts``:
    the source tensors of a merged expert tensor, in expert order (``name`` then reads
    ``experts.*``)."""

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
    add: float = 0.0
    rows: int | None = None
    parts: tuple[str, ...] = ()

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
    """A GGUF export decided: the tensors in file order, the metadata keys (``meta``: every
    key but qstream's own), and what the writer needs besides (the source, whether it is a
    qstream output, the explicit type, the recipe, the model config and where it was read,
    the architecture, whether a tokenizer is written) and the plan's warnings (recipe rules
    that match nothing, a file llama.cpp will not load; the caller shows them)."""

    source: str
    type: str | None
    recipe: Recipe
    config: dict[str, Any] | None
    config_path: str | None
    architecture: str
    output: bool  # the source is a qstream output (codes copied), not a float checkpoint
    tensors: tuple[GGUFTensorPlan, ...]
    meta: tuple[MetaItem, ...] = ()
    tokenizer: bool = False
    warnings: tuple[str, ...] = field(default=())
    #: the opened source tensors by name (a reader's handles: nothing read yet)
    opened: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: llama-quantize's mix (None: one type), the imatrix file and its weights by GGUF name
    mix: str | None = None
    imatrix: str | None = None
    weights: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

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
    tokenizer: bool = True,
    pure: bool = False,
    imatrix: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    store: str | None = None,
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
    ``max_memory``: the memory bound a qstream output's tensors are opened under.
    ``tokenizer``: write the model's tokenizer (from the source's folder, else the config's);
    False: tensors and hyperparameters only (llama.cpp will not load the file). ``type`` may be
    a K type (Q2_K..Q6_K) or llama-quantize's mix (Q4_K_M, ...: :mod:`.mixes`), the mix unless
    ``pure`` (one type everywhere); ``imatrix``: its file, used as llama-quantize.
    ``storage_options``, ``store``: how a URL ``src`` is opened (:func:`open_checkpoint`)."""
    from ...io.checkpoints import open_checkpoint, pair_scales
    from ...io.outputs import QuantizedArray, QuantizedCheckpoint, open_quantized

    gtype = explicit_type(type)
    base, mix = mix_name(gtype, bool(pure)) if gtype else (None, None)
    weights = read_weights(imatrix)
    path = config if config is None or isinstance(config, dict) else os.fspath(config)
    if path is None:
        path = source_config(src)
    cfg = read_config(path)
    where = "config" if isinstance(path, dict) else str(path) if path is not None else None
    check_config(cfg, where or "config")
    model = model_of(cfg, where or "config")
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
            shape = tuple(int(d) for d in a.shape)
            placed = _place(model, hf, shape)
            if placed is None:
                continue
            name, how = placed
            opened_by_name[hf] = a
            if isinstance(a, QuantizedArray):
                kind = copy_type(hf, a)
                if gtype is not None and gtype != kind:
                    raise InvalidParameterError(
                        f"{hf}: holds {a.qtype.name} codes, which GGUF holds exactly as {kind};"
                        f" type {gtype} (--gguf-type {gtype}) would quantize them again: leave"
                        f" the type out (or pass {kind}), or export the float checkpoint with"
                        f" --gguf-type {gtype}"
                    )
                if how.add:
                    raise InvalidParameterError(
                        f"{hf}: holds codes, and llama.cpp's converter adds {how.add} to it;"
                        " export the float checkpoint to .gguf instead"
                    )
                before = _stored_bytes(a)
                rule = f"{a.qtype.name} codes and scales copied exactly into {kind} blocks"
                plans.append(
                    GGUFTensorPlan(hf, name, shape, a.qtype.name, kind, rule, before,
                                   gguf_bytes(shape, kind), copied=True, heads=how.heads)
                )  # fmt: skip
            else:
                kind = converter_type(name, shape, plain_type(a, hf))
                plans.append(_kept(hf, name, shape, _dtype_name(a), kind, "kept", how))
    else:
        if tensors is None:
            found = open_checkpoint(src, storage_options=storage_options, store=store)
            tensors = pair_scales(found, recipe.scales)
        notes = tuple(recipe.check(tensors))
        asked: dict[int, list[str]] = {}  # refusals: (first) rule -> tensor names
        refusals: dict[int, str] = {}
        opened_by_name = dict(tensors)
        for hf, v in tensors.items():
            shape = tuple(int(d) for d in v.shape)
            placed = _place(model, hf, shape)
            if placed is None:
                continue
            name, how = placed
            dtype = _dtype_name(v)
            spec = recipe.spec_for(hf, shape, v.dtype)
            if spec is None:
                keep = recipe.keep_dtype(hf, shape, v.dtype)
                kind = _KEEP_TYPES[keep] if keep else plain_type(v, hf)
                kind = converter_type(name, shape, kind)
                why = f"kept ({kept_why(recipe, hf, shape, v.dtype)})"
                plans.append(_kept(hf, name, shape, dtype, kind, why, how))
                continue
            if converter_type(name, shape, "?") == "F32":
                plans.append(_kept(hf, name, shape, dtype, "F32", f"kept ({_FORCED})", how))
                continue
            if gtype is not None:
                assert base is not None  # (a --gguf-type has its base type)
                kind, why = base, f"--gguf-type {gtype}"
            else:
                index = rule_index(recipe, hf)
                try:
                    kind = spec_type(spec, shape)
                except InvalidParameterError as e:
                    refusals.setdefault(index, f"{hf} ({rule_where(recipe, index)}): {e}")
                    asked.setdefault(index, []).append(hf)
                    continue
                why = (
                    "no spec asked: GGUF's default Q8_0"
                    if is_default(spec)
                    else f"{describe(spec, shape)} ({rule_where(recipe, index)})"
                )
            if kind in q.TYPE_SIZE and (not shape or shape[-1] % q.BLOCK):
                last = shape[-1] if shape else 1
                why = (
                    f"kept: a last axis of {last} is not whole blocks of {q.BLOCK}, as"
                    " llama.cpp's converter keeps it"
                    + (" (in F16, its fallback)" if model is not None else "")
                )
                kept = converter_type(name, shape, "F16" if model else plain_type(v, hf))
                plans.append(_kept(hf, name, shape, dtype, kept, why, how))
                continue
            before = _source_bytes(v, shape)
            plans.append(
                GGUFTensorPlan(hf, name, shape, dtype, kind, f"{why}: {RULES[kind]}", before,
                               gguf_bytes(shape, kind), heads=how.heads, add=how.add)
            )  # fmt: skip
        if refusals:
            index, first = next(iter(refusals.items()))
            others = sum(len(v) for v in asked.values()) - 1
            more = f" (and {others} other tensor{'s' * (others != 1)})" if others else ""
            raise InvalidParameterError(first + more)
    if model is not None:
        plans = merge_experts(plans, lambda p: p.name, _merged)
    used: dict[str, Any] = {}
    if base is not None and not output:
        plans, used = retype(plans, str(gtype), base, mix, facts_of(model.arch, model.config)
                             if model else None, weights, gguf_bytes, RULES)  # fmt: skip
    elif weights is not None:
        raise InvalidParameterError("--imatrix applies to --gguf-type of a float checkpoint")
    extra: dict[str, Any] = dict(mix=mix, imatrix=imatrix and os.fspath(imatrix), weights=used)
    seen: dict[str, str] = {}
    for t in plans:
        if t.gguf_name in seen:
            raise InvalidParameterError(
                f"{seen[t.gguf_name]} and {t.name} map to one GGUF name {t.gguf_name!r}"
            )
        seen[t.gguf_name] = t.name
    folder = Path(src if os.path.isdir(src) else os.path.dirname(os.fspath(src)) or ".")
    name = _text(os.path.basename(os.path.abspath(folder)))
    types = {t.name: t.type for t in plans}
    if model is None:
        arch = str((cfg or {}).get("model_type") or "qstream")
        meta = (
            MetaItem("general.architecture", STRING, arch),
            MetaItem("general.name", STRING, name),
            MetaItem("general.file_type", UINT32, _file_type(gtype, types)),
            MetaItem("general.quantization_version", UINT32, 2),
        )
        return GGUFPlan(str(src), gtype, recipe, cfg, _path_of(path, where), arch, output,
                        tuple(plans), meta, False, notes, opened_by_name, **extra)  # fmt: skip
    vocab = None
    tok_folder = tokenizer_folder(os.fspath(src), _path_of(path, where)) if tokenizer else None
    if tok_folder is not None:
        from .vocab import tokenizer_items

        vocab = tokenizer_items(tok_folder, model.arch, model.config)
    elif tokenizer:
        raise InvalidParameterError(
            f"{os.fspath(src)}: no tokenizer.json or tokenizer.model beside the checkpoint or"
            " its config.json, and llama.cpp loads no GGUF without a tokenizer (as its converter,"
            " qstream refuses); pass --no-tokenizer to write tensors and hyperparameters only"
        )
    else:
        notes += (f"--no-tokenizer: {NO_TOKENIZER}",)
    plans = [_trimmed(model, t, vocab_count(vocab)) for t in plans]
    shapes = [(t.gguf_name, t.shape) for t in plans]
    ftype = mostly(types)
    meta_items = metadata_items(model, shapes, ftype if ftype in FILE_TYPES else "F32", name,
                                tok_folder or folder, vocab)  # fmt: skip
    meta_items = [replace(m, value=_file_type(gtype, types)) if m.key == "general.file_type" else m
                  for m in meta_items]  # fmt: skip
    return GGUFPlan(str(src), gtype, recipe, cfg, _path_of(path, where), model.arch, output,
                    tuple(plans), tuple(meta_items), vocab is not None, notes,
                    opened_by_name, **extra)  # fmt: skip


def _file_type(asked: str | None, types: Mapping[str, str]) -> int:
    """``general.file_type``: llama-quantize's for a mix or K type, else the type most
    tensors have (as the converter writes it)."""
    ftype = file_type(asked) if asked else None
    return FILE_TYPES.get(mostly(types), 0) if ftype is None else ftype


def _path_of(path: Any, where: str | None) -> str | None:
    return where if isinstance(path, str) else None


def _place(model: Model | None, hf: str, shape: tuple[int, ...]) -> tuple[str, Transform] | None:
    """The GGUF name and transform of ``hf`` (its name checked; its rows against the heads
    it is permuted over); None: left out."""
    check_name(hf)
    if model is None:
        return hf, Transform()
    placed = model.place(hf)
    if placed is not None:
        check_heads(hf, shape, placed[1].heads)
    return placed


def _merged(parts: list[GGUFTensorPlan]) -> GGUFTensorPlan:
    """One 3-D tensor of a layer's experts ``parts`` (alike in shape, dtype and type)."""
    first = parts[0]
    for p in parts[1:]:
        if (p.shape, p.dtype, p.type, p.kept) != (first.shape, first.dtype, first.type, first.kept):
            raise InvalidParameterError(
                f"{p.name}: {p.dtype} {list(p.shape)} as {p.type}, but {first.name} is"
                f" {first.dtype} {list(first.shape)} as {first.type}; GGUF holds a layer's"
                " experts as one tensor: give them one spec"
            )
        if p.copied:
            raise InvalidParameterError(
                f"{p.name}: a qstream output's expert codes are not merged into GGUF's 3-D"
                " expert tensors yet; export the float checkpoint to .gguf instead"
            )
    shape = (len(parts), *first.shape)
    return replace(
        first, name=merged_name(first.name), shape=shape,
        bytes_before=sum(p.bytes_before for p in parts),
        bytes_after=sum(p.bytes_after for p in parts), parts=tuple(p.name for p in parts),
    )  # fmt: skip


def _trimmed(model: Model, t: GGUFTensorPlan, n_vocab: int | None) -> GGUFTensorPlan:
    """Gemma 3's embedding cut to the vocabulary's rows, as the converter cuts it."""
    if model.arch != "gemma3" or t.name != "model.embed_tokens.weight" or t.copied:
        return t
    n = n_vocab or int(model.config.get("vocab_size") or t.shape[0])
    if n >= t.shape[0]:
        return t
    shape = (n, *t.shape[1:])
    return replace(t, shape=shape, rows=n, bytes_after=gguf_bytes(shape, t.type))


def mostly(types: Mapping[str, str]) -> str:
    """The quantized type most tensors have (else the plain one), naming the file's type."""
    counts: dict[str, int] = {}
    for v in types.values():
        counts[v] = counts.get(v, 0) + 1
    quantized = {k: n for k, n in counts.items() if k in q.TYPE_SIZE}
    pool = quantized or counts
    return max(pool, key=lambda k: pool[k]) if pool else "F32"


def _text(s: str) -> str:
    """``s`` as UTF-8 can hold it (undecodable bytes replaced)."""
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _kept(
    hf: str, name: str, shape: tuple[int, ...], dtype: str, kind: str, why: str, how: Transform
) -> GGUFTensorPlan:
    before = math.prod(shape) * _itemsize(dtype)
    return GGUFTensorPlan(
        hf, name, shape, dtype, kind, f"{why}: {RULES[kind]}", before,
        gguf_bytes(shape, kind), kept=True, heads=how.heads, add=how.add,
    )  # fmt: skip


def _itemsize(dtype: str) -> int:
    try:
        return int(np.dtype(dtype).itemsize)
    except TypeError:
        return 2 if dtype == "bfloat16" else 1


def _dtype_name(t: Any) -> str:
    return _name_of(getattr(t, "source_dtype", t.dtype))


@functools.lru_cache(maxsize=64)
def _name_of(dtype: Any) -> str:
    """``np.dtype(dtype).name``, looked up once per dtype (49,152 expert tensors share one)."""
    return str(np.dtype(dtype).name)


def _source_bytes(t: Any, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * _itemsize(_dtype_name(t))


def _stored_bytes(a: Any) -> int:
    n = math.prod(a.shape)
    params = int(np.asarray(a.scale).size)
    return math.ceil(n * a.qtype.bits / 8) + params * (
        a.scale_dtype.itemsize + (0 if a.spec.symmetric else math.ceil(a.qtype.bits / 8))
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
