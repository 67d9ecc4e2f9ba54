"""A quantized field as xarray users see it: ``qs.open_xarray`` names it as the source's
variable, keeps its ``units``/``long_name``, decodes to float32 and shows the coordinate
arrays of the output's group; ``xr.open_zarr`` decodes a per-tensor output as CF says
(float64; ``.astype("float32")`` is qstream's values; ``mask_and_scale=False`` the codes)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

import qstream as qs

xr = pytest.importorskip("xarray")
pytest.importorskip("dask")
zarr = pytest.importorskip("zarr")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def era5(tmp_path: Path) -> Path:
    """A small ERA5-like Zarr store: ``t2m`` (time, lat, lon) in K with its coordinates."""
    rng = np.random.default_rng(0)
    t2m = rng.normal(280, 5, (4, 30, 40)).astype("float32")
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), t2m, {"units": "K", "long_name": "2 m temperature"})},
        coords={"lat": np.linspace(-60, 60, 30), "lon": np.linspace(0, 351, 40)},
    )
    ds.lat.attrs["units"] = "degrees_north"
    path = tmp_path / "era5.zarr"
    ds.to_zarr(path, consolidated=False, zarr_format=3)
    return path


def test_open_xarray_keeps_the_variable_name_units_and_long_name_in_float32(era5, tmp_path):
    out = tmp_path / "q.zarr"
    qs.quantize_store(era5 / "t2m", out, qs.QuantSpec(dtype="int8", axis=1))
    da = qs.open_xarray(out)
    assert da.name == "t2m" and da.dims == ("time", "lat", "lon")
    assert da.attrs["units"] == "K" and da.attrs["long_name"] == "2 m temperature"
    assert da.attrs["quantized_dtype"] == "int8" and da.attrs["granularity"] == "per_axis"
    assert da.dtype == np.float32
    np.testing.assert_array_equal(da.values, qs.open_quantized(out)[...])
    assert "scale_factor" not in da.attrs and "coordinates" not in da.attrs  # (encoding only)


def test_open_xarray_of_an_unnamed_source_calls_it_data(tmp_path):
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    qs.quantize_store(x, tmp_path / "q.zarr", qs.QuantSpec(dtype="int8"))
    assert qs.open_xarray(tmp_path / "q.zarr").name == "data"


def test_open_xarray_shows_the_groups_coordinate_arrays_with_their_attributes(era5, tmp_path):
    out = tmp_path / "q.zarr"
    qs.quantize_store(era5 / "t2m", out, qs.QuantSpec(dtype="int8", axis=1))
    group = zarr.open_group(out, mode="r+")
    src = zarr.open_group(era5, mode="r")
    # (the source's coordinates are copied beside data, as xarray writes coordinates; one of
    # the wrong length is not taken)
    group.create_array("time", shape=(3,), dtype="int64", dimension_names=["time"], overwrite=True)
    da = qs.open_xarray(out)
    np.testing.assert_array_equal(da.lat.values, src["lat"][...])
    assert da.lat.attrs == {"units": "degrees_north"}
    assert "lon" in da.coords and "time" not in da.coords
    assert qs.open_quantized(out).meta["complete"]  # (extra members harm nothing)


def test_xr_open_zarr_decodes_a_per_tensor_output_to_float64_as_cf_says(era5, tmp_path):
    out = tmp_path / "q.zarr"
    qs.quantize_store(era5 / "t2m", out, qs.QuantSpec(dtype="int8"))
    ours = qs.open_xarray(out).values
    cf = xr.open_zarr(out, consolidated=False)["data"]
    assert cf.dtype == np.float64  # (xarray's CF decoding: what the README documents)
    np.testing.assert_array_equal(cf.values.astype(np.float32), ours)
    raw = xr.open_zarr(out, consolidated=False, mask_and_scale=False)["data"]
    assert raw.dtype == np.int8  # (the codes, as stored)
    assert cf.attrs["units"] == "K"


def test_the_codec_extra_installs_cast_value_rs():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(dep.startswith("cast-value-rs") for dep in extras["codec"])
