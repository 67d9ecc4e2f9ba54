"""GGUF files in an object store (the moto server, through a fault proxy): read by ranged
requests only (the header by growing reads, each tensor region by its rows' bytes), with the
bits of gguf-py's ``dequantize`` and of the same file read from a local path (Hugging Face
names and layouts for a llama file from llama.cpp's converter); every command that takes a
local GGUF file takes its URL and writes what it writes from the local file; a truncated or
garbage object, or a server failing mid-read, gives a one-line error, a non-zero exit and no
complete-looking output."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import qstream as qs
from qstream.errors import QStreamWarning

from ..support import s3_fixtures
from .test_s3 import BUCKET, _options, _s3, backend, endpoint  # noqa: F401 (fixtures)
from .test_url_checkpoints import _environment, _fsspec_environment, _same_conversion, _upload

proxy, px = s3_fixtures.proxy, s3_fixtures.px  # (the fixtures, shared)

pytest.importorskip("s3fs")
gguf = pytest.importorskip("gguf")

from ..io.test_gguf_source import TYPES, _bits, _reference, _stored, _write  # noqa: E402

SHAPES = ((5, 512), (3, 4, 256), (768,))
GGUF_GETS = ".gguf"


@pytest.fixture(scope="module")
def every_type(endpoint, tmp_path_factory):  # noqa: F811
    """gguf-py's writer: every type qstream reads, in three shapes, and keys holding more
    than the first read of a remote header (a 1.2 MB string, long arrays of numbers and of
    strings) and 4 MiB of data after them, locally
    and at ``s3://BUCKET/types/model.gguf``."""
    rng = np.random.default_rng(11)
    arrays = {}
    for t in TYPES:
        for shape in SHAPES:
            x = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 40.0])).astype(np.float32)
            arrays[f"{t}.{len(shape)}d"] = (_stored(x, t), t)
    arrays["big"] = (rng.standard_normal((2048, 512)).astype(np.float32), "F32")  # (4 MiB)
    kv = {"test.text": "qstream " * 150_000, "test.numbers": list(range(5000)),
          "test.words": ["ab", "cd"] * 2500}  # fmt: skip
    folder = tmp_path_factory.mktemp("types")
    path = _write(folder / "model.gguf", arrays, kv=kv)
    _upload(endpoint, folder, "types")
    _s3(endpoint).put_object(  # (a public copy: read by plain HTTP too)
        Bucket=BUCKET, Key="public/model.gguf", Body=path.read_bytes(), ACL="public-read"
    )
    return path, f"s3://{BUCKET}/types/model.gguf"


def _gets(px) -> list[dict]:
    return px.requests("GET", GGUF_GETS)


def test_a_gguf_url_reads_bit_equal_to_gguf_py_by_ranged_requests_only(every_type, px, backend):  # noqa: F811
    path, url = every_type
    ref = _reference(path)
    size = path.stat().st_size
    with pytest.warns(QStreamWarning, match="keep their GGUF names"):
        got = qs.open_checkpoint(url, storage_options=_options(backend, px.url), store=backend)
    header_gets = _gets(px)
    # the header: the first MiB, then growing reads, never the whole file
    assert len(header_gets) >= 2 and header_gets[0]["range"] == "bytes=0-1048575"
    assert all(r["range"] for r in header_gets)
    assert sum(r["nbytes"] for r in header_gets) < size
    with pytest.warns(QStreamWarning):
        local = qs.open_checkpoint(path)
    assert list(got) == list(local) == list(ref)
    for name, values in ref.items():
        t = got[name]
        assert t.shape == values.shape and t.dtype == np.float32, name
        assert np.array_equal(_bits(t[...]), _bits(values)), name
        k = (slice(1, 3), Ellipsis, slice(256, 512)) if t.ndim > 1 else slice(40, 300)
        assert np.array_equal(_bits(t[k]), _bits(values[k])), name
    gets = _gets(px)
    assert all(r["range"] for r in gets)  # by byte ranges only
    data = [r["nbytes"] for r in gets[len(header_gets) :]]
    assert max(data) == 4 << 20 and sorted(data)[-2] < 64 << 10  # (one tensor's rows a GET)


def test_an_http_url_of_a_gguf_file_reads_as_its_s3_url(every_type, px):
    path, _ = every_type
    http = f"{px.url}/{BUCKET}/public/model.gguf"
    with pytest.warns(QStreamWarning):
        local = qs.open_checkpoint(path)
    with pytest.warns(QStreamWarning):
        got = qs.open_checkpoint(http)
    assert list(got) == list(local)
    for name, t in local.items():
        assert np.array_equal(_bits(got[name][...]), _bits(t[...])), name
    local_cli = _run(["inspect", "SRC", "--json"], str(path), Path("OUT"))
    remote_cli = _run(["inspect", "SRC", "--json"], http, Path("OUT"))
    assert remote_cli.exit_code == local_cli.exit_code == 0, remote_cli.output
    assert remote_cli.output.replace(http, "SRC") == local_cli.output.replace(str(path), "SRC")
    gets = _gets(px)
    assert gets and all(r["range"] for r in gets)


@pytest.mark.slow  # (a LocalCluster: ~10 s)
def test_dask_workers_read_their_own_ranges_of_a_gguf_url(llama, px, tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    from qstream.engine.run.dask import local_client
    from qstream.io.checkpoints import remote

    path, url = llama
    local = qs.convert_checkpoint(path, tmp_path / "local", max_memory=1 << 20)
    here: list[tuple[int, int]] = []  # what this (the client's) process reads: the header
    real = remote.RemoteFolder.read

    def counted(self, name, start, end):
        here.append((start, end))
        return real(self, name, start, end)

    monkeypatch.setattr(remote.RemoteFolder, "read", counted)
    with local_client(2) as client:
        got = qs.convert_checkpoint(
            url,
            tmp_path / "dask",
            max_memory=1 << 20,
            storage_options=_options("fsspec", px.url),
            store="fsspec",
            executor=qs.DaskExecutor(client),
        )
    names = list(local["tensors"])
    assert list(got["tensors"]) == names
    _same_conversion(tmp_path / "local", tmp_path / "dask", names)
    # the client read the header (one request from the start: the file's first MiB), the
    # workers every tensor's rows
    assert len(here) == 1 and here[0][0] == 0 and here[0][1] <= 1 << 20, here
    gets = _gets(px)
    assert len(gets) > len(names) and all(r["range"] for r in gets)  # (the workers' reads)


# -- every command, on a llama file from llama.cpp's converter ---------------------------------


@pytest.fixture(scope="module")
def llama(endpoint, tmp_path_factory):  # noqa: F811
    """A tiny llama model converted by llama.cpp's converter to Q8_0, locally and in the
    bucket (``s3://BUCKET/llama/model.gguf``)."""
    from tests.support.gguf_models import build_model, llama_cpp_converter, run_converter

    llama_cpp_converter()  # (skips, or fails under CI, when absent)
    root = tmp_path_factory.mktemp("llama")
    build_model(root / "hf", "llama", "sentencepiece")
    (root / "llama").mkdir()  # (the folder names the model, as the URL's does)
    path = run_converter(root / "hf", root / "llama" / "model.gguf", "q8_0")
    _upload(endpoint, root / "llama", "llama")
    return path, f"s3://{BUCKET}/llama/model.gguf"


COMMANDS = {
    "convert-zarr": ["convert", "SRC", "OUT", "--quiet"],
    "convert-dry-run": ["convert", "SRC", "OUT", "--dry-run"],
    "convert-safetensors": ["convert", "SRC", "OUT/model.safetensors", "--quiet"],
    "convert-gguf": ["convert", "SRC", "OUT/model.gguf", "--gguf-type", "Q8_0", "--pure",
                     "--quiet"],
    "dequantize-zarr": ["dequantize", "SRC", "OUT", "--quiet"],
    "dequantize-safetensors": ["dequantize", "SRC", "OUT/model.safetensors", "--quiet"],
    "dequantize-dry-run": ["dequantize", "SRC", "OUT/model.safetensors", "--dry-run"],
    "inspect": ["inspect", "SRC", "--json"],
    "calibrate": ["calibrate", "SRC", "--tensor", "model.layers.1.self_attn.k_proj.weight",
                  "--json"],
}  # fmt: skip


def _run(args: list[str], src: str, out: Path, env: dict[str, str] | None = None):
    from typer.testing import CliRunner

    from cli.main import app

    line = [w.replace("SRC", src).replace("OUT", str(out)) for w in args]
    if env is None:
        return CliRunner().invoke(app, line)
    with _environment(env):
        return CliRunner().invoke(app, line)


_VARY = (  # what names the source or the run: job hashes, local files' times, durations
    (re.compile(r"sha256:[0-9a-f]{64}"), "sha256:JOB"),
    (re.compile(r'"version": \[(\[[^]]*\](, )?)*\]'), '"version": V'),
    (re.compile(r'"seconds": ?[0-9.eE+-]+'), '"seconds": S'),
)


def _normal(text: str, src: str, out: Path) -> str:
    """``text`` with the source's and destination's names, job hashes, the local file's
    times and durations as placeholders."""
    text = text.replace(src, "SRC").replace(str(out), "OUT")
    for pattern, sub in _VARY:
        text = pattern.sub(sub, text)
    return text


def _outputs(out: Path, src: str) -> dict[str, object]:
    """What the command wrote at ``out``, file by file, with the source's and destination's
    names as placeholders: a JSON file's text, a safetensors file's header and data, a GGUF
    file's keys and tensors (gguf-py's reader), any other file's bytes."""
    from gguf import GGUFReader

    files = [out] if out.is_file() else sorted(p for p in out.rglob("*") if p.is_file())
    got: dict[str, object] = {}
    for p in files:
        data = p.read_bytes()
        if p.suffix == ".json":
            got[p.name if p == out else str(p.relative_to(out))] = _normal(data.decode(), src, out)
            continue
        if p.suffix == ".safetensors":
            n = int.from_bytes(data[:8], "little")
            value: object = (_normal(data[8 : 8 + n].decode(), src, out), data[8 + n :])
        elif p.suffix == ".gguf":
            r = GGUFReader(str(p))
            keys = {k: _normal(str(f.contents()), src, out) for k, f in r.fields.items()}
            value = (keys, [(t.name, int(t.tensor_type), t.data.tobytes()) for t in r.tensors])
        else:
            value = data
        got[str(p.relative_to(out)) if p != out else p.name] = value
    return got


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_takes_a_gguf_url_as_the_local_file(llama, px, tmp_path, command):
    path, url = llama
    args = COMMANDS[command]
    local = _run(args, str(path), tmp_path / "local")
    assert local.exit_code == 0, local.output
    remote = _run(args, url, tmp_path / "url", _fsspec_environment(px.url))
    assert remote.exit_code == 0, remote.output
    assert remote.output.replace(url, "SRC").replace(str(tmp_path / "url"), "OUT") == (
        local.output.replace(str(path), "SRC").replace(str(tmp_path / "local"), "OUT")
    )
    a = _outputs(tmp_path / "local", str(path)) if (tmp_path / "local").exists() else {}
    b = _outputs(tmp_path / "url", url) if (tmp_path / "url").exists() else {}
    assert list(a) == list(b)
    for name in a:  # the same bytes, but for the names of the source and destination
        assert a[name] == b[name], name
    gets = px.requests("GET", ".gguf")
    assert gets and all(r["range"] for r in gets)


def test_hf_names_from_a_gguf_url_are_the_local_files(llama, px):
    path, url = llama
    local = qs.open_checkpoint(path)
    got = qs.open_checkpoint(url, storage_options=_options("obstore", px.url), store="obstore")
    assert list(got) == list(local)
    assert "model.layers.1.self_attn.q_proj.weight" in got  # (named back, rows permuted back)
    for name, t in local.items():
        assert np.array_equal(_bits(got[name][...]), _bits(t[...])), name
        assert np.array_equal(_bits(got[name][3:9]), _bits(t[3:9])), name


def test_a_gguf_url_converts_within_the_memory_bound_as_the_local_file(every_type, px, tmp_path):
    path, url = every_type
    opts = _options("fsspec", px.url)
    with pytest.warns(QStreamWarning):
        done = qs.convert_checkpoint(path, tmp_path / "local", max_memory=1 << 20)
    px.reset()
    with pytest.warns(QStreamWarning):
        got = qs.convert_checkpoint(
            url, tmp_path / "url", max_memory=1 << 20, storage_options=opts, store="fsspec"
        )
    names = list(done["tensors"])
    assert "big" in names and list(got["tensors"]) == names
    _same_conversion(tmp_path / "local", tmp_path / "url", names)
    gets = _gets(px)
    data = [r["nbytes"] for r in gets if not r["range"].startswith("bytes=0-")]
    assert all(r["range"] for r in gets) and len(data) > 4  # (the 4 MiB tensor: in slices)
    assert max(data) <= 1 << 20


# -- faults ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def broken(every_type, endpoint, tmp_path_factory):  # noqa: F811
    """The file cut in its data, cut in its header's keys, random bytes, and a file of a type
    qstream does not decode (IQ2_XS), as local files and in the bucket
    (``s3://BUCKET/broken/<case>.gguf``), with what each is refused for."""
    path, _ = every_type
    data = path.read_bytes()
    folder = tmp_path_factory.mktemp("broken")
    iq = np.random.default_rng(6).integers(0, 256, (4, 74), dtype=np.uint8)  # (256 values a row)
    unread = _write(folder / "iq.gguf", {"w": (iq, "IQ2_XS")}).read_bytes()
    cases = {
        "type-not-decoded": (unread, "of type IQ2_XS, which qstream does not decode"),
        "cut-in-the-data": (data[: len(data) - (1 << 20)], "ends past the end of the file"),
        "cut-in-the-header": (data[: 1 << 20 | 4096], "the file is truncated or corrupt"),
        "random-bytes": (np.random.default_rng(5).bytes(50_000), "not a GGUF file"),
    }
    out = {}
    for case, (body, why) in cases.items():
        (folder / f"{case}.gguf").write_bytes(body)
        _s3(endpoint).put_object(Bucket=BUCKET, Key=f"broken/{case}.gguf", Body=body)
        out[case] = folder / f"{case}.gguf", f"s3://{BUCKET}/broken/{case}.gguf", why
    return out


@pytest.mark.parametrize(
    "case", ["cut-in-the-data", "cut-in-the-header", "random-bytes", "type-not-decoded"]
)
def test_a_truncated_or_garbage_gguf_url_is_refused_in_the_plan_as_the_local_file(
    broken, px, tmp_path, case
):
    path, url, why = broken[case]
    with pytest.raises(qs.StoreError, match=why) as e:
        qs.open_checkpoint(url, storage_options=_options("obstore", px.url), store="obstore")
    assert "\n" not in str(e.value) and url in str(e.value)
    env = _fsspec_environment(px.url)
    for command in (["convert", "SRC", "OUT"], ["convert", "SRC", "OUT", "--dry-run"],
                    ["dequantize", "SRC", "OUT/model.safetensors"]):  # fmt: skip
        local = _run(command, str(path), tmp_path / "local")
        remote = _run(command, url, tmp_path / "url", env)
        assert remote.exit_code == local.exit_code != 0, remote.output
        if command[0] == "convert":
            assert remote.exit_code == 2  # (refused in the plan)
        text = " ".join(remote.output.split())
        assert why in text and "Traceback" not in text, remote.output
        assert remote.output.replace(url, "SRC") == local.output.replace(str(path), "SRC")
    assert not (tmp_path / "url").exists()
    # nothing but the header's first bytes was asked for
    gets = _gets(px)
    assert gets and all(r["range"] for r in gets)
    assert all(int(r["range"].split("-")[1]) < 2 << 20 for r in gets)


def test_a_gguf_url_whose_header_goes_on_past_the_limit_is_refused(every_type, px, monkeypatch):
    from qstream.io.checkpoints import gguf_header

    monkeypatch.setattr(gguf_header, "REMOTE_HEADER", 1 << 20)  # (this header: ~1.3 MB)
    _, url = every_type
    with pytest.raises(qs.StoreError, match="header goes on past 1 MiB") as e:
        qs.open_checkpoint(url, storage_options=_options("fsspec", px.url), store="fsspec")
    assert "\n" not in str(e.value) and url in str(e.value)
    assert [r["range"] for r in _gets(px)] == ["bytes=0-1048575"]


def _outage(px, path: Path) -> None:
    """Every read of the GGUF objects' data at or after the data offset of the file ``path``
    fails (S3's 500, each retry too) once the header is read."""
    from gguf import GGUFReader

    data_start = GGUFReader(str(path)).data_offset

    def policy(req):
        ours = req["method"] == "GET" and req["path"].split("?")[0].endswith(".gguf")
        first = int((req["range"] or "bytes=0-").split("=")[1].split("-")[0])
        return 500 if ours and first >= data_start else None

    px.policy = policy


def test_a_server_failing_mid_read_of_a_gguf_url_leaves_no_complete_looking_output(
    every_type, llama, px, tmp_path, monkeypatch
):
    monkeypatch.setenv("QSTREAM_STORE_TIMEOUT", "6")
    path, url = every_type
    _outage(px, path)
    opts = _options("fsspec", px.url)
    with pytest.raises(qs.StoreError) as e, pytest.warns(QStreamWarning):
        qs.convert_checkpoint(
            url, tmp_path / "api", max_memory=1 << 20, storage_options=opts, store="fsspec"
        )
    assert "\n" not in str(e.value) and url in str(e.value), str(e.value)
    root = json.loads((tmp_path / "api" / "zarr.json").read_text())
    assert root["attributes"]["qstream_checkpoint"]["complete"] is False
    env = _fsspec_environment(px.url)
    for (p, u), out in ((every_type, "zarr"), (llama, "st/model.safetensors")):
        _outage(px, p)
        r = _run(["dequantize", "SRC", "OUT", "--quiet"], u, tmp_path / out, env)
        assert r.exit_code not in (0, 2) and "Traceback" not in r.output, r.output
        assert u in r.output and "internal error" in r.output, r.output  # (S3's words)
    attrs = json.loads((tmp_path / "zarr" / "zarr.json").read_text())["attributes"]
    assert attrs["qstream_checkpoint"]["complete"] is False
    assert not (tmp_path / "st" / "model.safetensors").exists()
    assert not (tmp_path / "st" / "config.json").exists()
