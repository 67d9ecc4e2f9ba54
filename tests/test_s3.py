"""Stores on S3: a real S3 API (``moto_server`` in its own process, on loopback), through both
URL backends (fsspec/s3fs and obstore), locally and from Dask workers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
import zarr

import qstream as qs
from qstream.spec import QuantSpec

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
pytest.importorskip("flask")

BUCKET = "qstream-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def endpoint():
    """A ``moto_server`` subprocess (not a thread of this process: the server must not share
    the GIL with the code under test) with one bucket."""
    import boto3

    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        else:
            pytest.fail("moto_server did not start")
        boto3.client(
            "s3",
            endpoint_url=url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket=BUCKET)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _options(backend: str, url: str) -> dict:
    if backend == "fsspec":
        return {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": url, "region_name": "us-east-1"},
        }
    return {
        "endpoint": url,
        "access_key_id": "testing",
        "secret_access_key": "testing",
        "region": "us-east-1",
        "client_options": {"allow_http": True},
    }


@pytest.fixture(params=["fsspec", "obstore"])
def backend(request):
    if request.param == "obstore":
        pytest.importorskip("obstore")
    return request.param


def _put_source(url: str, key: str, x: np.ndarray, chunks) -> str:
    fs_opts = _options("fsspec", url)
    store = zarr.storage.FsspecStore.from_url(f"s3://{BUCKET}/{key}", storage_options=fs_opts)
    a = zarr.create_array(store, shape=x.shape, chunks=chunks, dtype=x.dtype, overwrite=True)
    a[...] = x
    return f"s3://{BUCKET}/{key}"


def _read(url: str, key: str) -> np.ndarray:
    store = zarr.storage.FsspecStore.from_url(
        f"s3://{BUCKET}/{key}", storage_options=_options("fsspec", url), read_only=True
    )
    return zarr.open_array(store)[...]


def test_quantize_and_dequantize_between_s3_stores(endpoint, backend):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((96, 200)) * 0.02).astype(np.float32)
    src = _put_source(endpoint, f"{backend}/src.zarr", x, (16, 64))
    q, d = f"s3://{BUCKET}/{backend}/q.zarr", f"s3://{BUCKET}/{backend}/d.zarr"
    opts = _options(backend, endpoint)
    spec = QuantSpec(axis=0, method="percentile")
    report = qs.quantize_store(src, q, spec, storage_options=opts, store=backend)
    assert report.passes == 3 and report.error["sqnr_db"] > 20
    assert report.destination == q
    arr = qs.open_quantized(q, storage_options=_options("fsspec", endpoint))
    want = qs.quantize(x, arr.scale, arr.zero_point.astype(np.int64), axis=0, dtype="int8")
    np.testing.assert_array_equal(arr.quantized(...), want)
    # local and S3 runs of the same job agree bit for bit, report included
    local = qs.quantize_store(x, "memory://s3-compare", spec, overwrite=True)
    assert local.error == report.error and local.calibration == report.calibration
    qs.dequantize_store(q, d, storage_options=opts, store=backend)
    np.testing.assert_array_equal(_read(endpoint, f"{backend}/d.zarr"), arr[...])
    # re-running the finished job is a no-op; another spec is refused without overwrite
    again = qs.quantize_store(src, q, spec, storage_options=opts, store=backend)
    assert again.already_complete and again.error == report.error
    with pytest.raises(qs.StoreError, match="different job"):
        qs.quantize_store(src, q, QuantSpec(), storage_options=opts, store=backend)


def test_both_backends_name_the_same_job(endpoint):
    """The job's identity is the source's URL, whichever backend opened it: a run started
    through fsspec is finished (not refused) through obstore."""
    pytest.importorskip("obstore")
    x = np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32)
    src = _put_source(endpoint, "same/src.zarr", x, (16, 32))
    q = f"s3://{BUCKET}/same/q.zarr"
    spec = QuantSpec(method="minmax")
    a = qs.quantize_store(src, q, spec, storage_options=_options("fsspec", endpoint))
    b = qs.quantize_store(
        src, q, spec, storage_options=_options("obstore", endpoint), store="obstore"
    )
    assert b.already_complete and b.error == a.error


def test_unknown_store_backend_is_refused():
    with pytest.raises(qs.InvalidParameterError, match="store must be one of fsspec, obstore"):
        qs.quantize_store("s3://b/x.zarr", "s3://b/y.zarr", store="boto")


def test_dask_run_from_s3_to_s3_matches_the_local_run(endpoint, backend):
    distributed = pytest.importorskip("distributed")
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((128, 96)) * np.exp(rng.normal(0, 0.5, (128, 1)))).astype(np.float32)
    src = _put_source(endpoint, f"dask-{backend}/src.zarr", x, (32, 48))
    opts = _options(backend, endpoint)
    spec = QuantSpec(dtype="int8", axis=0, method="entropy", num_bins=256)
    local = qs.quantize_store(x, "memory://s3-dask-local", spec, overwrite=True)
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, dashboard_address=None, silence_logs=40
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        q = f"s3://{BUCKET}/dask-{backend}/q.zarr"
        got = qs.quantize_store(
            src,
            q,
            spec,
            storage_options=opts,
            store=backend,
            executor=qs.DaskExecutor(client, blocks_per_task=2),
        )
    assert json.dumps(got.error, sort_keys=True) == json.dumps(local.error, sort_keys=True)
    assert got.calibration == local.calibration
    np.testing.assert_array_equal(
        _read(endpoint, f"dask-{backend}/q.zarr/data"),
        qs.open_quantized("memory://s3-dask-local").quantized(...),
    )
