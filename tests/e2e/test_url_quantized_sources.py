"""Quantized checkpoints in an object store (the moto server): compressed-tensors checkpoints
made by compressed-tensors' own compressors (FP8 per channel, int4 groups packed, int4 with
zero points; NVFP4, MXFP8, FP8 per block and int8 read only) and gpt-oss's MXFP4 experts, read
through ``qs.open_checkpoint("s3://...")`` with the bits of the same checkpoint read from local
files (and of the format's own decoder), and converted from the URL (API and command line)
into the bytes of a conversion from local files, through fsspec and obstore; a file of a
format qstream reads from local paths only (.npy, .npz, a zipped Zarr group, torch files) is
refused at a URL before any byte of it is read, naming the reason (exit 2, nothing created).
GGUF files at URLs: ``test_url_gguf_sources.py``."""

from __future__ import annotations

import os

import numpy as np
import pytest

import qstream as qs

from ..io.test_gpt_oss_mxfp4 import build as build_gpt_oss
from ..io.test_gpt_oss_mxfp4 import reference as gpt_oss_reference
from ..io.test_quantized_sources import SCHEMES, bits, build, reference
from ..support import s3_fixtures
from .test_s3 import BUCKET, _options, backend, endpoint  # noqa: F401 (fixtures)
from .test_url_checkpoints import (
    _environment,
    _fsspec_environment,
    _same_conversion,
    _upload,
)

proxy, px = s3_fixtures.proxy, s3_fixtures.px  # (the fixtures, shared)

pytest.importorskip("s3fs")

# float-quantized per channel; pack-quantized int4 groups; pack-quantized int4 with zero points
CT = ("FP8_DYNAMIC", "W4_GROUP_SYM", "W4A16_ASYM")
# read from the URL only: nvfp4-pack-quantized, mxfp8-quantized, float-quantized 128 x 128
# blocks, int-quantized (int8 per channel)
READ_ONLY = ("NVFP4", "MXFP8", "FP8_BLOCK", "W8A8")
PARAMS = ("weight_scale", "weight_zero_point", "weight_global_scale", "weight_shape")


@pytest.fixture(scope="module")
def ct_models(endpoint, tmp_path_factory):  # noqa: F811
    """``get(scheme)``: a compressed-tensors checkpoint (sharded, with its index and config) in
    local files and under ``s3://BUCKET/ct-<scheme>/model/``, built once per module."""
    built: dict[str, tuple[str, os.PathLike]] = {}

    def get(scheme: str) -> tuple[str, os.PathLike]:
        if scheme not in built:
            folder = tmp_path_factory.mktemp(scheme.lower()) / "model"
            build(str(folder), SCHEMES[scheme])
            _upload(endpoint, folder, f"ct-{scheme}/model")
            built[scheme] = scheme, folder
        return built[scheme]

    return get


@pytest.fixture(params=CT)
def ct_model(request, ct_models):
    """Each of :data:`CT`."""
    return ct_models(request.param)


def _same_tensors(got: dict, local: dict) -> None:
    assert list(got) == list(local)
    for name, t in local.items():
        u = got[name]
        assert tuple(u.shape) == tuple(t.shape) and np.dtype(u.dtype) == np.dtype(t.dtype)
        assert np.array_equal(bits(u[...]), bits(t[...])), name


def test_a_compressed_tensors_checkpoint_in_s3_reads_as_from_local_files(
    ct_model,
    px,
    backend,  # noqa: F811
):
    _reads_as_local(*ct_model, px, backend, ("", "model.safetensors.index.json"))


@pytest.mark.parametrize(
    ("scheme", "store"),
    [("NVFP4", "fsspec"), ("MXFP8", "obstore"), ("FP8_BLOCK", "obstore"), ("W8A8", "fsspec")],
)
def test_nvfp4_mxfp8_fp8_block_and_int8_checkpoints_in_s3_read_as_from_local_files(
    ct_models, scheme, store, px
):
    if store == "obstore":
        pytest.importorskip("obstore")
    _reads_as_local(*ct_models(scheme), px, store, ("",))


def _reads_as_local(scheme: str, folder, px, backend: str, names: tuple[str, ...]) -> None:  # noqa: F811
    """The checkpoint at ``s3://BUCKET/ct-<scheme>/model/<name>`` for each of ``names``: its
    tensors are the local files', bit for bit, and compressed-tensors' own decompressor's,
    read by ranged requests only."""
    local = qs.open_checkpoint(folder)
    ref = reference(str(folder))
    assert len(ref) == 14
    opts = _options(backend, px.url)
    for url in (f"s3://{BUCKET}/ct-{scheme}/model/{name}" for name in names):
        px.reset()
        got = qs.open_checkpoint(url, storage_options=opts, store=backend)
        # the scales, zero points and packed codes are consumed, as from local files
        assert not [n for n in got if n.rsplit(".", 1)[1] in PARAMS or n.endswith("_packed")]
        _same_tensors(got, local)
        for name, want in ref.items():  # compressed-tensors' own decompressor, bit for bit
            assert np.array_equal(bits(got[name][...]), bits(want)), name
            assert np.array_equal(bits(got[name][70:133, 5:77]), bits(want[70:133, 5:77]))
        gets = px.requests("GET", ".safetensors")
        assert gets and all(r["range"] for r in gets)  # by byte ranges only


def test_a_compressed_tensors_checkpoint_in_s3_converts_to_the_bytes_of_a_local_conversion(
    ct_model,
    px,
    backend,  # noqa: F811
    tmp_path,
):
    scheme, folder = ct_model
    opts = _options(backend, px.url)
    local = qs.convert_checkpoint(folder, tmp_path / "local", max_memory=1 << 20)
    names = list(local["tensors"])
    assert any(".weight" in n and "proj" in n for n in names)
    got = qs.convert_checkpoint(
        f"s3://{BUCKET}/ct-{scheme}/model/",
        tmp_path / "url",
        max_memory=1 << 20,
        storage_options=opts,
        store=backend,
    )
    assert list(got["tensors"]) == names
    _same_conversion(tmp_path / "local", tmp_path / "url", names)
    gets = px.requests("GET", ".safetensors")
    assert gets and all(r["range"] for r in gets)
    assert max(r["nbytes"] for r in gets) <= 1 << 20


def test_the_command_line_converts_a_compressed_tensors_url_as_local_files(ct_model, px, tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    scheme, folder = ct_model
    runner = CliRunner()
    r = runner.invoke(app, ["convert", str(folder), str(tmp_path / "local"), "--quiet"])
    assert r.exit_code == 0, r.output
    with _environment(_fsspec_environment(px.url)):
        r = runner.invoke(
            app, ["convert", f"s3://{BUCKET}/ct-{scheme}/model/", str(tmp_path / "url"), "--quiet"]
        )
    assert r.exit_code == 0, r.output
    names = list(qs.open_quantized(tmp_path / "local"))
    assert len(names) > 14
    _same_conversion(tmp_path / "local", tmp_path / "url", names)


@pytest.fixture(scope="module")
def gpt_oss_model(endpoint, tmp_path_factory):  # noqa: F811
    """gpt-oss's experts as it ships them, in local files and in the bucket: ``model`` with the
    extreme E8M0 scales (infinities among the decoded values), ``finite`` without."""
    root = tmp_path_factory.mktemp("gpt_oss")
    sd = build_gpt_oss(str(root / "model"))
    build_gpt_oss(str(root / "finite"), extremes=False)
    _upload(endpoint, root / "model", "gpt-oss/model")
    _upload(endpoint, root / "finite", "gpt-oss/finite")
    return root, sd


def test_gpt_oss_mxfp4_experts_in_s3_read_and_convert_as_from_local_files(
    gpt_oss_model,
    px,
    backend,  # noqa: F811
    tmp_path,
):
    root, sd = gpt_oss_model
    opts = _options(backend, px.url)
    local = qs.open_checkpoint(root / "model")
    for url in (f"s3://{BUCKET}/gpt-oss/model/", f"s3://{BUCKET}/gpt-oss/model/model.safetensors"):
        got = qs.open_checkpoint(url, storage_options=opts, store=backend)
        assert not [n for n in got if n.endswith(("_blocks", "_scales"))]
        _same_tensors(got, local)
        ref = gpt_oss_reference(sd)
        assert len(ref) == 4
        for name, want in ref.items():  # transformers' own conversion, bit for bit
            assert np.array_equal(bits(got[name][...]), bits(want)), name
            assert np.array_equal(bits(got[name][1:3, 5:40, 7:]), bits(want[1:3, 5:40, 7:]))
    # converted (the finite one: infinities are refused by the default recipe, as locally)
    done = qs.convert_checkpoint(root / "finite", tmp_path / "local", max_memory=1 << 20)
    names = list(done["tensors"])
    assert "model.layers.1.mlp.experts.gate_up_proj" in names
    got = qs.convert_checkpoint(
        f"s3://{BUCKET}/gpt-oss/finite",
        tmp_path / "url",
        max_memory=1 << 20,
        storage_options=opts,
        store=backend,
    )
    assert list(got["tensors"]) == names
    _same_conversion(tmp_path / "local", tmp_path / "url", names)


LOCAL_FILES = {  # a URL's suffix -> the format the refusal names
    "weights.npy": "a .npy file",
    "weights.npz": "a .npz file",
    "group.zip": "a zipped Zarr group",
    "model.pt": "a torch file",
    "pytorch_model.bin": "a torch file",
}


@pytest.mark.parametrize("name", sorted(LOCAL_FILES))
def test_a_url_of_a_local_only_format_is_refused_before_any_byte_of_it_is_read(
    name,
    px,
    tmp_path,
):
    url = f"s3://{BUCKET}/local-only/{name}"
    opts = _options("fsspec", px.url)
    for call in (
        lambda: qs.open_checkpoint(url, storage_options=opts, store="fsspec"),
        lambda: qs.convert_checkpoint(url, tmp_path / "out", storage_options=opts),
    ):
        px.reset()
        with pytest.raises(qs.StoreError, match=f"{LOCAL_FILES[name]} is read from a local") as e:
            call()
        assert "\n" not in str(e.value) and url in str(e.value)
        assert not px.log  # (not a request: refused by its name)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "command", [["convert", "URL", "OUT"], ["convert", "URL", "OUT", "--dry-run"]]
)
def test_the_command_line_refuses_a_torch_file_url_with_exit_2_creating_nothing(
    px, tmp_path, command
):
    from typer.testing import CliRunner

    from cli.main import app

    url, out = f"s3://{BUCKET}/local-only/model.pt", tmp_path / "out"
    args = [{"URL": url, "OUT": str(out)}.get(w, w) for w in command]
    with _environment(_fsspec_environment(px.url)):
        r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "torch file is read from a local path" in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output and not px.log
    assert not out.exists() and not os.listdir(tmp_path)
