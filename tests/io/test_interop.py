"""Outputs in the ecosystem: real xarray opens every output, ``open_xarray`` is bit-exact for
every type and granularity, per-tensor CF decoding is exact, and a converted checkpoint's
root opens as one object."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

import qstream as qs
from qstream import QuantSpec

xr = pytest.importorskip("xarray")
pytest.importorskip("dask.array")

GRANULARITIES = {
    "tensor": {},
    "axis0": {"axis": 0},
    "axis1": {"axis": 1},
    "blocked": {"axis": 1, "block_size": 16},
}


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    rng = np.random.default_rng(4)
    return (rng.standard_normal((48, 64)) * np.exp(rng.normal(0, 0.5, (48, 1)))).astype(np.float32)


def _spec(dtype: str, gran: str) -> QuantSpec:
    extra = dict(GRANULARITIES[gran])
    method = "dynamic" if "block_size" in extra else "minmax"
    sym = not dtype.startswith("uint")
    return QuantSpec(dtype=dtype, method=method, symmetric=sym, **extra)


def _want(out, spec: QuantSpec) -> np.ndarray:
    """``qstream.dequantize`` of the stored values and parameters."""
    arr = qs.open_quantized(out)
    zp = None if qs.QTYPES[spec.dtype].is_float else arr.zero_point
    return qs.dequantize(
        arr.quantized(...), arr.scale, zp, axis=spec.axis, block_size=spec.block_size
    )


@pytest.mark.parametrize("gran", list(GRANULARITIES))
@pytest.mark.parametrize("dtype", list(qs.QTYPES))
def test_xarray_opens_every_output_and_open_xarray_is_bit_exact(x, tmp_path, dtype, gran):
    spec = _spec(dtype, gran)
    out = tmp_path / "q.zarr"
    qs.quantize_store(x, out, spec, max_memory=1 << 20)
    ds = xr.open_zarr(out, consolidated=False)
    assert ds["data"].dims == ("dim_0", "dim_1")
    if spec.axis is not None and not spec.block_size:  # the channel axis shares its name
        assert ds["scale"].dims == ds["zero_point"].dims == (f"dim_{spec.axis}",)
    lazy = qs.open_xarray(out)
    assert lazy.dtype == np.float32 and lazy.dims == ("dim_0", "dim_1")
    assert lazy.chunks is not None  # Dask-backed, nothing read yet
    got = lazy.values
    np.testing.assert_array_equal(got, _want(out, spec))
    np.testing.assert_array_equal(got, qs.open_quantized(out)[...])
    np.testing.assert_array_equal(lazy[5:17, 3:40].values, got[5:17, 3:40])


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16", "int4", "uint4", "int2"])
def test_per_tensor_cf_decoding_is_exact_after_astype_float32(x, tmp_path, dtype):
    spec = QuantSpec(dtype=dtype, method="minmax", symmetric=not dtype.startswith("uint"))
    out = tmp_path / "q.zarr"
    qs.quantize_store(x, out, spec)
    decoded = xr.open_zarr(out, consolidated=False)["data"]
    assert decoded.dtype == np.float64  # JSON attributes decode to float64
    np.testing.assert_array_equal(decoded.astype("float32").values, _want(out, spec))


def test_dequantized_output_has_dimension_names(x, tmp_path):
    qs.quantize_store(x, tmp_path / "q.zarr", QuantSpec(axis=0))
    qs.dequantize_store(tmp_path / "q.zarr", tmp_path / "d.zarr")
    a = zarr.open_array(str(tmp_path / "d.zarr"))
    assert list(a.metadata.dimension_names) == ["dim_0", "dim_1"]


def test_converted_checkpoint_root_opens_as_a_mapping_and_a_dataset(tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(6)
    tensors = {
        "enc.weight": rng.standard_normal((32, 24)).astype(np.float32),
        "enc.bias": rng.standard_normal(24).astype(np.float32),
        "dec.weight": rng.standard_normal((16, 32)).astype(np.float32),
    }
    ck = tmp_path / "m.safetensors"
    save_file(tensors, str(ck))
    out = tmp_path / "m-int8"
    qs.convert_checkpoint(ck, out)
    root = qs.open_quantized(out)
    assert isinstance(root, qs.QuantizedCheckpoint) and sorted(root) == sorted(tensors)
    assert isinstance(root["enc.weight"], qs.QuantizedArray)
    np.testing.assert_array_equal(root["enc.bias"][...], tensors["enc.bias"])  # kept
    ds = qs.open_xarray(out)
    assert set(ds.data_vars) == set(tensors)
    for name in ("enc.weight", "dec.weight"):
        np.testing.assert_array_equal(ds[name].values, root[name][...])
        assert ds[name].dims == (f"{name}/dim_0", f"{name}/dim_1")
    np.testing.assert_array_equal(ds["enc.bias"].values, tensors["enc.bias"])


def test_dequantize_and_inspect_take_a_converted_checkpoints_root(tmp_path):
    from safetensors.numpy import save_file
    from typer.testing import CliRunner

    from cli.main import app

    rng = np.random.default_rng(7)
    tensors = {
        "w1": rng.standard_normal((32, 24)).astype(np.float32),
        "b1": rng.standard_normal(24).astype(np.float32),
    }
    save_file(tensors, str(tmp_path / "m.safetensors"))
    out, back = tmp_path / "m-int8", tmp_path / "restored"
    qs.convert_checkpoint(tmp_path / "m.safetensors", out)
    result = qs.dequantize_store(out, back)
    assert set(result["tensors"]) == set(tensors) and not result["already_complete"]
    root = qs.open_quantized(out)
    np.testing.assert_array_equal(zarr.open_array(str(back / "w1"))[...], root["w1"][...])
    np.testing.assert_array_equal(zarr.open_array(str(back / "b1"))[...], tensors["b1"])
    assert qs.dequantize_store(out, back)["already_complete"]
    shown = CliRunner().invoke(app, ["inspect", str(out)])
    assert shown.exit_code == 0 and "w1" in shown.stdout and "kept" in shown.stdout


def test_safetensors_export_loads_and_matches_qstream_bit_for_bit(tmp_path):
    import ml_dtypes

    torch = pytest.importorskip("torch")  # loaders read through torch (bf16, float8)
    from safetensors.torch import load_file
    from safetensors.torch import save_file as save_torch

    def as_numpy(t):
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        if t.dtype == torch.float8_e4m3fn:
            return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
        return t.numpy()

    rng = np.random.default_rng(9)
    tensors = {
        "q8.weight": rng.standard_normal((40, 64)).astype(np.float32),
        "u8.weight": rng.standard_normal((24, 32)).astype(np.float32) + 0.5,
        "q4.weight": rng.standard_normal((16, 256)).astype(np.float32),
        "f8.weight": rng.standard_normal((20, 48)).astype(np.float32),
        "keep.norm": rng.standard_normal((8, 8)).astype(ml_dtypes.bfloat16),
        "bias": rng.standard_normal(16).astype(np.float32),
    }
    ck = tmp_path / "m.safetensors"

    save_torch(
        {
            k: torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16)
            if v.dtype == ml_dtypes.bfloat16
            else torch.from_numpy(v)
            for k, v in tensors.items()
        },
        str(ck),
    )
    recipe = qs.Recipe.from_dict(
        {
            "defaults": {"dtype": "int8", "axis": 0},
            "rules": [
                {"pattern": "u8.*", "spec": {"dtype": "uint8", "axis": None, "symmetric": False}},
                {
                    "pattern": "q4.*",
                    "spec": {"dtype": "int4", "axis": 1, "block_size": 128, "method": "dynamic"},
                },
                {"pattern": "f8.*", "spec": {"dtype": "float8_e4m3fn"}},
                {"pattern": "keep.*", "action": "keep"},
            ],
        }
    )
    out = tmp_path / "m-q"
    qs.convert_checkpoint(ck, out, recipe)
    result = qs.export_safetensors(
        out, tmp_path / "e.safetensors", max_shard_size=4000, format="qstream"
    )
    assert len(result["files"]) > 2  # shards and an index
    index = json.loads((tmp_path / "e.safetensors.index.json").read_text())
    loaded = {}
    for f in sorted(set(index["weight_map"].values())):
        loaded.update({k: as_numpy(v) for k, v in load_file(str(tmp_path / f)).items()})
    assert set(loaded) == set(index["weight_map"])
    root = qs.open_quantized(out)
    for name in ("q8.weight", "u8.weight", "q4.weight"):
        arr = root[name]
        q = loaded[name]
        s = loaded[f"{name}_scale"]
        zp = loaded.get(f"{name}_zero_point")
        # the loader's arithmetic: (q - zero_point) * scale in float32, broadcasting
        if arr.spec.block_size:  # groups: [out, in / group] parameters
            mine = qs.dequantize(
                q.astype(arr.qtype.dtype), s, zp, axis=1, block_size=arr.spec.block_size
            )
        else:
            mine = (q.astype(np.float32) - (0 if zp is None else zp.astype(np.float32))) * s
        np.testing.assert_array_equal(mine, arr[...])
    assert "u8.weight_zero_point" in loaded and "q8.weight_zero_point" not in loaded
    f8 = loaded["f8.weight"]
    assert f8.dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    f8q = f8.astype(np.float32)
    np.testing.assert_array_equal(f8q * loaded["f8.weight_scale"], root["f8.weight"][...])
    assert loaded["keep.norm"].dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(loaded["keep.norm"], tensors["keep.norm"])
    np.testing.assert_array_equal(loaded["bias"], tensors["bias"])
    again = qs.export_safetensors(
        out, tmp_path / "e.safetensors", max_shard_size=4000, format="qstream"
    )
    assert again["already_complete"]  # the same export again: nothing to do
    with pytest.raises(qs.StoreError, match=r"holds another export|exists"):
        qs.export_safetensors(
            out, tmp_path / "e.safetensors", max_shard_size=8000, format="qstream"
        )


# ---------------------------------------------------------------- packed sub-byte storage

SUB_BYTE = ["int4", "uint4", "int2", "uint2", "float4_e2m1fn"]


def _raw_source(path, x: np.ndarray, chunks) -> None:
    """An uncompressed float32 Zarr array of ``x`` (outputs then store their bytes as is)."""
    a = zarr.create_array(str(path), shape=x.shape, chunks=chunks, dtype=x.dtype, compressors=None)
    a[...] = x


def _oracle_pack(codes: list[int], bits: int) -> bytes:
    """zarr-extensions packbits, bit by bit: element i at bits [i*k, (i+1)*k) of the
    sequence, bit j of the sequence in byte j // 8 at position j % 8 (LSB first)."""
    seq = [(c >> b) & 1 for c in codes for b in range(bits)]
    seq += [0] * (-len(seq) % 8)
    return bytes(sum(seq[i + b] << b for b in range(8)) for i in range(0, len(seq), 8))


@pytest.mark.parametrize("bits, signed", [(4, True), (4, False), (2, True), (2, False)])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 8, 31, 64, 1001])
def test_pack_matches_the_bit_by_bit_oracle_and_unpack_inverts_it(bits, signed, n):
    from qstream.io.zarr_types.packing import packed_nbytes
    from qstream.kernels.packing import pack_codes, unpack_codes

    rng = np.random.default_rng(n * 7 + bits)
    codes = rng.integers(0, 1 << bits, n).astype(np.uint8)
    packed = np.full(packed_nbytes(n, bits), 0xAA, np.uint8)  # every byte must be written
    pack_codes(codes, bits, packed)
    assert packed.tobytes() == _oracle_pack(codes.tolist(), bits)
    out = np.empty(n, np.int8 if signed else np.uint8)
    unpack_codes(packed, n, bits, signed, out.view(np.uint8))
    half = 1 << (bits - 1)
    want = [(c ^ half) - half for c in codes.tolist()] if signed else codes.tolist()
    assert out.tolist() == want


@pytest.mark.parametrize("dtype", SUB_BYTE)
def test_sub_byte_outputs_are_packed_and_plain_zarr_reads_the_values(tmp_path, dtype):
    rng = np.random.default_rng(12)
    x = rng.standard_normal((96, 200)).astype(np.float32)  # incompressible enough
    _raw_source(tmp_path / "src.zarr", x, (32, 200))
    spec = QuantSpec(dtype=dtype, axis=0, symmetric=not dtype.startswith("uint"))
    out = tmp_path / "q.zarr"
    qs.quantize_store(str(tmp_path / "src.zarr"), out, spec)
    data = zarr.open_array(str(out / "data"))  # zarr-python alone (qstream's entry points)
    assert np.dtype(data.dtype) == qs.QTYPES[dtype].dtype
    assert data.metadata.to_dict()["codecs"][0]["name"] == "packbits"
    stored = data[...]
    np.testing.assert_array_equal(
        stored.astype(np.float32), qs.open_quantized(out).quantized(...).astype(np.float32)
    )
    qs.quantize_store(str(tmp_path / "src.zarr"), tmp_path / "q8.zarr", QuantSpec(axis=0))

    def size(p):
        return sum(f.stat().st_size for f in (p / "data").rglob("c*") if f.is_file())

    ratio = size(out) / size(tmp_path / "q8.zarr")
    assert ratio <= (0.55 if qs.QTYPES[dtype].bits == 4 else 0.3), ratio


READ_ALONE = """
import sys, numpy as np, zarr
if sys.argv[2] == "register":
    import qstream
    qstream.register_zarr_types()
a = zarr.open_array(sys.argv[1], mode="r")
print(a.dtype, np.asarray(a[...]).astype(np.int8).tolist())
"""


@pytest.mark.parametrize("how", ["register", "entry points"])
def test_a_fresh_process_reads_packed_outputs_with_zarr_alone(tmp_path, how):
    """What a user's own script sees: no qstream call has opened a store in it. zarr 3.2 and
    later load qstream's data types from its entry points; zarr 3.1 needs
    ``qstream.register_zarr_types()``."""
    import subprocess
    import sys

    if how == "entry points" and tuple(map(int, zarr.__version__.split(".")[:2])) < (3, 2):
        pytest.skip(f"zarr {zarr.__version__} does not load data types from entry points")
    x = np.random.default_rng(4).standard_normal((8, 10)).astype(np.float32)
    qs.quantize_store(x, tmp_path / "q.zarr", QuantSpec(dtype="int4", axis=0))
    want = qs.open_quantized(tmp_path / "q.zarr").quantized(...).astype(np.int8).tolist()
    out = subprocess.run(
        [sys.executable, "-c", READ_ALONE, str(tmp_path / "q.zarr" / "data"), how],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == f"int4 {want}"


def test_packed_chunks_read_through_the_direct_path_equal_zarrs_decode(tmp_path):
    """Chunks written by zarr's own codec pipeline (zstd over packbits) and read by qstream's
    direct chunk path, and the other way round."""
    import ml_dtypes

    from qstream.io.storage.chunks import chunk_files
    from qstream.io.zarr_types.zarr_ext import PackBits

    rng = np.random.default_rng(3)
    codes = rng.integers(-8, 8, (70, 45)).astype(ml_dtypes.int4)
    a = zarr.create_array(
        str(tmp_path / "z.zarr"),
        shape=codes.shape,
        chunks=(16, 20),
        dtype=ml_dtypes.int4,
        serializer=PackBits(),
        fill_value=0,
    )
    a[...] = codes
    files = chunk_files(a)
    assert files is not None and files.bits == 4 and files.signed
    got = np.empty(codes.shape, ml_dtypes.int4)
    files.read((slice(0, 70), slice(0, 45)), got)
    np.testing.assert_array_equal(got.astype(np.int8), codes.astype(np.int8))
    flipped = (-codes.astype(np.int8)).clip(-8, 7).astype(ml_dtypes.int4)
    files.write((slice(16, 48), slice(0, 40)), flipped[16:48, 0:40])
    back = zarr.open_array(str(tmp_path / "z.zarr"))[...]
    np.testing.assert_array_equal(
        back[16:48, 0:40].astype(np.int8), flipped[16:48, 0:40].astype(np.int8)
    )
    np.testing.assert_array_equal(back[:16].astype(np.int8), codes[:16].astype(np.int8))


def test_a_short_packed_chunk_is_a_store_error_naming_it(tmp_path):
    x = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    _raw_source(tmp_path / "s.zarr", x, (32, 64))
    out = tmp_path / "q.zarr"
    qs.quantize_store(str(tmp_path / "s.zarr"), out, QuantSpec(dtype="int4", axis=0))
    chunk = next(p for p in (out / "data").rglob("c*") if p.is_file())
    chunk.write_bytes(chunk.read_bytes()[:-7])
    with pytest.raises(qs.StoreError, match="chunk"):
        qs.dequantize_store(out, tmp_path / "d.zarr")


def test_format_2_outputs_one_value_per_byte_still_read(tmp_path, x):
    """Before packing (format 2) int4 was stored in an int8 array, masked to 4 bits."""
    out = tmp_path / "q.zarr"
    qs.quantize_store(x, out, QuantSpec(dtype="int4", axis=0))
    want = qs.open_quantized(out)[...]
    g = zarr.open_group(str(out), mode="a")
    q = g["data"][...]
    meta = dict(g.attrs["qstream"])
    del g["data"]
    old = g.create_array("data", shape=q.shape, chunks=q.shape, dtype="int8", fill_value=0)
    old[...] = q.view(np.int8) & 0x0F  # -1 stored as 15
    g.attrs["qstream"] = {**meta, "version": 2}
    np.testing.assert_array_equal(qs.open_quantized(out)[...], want)


def test_convert_to_safetensors_in_one_call_matches_convert_then_export(tmp_path):
    from safetensors.numpy import load_file, save_file
    from typer.testing import CliRunner

    from cli.main import app

    rng = np.random.default_rng(10)
    tensors = {
        "a.weight": rng.standard_normal((48, 40)).astype(np.float32),
        "a.bias": rng.standard_normal(40).astype(np.float32),
    }
    ck = tmp_path / "m.safetensors"
    save_file(tensors, str(ck))
    direct = CliRunner().invoke(app, ["convert", str(ck), str(tmp_path / "d.safetensors")])
    assert direct.exit_code == 0, direct.output
    assert not (tmp_path / "d.safetensors.qstream-work").exists()  # the working group is gone
    qs.convert_checkpoint(ck, tmp_path / "z")
    qs.export_safetensors(tmp_path / "z", tmp_path / "e.safetensors")
    a, b = load_file(str(tmp_path / "d.safetensors")), load_file(str(tmp_path / "e.safetensors"))
    assert set(a) == set(b) == {"a.weight", "a.weight_scale", "a.bias"}
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    again = CliRunner().invoke(app, ["convert", str(ck), str(tmp_path / "d.safetensors")])
    assert again.exit_code == 0 and "already complete" in again.output  # same job: no-op
    qs.export_safetensors(tmp_path / "z", tmp_path / "f.safetensors")  # not a conversion's
    again = CliRunner().invoke(app, ["convert", str(ck), str(tmp_path / "f.safetensors")])
    assert again.exit_code == 2 and "holds another export" in again.output  # (in the plan)
