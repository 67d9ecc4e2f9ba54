"""The Python API reads URL sources with the ``storage_options`` it is given, and with
nothing else: no ``AWS_*`` variable, no credentials file (each test clears them), so a call
that dropped its options on the way would fail (``NoCredentialsError``) instead of reading
the moto server. Each result equals the same call on the local file: ``qs.dequantize_store``
of a GGUF URL (also equal to gguf-py's ``dequantize``) and of a compressed-tensors index URL
(also equal to compressed-tensors' own decompression), ``qs.convert_checkpoint`` /
``qs.plan_convert`` of a safetensors URL to a ``.gguf`` file, and ``qs.describe_checkpoint``
of both URLs; through fsspec and obstore."""

from __future__ import annotations

import os

import numpy as np
import pytest

import qstream as qs

from ..support import s3_fixtures
from .test_s3 import BUCKET, _options, backend, endpoint  # noqa: F401 (fixtures)
from .test_url_checkpoints import _upload

proxy, px = s3_fixtures.proxy, s3_fixtures.px  # (the fixtures, shared)

pytest.importorskip("s3fs")
gguf = pytest.importorskip("gguf")

from ..io.test_gguf_source import _bits, _reference, _stored, _write  # noqa: E402
from ..io.test_quantized_sources import bits, build, reference  # noqa: E402

INDEX = "model.safetensors.index.json"


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    """No S3 configuration but the call's own ``storage_options``: every ``AWS_*`` variable
    removed, the credentials and config files pointed at nothing."""
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("HOME", str(tmp_path))  # (no ~/.aws either)


@pytest.fixture(scope="module")
def sources(endpoint, tmp_path_factory):  # noqa: F811
    """Tiny sources, local and in the bucket: a GGUF file of three types (gguf-py's writer;
    ``s3://BUCKET/opts-gguf/model.gguf``), a plain float32 safetensors file
    (``s3://BUCKET/opts-float/w.safetensors``) and compressed-tensors' FP8 per-channel
    checkpoint of a tiny Llama (``s3://BUCKET/opts-ct/model/``, sharded with its index)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(49)
    arrays = {
        f"{t}.w": (_stored(rng.standard_normal((4, 256)).astype(np.float32), t), t)
        for t in ("Q4_K", "Q8_0", "F16")
    }
    folder = tmp_path_factory.mktemp("opts_gguf")
    path = _write(folder / "model.gguf", arrays)
    _upload(endpoint, folder, "opts-gguf")
    flt = tmp_path_factory.mktemp("opts_float")
    save_file(
        {"a.weight": rng.standard_normal((4, 64)).astype(np.float32),
         "b.weight": rng.standard_normal((2, 96)).astype(np.float32),
         "norm": rng.standard_normal(64).astype(np.float32)},
        str(flt / "w.safetensors"),
    )  # fmt: skip
    _upload(endpoint, flt, "opts-float")
    ct = tmp_path_factory.mktemp("opts_ct") / "model"
    build(str(ct), "FP8_DYNAMIC")
    _upload(endpoint, ct, "opts-ct/model")
    return {
        "gguf": (path, f"s3://{BUCKET}/opts-gguf/model.gguf"),
        "float": (flt / "w.safetensors", f"s3://{BUCKET}/opts-float/w.safetensors"),
        "ct": (ct / INDEX, f"s3://{BUCKET}/opts-ct/model/{INDEX}"),
    }


def _tensors(path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file (or of the shards of an index's folder)."""
    from safetensors.numpy import load_file

    files = [path] if str(path).endswith(".safetensors") else sorted(
        os.path.join(path, n) for n in os.listdir(path) if n.endswith(".safetensors")
    )  # fmt: skip
    out: dict[str, np.ndarray] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def test_dequantize_store_reads_a_gguf_url_with_its_storage_options(
    sources,
    px,
    tmp_path,
    no_credentials,
    backend,  # noqa: F811
):
    import zarr

    path, url = sources["gguf"]
    opts = _options(backend, px.url)
    plan = qs.plan_dequantize(url, tmp_path / "url.zarr", storage_options=opts, store=backend)
    assert sorted(r["name"] for r in plan.tensors) == ["F16.w", "Q4_K.w", "Q8_0.w"]
    got = qs.dequantize_store(url, tmp_path / "url.zarr", storage_options=opts, store=backend)
    qs.dequantize_store(path, tmp_path / "local.zarr")
    assert got["tensors"] and px.requests("GET", ".gguf")  # (read from the server)
    remote, local = zarr.open_group(tmp_path / "url.zarr"), zarr.open_group(tmp_path / "local.zarr")
    for name, x in _reference(path).items():
        assert np.array_equal(_bits(remote[name][...]), _bits(x)), name
        assert remote[name][...].tobytes() == local[name][...].tobytes(), name


def test_dequantize_store_reads_a_compressed_tensors_url_with_its_storage_options(
    sources,
    px,
    tmp_path,
    no_credentials,
    backend,  # noqa: F811
):
    path, url = sources["ct"]
    opts = _options(backend, px.url)
    got = qs.dequantize_store(
        url, tmp_path / "url.safetensors", storage_options=opts, store=backend
    )
    qs.dequantize_store(path, tmp_path / "local.safetensors")
    assert got["tensors"]
    remote, local = _tensors(tmp_path / "url.safetensors"), _tensors(tmp_path / "local.safetensors")
    assert sorted(remote) == sorted(local)
    for name in remote:
        assert remote[name].tobytes() == local[name].tobytes(), name
    ref = reference(str(path.parent))  # (compressed-tensors' own decompression)
    weight = "model.layers.0.self_attn.q_proj.weight"
    assert np.array_equal(bits(remote[weight]), bits(ref[weight].float()))


def _gguf_tensors(path) -> dict[str, tuple[int, bytes]]:
    """Every tensor of a GGUF file as gguf-py reads it: its type and stored bytes."""
    return {
        t.name: (int(t.tensor_type), bytes(np.ascontiguousarray(t.data).view(np.uint8)))
        for t in gguf.GGUFReader(str(path)).tensors
    }


def test_convert_checkpoint_to_gguf_reads_a_url_with_its_storage_options(
    sources,
    px,
    tmp_path,
    no_credentials,
    backend,  # noqa: F811
):
    path, url = sources["float"]
    opts = _options(backend, px.url)
    plan = qs.plan_convert(url, tmp_path / "url.gguf", storage_options=opts, store=backend)
    local_plan = qs.plan_convert(path, tmp_path / "local.gguf")
    assert plan.tensors == local_plan.tensors and plan.tensors
    qs.convert_checkpoint(url, tmp_path / "url.gguf", storage_options=opts, store=backend)
    qs.convert_checkpoint(path, tmp_path / "local.gguf")
    remote, local = _gguf_tensors(tmp_path / "url.gguf"), _gguf_tensors(tmp_path / "local.gguf")
    assert sorted(remote) == ["a.weight", "b.weight", "norm"]
    assert remote == local


@pytest.mark.parametrize("kind", ["gguf", "ct"])
def test_describe_checkpoint_reads_a_url_with_its_storage_options(
    sources,
    px,
    no_credentials,
    kind,
    backend,  # noqa: F811
):
    path, url = sources[kind]
    got = qs.describe_checkpoint(url, storage_options=_options(backend, px.url), store=backend)
    want = qs.describe_checkpoint(path)
    assert got["file"] == url
    skip = {"file", "written_by"}
    assert {k: v for k, v in got.items() if k not in skip} == {
        k: v for k, v in want.items() if k not in skip
    }
    if kind == "ct":
        assert got["quantization"].startswith("compressed-tensors") and got["decoded"] is True
