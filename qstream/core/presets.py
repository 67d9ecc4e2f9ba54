"""compressed-tensors 0.20's preset schemes (``PRESET_SCHEMES``: ``W4A16``, ``FP8_DYNAMIC``,
``NVFP4A16``, ...) as qstream reads them: what the weights become, which compressed-tensors
format writes them, and whether the activations need calibrated scales qstream cannot provide.

A name means exactly what compressed-tensors means by it (``preset("w4a16")`` is int4 in
groups of 128, symmetric, 16 levels, scale ``absmax / 7.5`` in the weight's dtype). Weight
scale dtypes: ``"weight"`` (the source's dtype, as llm-compressor's parameters),
``"float8_e4m3fn"`` (NVFP4's group scales, with a float32 global scale) or ``"e8m0"`` (MX:
uint8 biased exponents).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from ..errors import InvalidParameterError

STRATEGIES = ("tensor", "channel", "group", "block", "tensor_group", "token")
SCALE_DTYPES = ("weight", "float8_e4m3fn", "e8m0")


@dataclass(frozen=True)
class WeightArgs:
    """How a preset quantizes weights (compressed-tensors' ``QuantizationArgs``)."""

    num_bits: int
    type: str  # "int" | "float"
    strategy: str  # tensor | channel | group | block | tensor_group
    symmetric: bool = True
    group_size: int | None = None
    block_structure: tuple[int, int] | None = None
    scale_dtype: str = "weight"


@dataclass(frozen=True)
class ActivationArgs:
    """How a preset quantizes a linear layer's input activations at run time."""

    num_bits: int
    type: str
    strategy: str
    dynamic: bool | str  # True: from each input; False: a calibrated scale; "local": both
    group_size: int | None = None


@dataclass(frozen=True)
class Preset:
    """One compressed-tensors preset: weights, the format that writes them, activations."""

    name: str
    weights: WeightArgs | None
    format: str  # the compressed-tensors format its weights are written in
    activations: ActivationArgs | None = None

    @property
    def float_format(self) -> str | None:
        """Which of qstream's float formats computes the weights (``"fp8"``, ``"nvfp4"``,
        ``"mxfp4"``, ``"mxfp8"``), None for integer weights, no weights, or MXFP6."""
        return _FLOAT_FORMATS.get(self.format)

    @property
    def refusal(self) -> str | None:
        """Why qstream cannot write this preset from weights alone, or None."""
        if self.weights is None:
            return f"the {self.name} preset quantizes nothing"
        act = self.activations
        if act is not None and act.dynamic is not True:
            what = (
                "a calibrated input scale"
                if act.dynamic is False
                else "a calibrated input global scale"
            )
            return (
                f"the {self.name} preset quantizes activations with {what}, which needs "
                "activation data qstream does not have (pick the dynamic or weight-only preset)"
            )
        if self.weights.type == "float" and self.float_format is None:
            return f"the {self.name} preset's {self.format} weights are not implemented"
        return None

    def to_json(self) -> str:
        """The preset as a JSON object (``from_json`` reads it back)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Preset:
        """A preset from :meth:`to_json`'s text; refuses malformed objects."""
        try:
            d = json.loads(text)
            w, a = d["weights"], d.get("activations")
            weights = None
            if w is not None:
                block = w.get("block_structure")
                weights = WeightArgs(**{**w, "block_structure": tuple(block) if block else None})
            preset = cls(
                name=d["name"],
                weights=weights,
                format=d["format"],
                activations=None if a is None else ActivationArgs(**a),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise InvalidParameterError(f"not a preset's JSON: {e}") from e
        if weights is not None and (
            weights.strategy not in STRATEGIES or weights.scale_dtype not in SCALE_DTYPES
        ):
            raise InvalidParameterError(f"not a preset's JSON: {text[:200]}")
        return preset


_FLOAT_FORMATS = {
    "float-quantized": "fp8",
    "nvfp4-pack-quantized": "nvfp4",
    "mxfp4-pack-quantized": "mxfp4",
    "mxfp8-quantized": "mxfp8",
}


def _int_group(bits: int, symmetric: bool = True) -> WeightArgs:
    return WeightArgs(bits, "int", "group", symmetric, group_size=128)


def _mx(bits: int) -> WeightArgs:
    return WeightArgs(bits, "float", "group", True, group_size=32, scale_dtype="e8m0")


def _wxay(w_bits: int, a_bits: int) -> Preset:
    act = ActivationArgs(a_bits, "int", "token", True) if a_bits < 16 else None
    fmt = "int-quantized" if act is not None else "pack-quantized"
    return Preset(f"W{w_bits}A{a_bits}", _int_group(w_bits), fmt, act)


_NVFP4_W = WeightArgs(4, "float", "tensor_group", True, group_size=16, scale_dtype="float8_e4m3fn")
_W8A8 = WeightArgs(8, "int", "channel", True)
_A8_TOKEN_INT = ActivationArgs(8, "int", "token", True)

_ALL = [
    Preset("UNQUANTIZED", None, "dense"),
    Preset("W4A16_ASYM", _int_group(4, symmetric=False), "pack-quantized"),
    Preset("W8A8", _W8A8, "int-quantized", _A8_TOKEN_INT),
    Preset("INT8", _W8A8, "int-quantized", _A8_TOKEN_INT),
    Preset("W4AFP8", _int_group(4), "int-quantized", ActivationArgs(8, "float", "token", True)),
    Preset(
        "FP8",
        WeightArgs(8, "float", "tensor"),
        "float-quantized",
        ActivationArgs(8, "float", "tensor", False),
    ),
    Preset(
        "FP8_DYNAMIC",
        WeightArgs(8, "float", "channel"),
        "float-quantized",
        ActivationArgs(8, "float", "token", True),
    ),
    Preset(
        "FP8_BLOCK",
        WeightArgs(8, "float", "block", block_structure=(128, 128)),
        "float-quantized",
        ActivationArgs(8, "float", "group", True, group_size=128),
    ),
    Preset("NVFP4A16", _NVFP4_W, "nvfp4-pack-quantized"),
    Preset(
        "NVFP4",
        _NVFP4_W,
        "nvfp4-pack-quantized",
        ActivationArgs(4, "float", "tensor_group", "local", group_size=16),
    ),
    Preset("MXFP4A16", _mx(4), "mxfp4-pack-quantized"),
    Preset(
        "MXFP4",
        _mx(4),
        "mxfp4-pack-quantized",
        ActivationArgs(4, "float", "group", True, group_size=32),
    ),
    Preset(
        "MXFP4XFP8",
        _mx(4),
        "mxfp4-pack-quantized",
        ActivationArgs(8, "float", "group", True, group_size=128),
    ),
    Preset("MXFP6A16", _mx(6), "mxfp6-pack-quantized"),
    Preset(
        "MXFP6A8",
        _mx(6),
        "mxfp6-pack-quantized",
        ActivationArgs(8, "float", "group", True, group_size=32),
    ),
    Preset("MXFP8A16", _mx(8), "mxfp8-quantized"),
    Preset(
        "MXFP8", _mx(8), "mxfp8-quantized", ActivationArgs(8, "float", "group", True, group_size=32)
    ),
    *(_wxay(w, a) for w, a in [(2, 4), (2, 8), (2, 16), (3, 4), (3, 8), (3, 16)]),
    *(_wxay(w, a) for w, a in [(4, 4), (4, 8), (4, 16), (5, 8), (5, 16), (6, 8), (6, 16)]),
    *(_wxay(w, a) for w, a in [(7, 8), (7, 16), (8, 16)]),
]

PRESETS: dict[str, Preset] = {p.name: p for p in _ALL}


def preset(name: str) -> Preset:
    """The preset of a compressed-tensors scheme name (any case, as compressed-tensors takes
    it); refuses unknown names, listing the known ones."""
    found = PRESETS.get(name.upper()) if isinstance(name, str) else None
    if found is None:
        raise InvalidParameterError(
            f"unknown compressed-tensors preset {name!r}; known: {', '.join(PRESETS)}"
        )
    return found
