"""FP8 / NVFP4 / MXFP4 / MXFP8 weights: qstream's codes, scales and decoded values equal
compressed-tensors 0.20's own (its ``calculate_qparams`` / ``generate_gparam`` fed the min and
max llm-compressor's observer takes, then its compressors and decompressors), byte for byte."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from qstream.core.float_formats import (
    fp8_dequantize,
    fp8_quantize,
    mx_dequantize,
    mx_quantize,
)
from qstream.core.nvfp4 import nvfp4_dequantize, nvfp4_global_scale, nvfp4_quantize
from qstream.errors import InvalidDTypeError, InvalidParameterError, NonFiniteInputError

torch = pytest.importorskip("torch")
ct = pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors import BaseCompressor  # noqa: E402
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8  # noqa: E402
from compressed_tensors.quantization import dequantize, preset_name_to_scheme  # noqa: E402
from compressed_tensors.quantization.utils import (  # noqa: E402
    calculate_qparams,
    generate_gparam,
    maybe_pad_tensor_for_block_quant,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
DTYPES = {"float32": F32, "bfloat16": BF16}
TORCH_DTYPES = {F32: torch.float32, BF16: torch.bfloat16}
FP8_PRESETS = {"tensor": "FP8", "channel": "FP8_DYNAMIC", "block": "FP8_BLOCK"}
E4M3_TIES = [1.0625, 17.0, 2.25, 0.01953125 * 1.5, 208.0, 240.0, 3.0 / 512]  # halfway points
E2M1_TIES = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


# ------------------------------------------------------------------------------- inputs


def _weights(rows: int, cols: int, seed: int) -> dict[str, np.ndarray]:
    """Random and adversarial float32 weights (the bfloat16 cases round them)."""
    rng = np.random.default_rng(seed)
    normal = (rng.standard_normal((rows, cols)) * 0.02).astype(F32)
    heavy = (rng.standard_t(1.5, (rows, cols)) * 0.01).astype(F32)
    zero_parts = normal.copy()
    zero_parts[1] = 0.0
    zero_parts[2, :32] = 0.0
    zero_parts[-1, -32:] = -0.0
    huge = normal.copy()
    huge[rows // 2, cols // 3] = 1.0e4
    huge[0, 0] = -3.0e30
    subnormal = (rng.standard_normal((rows, cols)) * 1e-39).astype(F32)
    subnormal[0, :16] = np.float32(1e-45)
    tiny_mixed = normal.copy()
    tiny_mixed[3] *= np.float32(1e-36)
    tiny_mixed[4, :64] = np.float32(2.0**-130)
    ties = np.resize(
        np.array([448.0, *E4M3_TIES, 6.0, *E2M1_TIES, -6.0, *(-np.array(E2M1_TIES))], F32),
        (rows, cols),
    ).astype(F32)
    ties[:, ::16] = 6.0  # every group of 16 keeps 6 as its max: scale 1 for NVFP4 and MX
    ties[:, 1::16] = 448.0 * (np.arange(rows, dtype=F32)[:, None] % 2)  # FP8 rows: max 448
    return {
        "normal": normal,
        "heavy_tailed": heavy,
        "all_zero": np.zeros((rows, cols), F32),
        "zero_rows_and_groups": zero_parts,
        "single_huge": huge,
        "subnormal": subnormal,
        "tiny_rows": tiny_mixed,
        "rounding_ties": ties,
        "grid_values": _on_grid(rng, rows, cols),
    }


def _on_grid(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Values that are E4M3 numbers times powers of two (exact quotients, many ties)."""
    codes = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x7E
    vals = codes.view(ml_dtypes.float8_e4m3fn).astype(F32)
    return (vals * np.float32(2.0) ** rng.integers(-12, 4, (rows, 1))).astype(F32)


CASES = list(_weights(8, 16, 0))


def _case(name: str, dtype: np.dtype, rows: int, cols: int) -> np.ndarray:
    return _weights(rows, cols, 7)[name].astype(dtype)


# ------------------------------------------------------------------------------- the oracle


def _t(a: np.ndarray) -> torch.Tensor:
    """A torch tensor of the same dtype and bits."""
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    if a.dtype == np.dtype(ml_dtypes.float8_e4m3fn):
        return torch.from_numpy(a.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    return torch.from_numpy(np.ascontiguousarray(a))


def _bits(t: torch.Tensor) -> np.ndarray:
    """The raw bytes of a tensor as an unsigned integer array."""
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]
    out = t.detach().contiguous().view(width).numpy()
    return out.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[t.element_size()])


def _np_bits(a: np.ndarray) -> np.ndarray:
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _observed(w: torch.Tensor, strategy: str, group: int = 0, block=(128, 128)):
    """The min and max llm-compressor's min-max observer hands calculate_qparams."""
    if strategy == "tensor":
        return torch.aminmax(w)
    if strategy == "channel":
        return w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    if strategy == "block":
        p = maybe_pad_tensor_for_block_quant(w, tuple(block))
        b = p.reshape(p.shape[0] // block[0], block[0], p.shape[1] // block[1], block[1])
        return b.amin(dim=(1, 3)), b.amax(dim=(1, 3))
    g = w.reshape(w.shape[0], -1, group)
    return g.amin(dim=-1), g.amax(dim=-1)


def _compressor(scheme):
    from compressed_tensors.compressors.format import infer_module_format

    return BaseCompressor.get_value_from_registry(
        infer_module_format(torch.nn.Linear, scheme).value
    )


def _oracle(w: np.ndarray, preset: str) -> tuple[dict, dict, object]:
    """compressed-tensors' compressed state dict of ``w`` under a preset, and its decompression."""
    scheme = preset_name_to_scheme(preset, ["Linear"])
    args = scheme.weights
    wt = _t(w)
    strategy = {"tensor_group": "group"}.get(args.strategy, args.strategy)
    mn, mx = _observed(wt, strategy, args.group_size or 0, args.block_structure or (128, 128))
    sd = {"weight": wt}
    gs = None
    if args.strategy == "tensor_group":
        gs = generate_gparam(*torch.aminmax(wt))
        sd["weight_global_scale"] = gs
    scale, zp = calculate_qparams(mn, mx, args, global_scale=gs)
    sd["weight_scale"] = scale.to(wt.dtype)  # the module's parameter has the weight's dtype
    sd["weight_zero_point"] = zp
    comp = _compressor(scheme)
    packed = comp.compress(dict(sd), scheme)
    unpacked = comp.decompress(dict(packed), scheme)
    return packed, unpacked, scheme


# ------------------------------------------------------------------------------- FP8


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("granularity", FP8_PRESETS)
def test_fp8_codes_scales_and_decoded_values_equal_compressed_tensors(dtype, granularity):
    counted = 0
    for name in CASES:
        shape = (200, 300) if granularity == "block" else (24, 96)
        w = _case(name, DTYPES[dtype], *shape)
        packed, unpacked, _ = _oracle(w, FP8_PRESETS[granularity])
        codes, scale = fp8_quantize(w, granularity)
        assert scale.dtype == w.dtype, name
        np.testing.assert_array_equal(_np_bits(scale), _bits(packed["weight_scale"]), name)
        np.testing.assert_array_equal(codes, _bits(packed["weight"]), name)
        dec = fp8_dequantize(codes, scale, granularity)
        np.testing.assert_array_equal(_np_bits(dec), _bits(unpacked["weight"]), name)
        counted += codes.size
    assert counted > 0


def test_fp8_decoder_reads_float8_typed_codes_and_casts_the_oracles_values():
    # (compressed-tensors' own dequantize ignores its dtype argument outside group strategies:
    # the values are computed in the scale's dtype, then cast; so does fp8_dequantize)
    w = _case("heavy_tailed", F32, 130, 257)
    packed, unpacked, _ = _oracle(w, "FP8_BLOCK")
    codes = _bits(packed["weight"]).view(ml_dtypes.float8_e4m3fn)
    scale = packed["weight_scale"].numpy()
    got = fp8_dequantize(codes, scale, "block", dtype=BF16)
    np.testing.assert_array_equal(_np_bits(got), _bits(unpacked["weight"].to(torch.bfloat16)))


# ------------------------------------------------------------------------------- MX


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
def test_mx_codes_scales_and_decoded_values_equal_compressed_tensors(dtype, fmt):
    preset = {"mxfp4": "MXFP4A16", "mxfp8": "MXFP8A16"}[fmt]
    key = "weight_packed" if fmt == "mxfp4" else "weight"
    for name in CASES:
        w = _case(name, DTYPES[dtype], 24, 128)
        packed, unpacked, _ = _oracle(w, preset)
        codes, scales = mx_quantize(w, fmt)
        np.testing.assert_array_equal(scales, _bits(packed["weight_scale"]), name)
        np.testing.assert_array_equal(codes, _bits(packed[key]), name)
        dec = mx_dequantize(codes, scales, fmt)
        assert unpacked["weight"].dtype == torch.bfloat16
        np.testing.assert_array_equal(_np_bits(dec), _bits(unpacked["weight"]), name)


def test_mx_refuses_a_group_whose_scale_would_be_infinite():
    w = np.zeros((2, 32), F32)
    w[0, 0] = 3.0e38
    with pytest.raises(InvalidParameterError, match="E8M0"):
        mx_quantize(w, "mxfp4")


# ------------------------------------------------------------------------------- NVFP4


@pytest.mark.parametrize("dtype", DTYPES)
def test_nvfp4_codes_scales_and_decoded_values_equal_compressed_tensors(dtype):
    for name in CASES:
        w = _case(name, DTYPES[dtype], 24, 96)
        packed, unpacked, scheme = _oracle(w, "NVFP4A16")
        codes, scale, gs = nvfp4_quantize(w)
        np.testing.assert_array_equal(_np_bits(gs), _bits(packed["weight_global_scale"]), name)
        np.testing.assert_array_equal(_np_bits(nvfp4_global_scale(w)), _np_bits(gs), name)
        np.testing.assert_array_equal(_np_bits(scale), _bits(packed["weight_scale"]), name)
        np.testing.assert_array_equal(codes, _bits(packed["weight_packed"]), name)
        dec = nvfp4_dequantize(codes, scale, gs)
        np.testing.assert_array_equal(_np_bits(dec), _bits(unpacked["weight"]), name)
        # float32 decoding: the oracle's dequantize asked for float32
        m, n = codes.shape
        ref32 = dequantize(
            unpack_fp4_from_uint8(packed["weight_packed"], m, 2 * n, dtype=torch.float32),
            packed["weight_scale"].to(torch.float32),
            args=scheme.weights,
            global_scale=packed["weight_global_scale"],
            dtype=torch.float32,
        )
        dec32 = nvfp4_dequantize(codes, scale.view(np.uint8), gs, dtype=F32)
        np.testing.assert_array_equal(_np_bits(dec32), _bits(ref32), name)


# ------------------------------------------------------------------------------- refusals


QUANTIZERS = {
    "fp8": lambda w: fp8_quantize(w, "channel"),
    "mxfp4": lambda w: mx_quantize(w, "mxfp4"),
    "mxfp8": lambda w: mx_quantize(w, "mxfp8"),
    "nvfp4": nvfp4_quantize,
}


@pytest.mark.parametrize("fmt", QUANTIZERS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_are_refused_before_any_work(fmt, bad):
    w = np.ones((4, 64), F32)
    w[2, 5] = bad
    with pytest.raises(NonFiniteInputError, match="NaN or infinite"):
        QUANTIZERS[fmt](w)


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8", "nvfp4"])
def test_columns_not_divisible_by_the_group_are_refused_as_the_oracle_refuses(fmt):
    w = np.ones((4, 40), F32)
    with pytest.raises(InvalidParameterError, match="not divisible"):
        QUANTIZERS[fmt](w)
    preset = {"mxfp4": "MXFP4A16", "mxfp8": "MXFP8A16", "nvfp4": "NVFP4A16"}[fmt]
    with pytest.raises((ValueError, RuntimeError)):
        _oracle(np.ones((4, 40), F32), preset)


@pytest.mark.parametrize(
    "bad", [np.ones((4, 64), np.float16), np.ones(64, F32), np.ones((0, 32), F32)]
)
def test_other_dtypes_ranks_and_empty_weights_are_refused(bad):
    with pytest.raises((InvalidDTypeError, InvalidParameterError)):
        fp8_quantize(bad, "tensor")


def test_decoders_refuse_scales_of_the_wrong_shape_or_non_finite_values():
    codes, scale = fp8_quantize(np.ones((4, 64), F32), "channel")
    with pytest.raises(InvalidParameterError, match="shape"):
        fp8_dequantize(codes, scale[:2], "channel")
    with pytest.raises(NonFiniteInputError):
        fp8_dequantize(codes, np.full((4, 1), np.nan, F32), "channel")
    packed, s8, gs = nvfp4_quantize(np.ones((4, 64), F32))
    with pytest.raises(NonFiniteInputError):
        nvfp4_dequantize(packed, s8, np.zeros(1, F32))
    with pytest.raises(NonFiniteInputError, match="NaN"):
        nvfp4_dequantize(packed, np.full(s8.shape, 0x7F, np.uint8), gs)
    mcodes, ms = mx_quantize(np.ones((4, 64), F32), "mxfp8")
    with pytest.raises(NonFiniteInputError, match="255"):
        mx_dequantize(mcodes, np.full(ms.shape, 255, np.uint8), "mxfp8")
    with pytest.raises(InvalidParameterError, match="shape"):
        mx_dequantize(mcodes, ms[:, :1], "mxfp8")
