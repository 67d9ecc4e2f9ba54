"""FP8 checkpoints: safetensors F8_* tensors read as ml_dtypes values, FP8 weights with block
scales (``W_scale_inv``, DeepSeek-V3's layout) dequantized exactly and converted by a recipe."""

from __future__ import annotations

import json
import math
import struct

import ml_dtypes
import numpy as np
import pytest
import zarr

import qstream as qs
from qstream import budget
from qstream.io.checkpoints.fp8 import Float8Tensor, ScaleRule, pair_scales
from qstream.io.checkpoints.open import open_checkpoint

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
F8 = {
    "F8_E4M3": E4M3,
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "F8_E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
}
_CODES = {
    **{v: k for k, v in F8.items()},
    np.dtype(np.float32): "F32",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(np.float16): "F16",
}


def write_safetensors(path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file written byte by byte (the format's layout, no library)."""
    header, blobs, at = {}, [], 0
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {
            "dtype": _CODES[a.dtype],
            "shape": list(a.shape),
            "data_offsets": [at, at + len(raw)],
        }
        blobs.append(raw)
        at += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def dequant_ref(x: np.ndarray, s: np.ndarray, block=(128, 128)) -> np.ndarray:
    """The reference block dequantization: float32(x) * s[i // bm, j // bn], in float32."""
    m, n = x.shape
    full = np.repeat(np.repeat(s.astype(np.float32), block[0], 0), block[1], 1)[:m, :n]
    return x.astype(np.float32) * full


def fp8_weight(rng, shape, *, finite=True, dtype=E4M3) -> np.ndarray:
    """FP8 values of every byte pattern (NaN patterns left out when ``finite``)."""
    bits = rng.integers(0, 256, shape, dtype=np.uint8)
    x = bits.view(dtype)
    if finite:
        bad = ~np.isfinite(x.astype(np.float32))
        x = np.where(bad, np.zeros((), dtype), x).astype(dtype)
    return x


def block_scales(rng, shape, block=(128, 128)) -> np.ndarray:
    grid = tuple(-(-n // b) for n, b in zip(shape, block, strict=True))
    return rng.uniform(1e-4, 3e-3, grid).astype(np.float32)


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    nan = np.isnan(a)
    np.testing.assert_array_equal(nan, np.isnan(b))
    w = np.dtype(f"u{a.dtype.itemsize}")
    np.testing.assert_array_equal(a.view(w)[~nan], b.view(w)[~nan])


# ------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("code", sorted(F8))
def test_fp8_tensors_read_as_ml_dtypes_values_mapped_like_the_others(tmp_path, code):
    bits = np.arange(256, dtype=np.uint8).reshape(16, 16)
    path = tmp_path / "m.safetensors"
    write_safetensors(path, {"w": bits.view(F8[code])})
    t = open_checkpoint(path)["w"]
    assert t.dtype == F8[code] and t.shape == (16, 16) and t.nbytes == 256
    np.testing.assert_array_equal(t[3:5].view(np.uint8), bits[3:5])
    v = t.view((slice(2, 9), slice(0, 16)))  # a mapping of just those bytes
    assert v is not None and v.dtype == F8[code]
    np.testing.assert_array_equal(v.view(np.uint8), bits[2:9])
    out = np.empty((4, 16), F8[code])
    assert t.read_into((slice(12, 16), slice(0, 16)), out)
    np.testing.assert_array_equal(out.view(np.uint8), bits[12:])
    # an FP8 tensor without a scale reads as its float32 values (exact)
    wide = pair_scales({"w": t})["w"]
    assert isinstance(wide, Float8Tensor) and wide.dtype == np.float32
    _same_bits(wide[...], bits.view(F8[code]).astype(np.float32))


def test_files_written_by_torch_name_fp8_as_the_format_does(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    bits = np.arange(256, dtype=np.uint8).reshape(16, 16)
    save_file(
        {
            "a": torch.from_numpy(bits).view(torch.float8_e4m3fn),
            "b": torch.from_numpy(bits.copy()).view(torch.float8_e5m2),
        },
        str(tmp_path / "t.safetensors"),
    )
    got = open_checkpoint(tmp_path / "t.safetensors")
    assert got["a"].dtype == E4M3 and got["b"].dtype == F8["F8_E5M2"]
    np.testing.assert_array_equal(got["b"][...].view(np.uint8), bits)


# ---------------------------------------------------------------- block dequantization


@pytest.mark.parametrize("shape", [(300, 200), (128, 128), (257, 129), (1, 513)])
def test_block_scaled_weight_reads_as_the_reference_dequantization(tmp_path, shape):
    rng = np.random.default_rng(sum(shape))
    x = fp8_weight(rng, shape, finite=False)  # every byte pattern: NaN, max, subnormals, -0
    s = block_scales(rng, shape)
    s.flat[0] = np.float32(2.0**-130)  # results below float32's normal range
    s.flat[-1] = np.float32(1e36)  # and above its largest value (inf)
    write_safetensors(tmp_path / "m.safetensors", {"l.weight": x, "l.weight_scale_inv": s})
    tensors = pair_scales(open_checkpoint(tmp_path / "m.safetensors"))
    assert list(tensors) == ["l.weight"]  # the scale is consumed
    w = tensors["l.weight"]
    assert w.dtype == np.float32 and w.block == (min(128, shape[0]) if shape[0] == 1 else 128, 128)
    ref = dequant_ref(x, s)
    _same_bits(w[...], ref)
    m, n = shape
    for key in [
        (slice(m // 3, m),),
        (slice(min(5, m - 1), m), slice(n // 2, n)),
        (slice(None, None, -3), slice(1, n, 7)),
        (m - 1,),
    ]:
        _same_bits(w[key], np.ascontiguousarray(ref[key]))
    out = np.empty((m - m // 2, n), np.float32)  # a region that starts inside a block
    assert w.read_into((slice(m // 2, m), slice(0, n)), out)
    _same_bits(out, ref[m // 2 :])


def test_block_shape_from_the_shapes_or_the_recipe(tmp_path):
    rng = np.random.default_rng(1)
    x = fp8_weight(rng, (96, 40))
    s = rng.uniform(0.5, 2, (3, 5)).astype(np.float32)  # blocks of 32 x 8: only these fit
    write_safetensors(tmp_path / "m.safetensors", {"w": x, "w_scale_inv": s})
    raw = open_checkpoint(tmp_path / "m.safetensors")
    w = pair_scales(raw)["w"]
    assert w.block == (32, 8)
    _same_bits(w[...], dequant_ref(x, s, (32, 8)))
    # ambiguous shapes: 1000 values in 2 blocks could be any of 500..999
    write_safetensors(
        tmp_path / "a.safetensors",
        {"w": fp8_weight(rng, (1000, 8)), "w_scale_inv": np.ones((2, 1), np.float32)},
    )
    amb = open_checkpoint(tmp_path / "a.safetensors")
    w = pair_scales(amb)["w"]  # one power of two in range: 512
    assert w.block == (512, 8)
    write_safetensors(
        tmp_path / "b.safetensors",
        {"w": fp8_weight(rng, (1000, 8)), "w_scale_inv": np.ones((3, 1), np.float32)},
    )
    with pytest.raises(qs.StoreError, match=r"ambiguous.*\[scales\] block") as e:
        pair_scales(open_checkpoint(tmp_path / "b.safetensors"))
    assert "\n" not in str(e.value)
    w = pair_scales(open_checkpoint(tmp_path / "b.safetensors"), ScaleRule(block=(400, 8)))["w"]
    assert w.block == (400, 8)
    with pytest.raises(qs.StoreError, match=r"do not match the block \[100, 8\]"):
        pair_scales(amb, ScaleRule(block=(100, 8)))


def test_scales_that_do_not_fit_are_refused_with_one_line(tmp_path):
    rng = np.random.default_rng(2)
    x = fp8_weight(rng, (256, 256))
    cases = {
        "rank": (np.ones((2,), np.float32), "different ranks"),
        "count": (np.ones((2, 300), np.float32), "no block length"),
        "dtype": (np.ones((2, 2), np.float16).view(np.int16), "dtype int16"),
    }
    for name, (s, message) in cases.items():
        p = tmp_path / f"{name}.safetensors"
        if s.dtype == np.int16:
            write_safetensors(p, {"w": x, "w_scale_inv": np.ones((2, 2), np.float16)})
            raw = open_checkpoint(p)
            raw["w_scale_inv"].dtype = np.dtype(np.int16)  # (a header qstream would not write)
        else:
            write_safetensors(p, {"w": x, "w_scale_inv": s})
            raw = open_checkpoint(p)
        with pytest.raises(qs.StoreError, match=message) as e:
            pair_scales(raw)
        assert "\n" not in str(e.value) and "'w_scale_inv'" in str(e.value)


def test_a_per_tensor_scale_and_bf16_scales(tmp_path):
    rng = np.random.default_rng(3)
    x = fp8_weight(rng, (64, 48))
    s = np.array(0.0123, np.float32)
    sb = rng.uniform(0.5, 2, (1, 3)).astype(ml_dtypes.bfloat16)
    y = fp8_weight(rng, (5, 48))
    write_safetensors(
        tmp_path / "m.safetensors",
        {"a": x, "a_scale_inv": s, "b": y, "b_scale_inv": sb},
    )
    t = pair_scales(open_checkpoint(tmp_path / "m.safetensors"))
    assert sorted(t) == ["a", "b"]
    _same_bits(t["a"][...], x.astype(np.float32) * s)
    _same_bits(t["b"][...], dequant_ref(y, sb.astype(np.float32), (5, 16)))


# ----------------------------------------------------------------------- conversions


def _fp8_checkpoint(tmp_path, rng, shape=(300, 200)):
    x = fp8_weight(rng, shape)
    s = block_scales(rng, shape)
    norm = rng.standard_normal(shape[1]).astype(ml_dtypes.bfloat16)
    emb = rng.standard_normal((64, shape[1])).astype(ml_dtypes.bfloat16)
    path = tmp_path / "fp8.safetensors"
    write_safetensors(
        path,
        {"emb": emb, "l.weight": x, "l.weight_scale_inv": s, "l.norm": norm},
    )
    return path, {"x": x, "s": s, "norm": norm, "emb": emb}


@pytest.mark.parametrize(
    "spec",
    [
        {"dtype": "int8", "axis": 0},
        {"dtype": "int4", "axis": 1, "block_size": 32, "method": "dynamic"},
        {"dtype": "uint8", "axis": None, "symmetric": False, "method": "percentile"},
    ],
    ids=["int8-axis0", "int4-blocked", "uint8-tensor"],
)
def test_fp8_block_scaled_checkpoint_converts_exactly(tmp_path, monkeypatch, spec):
    # (an FP8 source's conversion runs Numba's kernels: the store job of its values too, so
    # that their error figures are the same bits, not only the same to float64 rounding)
    monkeypatch.setattr(budget, "NUMPY_JOB", 0)
    rng = np.random.default_rng(4)
    path, v = _fp8_checkpoint(tmp_path, rng, (300, 200))
    recipe = qs.Recipe.from_dict({"defaults": spec})
    # a small memory bound: blocks start inside the 128-row scale blocks
    report = qs.convert_checkpoint(path, tmp_path / "ck", recipe, max_memory=1 << 20)
    assert set(report["tensors"]) == {"emb", "l.weight", "l.norm"}  # the scale is consumed
    ref = dequant_ref(v["x"], v["s"])
    job = qs.quantize_store(
        ref, tmp_path / "ref.zarr", qs.QuantSpec.from_dict(spec), max_memory=1 << 20
    )
    want = qs.open_quantized(tmp_path / "ref.zarr")
    got = qs.open_quantized(tmp_path / "ck")["l.weight"]
    np.testing.assert_array_equal(got.quantized(...), want.quantized(...))
    np.testing.assert_array_equal(got.scale, want.scale)
    np.testing.assert_array_equal(got.zero_point, want.zero_point)
    assert json.dumps(got.meta["error"], sort_keys=True) == json.dumps(job.error, sort_keys=True)
    row = report["tensors"]["l.weight"]
    assert row["bytes_before"] == v["x"].nbytes + v["s"].nbytes and row["dtype"] == "float32"


def test_fp8_checkpoint_kept_as_bf16_is_the_plain_bf16_checkpoint(tmp_path):
    rng = np.random.default_rng(5)
    path, v = _fp8_checkpoint(tmp_path, rng, (257, 129))
    recipe = qs.Recipe.from_dict(
        {"min_rank": 0, "rules": [{"pattern": "*", "action": "keep", "dtype": "bfloat16"}]}
    )
    events = []
    report = qs.convert_checkpoint(path, tmp_path / "bf16", recipe, on_tensor=events.append)
    assert all(r["kept"] for r in report["tensors"].values())
    assert {e.target for e in events} == {"keep/bfloat16"}
    root = zarr.open_group(tmp_path / "bf16", mode="r")
    want = dequant_ref(v["x"], v["s"]).astype(ml_dtypes.bfloat16)  # one rounding, to nearest even
    for name, ref in [("l.weight", want), ("l.norm", v["norm"]), ("emb", v["emb"])]:
        a = root[name]
        assert a.attrs["qstream"]["dtype"] == "bfloat16"
        assert a.dtype == np.dtype(ml_dtypes.bfloat16)  # stored as bfloat16, not widened
        _same_bits(a[...].astype(np.float32), ref.astype(np.float32))
    assert "l.weight_scale_inv" not in root
    # the same as a script with torch: float32(x) * s per block, then .to(bfloat16)
    torch = pytest.importorskip("torch")
    xt = torch.from_numpy(v["x"].view(np.uint8).copy()).view(torch.float8_e4m3fn)
    st = torch.from_numpy(v["s"]).repeat_interleave(128, 0).repeat_interleave(128, 1)
    script = (xt.to(torch.float32) * st[:257, :129]).to(torch.bfloat16)
    np.testing.assert_array_equal(
        root["l.weight"][...].astype(np.float32), script.to(torch.float32).numpy()
    )


def test_recipe_scales_table_names_the_pairing_or_turns_it_off(tmp_path):
    rng = np.random.default_rng(6)
    x = fp8_weight(rng, (128, 64))
    s = block_scales(rng, (128, 64), (64, 64))
    write_safetensors(tmp_path / "m.safetensors", {"w": x, "w.scale": s})
    on = qs.Recipe.from_dict({"scales": {"suffix": [".scale"], "block": [64, 64]}})
    report = qs.convert_checkpoint(tmp_path / "m.safetensors", tmp_path / "on", on)
    assert list(report["tensors"]) == ["w"]
    assert report["recipe"]["scales"] == {"enabled": True, "suffix": [".scale"], "block": [64, 64]}
    off = qs.Recipe.from_dict({"scales": {"enabled": False}})
    report = qs.convert_checkpoint(tmp_path / "m.safetensors", tmp_path / "off", off)
    assert sorted(report["tensors"]) == ["w", "w.scale"]  # the FP8 weight widened alone
    got = qs.open_quantized(tmp_path / "off")["w"]
    qs.quantize_store(x.astype(np.float32), tmp_path / "r.zarr", qs.QuantSpec(axis=0))
    np.testing.assert_array_equal(
        got.quantized(...), qs.open_quantized(tmp_path / "r.zarr").quantized(...)
    )
    # the default recipe's identity is unchanged (runs begun before [scales] resume)
    assert "scales" not in qs.Recipe().to_dict()


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"scales": {"suffix": ""}}, "suffix must be"),
        ({"scales": {"block": [0, 128]}}, "block must be a list of positive integers"),
        ({"scales": {"pairs": 1}}, "unknown key 'pairs'"),
        ({"rules": [{"pattern": "*", "action": "keep", "dtype": "int8"}]}, "dtype belongs"),
        ({"rules": [{"pattern": "*", "spec": {}, "dtype": "bfloat16"}]}, "dtype belongs"),
    ],
)
def test_bad_recipe_tables_name_the_problem(bad, message):
    with pytest.raises(qs.InvalidParameterError, match=message) as e:
        qs.Recipe.from_dict(bad)
    assert "\n" not in str(e.value)


def test_a_converted_fp8_checkpoint_resumes_after_a_stop(tmp_path):
    """Killed between tensors (a failure in the second one), the re-run finishes it with the
    bytes of an uninterrupted run."""
    rng = np.random.default_rng(7)
    x = fp8_weight(rng, (512, 256))
    y = fp8_weight(rng, (384, 256))
    tensors = {
        "a": x,
        "a_scale_inv": block_scales(rng, x.shape),
        "b": y,
        "b_scale_inv": block_scales(rng, y.shape),
    }
    write_safetensors(tmp_path / "m.safetensors", tensors)
    clean = qs.convert_checkpoint(
        tmp_path / "m.safetensors", tmp_path / "clean", max_memory=1 << 20
    )
    calls = {"n": 0}
    real = Float8Tensor._fill

    def failing(self, box, out):
        if self.name == "b":
            calls["n"] += 1
            if calls["n"] == 2:
                raise qs.StoreError("injected read failure")
        return real(self, box, out)

    Float8Tensor._fill = failing
    try:
        with pytest.raises(qs.StoreError, match="injected"):
            qs.convert_checkpoint(tmp_path / "m.safetensors", tmp_path / "ck", max_memory=1 << 20)
    finally:
        Float8Tensor._fill = real
    meta = json.loads((tmp_path / "ck" / "zarr.json").read_text())
    assert meta["attributes"]["qstream_checkpoint"]["complete"] is False
    again = qs.convert_checkpoint(tmp_path / "m.safetensors", tmp_path / "ck", max_memory=1 << 20)
    assert not again["already_complete"]
    for name in ("a", "b"):
        np.testing.assert_array_equal(
            qs.open_quantized(tmp_path / "ck")[name].quantized(...),
            qs.open_quantized(tmp_path / "clean")[name].quantized(...),
        )
        assert again["tensors"][name]["error"] == clean["tensors"][name]["error"]
    assert math.isfinite(clean["tensors"]["a"]["error"]["sqnr_db"])


def test_public_open_checkpoint_pairs_fp8_weights_with_their_scales(tmp_path):
    rng = np.random.default_rng(11)
    x = fp8_weight(rng, (256, 300))
    s = block_scales(rng, (256, 300))
    b = rng.standard_normal(300).astype(np.float32)
    write_safetensors(tmp_path / "m.safetensors", {"l.weight": x, "l.weight_scale_inv": s, "b": b})
    tensors = qs.open_checkpoint(tmp_path / "m.safetensors")
    assert list(tensors) == ["l.weight", "b"]  # the scale is consumed, the order kept
    _same_bits(tensors["l.weight"][...], dequant_ref(x, s))
    _same_bits(tensors["l.weight"][100:200, 7:300:5], dequant_ref(x, s)[100:200, 7:300:5])
    _same_bits(tensors["b"][...], b)
