"""qstream's table of compressed-tensors presets equals compressed-tensors 0.20's own
``PRESET_SCHEMES``: every name, the weight arguments, the format its compressor picks and the
activation arguments."""

from __future__ import annotations

import pytest

from qstream.core.presets import PRESETS, Preset, preset
from qstream.errors import InvalidParameterError

torch = pytest.importorskip("torch")
pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors.format import infer_module_format  # noqa: E402
from compressed_tensors.quantization.quant_scheme import (  # noqa: E402
    PRESET_SCHEMES,
    preset_name_to_scheme,
)

_SCALE_DTYPES = {None: "weight", torch.float8_e4m3fn: "float8_e4m3fn", torch.uint8: "e8m0"}


def test_every_preset_of_compressed_tensors_is_covered_and_no_other():
    assert set(PRESETS) == set(PRESET_SCHEMES)


@pytest.mark.parametrize("name", sorted(PRESET_SCHEMES))
def test_weight_args_format_and_activations_match_the_oracles_scheme(name):
    scheme = preset_name_to_scheme(name, ["Linear"])
    ours = preset(name.lower())
    w = scheme.weights
    if w is None:
        assert ours.weights is None
    else:
        assert ours.weights is not None
        assert ours.weights.num_bits == w.num_bits
        assert ours.weights.type == w.type
        assert ours.weights.strategy == w.strategy
        assert ours.weights.symmetric == w.symmetric
        assert ours.weights.group_size == w.group_size
        want_block = tuple(w.block_structure) if w.block_structure else None
        assert ours.weights.block_structure == want_block
        assert ours.weights.scale_dtype == _SCALE_DTYPES[w.scale_dtype]
        assert w.dynamic is False  # weights are always static: qstream computes them
    assert ours.format == infer_module_format(torch.nn.Linear, scheme).value
    a = scheme.input_activations
    if a is None:
        assert ours.activations is None
    else:
        assert ours.activations is not None
        assert ours.activations.num_bits == a.num_bits
        assert ours.activations.type == a.type
        assert ours.activations.strategy == a.strategy
        assert ours.activations.group_size == a.group_size
        dyn = (
            a.dynamic
            if isinstance(a.dynamic, bool)
            else str(getattr(a.dynamic, "value", a.dynamic))
        )
        assert ours.activations.dynamic == dyn
    assert scheme.output_activations is None


@pytest.mark.parametrize("name", sorted(PRESET_SCHEMES))
def test_presets_round_trip_through_json(name):
    p = preset(name)
    assert Preset.from_json(p.to_json()) == p


def test_presets_with_calibrated_activation_scales_are_refused_with_the_reason():
    refused = {n for n, p in PRESETS.items() if p.refusal and "calibrated" in p.refusal}
    assert refused == {"FP8", "NVFP4"}
    assert "activation data" in (preset("FP8").refusal or "")
    for name in ("FP8_DYNAMIC", "FP8_BLOCK", "NVFP4A16", "MXFP4A16", "MXFP8A16", "W4A16", "W8A16"):
        assert preset(name).refusal is None, name
    assert "mxfp6" in (preset("MXFP6A16").refusal or "")


def test_float_presets_name_the_qstream_float_format_that_computes_them():
    got = {n: p.float_format for n, p in PRESETS.items() if p.float_format}
    assert got == {
        "FP8": "fp8",
        "FP8_DYNAMIC": "fp8",
        "FP8_BLOCK": "fp8",
        "NVFP4A16": "nvfp4",
        "NVFP4": "nvfp4",
        "MXFP4A16": "mxfp4",
        "MXFP4": "mxfp4",
        "MXFP4XFP8": "mxfp4",
        "MXFP8A16": "mxfp8",
        "MXFP8": "mxfp8",
    }


@pytest.mark.parametrize("bad", ["W4A17", "", "fp16"])
def test_unknown_preset_names_are_refused_listing_the_known_ones(bad):
    with pytest.raises(InvalidParameterError, match="W4A16"):
        preset(bad)


@pytest.mark.parametrize("text", ["{", "[]", '{"name": "X"}', '{"name": "X", "weights": {"a": 1}}'])
def test_malformed_preset_json_is_refused(text):
    with pytest.raises(InvalidParameterError):
        Preset.from_json(text)
