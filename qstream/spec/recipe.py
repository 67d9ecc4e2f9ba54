"""Conversion recipes: which tensors of a checkpoint to quantize, and how.

A recipe is TOML::

    [defaults]                 # the spec for tensors no rule names (QuantSpec fields)
    dtype = "int8"
    axis = 0

    include = ["*proj*"]       # optional: only tensors matching one of these are quantized

    [[rules]]                  # first matching rule wins; patterns are fnmatch globs on names
    pattern = "*norm*"
    action = "keep"            # store unquantized

    [[rules]]
    pattern = "*embed*"
    spec = { dtype = "int8", axis = 0, method = "percentile", percentile = 99.99 }

    [[rules]]
    pattern = "*"
    action = "keep"
    dtype = "bfloat16"         # kept, rounded to this type (float32, bfloat16 or float16)

    [scales]                   # FP8 weights and their block scales (qstream.io.checkpoints.fp8)
    suffix = "_scale_inv"      # the scale of W is W_scale_inv (a string or a list)
    block = [128, 128]         # optional: else taken from the two shapes
    enabled = true             # false: no pairing, scale tensors are tensors

Tensors that are not floating point, or have rank < ``min_rank`` (default 2), are kept.
The default recipe quantizes every float tensor of rank >= 2 to int8, symmetric, per channel
on axis 0.
"""

from __future__ import annotations

import fnmatch
import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import ml_dtypes
import numpy as np
import numpy.typing as npt

from ..errors import InvalidDTypeError, InvalidParameterError, StoreError
from ..input_files import open_regular
from ..qtypes import is_float_dtype
from .json_helpers import check_keys, jsonable_dict
from .quantspec import QuantSpec

_SPEC_KEYS = tuple(QuantSpec.__dataclass_fields__)
DEFAULT_SPEC: dict[str, Any] = {"dtype": "int8", "axis": 0, "symmetric": True, "method": "minmax"}
KEEP_DTYPES = ("float32", "bfloat16", "float16")  # what a keep rule may round kept values to


DEFAULT_SUFFIXES = ("_scale_inv",)  # the scale of W is W + suffix


# a quantized checkpoint's activation / attention parameters: plain values, never quantized
ACTIVATION_PARAMS = (
    "input_scale",
    "input_zero_point",
    "input_global_scale",
    "output_scale",
    "output_zero_point",
    "q_scale",
    "k_scale",
    "v_scale",
)


@dataclass(frozen=True)
class ScaleRule:
    """How FP8 weights pair with their scale tensors: the scale of ``W`` is ``W + suffix``
    (the first of ``suffixes`` that names a tensor); ``block``: the block shape (else taken
    from the two shapes); ``enabled=False``: no pairing (scale tensors are tensors)."""

    suffixes: tuple[str, ...] = DEFAULT_SUFFIXES
    block: tuple[int, ...] | None = None
    enabled: bool = True

    def is_default(self) -> bool:
        """Whether this is the rule a recipe without a ``[scales]`` table has."""
        return self == ScaleRule()

    def to_dict(self) -> dict[str, Any]:
        """The rule as a recipe's ``[scales]`` table."""
        out: dict[str, Any] = {"enabled": self.enabled, "suffix": list(self.suffixes)}
        if self.block is not None:
            out["block"] = list(self.block)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> ScaleRule:
        """The rule of a recipe's ``[scales]`` table (None: the default rule)."""
        if d is None:
            return cls()
        where = "recipe [scales]"
        if not isinstance(d, dict):
            raise InvalidParameterError(f"{where} must be a table")
        unknown = sorted(set(d) - {"enabled", "suffix", "block"})
        if unknown:
            raise InvalidParameterError(
                f"{where}: unknown key {unknown[0]!r} (known: block, enabled, suffix)"
            )
        enabled = d.get("enabled", True)
        if not isinstance(enabled, bool):
            raise InvalidParameterError(f"{where}: enabled must be true or false")
        suffix = d.get("suffix", list(DEFAULT_SUFFIXES))
        suffixes = [suffix] if isinstance(suffix, str) else suffix
        if (
            not isinstance(suffixes, list)
            or not suffixes
            or not all(isinstance(s, str) and s for s in suffixes)
        ):
            raise InvalidParameterError(
                f"{where}: suffix must be a non-empty string or a list of them, got {suffix!r}"
            )
        block = d.get("block")
        if block is not None and (
            not isinstance(block, list)
            or not block
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
        ):
            raise InvalidParameterError(
                f"{where}: block must be a list of positive integers (e.g. [128, 128]),"
                f" got {block!r}"
            )
        return cls(tuple(suffixes), None if block is None else tuple(block), enabled)


class Shaped(Protocol):
    """What a recipe reads of a checkpoint's tensor: its shape and dtype."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> np.dtype[Any]: ...


@dataclass(frozen=True)
class Rule:
    """A recipe rule: tensors whose names match ``pattern`` get ``spec`` (None: kept)."""

    pattern: str
    spec: QuantSpec | None  # None: keep the tensor as it is
    dtype: str | None = None  # a keep rule's: kept values rounded to this type


@dataclass(frozen=True)
class Recipe:
    """Rules from tensor-name patterns to a spec or ``keep``."""

    defaults: QuantSpec = field(default_factory=lambda: QuantSpec(**DEFAULT_SPEC))
    rules: tuple[Rule, ...] = ()
    min_rank: int = 2
    scales: ScaleRule = field(default_factory=ScaleRule)
    #: when not empty, only tensors matching one of these patterns are quantized
    include: tuple[str, ...] = ()

    def keep_dtype(self, name: str, shape: Sequence[int], dtype: npt.DTypeLike) -> str | None:
        """The type a kept floating-point tensor is rounded to: the ``dtype`` of the first
        rule matching ``name`` when it is a keep rule with one (whatever the tensor's rank),
        else None (kept as it is)."""
        if not is_float_dtype(np.dtype(dtype)):
            return None
        for rule in self.rules:
            if fnmatch.fnmatchcase(name, rule.pattern):
                return rule.dtype if rule.spec is None else None
        return None

    def spec_for(self, name: str, shape: Sequence[int], dtype: npt.DTypeLike) -> QuantSpec | None:
        """The spec for a tensor, or None to keep it (a quantized source's activation
        parameters, :data:`ACTIVATION_PARAMS`, always)."""
        if not is_float_dtype(np.dtype(dtype)) or len(shape) < self.min_rank:
            return None
        if name.rpartition(".")[2] in ACTIVATION_PARAMS:
            return None
        if self.include and not any(fnmatch.fnmatchcase(name, p) for p in self.include):
            return None
        for rule in self.rules:
            if fnmatch.fnmatchcase(name, rule.pattern):
                return None if rule.spec is None else rule.spec.for_source(dtype)
        return self.defaults.for_source(dtype)  # (scale_dtype "source": the tensor's dtype)

    def check(self, tensors: Mapping[str, Shaped]) -> list[str]:
        """Check the recipe against a checkpoint's ``tensors`` (name -> object with
        ``shape`` and ``dtype``) before anything is written: an axis a tensor does not have
        is an error naming the rule and the tensor; the returned warnings name each rule that
        matches no tensor (a pattern that misses the checkpoint's names)."""
        from ..core import normalize_axis

        used: set[int] = set()
        fine: set[tuple[int, int]] = set()  # (id(spec), rank) of axes checked (tensors share)
        for name, t in tensors.items():
            shape = tuple(t.shape)
            index = next(
                (i for i, r in enumerate(self.rules) if fnmatch.fnmatchcase(name, r.pattern)),
                None,
            )
            if index is not None:
                used.add(index)
            spec = self.spec_for(name, shape, t.dtype)
            if spec is None or spec.axis is None or (id(spec), len(shape)) in fine:
                continue
            try:
                normalize_axis(spec.axis, len(shape))
            except InvalidParameterError as e:
                where = (
                    "recipe [defaults]"
                    if index is None
                    else f"recipe rule {index + 1} ({self.rules[index].pattern!r})"
                )
                raise InvalidParameterError(
                    f"{where} on tensor {name} (shape {list(shape)}): {e}; give that tensor"
                    " its own rule (a spec with another axis, or keep)"
                ) from None
            fine.add((id(spec), len(shape)))
        missed = [p for p in self.include if not any(fnmatch.fnmatchcase(n, p) for n in tensors)]
        if self.include and len(missed) == len(self.include) and tensors:
            raise InvalidParameterError(
                f"include pattern{'s' if len(missed) > 1 else ''}"
                f" {', '.join(repr(p) for p in missed)} match{'' if len(missed) > 1 else 'es'}"
                f" no tensor of the checkpoint{_like(missed[0], tensors)}: nothing would be"
                " quantized"
            )
        return [
            f"recipe rule {i + 1} ({r.pattern!r}) matches no tensor of the checkpoint"
            f"{_like(r.pattern, tensors)}"
            for i, r in enumerate(self.rules)
            if i not in used
        ] + [
            f"recipe include pattern {p!r} matches no tensor of the checkpoint{_like(p, tensors)}"
            for p in missed
        ]

    def check_blocks(self, tensors: Mapping[str, Shaped], max_memory: int | None) -> None:
        """Refuse, before anything is written, a tensor whose blocked spec makes blocks the
        memory bound ``max_memory`` cannot hold (the check its job makes when it is planned,
        :func:`~qstream.budget.default_chunks`, made for every tensor at once), naming
        the rule, the tensor and the bound. A block size past a tensor's axis is one group
        along it: blocks of the whole axis, held to the bound as any other."""
        from ..budget import block_budget, default_chunks, memory_limit
        from ..core import normalize_axis

        given = [self.defaults, *(r.spec for r in self.rules if r.spec is not None)]
        if not any(s.block_size for s in given):  # (no tensor's spec is blocked: nothing to walk)
            return
        for name, t in tensors.items():
            shape = tuple(int(d) for d in t.shape)
            spec = self.spec_for(name, shape, t.dtype)
            if spec is None or not spec.block_size or spec.axis is None or not shape:
                continue
            stored = getattr(t, "shards", None) or getattr(t, "chunks", None)
            try:
                default_chunks(
                    shape,
                    max(4, np.dtype(t.dtype).itemsize),
                    stored,
                    axis=normalize_axis(spec.axis, len(shape)),
                    block_size=spec.block_size,
                    budget=block_budget(max_memory),
                    limit=memory_limit(max_memory),
                )
            except InvalidParameterError as e:
                index = next(
                    (i for i, r in enumerate(self.rules) if fnmatch.fnmatchcase(name, r.pattern)),
                    None,
                )
                where = (
                    "recipe [defaults]"
                    if index is None
                    else f"recipe rule {index + 1} ({self.rules[index].pattern!r})"
                )
                raise InvalidParameterError(f"{where} on tensor {name}: {e}") from None

    def specs(self) -> list[QuantSpec]:
        """Every spec the recipe can give (the defaults first), without repeats; one with
        ``scale_dtype="source"`` as it is for bfloat16, float16 and float32 tensors."""
        out: list[QuantSpec] = []
        for spec in [self.defaults, *(r.spec for r in self.rules if r.spec is not None)]:
            for dtype in (ml_dtypes.bfloat16, np.float16, np.float32):
                s = spec.for_source(dtype)
                if s not in out:
                    out.append(s)
        return out

    def with_scale_dtype(self, scale_dtype: str, *, where_default: bool = False) -> Recipe:
        """The recipe with every spec's ``scale_dtype`` set to ``scale_dtype``
        (``where_default``: only the specs that leave it at the default, float32)."""
        from dataclasses import replace

        def set_(spec: QuantSpec) -> QuantSpec:
            if where_default and spec.scale_dtype != "float32":
                return spec
            return replace(spec, scale_dtype=scale_dtype)

        rules = tuple(r if r.spec is None else replace(r, spec=set_(r.spec)) for r in self.rules)
        return replace(self, defaults=set_(self.defaults), rules=rules)

    def to_dict(self) -> dict[str, Any]:
        """The recipe as a JSON-ready dict (:meth:`from_dict` reads it back)."""
        return jsonable_dict(
            {
                "defaults": self.defaults.to_dict(),
                "min_rank": self.min_rank,
                "rules": [
                    {
                        "pattern": r.pattern,
                        **({"spec": r.spec.to_dict()} if r.spec else {"action": "keep"}),
                        **({"dtype": r.dtype} if r.dtype else {}),
                    }
                    for r in self.rules
                ],
                # (only when not the default: the identities of earlier runs stay the same)
                **({} if self.scales.is_default() else {"scales": self.scales.to_dict()}),
                **({"include": list(self.include)} if self.include else {}),
            }
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Recipe:
        """The recipe ``d`` (a parsed TOML table) describes; any unknown key, bad value or
        bad spec is an error naming the table it is in."""
        if not isinstance(d, dict):
            raise InvalidParameterError("a recipe is a table of [defaults] and [[rules]]")
        check_keys(d, ("defaults", "rules", "min_rank", "scales", "include"), "recipe")
        include = d.get("include", [])
        if not isinstance(include, list) or not all(isinstance(p, str) for p in include):
            raise InvalidParameterError("recipe include must be a list of name patterns")
        if not isinstance(d.get("defaults", {}), dict):
            raise InvalidParameterError("recipe [defaults] must be a table")
        if not isinstance(d.get("rules", []), list):
            raise InvalidParameterError("recipe rules must be an array of tables ([[rules]])")
        check_keys(d.get("defaults", {}), _SPEC_KEYS, "recipe [defaults]")
        defaults = _spec("recipe [defaults]", {**DEFAULT_SPEC, **d.get("defaults", {})})
        rules = []
        for i, r in enumerate(d.get("rules", [])):
            if not isinstance(r, dict):
                raise InvalidParameterError(f"recipe rule {i + 1} is not a table")
            check_keys(r, ("pattern", "action", "spec", "dtype"), f"recipe rule {i + 1}")
            if not isinstance(r.get("pattern"), str):
                raise InvalidParameterError(f"recipe rule {i + 1} has no pattern (a string)")
            if "action" in r and r["action"] != "keep":
                raise InvalidParameterError(
                    f'recipe rule {i + 1} ({r["pattern"]!r}): action must be "keep", got'
                    f" {r['action']!r}"
                )
            if "action" in r and "spec" in r:
                raise InvalidParameterError(
                    f'recipe rule {i + 1} ({r["pattern"]!r}): a "keep" rule has no spec (it'
                    " keeps the tensors as they are); remove its spec, or its action to"
                    " quantize them with the spec"
                )
            if "dtype" in r and (r.get("action") != "keep" or r["dtype"] not in KEEP_DTYPES):
                raise InvalidParameterError(
                    f"recipe rule {i + 1} ({r['pattern']!r}): dtype belongs to a keep rule and"
                    f" is one of {', '.join(KEEP_DTYPES)}, got {r['dtype']!r} (a quantized"
                    " type goes in the rule's spec)"
                )
            if r.get("action") == "keep":
                rules.append(Rule(r["pattern"], None, r.get("dtype")))
            elif "spec" in r:
                where = f"recipe rule {i + 1} ({r['pattern']!r})"
                if not isinstance(r["spec"], dict):
                    raise InvalidParameterError(f"{where}: spec must be a table")
                check_keys(r["spec"], _SPEC_KEYS, f"recipe rule {i + 1} spec")
                rules.append(Rule(r["pattern"], _spec(where, {**defaults.to_dict(), **r["spec"]})))
            else:
                raise InvalidParameterError(
                    f'recipe rule {i + 1} ({r["pattern"]!r}) needs action = "keep" or a spec'
                )
        min_rank = d.get("min_rank", 2)
        if isinstance(min_rank, bool) or not isinstance(min_rank, int) or min_rank < 0:
            raise InvalidParameterError(
                f"recipe min_rank must be an integer >= 0, got {min_rank!r}"
            )
        scales = ScaleRule.from_dict(d.get("scales"))
        return cls(defaults, tuple(rules), min_rank, scales, tuple(include))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Recipe:
        """The recipe in the TOML file ``path`` (at most :data:`MAX_RECIPE` bytes)."""
        try:
            with open_regular(str(path), "recipe") as f:
                raw = f.read(MAX_RECIPE + 1)
        except FileNotFoundError:
            raise InvalidParameterError(f"recipe file not found: {path}") from None
        except StoreError as e:  # (a folder, a FIFO, a link: a bad input, refused as one)
            raise InvalidParameterError(str(e)) from None
        if len(raw) > MAX_RECIPE:
            raise InvalidParameterError(f"recipe {path} is larger than {MAX_RECIPE} bytes")
        try:
            return cls.from_dict(tomllib.loads(raw.decode("utf-8")))
        except (InvalidParameterError, InvalidDTypeError) as e:  # (naming the file too)
            raise type(e)(f"{path}: {e}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise InvalidParameterError(f"recipe {path} is not valid TOML: {e}") from None
        except RecursionError:
            raise InvalidParameterError(f"recipe {path} is nested too deeply") from None


MAX_RECIPE = 1 << 20  # bytes of a recipe file


def _spec(where: str, fields: dict[str, Any]) -> QuantSpec:
    """``QuantSpec.from_dict(fields)``, its errors naming the recipe's table ``where``."""
    from ..budget import check_block_size

    try:
        spec = QuantSpec.from_dict(fields)
        check_block_size(spec.block_size)
        return spec
    except (InvalidParameterError, InvalidDTypeError) as e:  # (an unknown dtype is the latter)
        raise type(e)(f"{where}: {e}") from None


def _like(pattern: str, names: Iterable[str]) -> str:
    """The hint ``(names look like 'NAME')``: the first name holding the most of
    ``pattern``'s plain pieces (what it meant to match, most likely: ``layers.*.mlp.*``
    shows a name with ``layers.`` and ``.mlp.``, and its missing prefix), else the first."""
    plain = re.sub(r"\[[^\]]*\]", "*", pattern)  # (a class [abc] is no plain text)
    pieces = [p for p in re.split(r"[*?]", plain) if p]
    best, score = None, -1
    for n in names:
        held = sum(p in n for p in pieces)
        if held > score:
            best, score = n, held
            if held == len(pieces):
                break
    return f" (names look like {best if best is not None else '?'!r})"
