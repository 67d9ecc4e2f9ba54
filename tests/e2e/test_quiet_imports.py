"""qstream says nothing unasked (issue 44): no warning from its code when it is imported, when
zarr loads its entry points (at every zarr open wherever qstream is installed, zarr >= 3.2), or
when FP8 weights dequantize to inf; and the test suite's own filters make a warning issued from
qstream's modules an error (pyproject.toml), QStreamWarning apart."""

from __future__ import annotations

import subprocess
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest

from qstream.io.checkpoints.fp8 import Float8Tensor


def _quiet(code: str, cwd) -> str:
    """``code`` run in a fresh interpreter under ``-W error``; its stdout."""
    run = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr == ""
    return run.stdout


def test_a_plain_zarr_array_opens_under_w_error(tmp_path):
    """Written and read with zarr alone (zarr >= 3.2 loads qstream's data-type entry points as
    it opens it); every entry point loaded too, as zarr 3.1 would not."""
    code = """
import importlib.metadata as md
import numpy as np
import zarr
a = zarr.create_array("plain.zarr", shape=(6,), chunks=(4,), dtype="float32")
a[:] = np.arange(6, dtype="float32")
b = zarr.open_array("plain.zarr", mode="r")
assert b[:].tolist() == [0, 1, 2, 3, 4, 5]
names = []
for group in ("zarr.data_type", "zarr.codecs"):
    for e in md.entry_points(group=group):
        if e.value.startswith("qstream."):
            e.load()
            names.append(e.name)
print(sorted(names))
"""
    out = _quiet(code, tmp_path)
    assert "packbits" in out and "int4" in out and "bfloat16" in out


def test_import_qstream_and_its_public_names_under_w_error(tmp_path):
    code = """
import qstream, cli.main, qstream.io.zarr_types.zarr_ext
for name in qstream.__all__:
    getattr(qstream, name)
qstream.register_zarr_types()
print(len(qstream.__all__))
"""
    assert int(_quiet(code, tmp_path)) > 10


def test_a_packed_output_reads_with_zarr_under_w_error(tmp_path):
    import qstream as qs

    x = np.linspace(-1, 1, 40, dtype=np.float32).reshape(5, 8)
    qs.quantize_store(x, tmp_path / "q.zarr", spec=qs.QuantSpec(dtype="int4", axis=None))
    code = """
import zarr, qstream
qstream.register_zarr_types()  # (zarr 3.1 does not load entry points)
g = zarr.open_group("q.zarr", mode="r")
codes = [k for k, v in g.arrays() if str(v.dtype) == "int4"]
assert codes, list(g.array_keys())
print(g[codes[0]][...].dtype)
"""
    assert "int4" in _quiet(code, tmp_path)


@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
def test_fp8_products_beyond_float32_are_inf_without_a_warning(dtype):
    """float32(W) * S overflows to inf (and inf * 0 is NaN) as the reference's one float32
    multiply does: the values are IEEE's, and no RuntimeWarning is issued."""
    w = np.array([[448.0, -448.0, 1.0, 0.0], [2.0, -1.0, 0.5, 0.25]], np.float32).astype(dtype)
    if dtype is ml_dtypes.float8_e5m2:
        w[1, 2] = np.inf  # times a zero scale: NaN
    scales = np.array([[np.float32(1e37), np.float32(0.0)]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = Float8Tensor("w", w, scales, (2, 2))[...]
    with np.errstate(all="ignore"):
        full = np.repeat(np.repeat(scales, 2, 0), 2, 1)
        want = w.astype(np.float32) * full
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.isinf(got[0, :2]).all()
    if dtype is ml_dtypes.float8_e5m2:
        assert np.isnan(got[1, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one = Float8Tensor("w", w, np.array([[np.float32(3e38)]], np.float32), (2, 4))[...]
    assert np.isinf(one[0, :2]).all()


def test_the_suites_filters_make_qstreams_warnings_errors():
    """pyproject's filterwarnings, as pytest applied them to this test."""
    with pytest.raises(RuntimeWarning):
        warnings.warn_explicit(
            "overflow", RuntimeWarning, "fp8.py", 1, module="qstream.io.checkpoints.fp8"
        )
    with pytest.raises(DeprecationWarning):
        warnings.warn_explicit("old", DeprecationWarning, "x.py", 1, module="qstream")
    from qstream.errors import QStreamWarning

    with warnings.catch_warnings(record=True) as seen:
        warnings.warn_explicit("fyi", QStreamWarning, "c.py", 1, module="qstream.api.convert")
        warnings.warn_explicit("not ours", RuntimeWarning, "t.py", 1, module="qstreamish")
    assert [w.category for w in seen] == [QStreamWarning, RuntimeWarning]
