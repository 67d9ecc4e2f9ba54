"""Stores on S3: a real S3 API (moto's server) on loopback, through fsspec/s3fs."""

import numpy as np
import pytest
import zarr

import qstream as qs
from qstream.spec import QuantSpec

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")
pytest.importorskip("flask")


@pytest.fixture(scope="module")
def s3():
    import boto3

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    opts = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": f"http://{host}:{port}", "region_name": "us-east-1"},
    }
    boto3.client(
        "s3",
        endpoint_url=opts["client_kwargs"]["endpoint_url"],
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket="qstream-test")
    yield opts
    server.stop()


def test_quantize_and_dequantize_between_s3_stores(s3):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((96, 200)) * 0.02).astype(np.float32)
    src = zarr.create_array(
        zarr.storage.FsspecStore.from_url("s3://qstream-test/src.zarr", storage_options=s3),
        shape=x.shape,
        chunks=(16, 64),
        dtype=x.dtype,
    )
    src[...] = x
    spec = QuantSpec(axis=0, method="percentile")
    report = qs.quantize_store(
        "s3://qstream-test/src.zarr", "s3://qstream-test/q.zarr", spec, storage_options=s3
    )
    assert report.passes == 3 and report.error["sqnr_db"] > 20
    arr = qs.open_quantized("s3://qstream-test/q.zarr", storage_options=s3)
    want = qs.quantize(x, arr.scale, arr.zero_point.astype(np.int64), axis=0, dtype="int8")
    np.testing.assert_array_equal(arr.quantized(...), want)
    # local and S3 runs of the same job agree bit for bit, report included
    local = qs.quantize_store(x, "memory://s3-compare", spec, overwrite=True)
    assert local.error == report.error and local.calibration == report.calibration
    qs.dequantize_store("s3://qstream-test/q.zarr", "s3://qstream-test/d.zarr", storage_options=s3)
    back = zarr.open_array(
        zarr.storage.FsspecStore.from_url(
            "s3://qstream-test/d.zarr", storage_options=s3, read_only=True
        )
    )[...]
    np.testing.assert_array_equal(back, arr[...])
    # re-running the finished job is a no-op; another spec is refused without overwrite
    again = qs.quantize_store(
        "s3://qstream-test/src.zarr", "s3://qstream-test/q.zarr", spec, storage_options=s3
    )
    assert again.error == report.error
    with pytest.raises(qs.StoreError, match="different job"):
        qs.quantize_store(
            "s3://qstream-test/src.zarr",
            "s3://qstream-test/q.zarr",
            QuantSpec(),
            storage_options=s3,
        )
