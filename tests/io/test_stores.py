"""Store conversions: bit-identical to in-memory quantize, chunking-invariant calibration,
NaN policies, resume, and clear failures."""

import json

import numpy as np
import pytest
import zarr

import qstream as qs
from qstream.engine.jobs.job import QuantizeJob
from qstream.errors import NonFiniteInputError, StoreError
from qstream.io.storage.stores import open_source
from qstream.spec import QuantSpec


def _zarr(path, x, chunks):
    a = zarr.create_array(str(path), shape=x.shape, chunks=chunks, dtype=x.dtype, overwrite=True)
    a[...] = x
    return str(path)


@pytest.fixture
def weights():
    rng = np.random.default_rng(0)
    rows = np.exp(rng.normal(0, 0.5, (96, 1)))
    return (rng.standard_normal((96, 200)) * 0.02 * rows).astype(np.float32)


SPECS = [
    QuantSpec(),
    QuantSpec(axis=0),
    QuantSpec(axis=-1, dtype="uint8", symmetric=False),
    QuantSpec(axis=1, block_size=32),
    QuantSpec(dtype="int4", axis=0),
    QuantSpec(dtype="int16", round_mode="half_away_from_zero"),
    QuantSpec(method="percentile", percentile=99.5),
    QuantSpec(axis=0, method="percentile", symmetric=False, dtype="uint8"),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.dtype}-{s.granularity}-{s.method}")
@pytest.mark.parametrize("max_memory", [1 << 20, 64 << 20])
def test_store_output_is_bit_identical_to_in_memory_quantize(tmp_path, weights, spec, max_memory):
    src = _zarr(tmp_path / "src.zarr", weights, (16, 64))
    report = qs.quantize_store(src, tmp_path / "q.zarr", spec, max_memory=max_memory)
    arr = qs.open_quantized(tmp_path / "q.zarr")
    want = qs.quantize(
        weights,
        arr.scale,
        arr.zero_point.astype(np.int64),
        axis=spec.axis,
        block_size=spec.block_size,
        dtype=spec.dtype,
        round_mode=spec.round_mode,
    )
    np.testing.assert_array_equal(arr.quantized(...), want)
    restored = arr[...]
    np.testing.assert_array_equal(
        restored,
        qs.dequantize(
            want,
            arr.scale,
            arr.zero_point.astype(np.int64),
            axis=spec.axis,
            block_size=spec.block_size,
        ),
    )
    np.testing.assert_array_equal(arr[5:40, 3], restored[5:40, 3])
    assert report.error["sqnr_db"] > 10
    assert report.passes == (1 if spec.block_size else 3 if spec.method == "percentile" else 2)


@pytest.mark.parametrize("method", ["minmax", "percentile"])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_calibration_is_independent_of_chunking_and_chunk_order(tmp_path, weights, method, axis):
    spec = QuantSpec(method=method, axis=axis, symmetric=False, dtype="uint8")
    results = []
    for i, chunks in enumerate([(96, 200), (7, 13), (32, 200)]):
        src = _zarr(tmp_path / f"s{i}.zarr", weights, chunks)
        results.append(qs.calibrate(src, spec))
    for order in (None, "reverse"):
        job = QuantizeJob(_zarr(tmp_path / "o.zarr", weights, (10, 30)), spec, max_memory=1 << 20)
        if order:
            job.blocks = job.blocks[::-1]
        results.append(job.calibration())
    for r in results[1:]:
        np.testing.assert_array_equal(r.scale, results[0].scale)
        np.testing.assert_array_equal(r.zero_point, results[0].zero_point)


@pytest.mark.parametrize("spec", [QuantSpec(), QuantSpec(axis=0, method="percentile")])
def test_results_do_not_depend_on_workers_or_threads(tmp_path, weights, spec):
    import numba

    from qstream.engine.run import pipeline

    src = _zarr(tmp_path / "src.zarr", np.tile(weights, (8, 1)), (16, 64))
    reports, data = [], []
    before = numba.get_num_threads()
    try:
        for threads, workers in [(1, 1), (2, 1), (2, 4), (1, 3)]:
            numba.set_num_threads(threads)
            original = pipeline.default_workers
            pipeline.default_workers = lambda w=workers: w
            try:
                dst = tmp_path / f"q{threads}-{workers}.zarr"
                reports.append(qs.quantize_store(src, dst, spec, max_memory=1 << 20))
            finally:
                pipeline.default_workers = original
            data.append(qs.open_quantized(dst).quantized(...))
    finally:
        numba.set_num_threads(before)
    for r, d in zip(reports[1:], data[1:], strict=True):
        np.testing.assert_array_equal(d, data[0])
        assert r.error == reports[0].error  # float sums merged in block order: same bits
        assert r.calibration == reports[0].calibration


def test_nan_policy_error_names_array_count_and_first_index(tmp_path, weights):
    x = weights.copy()
    x[40, 7] = np.nan
    x[90, 1] = np.inf
    src = _zarr(tmp_path / "nan.zarr", x, (16, 64))
    with pytest.raises(
        NonFiniteInputError, match=r"nan.zarr: 2 non-finite.*first at index \(40, 7\)"
    ):
        qs.quantize_store(src, tmp_path / "q.zarr", QuantSpec())
    assert not (tmp_path / "q.zarr").exists()
    with pytest.raises(NonFiniteInputError, match=r"first at index \(40, 7\)"):
        qs.quantize_store(src, tmp_path / "q2.zarr", QuantSpec(scale=0.01))
    with pytest.raises(StoreError, match="incomplete"):
        qs.open_quantized(tmp_path / "q2.zarr")


@pytest.mark.parametrize(("policy", "expected"), [("zero_point", 128), ("min", 0)])
def test_nan_policy_zero_point_and_min(tmp_path, weights, policy, expected):
    x = weights.copy()
    x[3, 4] = np.nan
    spec = QuantSpec(dtype="uint8", nan_policy=policy)
    qs.quantize_store(x, tmp_path / "q.zarr", spec)
    arr = qs.open_quantized(tmp_path / "q.zarr")
    assert int(arr.zero_point) == 128
    assert arr.quantized((3, 4)) == expected


@pytest.mark.parametrize("dst", ["q.zip", "memory://q-test"])
def test_zip_and_memory_destinations(tmp_path, weights, dst):
    target = str(tmp_path / dst) if dst.endswith(".zip") else dst
    qs.quantize_store(weights, target, QuantSpec(axis=0), overwrite=True)
    arr = qs.open_quantized(target)
    np.testing.assert_allclose(arr[...], weights, atol=float(arr.scale.max()))
    out = target.replace("q", "deq", 1) if dst.startswith("memory") else str(tmp_path / "d.zarr")
    qs.dequantize_store(target, out, overwrite=True)
    np.testing.assert_array_equal(open_source(out).array[...], arr[...])


def test_metadata_round_trips_and_per_tensor_carries_cf_attributes(tmp_path, weights):
    report = qs.quantize_store(
        weights, tmp_path / "q.zarr", QuantSpec(dtype="uint8", symmetric=False)
    )
    meta = json.loads((tmp_path / "q.zarr" / "zarr.json").read_text())["attributes"]["qstream"]
    assert meta["complete"] is True and meta["version"] == 3 and meta["ready"] is True
    assert qs.QuantSpec.from_dict(meta["spec"]) == report.spec
    assert qs.QuantReport.from_dict(meta["report"]).error == report.error
    data_attrs = json.loads((tmp_path / "q.zarr" / "data" / "zarr.json").read_text())["attributes"]
    q = np.asarray(zarr.open_array(str(tmp_path / "q.zarr" / "data"))[...])
    cf = q * data_attrs["scale_factor"] + data_attrs["add_offset"]
    np.testing.assert_allclose(
        cf, qs.open_quantized(tmp_path / "q.zarr")[...], rtol=1e-6, atol=1e-9
    )


def test_bad_inputs_fail_clearly(tmp_path, weights):
    with pytest.raises(StoreError, match="no such Zarr store"):
        qs.quantize_store(tmp_path / "missing.zarr", tmp_path / "q.zarr")
    bad = tmp_path / "corrupt.zarr"
    bad.mkdir()
    (bad / "zarr.json").write_text("{not json")
    with pytest.raises(StoreError, match="cannot open"):
        qs.quantize_store(bad, tmp_path / "q.zarr")
    with pytest.raises(TypeError, match="not floating point"):
        qs.quantize_store(np.arange(10), tmp_path / "q.zarr")
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        qs.quantize_store(weights, tmp_path / "q.zarr", QuantSpec(axis=2))
    with pytest.raises(ValueError, match="scale must be finite and > 0"):
        qs.quantize_store(weights, tmp_path / "q.zarr", QuantSpec(scale=0.0))
    with pytest.raises(ValueError, match="outside the int8 range"):
        qs.quantize_store(weights, tmp_path / "q.zarr", QuantSpec(scale=1.0, zero_point=300))
    with pytest.raises(ValueError, match="unknown method"):
        QuantSpec(method="kl")
    blocker = tmp_path / "blocker"  # a file where a directory should be: unwritable, even as root
    blocker.write_text("x")
    with pytest.raises(StoreError, match="cannot write"):
        qs.quantize_store(weights, blocker / "q.zarr")
