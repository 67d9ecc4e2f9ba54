"""gzip chunks carry no write time: two runs of a job write the same bytes, and zarr reads them."""

import gzip
import os

import numpy as np
import zarr

import qstream as qs


def _chunks(root):
    out = {}
    for here, _, names in os.walk(root):
        for n in names:
            if n.startswith("c"):
                path = os.path.join(here, n)
                with open(path, "rb") as f:
                    out[os.path.relpath(path, root)] = f.read()
    return out


def test_gzip_chunks_of_two_runs_are_byte_identical_and_read_by_plain_zarr(tmp_path):
    x = np.random.default_rng(4).standard_normal((300, 200)).astype(np.float32)
    spec = qs.QuantSpec(dtype="int8", axis=0)
    first, second = tmp_path / "a.zarr", tmp_path / "b.zarr"
    qs.quantize_store(x, first, spec, compression="gzip:6")
    os.utime(tmp_path)  # (a second later or not: the header's time field is 0 either way)
    qs.quantize_store(x, second, spec, compression="gzip:6")
    a, b = _chunks(first), _chunks(second)
    assert a and a == b
    data = a[os.path.join("data", "c.0.0")]
    assert data[:2] == b"\x1f\x8b" and data[4:8] == b"\0\0\0\0"  # gzip, mtime 0
    codes = np.frombuffer(gzip.decompress(data), np.int8)
    assert np.array_equal(codes.reshape(x.shape), np.asarray(zarr.open_array(first / "data")))
    scale = np.asarray(zarr.open_array(first / "scale"))
    want = codes.reshape(x.shape).astype(np.float32) * scale[:, None]
    assert np.array_equal(np.asarray(qs.open_quantized(first)[:]), want)


def test_the_gzip_codec_without_time_goes_to_a_worker_process_as_it_is():
    import pickle

    from qstream.io.storage.chunkcodecs import _gzip_codec

    codec = _gzip_codec(6)
    copy = pickle.loads(pickle.dumps(codec))  # (as a Dask worker receives a chunk writer)
    data = np.arange(1000, dtype=np.int8)
    assert copy.level == 6 and copy.encode(data) == codec.encode(data)
    assert copy.encode(data)[4:8] == b"\0\0\0\0"
