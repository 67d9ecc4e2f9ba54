"""What a plain ``xr.open_zarr`` user sees of a quantized output: codes that xarray does not
decode (per channel, blockwise, float types) are flagged in ``data``'s attributes with the
names of their parameter arrays and the decoding formula; the source's coordinates (values
and attributes: ``lat``, ``lon``, ``time`` with its CF units) are in the output, as xarray
writes coordinates, and ``qs.open_xarray`` gives them with the decoded values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import qstream as qs

xr = pytest.importorskip("xarray")
pytest.importorskip("dask")


@pytest.fixture
def era5(tmp_path: Path) -> Path:
    """A NetCDF-like Zarr store: ``t2m`` (time, lat, lon) with its three coordinates."""
    rng = np.random.default_rng(4)
    t2m = rng.normal(280, 5, (4, 18, 64)).astype("float32")
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), t2m, {"units": "K", "long_name": "2 m temperature"})},
        coords={
            "time": ("time", np.arange(4, dtype="int64"), {"units": "hours since 2000-01-01"}),
            "lat": ("lat", np.linspace(-85, 85, 18), {"units": "degrees_north"}),
            "lon": ("lon", np.linspace(0, 354.375, 64), {"units": "degrees_east"}),
        },
    )
    path = tmp_path / "era5.zarr"
    ds.to_zarr(path, consolidated=False, zarr_format=3)
    return path


def _by_axis(values: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    shape = [1] * ndim
    shape[axis] = -1
    return values.reshape(shape)


def test_per_channel_codes_are_flagged_and_decode_as_their_attributes_say(era5, tmp_path):
    out = tmp_path / "q.zarr"
    qs.quantize_store(era5 / "t2m", out, qs.QuantSpec(dtype="int8", axis=1, symmetric=False))
    ds = xr.open_zarr(out, consolidated=False)
    data = ds["data"]
    assert data.dtype == np.int8  # (codes: xarray has nothing to decode them with)
    a = data.attrs
    assert a["qstream_codes"] is True and a["qstream_dtype"] == "int8" and a["qstream_axis"] == 1
    assert "qstream.open_xarray" in a["qstream_decode"]
    assert "(data - zero_point) * scale" in a["qstream_decode"]
    # what the attributes say, done by hand with xarray, gives qstream's values
    scale = ds[a["qstream_scale"]].values
    zp = ds[a["qstream_zero_point"]].values
    by_hand = (data.values.astype(np.float32) - _by_axis(zp, 1, 3)) * _by_axis(scale, 1, 3)
    ours = qs.open_xarray(out)
    np.testing.assert_allclose(by_hand, ours.values, rtol=1e-6, atol=0)
    # the decoded values are not codes: qstream's own view carries no flag
    assert not [k for k in ours.attrs if k.startswith("qstream_")]
    assert ours.attrs["units"] == "K"


def test_blockwise_codes_name_their_block_size(era5, tmp_path):
    out = tmp_path / "q.zarr"
    qs.quantize_store(era5 / "t2m", out, qs.QuantSpec(dtype="int4", axis=2, block_size=32))
    a = xr.open_zarr(out, consolidated=False)["data"].attrs
    assert a["qstream_codes"] is True and a["qstream_block_size"] == 32
    assert "one per block of 32 along axis 2" in a["qstream_decode"]


def test_a_per_tensor_integer_output_is_decoded_by_xarray_and_not_flagged(era5, tmp_path):
    out = tmp_path / "q.zarr"
    qs.quantize_store(era5 / "t2m", out, qs.QuantSpec(dtype="int8"))
    data = xr.open_zarr(out, consolidated=False)["data"]
    assert data.dtype.kind == "f"  # (CF scale_factor / add_offset)
    assert not [k for k in data.attrs if k.startswith("qstream_")]


def test_the_sources_coordinates_reach_the_output_with_their_values_and_attributes(era5, tmp_path):
    out = tmp_path / "q.zarr"
    qs.quantize_store(era5 / "t2m", out, qs.QuantSpec(dtype="int8", axis=1))
    src = xr.open_zarr(era5, consolidated=False)
    got = xr.open_zarr(out, consolidated=False)
    for name in ("time", "lat", "lon"):
        assert name in got.indexes, name  # (a dimension's coordinate, as in the source)
        np.testing.assert_array_equal(got[name].values, src[name].values)
        assert got[name].dtype == src[name].dtype
        assert got[name].attrs == src[name].attrs, name
    assert got["time"].encoding["units"] == "hours since 2000-01-01"  # (decoded as CF time)
    ours = qs.open_xarray(out)
    for name in ("time", "lat", "lon"):  # (CF-decoded as xr.open_zarr decodes them)
        np.testing.assert_array_equal(ours[name].values, src[name].values)
        assert ours[name].attrs == src[name].attrs
    assert ours["time"].dtype.kind == "M" and ours["time"].encoding["units"] == (
        "hours since 2000-01-01"
    )
    assert qs.open_quantized(out).meta["complete"]


def test_a_source_without_a_group_around_it_gets_no_coordinates(tmp_path):
    x = np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32)
    out = tmp_path / "q.zarr"
    qs.quantize_store(x, out, qs.QuantSpec(dtype="int8", axis=0))
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["data", "scale", "zero_point"]


def test_a_link_where_a_coordinate_goes_is_refused_not_written_through(era5, tmp_path):
    out = tmp_path / "q.zarr"
    spec = qs.QuantSpec(dtype="int8", axis=1)
    qs.quantize_store(era5 / "t2m", out, spec)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    import shutil

    shutil.rmtree(out / "lat")
    (out / "lat").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(qs.StoreError, match="link"):
        qs.quantize_store(era5 / "t2m", out, spec, overwrite=True)
    assert not list(elsewhere.iterdir())


def test_a_dequantized_copy_inside_a_group_gets_the_coordinates_beside_it(era5, tmp_path):
    import zarr

    q = tmp_path / "q.zarr"
    qs.quantize_store(era5 / "t2m", q, qs.QuantSpec(dtype="int8", axis=1))
    copy = tmp_path / "copy.zarr"
    zarr.open_group(copy, mode="w")
    result = qs.dequantize_store(q, copy / "t2m")
    assert sorted(result["coordinates"]) == ["lat", "lon", "time"]
    ds = xr.open_zarr(copy, consolidated=False, decode_times=False)
    src = xr.open_zarr(era5, consolidated=False, decode_times=False)
    np.testing.assert_array_equal(ds["t2m"].values, qs.open_xarray(q).values)
    for name in ("time", "lat", "lon"):
        np.testing.assert_array_equal(ds[name].values, src[name].values)
        assert ds[name].attrs["units"] == src[name].attrs["units"]
    assert ds["t2m"].dims == ("time", "lat", "lon")


def test_a_member_already_beside_the_copy_is_never_replaced(era5, tmp_path):
    import zarr

    q = tmp_path / "q.zarr"
    qs.quantize_store(era5 / "t2m", q, qs.QuantSpec(dtype="int8", axis=1))
    copy = tmp_path / "copy.zarr"
    group = zarr.open_group(copy, mode="w")
    theirs = group.create_array("lat", shape=(18,), dtype="int32")
    theirs[...] = np.arange(18)
    before = {p: p.read_bytes() for p in (copy / "lat").rglob("*") if p.is_file()}
    result = qs.dequantize_store(q, copy / "t2m")
    assert sorted(result["coordinates"]) == ["lon", "time"]  # (their lat is not the source's)
    assert {p: p.read_bytes() for p in (copy / "lat").rglob("*") if p.is_file()} == before


def test_a_dequantized_copy_outside_any_group_gets_no_coordinates(era5, tmp_path):
    q = tmp_path / "q.zarr"
    qs.quantize_store(era5 / "t2m", q, qs.QuantSpec(dtype="int8", axis=1))
    result = qs.dequantize_store(q, tmp_path / "copy.zarr")
    assert result["coordinates"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.zarr", "era5.zarr", "q.zarr"]


def test_a_copy_named_inside_a_new_zarr_folder_makes_it_a_group_with_the_coordinates(
    era5, tmp_path
):
    q = tmp_path / "q.zarr"
    qs.quantize_store(era5 / "t2m", q, qs.QuantSpec(dtype="int8", axis=1))
    result = qs.dequantize_store(q, tmp_path / "copy.zarr" / "t2m")  # (copy.zarr: not there)
    assert sorted(result["coordinates"]) == ["lat", "lon", "time"]
    got = xr.open_zarr(tmp_path / "copy.zarr", consolidated=False)
    src = xr.open_zarr(era5, consolidated=False)
    for name in ("time", "lat", "lon"):
        np.testing.assert_array_equal(got[name].values, src[name].values)
        assert got[name].attrs == src[name].attrs
    assert got["t2m"].dtype == np.float32
    # a folder that holds anything else is left as it is: no group made in it
    (tmp_path / "mine.zarr").mkdir()
    (tmp_path / "mine.zarr" / "notes.txt").write_text("mine")
    result = qs.dequantize_store(q, tmp_path / "mine.zarr" / "t2m")
    assert result["coordinates"] == [] and not (tmp_path / "mine.zarr" / "zarr.json").exists()
