"""Issue 27: scientific arrays. Float offsets, the fill NaN policy, the clean xarray view
(coordinates, dimension names, attributes, no lock or _progress left), chosen chunks, and
the codec layout (zarr >= 3.2: decoded by zarr and xarray in a process without qstream)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import zarr

import qstream as qs
from qstream.errors import InvalidParameterError

xr = pytest.importorskip("xarray")
pytest.importorskip("dask")

CODEC = hasattr(zarr.codecs, "ScaleOffset") and hasattr(zarr.codecs, "CastValue")
try:
    import cast_value_rs  # noqa: F401
except ImportError:
    CODEC = False


def climate(shape=(90, 180), seed=0) -> np.ndarray:
    """A temperature-like field in K (262-297, far from 0) with missing values (NaN)."""
    rng = np.random.default_rng(seed)
    lat = np.linspace(-1, 1, shape[0])[:, None]
    lon = np.linspace(0, 2 * np.pi, shape[1])[None, :]
    x = 279.5 + 15 * np.cos(np.pi * lat / 2) * np.sin(lon) - 2 * lat
    x = np.clip(x + rng.normal(0, 0.5, shape), 262, 297).astype(np.float32)
    x[rng.random(shape) < 0.02] = np.nan  # land points, say
    return x


@pytest.fixture
def field(tmp_path):
    x = climate()
    path = tmp_path / "t2m.zarr"
    z = zarr.create_array(
        path,
        shape=x.shape,
        chunks=(45, 90),
        dtype="f4",
        fill_value=np.nan,
        dimension_names=["lat", "lon"],
        attributes={"units": "K", "long_name": "air temperature", "_FillValue": "NaN"},
    )
    z[...] = x
    return str(path), x


# --------------------------------------------------------------------------- float offsets


def test_float_offset_error_is_a_fraction_of_the_zero_containing_range(field, tmp_path):
    src, x = field
    zero = qs.quantize_store(
        src, tmp_path / "zp.zarr", qs.QuantSpec(dtype="uint8", symmetric=False, nan_policy="fill")
    )
    off = qs.quantize_store(
        src, tmp_path / "off.zarr", qs.QuantSpec(dtype="uint8", offset="range", nan_policy="fill")
    )
    y0 = qs.open_quantized(tmp_path / "zp.zarr")[...]
    y1 = qs.open_quantized(tmp_path / "off.zarr")[...]
    e0, e1 = np.nanmax(np.abs(y0 - x)), np.nanmax(np.abs(y1 - x))
    assert e1 <= 0.15 * e0, (e0, e1)
    # the report's max error is the one measured on the dequantized values
    assert off.error["max_abs"] == pytest.approx(float(e1), rel=1e-6)
    assert zero.error["max_abs"] == pytest.approx(float(e0), rel=1e-6)
    # half a step of the data's own range (254 codes: one is NaN's)
    lo, hi = np.nanmin(x), np.nanmax(x)
    assert e1 <= (hi - lo) / 254 / 2 * 1.001
    # missing values stay missing, and are counted
    assert np.array_equal(np.isnan(y1), np.isnan(x))
    assert off.error["nan"] == int(np.isnan(x).sum())


def _oracle_codes(x, s, o, qmin, qmax):
    v = (x.astype(np.float64) - o) / np.float64(s)
    return np.clip(np.rint(v), qmin, qmax)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint16", "int16"])
def test_float_offset_codes_and_values_match_the_formulas(dtype, tmp_path):
    x = climate((40, 64), seed=1)
    x = np.nan_to_num(x, nan=280.0)
    spec = qs.QuantSpec(dtype=dtype, offset="range", axis=0)
    qs.quantize_store(x, tmp_path / "o.zarr", spec)
    arr = qs.open_quantized(tmp_path / "o.zarr")
    s, o = arr.scale, arr.offset
    qt = spec.qtype
    lo, hi = x.min(axis=1), x.max(axis=1)
    # calibration: lo is code qmin; scale the span over the codes (float32)
    want_s = ((hi.astype(np.float64) - lo) / (qt.qmax - qt.qmin)).astype(np.float32)
    assert np.array_equal(s, want_s)
    assert np.array_equal(o, lo.astype(np.float64) - qt.qmin * s.astype(np.float64))
    q = arr.quantized().astype(np.float64)
    assert np.array_equal(q, _oracle_codes(x, s[:, None], o[:, None], qt.qmin, qt.qmax))
    y = (q * s[:, None].astype(np.float64) + o[:, None]).astype(np.float32)
    assert np.array_equal(arr[...], y)
    assert np.array_equal(arr[3:17, 5:9], y[3:17, 5:9])  # a region: its channels' parameters


def test_explicit_offset_and_scale(tmp_path):
    x = climate((16, 32), seed=2)
    x = np.nan_to_num(x, nan=270.0)
    spec = qs.QuantSpec(dtype="uint8", offset=260.0, scale=0.2, round_mode="half_away_from_zero")
    qs.quantize_store(x, tmp_path / "e.zarr", spec)
    arr = qs.open_quantized(tmp_path / "e.zarr")
    codes = _oracle_codes(x, np.float32(0.2), 260.0, 0, 255)
    v = (x.astype(np.float64) - 260.0) / np.float64(np.float32(0.2))
    codes = np.clip(np.copysign(np.floor(np.abs(v) + 0.5), v), 0, 255)  # half away from zero
    assert np.array_equal(arr.quantized().astype(np.float64), codes)
    # a user offset with a calibrated scale covers the range from it
    qs.quantize_store(x, tmp_path / "u.zarr", qs.QuantSpec(dtype="uint8", offset=260.0))
    u = qs.open_quantized(tmp_path / "u.zarr")
    assert u.offset.item() == 260.0
    assert np.max(np.abs(u[...] - x)) <= u.scale.item() / 2 * 1.001


def test_offset_spec_rules():
    assert "offset" not in qs.QuantSpec().to_dict()  # job identities of existing specs stay
    assert "offset" not in qs.QuantSpec(dtype="uint8", symmetric=False).to_dict()
    spec = qs.QuantSpec(dtype="uint8", offset="range")
    assert spec.symmetric is False and qs.QuantSpec.from_dict(spec.to_dict()) == spec
    assert qs.QuantSpec(dtype="int8", nan_policy="fill").narrow_range
    for bad, word in [
        (dict(dtype="float8_e4m3fn", offset="range"), "float"),
        (dict(dtype="int8", axis=0, block_size=32, offset="range"), "blocked"),
        (dict(dtype="int8", offset="range", method="entropy"), "method"),
        (dict(dtype="int32", offset="range"), "16 bits"),
        (dict(dtype="int8", offset="middle"), "offset must be"),
        (dict(dtype="int8", offset=float("nan")), "finite"),
        (dict(dtype="int8", offset="range", scale=0.1), "number"),
        (dict(dtype="float8_e4m3fn", nan_policy="fill"), "float type"),
    ]:
        with pytest.raises(InvalidParameterError, match=word):
            qs.QuantSpec(**bad)


def test_offsets_are_not_for_checkpoints(tmp_path):
    np.savez(tmp_path / "ck.npz", w=np.ones((8, 8), np.float32))
    from qstream.spec.recipe import Recipe, Rule

    recipe = Recipe(rules=(Rule("*", qs.QuantSpec(dtype="uint8", offset="range")),))
    with pytest.raises(InvalidParameterError, match="checkpoint"):
        qs.convert_checkpoint(tmp_path / "ck.npz", tmp_path / "ck.zarr", recipe)


# --------------------------------------------------------------------------- the xarray view


@pytest.mark.parametrize(
    "spec",
    [
        qs.QuantSpec(dtype="uint8", offset="range", nan_policy="fill"),
        qs.QuantSpec(dtype="int8", offset="range", nan_policy="fill"),
        qs.QuantSpec(dtype="uint8", symmetric=False, nan_policy="fill"),
        qs.QuantSpec(dtype="int16", nan_policy="fill"),
    ],
    ids=["uint8-offset", "int8-offset", "uint8-zero-point", "int16-symmetric"],
)
def test_per_tensor_output_decodes_in_xarray_exactly(field, tmp_path, spec):
    src, x = field
    out = tmp_path / "q.zarr"
    qs.quantize_store(src, out, spec)
    y = qs.open_quantized(out)[...]
    assert sorted(os.listdir(out)) == sorted(
        ["zarr.json", "data", "scale", "zero_point", *(["offset"] if spec.offset else [])]
    )  # no lock file, no _progress: nothing but the Zarr hierarchy
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = xr.open_zarr(out, consolidated=False)
        decoded = ds["data"].values
    assert list(ds.data_vars) == ["data"]
    assert {"scale", "zero_point"} <= set(ds.coords)
    assert ds["data"].dims == ("lat", "lon")
    assert ds["data"].attrs["units"] == "K"
    assert ds["data"].attrs["long_name"] == "air temperature"
    # CF decoding (float64) cast to float32 is qstream's dequantize, bit for bit; NaN kept
    assert np.array_equal(decoded.astype(np.float32), y, equal_nan=True)
    assert np.array_equal(np.isnan(decoded), np.isnan(x))
    # the dequantized copy keeps the names and the attributes
    qs.dequantize_store(out, tmp_path / "r.zarr")
    r = zarr.open_array(tmp_path / "r.zarr", mode="r")
    assert tuple(r.metadata.dimension_names) == ("lat", "lon")
    assert r.attrs["units"] == "K"
    assert np.array_equal(r[...], y, equal_nan=True)


@pytest.mark.parametrize("offset", [None, "range"])
def test_per_axis_output_through_open_xarray(field, tmp_path, offset):
    src, x = field
    out = tmp_path / "q.zarr"
    spec = qs.QuantSpec(dtype="uint8", axis=0, offset=offset, symmetric=False, nan_policy="fill")
    qs.quantize_store(src, out, spec)
    y = qs.open_quantized(out)[...]
    da = qs.open_xarray(out)
    assert da.dims == ("lat", "lon")
    assert np.array_equal(da.values, y, equal_nan=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = xr.open_zarr(out, consolidated=False)
    assert list(ds.data_vars) == ["data"]
    assert ds["scale"].dims == ("lat",)
    if offset:
        assert ds["offset"].dims == ("lat",)
        # the documented recipe: data * scale + offset (float64), cast to float32
        raw = xr.open_zarr(out, consolidated=False, mask_and_scale=False)
        q = raw["data"].values.astype(np.float64)
        rec = q * raw["scale"].values[:, None].astype(np.float64) + raw["offset"].values[:, None]
        rec = np.where(raw["data"].values == 0, np.nan, rec).astype(np.float32)
        assert np.array_equal(rec, y, equal_nan=True)
    assert np.nanmax(np.abs(y - x)) < (0.1 if offset else 0.6)  # a range from 0: 8x worse


def test_progress_removed_but_interrupted_runs_resume(field, tmp_path, monkeypatch):
    """A complete output has no _progress; an interrupted one keeps it and resumes to the same
    bytes and report."""
    from qstream.engine.blocks import work

    src, _ = field
    spec = qs.QuantSpec(dtype="uint8", offset="range", nan_policy="fill")
    full = qs.quantize_store(src, tmp_path / "a.zarr", spec, chunks=(15, 180))
    calls = [0]
    real = work.QuantizeWork.__call__

    def flaky(self, b):
        calls[0] += 1
        if calls[0] == 4:
            raise OSError("disk full")
        return real(self, b)

    monkeypatch.setattr(work.QuantizeWork, "__call__", flaky)
    monkeypatch.setenv("QSTREAM_PROGRESS_EVERY", "0")
    from qstream.io.outputs import progress_log as progress

    monkeypatch.setattr(progress, "SAVE_EVERY", 0.0)
    with pytest.raises(qs.StoreError):
        qs.quantize_store(src, tmp_path / "b.zarr", spec, chunks=(15, 180))
    assert os.path.isdir(tmp_path / "b.zarr" / "_progress")
    monkeypatch.setattr(work.QuantizeWork, "__call__", real)
    again = qs.quantize_store(src, tmp_path / "b.zarr", spec, chunks=(15, 180))
    assert again.resumed_blocks > 0
    assert again.error == full.error
    assert not os.path.exists(tmp_path / "b.zarr" / "_progress")
    a, b = qs.open_quantized(tmp_path / "a.zarr"), qs.open_quantized(tmp_path / "b.zarr")
    assert np.array_equal(a.quantized(), b.quantized())


# --------------------------------------------------------------------------- chunks


def test_chunks_follow_the_source_or_the_option(field, tmp_path):
    src, _ = field
    spec = qs.QuantSpec(dtype="uint8", offset="range", nan_policy="fill")
    qs.quantize_store(src, tmp_path / "d.zarr", spec)
    d = qs.open_quantized(tmp_path / "d.zarr")
    assert all(
        c % s == 0 or c == n for c, s, n in zip(d.data.chunks, (45, 90), d.shape, strict=True)
    )
    qs.quantize_store(src, tmp_path / "c.zarr", spec, chunks=(-1, 30))
    c = qs.open_quantized(tmp_path / "c.zarr")
    assert c.data.chunks == (90, 30)
    assert np.array_equal(c.quantized(), d.quantized())  # same codes, other chunks
    with pytest.raises(InvalidParameterError, match="one size per axis"):
        qs.quantize_store(src, tmp_path / "x.zarr", spec, chunks=(10,))
    with pytest.raises(InvalidParameterError, match="positive"):
        qs.quantize_store(src, tmp_path / "x.zarr", spec, chunks=(0, 10))
    big = np.zeros((2048, 2048), np.float32)
    with pytest.raises(InvalidParameterError, match="memory bound"):
        qs.quantize_store(big, tmp_path / "y.zarr", spec, chunks=(-1, -1), max_memory=8 << 20)


# --------------------------------------------------------------------------- the codec layout


@pytest.mark.skipif(CODEC, reason="this zarr has the codecs")
def test_codec_layout_refused_on_older_zarr(field, tmp_path):
    src, _ = field
    with pytest.raises(InvalidParameterError, match=r"zarr >= 3\.2") as refused:
        qs.quantize_store(src, tmp_path / "c.zarr", qs.QuantSpec(dtype="uint8"), layout="codec")
    assert "pip install 'qstream-zarr[codec]'" in str(refused.value)  # (the extra named)
    assert not os.path.exists(tmp_path / "c.zarr")


def test_codec_layout_refusals(field, tmp_path):
    src, _ = field
    with pytest.raises(InvalidParameterError, match="per tensor"):
        qs.quantize_store(
            src, tmp_path / "c.zarr", qs.QuantSpec(dtype="uint8", axis=0), layout="codec"
        )
    with pytest.raises(InvalidParameterError, match="unknown layout"):
        qs.quantize_store(src, tmp_path / "c.zarr", qs.QuantSpec(), layout="flat")


_READER = """
import json, sys
import numpy as np, zarr, xarray as xr
out, want = sys.argv[1], sys.argv[2]
y = np.load(want)
a = zarr.open_group(out, mode="r")["data"]
ds = xr.open_zarr(out, consolidated=False)
print(json.dumps({
    "zarr": bool(np.array_equal(a[...], y, equal_nan=True)),
    "zarr_dtype": str(a.dtype),
    "xarray": bool(np.array_equal(ds["data"].values, y, equal_nan=True)),
    "xarray_dtype": str(ds["data"].dtype),
    "dims": list(ds["data"].dims),
    "units": ds["data"].attrs.get("units"),
    "qstream_modules": sorted(m for m in sys.modules if m.split(".")[0] == "qstream"),
}))
"""


@pytest.mark.skipif(not CODEC, reason="the codec layout needs zarr >= 3.2 and cast-value-rs")
@pytest.mark.parametrize(
    "spec",
    [
        qs.QuantSpec(dtype="uint8", offset="range", nan_policy="fill"),
        qs.QuantSpec(dtype="int8", nan_policy="fill"),
        qs.QuantSpec(dtype="uint8", symmetric=False, nan_policy="fill"),
        qs.QuantSpec(dtype="int16", offset="range", nan_policy="fill"),
    ],
    ids=["uint8-offset", "int8-symmetric", "uint8-zero-point", "int16-offset"],
)
def test_codec_layout_decodes_without_qstream(field, tmp_path, spec):
    src, _ = field
    out = tmp_path / "c.zarr"
    report = qs.quantize_store(src, out, spec, layout="codec")
    arr = qs.open_quantized(out)
    y = arr[...]
    np.save(tmp_path / "y.npy", y)
    # the same codes as the group layout writes (for an offset spec, quantized with its
    # float32 offset), and values within a float32 rounding of that layout's
    plain = qs.quantize_store(src, tmp_path / "g.zarr", spec)
    g = qs.open_quantized(tmp_path / "g.zarr")
    if not spec.offset:
        assert np.array_equal(arr.quantized(), g.quantized())
    assert np.nanmax(np.abs(y - g[...])) <= 2 * np.float32(arr.scale.item()) + 1e-3
    assert report.error["max_abs"] == pytest.approx(plain.error["max_abs"], rel=0.02)
    doc = json.loads((out / "data" / "zarr.json").read_text())
    assert doc["data_type"] == "float32"
    assert [c["name"] for c in doc["codecs"]][:1] == ["scale_offset"]
    assert "cast_value" in [c["name"] for c in doc["codecs"]]
    # a fresh process with zarr and xarray only: no qstream on its path
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    got = subprocess.run(
        [sys.executable, "-c", _READER, str(out), str(tmp_path / "y.npy")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert got.returncode == 0, got.stderr
    res = json.loads(got.stdout.strip().splitlines()[-1])
    # zarr >= 3.2 loads the data types of every installed package's entry points at its first
    # open, qstream's among them (qstream.io.zarr_types.zarr_ext): that far only (its folder's
    # face imports nothing), none of its decoding code
    assert set(res.pop("qstream_modules")) <= {
        "qstream",
        "qstream.io",
        "qstream.io.zarr_types",
        "qstream.io.zarr_types.packing",
        "qstream.io.zarr_types.zarr_ext",
    }
    assert res == {
        "zarr": True,
        "zarr_dtype": "float32",
        "xarray": True,
        "xarray_dtype": "float32",
        "dims": ["lat", "lon"],
        "units": "K",
    }
    # qstream's dequantize and xarray view of it agree
    qs.dequantize_store(out, tmp_path / "r.zarr")
    assert np.array_equal(zarr.open_array(tmp_path / "r.zarr")[...], y, equal_nan=True)
    assert np.array_equal(qs.open_xarray(out).values, y, equal_nan=True)
    # the same job again: complete, nothing done
    assert qs.quantize_store(src, out, spec, layout="codec").already_complete


@pytest.mark.skipif(not CODEC, reason="the codec layout needs zarr >= 3.2 and cast-value-rs")
def test_codec_layout_resumes_after_the_swap(field, tmp_path):
    """A run killed after data's document was swapped (before ``complete``) resumes: the
    document goes back to its plain form while codes are written."""
    from qstream.io.outputs import codec

    src, _ = field
    spec = qs.QuantSpec(dtype="uint8", offset="range", nan_policy="fill")
    out = tmp_path / "c.zarr"
    qs.quantize_store(src, out, spec, layout="codec")
    y = qs.open_quantized(out)[...]
    meta = json.loads((out / "zarr.json").read_text())
    meta["attributes"]["qstream"]["complete"] = False
    (out / "zarr.json").write_text(json.dumps(meta))
    group = zarr.open_group(out, mode="r")
    assert codec.plain_document(codec.read_doc(group)) is not None  # still the codec form
    again = qs.quantize_store(src, out, spec, layout="codec")
    assert not again.already_complete
    assert np.array_equal(qs.open_quantized(out)[...], y, equal_nan=True)
