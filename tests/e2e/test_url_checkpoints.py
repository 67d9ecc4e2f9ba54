"""Checkpoints in object stores: a sharded safetensors checkpoint (FP8 block-scaled weights
included) on the moto server, read by byte ranges through fsspec and obstore, converted into a
local folder and into S3 with the bytes of a conversion from local files; a store failing
mid-run, then resumed; workers of a Dask cluster reading their own ranges."""

from __future__ import annotations

import json
import os
import textwrap

import ml_dtypes
import numpy as np
import pytest

import qstream as qs

from ..io.test_fp8_checkpoints import block_scales, fp8_weight, write_safetensors
from ..support import s3_fixtures
from ..support.memory_peak import PREAMBLE, run_child
from .test_s3 import BUCKET, _options, _s3, backend, endpoint  # noqa: F401 (fixtures)

pytest.importorskip("s3fs")
proxy, px = s3_fixtures.proxy, s3_fixtures.px  # (the fixtures, shared)

RECIPE = qs.Recipe.from_dict(
    {
        "defaults": {"dtype": "int8", "axis": 0},
        "rules": [{"pattern": "*.w4", "spec": {"dtype": "int4", "axis": 1, "block_size": 32}}],
    }
)


def _sharded(folder, seed: int = 0) -> dict[str, np.ndarray]:
    """A two-shard checkpoint with an index; an FP8 weight's scale in the other shard."""
    rng = np.random.default_rng(seed)
    x = fp8_weight(rng, (300, 200))
    one = {
        "emb": rng.standard_normal((64, 96)).astype(ml_dtypes.bfloat16),
        "l0.proj.weight": x,
        "l0.norm": rng.standard_normal(96).astype(np.float32),
    }
    two = {
        "l0.proj.weight_scale_inv": block_scales(rng, x.shape),
        "l1.mlp.w4": rng.standard_normal((256, 96)).astype(np.float32),
        "l1.dense": (rng.standard_normal((512, 256)) * 0.05).astype(np.float16),
    }
    os.makedirs(folder, exist_ok=True)
    write_safetensors(os.path.join(folder, "model-00001-of-00002.safetensors"), one)
    write_safetensors(os.path.join(folder, "model-00002-of-00002.safetensors"), two)
    wmap = {n: "model-00001-of-00002.safetensors" for n in one}
    wmap |= {n: "model-00002-of-00002.safetensors" for n in two}
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wmap}, f)
    return {**one, **two}


def _upload(url: str, folder, prefix: str) -> dict[str, int]:
    s3 = _s3(url)
    sizes = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            body = f.read()
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{name}", Body=body)
        sizes[name] = len(body)
    return sizes


def _same_conversion(a, b, names, storage_options=None) -> None:
    """Two converted checkpoints hold the same values, parameters and reports."""
    ca = qs.open_quantized(a, storage_options=storage_options if "://" in str(a) else None)
    cb = qs.open_quantized(b, storage_options=storage_options if "://" in str(b) else None)
    assert sorted(ca) == sorted(cb) == sorted(names)
    for n in names:
        x, y = ca[n], cb[n]
        if isinstance(x, qs.QuantizedArray):
            np.testing.assert_array_equal(x.quantized(...), y.quantized(...))
            np.testing.assert_array_equal(x.scale, y.scale)
            np.testing.assert_array_equal(x.zero_point, y.zero_point)
            assert json.dumps(x.meta["error"], sort_keys=True) == json.dumps(
                y.meta["error"], sort_keys=True
            )
        else:
            np.testing.assert_array_equal(x[...], y[...])
            assert x.dtype == y.dtype and dict(x.attrs) == dict(y.attrs)


def test_sharded_checkpoint_in_s3_converts_as_from_local_files(px, backend, tmp_path):  # noqa: F811
    tensors = _sharded(tmp_path / "model")
    names = [n for n in tensors if not n.endswith("_scale_inv")]
    sizes = _upload(px.url, tmp_path / "model", f"{backend}/model")
    local = qs.convert_checkpoint(
        tmp_path / "model", tmp_path / "local", RECIPE, max_memory=1 << 20
    )
    opts = _options(backend, px.url)
    for url in (
        f"s3://{BUCKET}/{backend}/model/",
        f"s3://{BUCKET}/{backend}/model/model.safetensors.index.json",
    ):
        px.reset()
        out = tmp_path / f"url-{len(url)}"
        got = qs.convert_checkpoint(
            url, out, RECIPE, max_memory=1 << 20, storage_options=opts, store=backend
        )
        assert list(got["tensors"]) == list(local["tensors"])
        _same_conversion(tmp_path / "local", out, names)
        # by ranges only: every read of a shard names its bytes and is at most a block (the
        # memory bound), a shard is read once per pass, each header with one request
        for shard, size in sizes.items():
            if not shard.endswith(".safetensors"):
                continue
            gets = px.requests("GET", shard)
            assert gets and all(r["range"] for r in gets), gets
            assert max(r["nbytes"] for r in gets) <= 1 << 20
            assert sum(r["nbytes"] for r in gets) <= 3 * size + 64 * 1024
            assert sum(r["range"] == "bytes=0-65535" for r in gets) == 1
    # into S3: the same bytes; a re-run finds it complete
    dst = f"s3://{BUCKET}/{backend}/out.zarr"
    fs_opts = _options("fsspec", px.url)
    env = {} if backend == "fsspec" else _fsspec_environment(px.url)
    with _environment(env):
        got = qs.convert_checkpoint(
            f"s3://{BUCKET}/{backend}/model",
            dst,
            RECIPE,
            max_memory=1 << 20,
            storage_options=opts,
            store=backend,
        )
        again = qs.convert_checkpoint(
            f"s3://{BUCKET}/{backend}/model",
            dst,
            RECIPE,
            max_memory=1 << 20,
            storage_options=opts,
            store=backend,
        )
    assert not got["already_complete"] and again["already_complete"]
    _same_conversion(tmp_path / "local", dst, names, fs_opts)


def _fsspec_environment(url: str) -> dict[str, str]:
    """fsspec's own configuration of the moto server (a destination of an obstore run)."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ENDPOINT_URL": url,
        "AWS_DEFAULT_REGION": "us-east-1",
    }


class _environment:
    """The S3 configuration ``env`` in the environment for a ``with`` block; s3fs's cached
    file systems (made from the environment of an earlier block, possibly another module's
    server) are dropped on entry and exit."""

    def __init__(self, env):
        self.env, self.saved = env, {}

    def __enter__(self):
        _drop_cached_file_systems()
        for k, v in self.env.items():
            self.saved[k] = os.environ.get(k)
            os.environ[k] = v

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _drop_cached_file_systems()


def _drop_cached_file_systems() -> None:
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


def test_missing_and_bad_objects_are_refused_with_one_line(px, backend, tmp_path):  # noqa: F811
    opts = _options(backend, px.url)
    s3 = _s3(px.url)
    s3.put_object(Bucket=BUCKET, Key=f"bad-{backend}/short.safetensors", Body=b"\x10\x00")
    index = {"weight_map": {"a": "../other/x.safetensors"}}
    s3.put_object(
        Bucket=BUCKET, Key=f"bad-{backend}/up/model.safetensors.index.json", Body=json.dumps(index)
    )
    cases = [
        (f"s3://{BUCKET}/bad-{backend}/none.safetensors", "no such object"),
        (f"s3://{BUCKET}/bad-{backend}/short.safetensors", "truncated"),
        (f"s3://{BUCKET}/bad-{backend}/up/", "outside its folder"),
        (f"s3://{BUCKET}/bad-{backend}/empty/", "empty or missing"),
    ]
    for url, message in cases:
        with pytest.raises(qs.StoreError, match=message) as e:
            qs.convert_checkpoint(url, tmp_path / "x", storage_options=opts, store=backend)
        assert "\n" not in str(e.value)
    assert not (tmp_path / "x").exists()


def test_a_store_failing_mid_run_leaves_a_resumable_output(px, backend, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("QSTREAM_STORE_TIMEOUT", "6")
    rng = np.random.default_rng(9)
    tensors = {
        f"layer{i}.weight": rng.standard_normal((512, 256)).astype(np.float32) for i in range(4)
    }
    write_safetensors(tmp_path / "m.safetensors", tensors)
    _s3(px.url).put_object(
        Bucket=BUCKET,
        Key=f"fault-{backend}/m.safetensors",
        Body=(tmp_path / "m.safetensors").read_bytes(),
    )
    url = f"s3://{BUCKET}/fault-{backend}/m.safetensors"
    opts = _options(backend, px.url)
    clean = qs.convert_checkpoint(
        tmp_path / "m.safetensors", tmp_path / "clean", max_memory=1 << 20
    )
    full = len(px.requests("GET", ".safetensors"))
    state = {"reads": 0}

    def outage(req):  # the server answers errors from the 41st ranged read on
        if req["method"] == "GET" and req["path"].split("?")[0].endswith(".safetensors"):
            state["reads"] += 1
            if state["reads"] > 40:
                return 500
        return None

    px.policy = outage
    with pytest.raises(qs.StoreError) as e:
        qs.convert_checkpoint(
            url, tmp_path / "ck", max_memory=1 << 20, storage_options=opts, store=backend
        )
    message = str(e.value)
    assert "\n" not in message and url in message, message
    root = json.loads((tmp_path / "ck" / "zarr.json").read_text())
    assert root["attributes"]["qstream_checkpoint"]["complete"] is False
    px.reset()
    again = qs.convert_checkpoint(
        url, tmp_path / "ck", max_memory=1 << 20, storage_options=opts, store=backend
    )
    assert not again["already_complete"]
    _same_conversion(tmp_path / "clean", tmp_path / "ck", list(tensors))
    assert json.dumps(again["tensors"], sort_keys=True) == json.dumps(
        clean["tensors"], sort_keys=True
    )
    resumed = len(px.requests("GET", ".safetensors"))
    px.reset()
    qs.convert_checkpoint(
        url, tmp_path / "whole", max_memory=1 << 20, storage_options=opts, store=backend
    )
    full = len(px.requests("GET", ".safetensors"))
    assert resumed < full  # what was finished was not read again


def test_dask_workers_read_their_own_ranges(px, backend, tmp_path, monkeypatch):  # noqa: F811
    pytest.importorskip("distributed")
    from qstream.engine.run.dask import local_client
    from qstream.io.checkpoints import remote

    tensors = _sharded(tmp_path / "model", seed=3)
    names = [n for n in tensors if not n.endswith("_scale_inv")]
    _upload(px.url, tmp_path / "model", f"dask-{backend}/model")
    url = f"s3://{BUCKET}/dask-{backend}/model/"
    opts = _options(backend, px.url)
    local = qs.convert_checkpoint(
        tmp_path / "model", tmp_path / "local", RECIPE, max_memory=1 << 20
    )
    read_here = []  # bytes this (the client's) process reads: headers only
    real = remote.RemoteFolder.read

    def counted(self, name, start, end):
        out = real(self, name, start, end)
        read_here.append((name, start, len(out)))
        return out

    monkeypatch.setattr(remote.RemoteFolder, "read", counted)
    monkeypatch.setattr(
        remote.RemoteFolder, "read_runs", lambda *a: pytest.fail("client read data")
    )
    with local_client(2) as client:
        got = qs.convert_checkpoint(
            url,
            tmp_path / "dask",
            RECIPE,
            max_memory=1 << 20,
            storage_options=opts,
            store=backend,
            executor=qs.DaskExecutor(client),
        )
    assert json.dumps(got["tensors"], sort_keys=True) == json.dumps(
        local["tensors"], sort_keys=True
    )
    _same_conversion(tmp_path / "local", tmp_path / "dask", names)
    assert read_here and all(start == 0 for _, start, _ in read_here), read_here  # headers


# (its own peak, VmHWM, reported when it exits: see tests/support/memory_peak.py)
_RSS_SCRIPT = PREAMBLE + textwrap.dedent(
    """
    import json
    import qstream as qs
    src, dst, opts, store = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    kw = {"storage_options": opts, "store": store} if "://" in src else {}
    qs.convert_checkpoint(src, dst, max_memory=32 << 20, **kw)
    """
)


@pytest.mark.parametrize("store", ["fsspec", "obstore"])
def test_peak_memory_of_a_url_conversion_is_bounded_as_for_local_files(px, store, tmp_path):
    if store == "obstore":
        pytest.importorskip("obstore")
    rng = np.random.default_rng(10)
    big = {"w": rng.standard_normal((4096, 4096)).astype(np.float32)}  # 64 MiB
    write_safetensors(tmp_path / "big.safetensors", big)
    del big
    _s3(px.url).put_object(
        Bucket=BUCKET,
        Key=f"rss-{store}/big.safetensors",
        Body=(tmp_path / "big.safetensors").read_bytes(),
    )

    def peak(src, dst):
        args = [src, dst, json.dumps(_options(store, px.url)), store]
        r = run_child(args, code=_RSS_SCRIPT)
        assert r.returncode == 0 and r.peak, r.stderr
        return r.peak

    local = peak(tmp_path / "big.safetensors", tmp_path / "a")
    url = peak(f"s3://{BUCKET}/rss-{store}/big.safetensors", tmp_path / "b")
    print(f"peak RSS: local {local / 2**20:.0f} MiB, {store} URL {url / 2**20:.0f} MiB")
    assert url < local + (48 << 20), (local, url)  # far below the 64 MiB tensor on top
    _same_conversion(tmp_path / "a", tmp_path / "b", ["w"])
