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


# ---------------------------------------------------------------- faults on the destination


def _s3(url: str):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )


class _OnBlock:
    """A progress reporter that runs ``action`` once, when block ``at`` of the quantize pass
    has landed."""

    def __init__(self, at: int, action):
        self.at, self.action, self.fired, self.pass_ = at, action, False, None

    def stage(self, name, total, done):
        self.pass_ = name

    def __call__(self, done, total):
        if self.pass_ == "quantize" and done == self.at and not self.fired:
            self.fired = True
            self.action()


def _many_blocks(seed: int) -> np.ndarray:
    """1 MiB of float32 that a 1 MiB memory bound cuts in 16 blocks of 64 rows."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((1024, 256)) * 0.1).astype(np.float32)


def _stored(url: str, key: str) -> dict[str, bytes]:
    """Every object under ``key`` and its bytes."""
    s3 = _s3(url)
    listing = s3.list_objects_v2(Bucket=BUCKET, Prefix=key + "/").get("Contents", [])
    return {
        o["Key"][len(key) + 1 :]: s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
        for o in listing
    }


@pytest.mark.parametrize("lost", ["data/c.1.0", "data/zarr.json"])
def test_objects_deleted_mid_run_fail_the_job_and_the_rerun_repairs_it(endpoint, backend, lost):
    x = _many_blocks(11)
    key = f"lost-{backend}-{lost.replace('/', '-')}"
    src = _put_source(endpoint, f"{key}/src.zarr", x, (16, 256))
    q = f"s3://{BUCKET}/{key}/q.zarr"
    opts = _options(backend, endpoint)
    spec = QuantSpec(axis=0)
    delete = _OnBlock(
        4, lambda: _s3(endpoint).delete_object(Bucket=BUCKET, Key=f"{key}/q.zarr/{lost}")
    )
    with pytest.raises(qs.StoreError, match=r"missing or damaged|taken over"):
        qs.quantize_store(
            src, q, spec, storage_options=opts, store=backend, max_memory=1 << 20, progress=delete
        )
    assert delete.fired
    meta = json.loads(_stored(endpoint, f"{key}/q.zarr")["zarr.json"])
    assert meta["attributes"]["qstream"]["complete"] is False
    again = qs.quantize_store(src, q, spec, storage_options=opts, store=backend, max_memory=1 << 20)
    clean = qs.quantize_store(x, "memory://s3-lost", spec, overwrite=True, max_memory=1 << 20)
    assert again.error == clean.error and not again.already_complete
    np.testing.assert_array_equal(
        qs.open_quantized(q, storage_options=_options("fsspec", endpoint)).quantized(...),
        qs.open_quantized("memory://s3-lost").quantized(...),
    )


def test_a_damaged_complete_output_is_refused_when_read_and_rewritten_by_the_rerun(
    endpoint, backend
):
    x = _many_blocks(12)
    key = f"damaged-{backend}"
    src = _put_source(endpoint, f"{key}/src.zarr", x, (16, 256))
    q = f"s3://{BUCKET}/{key}/q.zarr"
    opts = _options(backend, endpoint)
    first = qs.quantize_store(src, q, storage_options=opts, store=backend, max_memory=1 << 20)
    before = _stored(endpoint, f"{key}/q.zarr")
    whole = qs.open_quantized(q, storage_options=_options("fsspec", endpoint))[...]
    _s3(endpoint).delete_object(Bucket=BUCKET, Key=f"{key}/q.zarr/data/c.2.0")
    # read: what is there as ever, the lost chunk refused (never zeros), a dequantize too
    arr = qs.open_quantized(q, storage_options=_options("fsspec", endpoint))
    np.testing.assert_array_equal(arr[0:16], whole[0:16])
    with pytest.raises(qs.StoreError, match=r"missing chunk .*data/c\.2\.0.*damaged"):
        arr[...]
    with pytest.raises(qs.StoreError, match="missing chunk"):
        qs.dequantize_store(q, f"s3://{BUCKET}/{key}/d.zarr", storage_options=opts, store=backend)
    again = qs.quantize_store(src, q, storage_options=opts, store=backend, max_memory=1 << 20)
    assert not again.already_complete and again.error == first.error
    after = _stored(endpoint, f"{key}/q.zarr")
    assert set(after) == set(before)
    assert {k: v for k, v in after.items() if k != "zarr.json" and "_progress" not in k} == {
        k: v for k, v in before.items() if k != "zarr.json" and "_progress" not in k
    }
    third = qs.quantize_store(src, q, storage_options=opts, store=backend, max_memory=1 << 20)
    assert third.already_complete


def test_a_second_job_cannot_replace_an_output_another_job_is_writing(endpoint, backend):
    x = _many_blocks(13)
    key = f"two-{backend}"
    src = _put_source(endpoint, f"{key}/src.zarr", x, (16, 256))
    q = f"s3://{BUCKET}/{key}/q.zarr"
    opts = _options(backend, endpoint)
    refused = []

    def second():
        with pytest.raises(qs.StoreError, match="being written by another job") as e:
            qs.quantize_store(
                src, q, QuantSpec(axis=1), storage_options=opts, store=backend, overwrite=True
            )
        refused.append(str(e.value))

    first = qs.quantize_store(
        src,
        q,
        storage_options=opts,
        store=backend,
        max_memory=1 << 20,
        progress=_OnBlock(3, second),
    )
    assert refused and not first.already_complete
    assert qs.open_quantized(q, storage_options=_options("fsspec", endpoint)).spec.axis is None


def test_a_writer_whose_output_was_taken_over_fails_instead_of_marking_it_complete(
    endpoint, backend, monkeypatch
):
    from qstream.io.outputs import destination

    monkeypatch.setattr(destination, "LEASE", 0.0)  # the first job's hold has lapsed
    x = _many_blocks(14)
    key = f"taken-{backend}"
    src = _put_source(endpoint, f"{key}/src.zarr", x, (16, 256))
    q = f"s3://{BUCKET}/{key}/q.zarr"
    opts = _options(backend, endpoint)

    other = QuantSpec(symmetric=False, dtype="uint8")  # the same chunks, other bytes

    def second():
        qs.quantize_store(
            src, q, other, storage_options=opts, store=backend, overwrite=True, max_memory=1 << 20
        )

    with pytest.raises(qs.StoreError, match="taken over by another job"):
        qs.quantize_store(
            src,
            q,
            storage_options=opts,
            store=backend,
            max_memory=1 << 20,
            progress=_OnBlock(3, second),
        )
    # not one block of the first job landed in the second's finished output
    clean = qs.quantize_store(x, "memory://s3-taken", other, overwrite=True, max_memory=1 << 20)
    got = qs.open_quantized(q, storage_options=_options("fsspec", endpoint))
    np.testing.assert_array_equal(
        got.quantized(...), qs.open_quantized("memory://s3-taken").quantized(...)
    )
    assert got.meta["error"] == clean.error


@pytest.fixture
def dead_endpoint():
    """An endpoint that accepts connections and never answers."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join(2)
    for c in held:
        c.close()
    srv.close()


def test_a_dead_endpoint_ends_the_job_within_its_timeout_with_one_line(
    dead_endpoint, backend, monkeypatch
):
    monkeypatch.setenv("QSTREAM_STORE_TIMEOUT", "4")
    opts = _options(backend, dead_endpoint)
    t0 = time.monotonic()
    with pytest.raises(qs.StoreError) as e:
        qs.quantize_store(
            np.ones((8, 8), np.float32),
            f"s3://{BUCKET}/dead/q.zarr",
            storage_options=opts,
            store=backend,
        )
    took = time.monotonic() - t0
    assert took < 20, took
    message = str(e.value)
    assert "\n" not in message and f"s3://{BUCKET}/dead/q.zarr" in message
    assert "timeout" in message.lower() or "timed out" in message.lower()
