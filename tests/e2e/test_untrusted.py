"""Untrusted checkpoints, outputs and destinations (the threat model in the README): tensor
names are data, never paths; nothing outside DST is written, read or deleted; what qstream did
not write is never removed; special files are refused without blocking. Each case is run with
real files and compared by hashing a sandbox before and after."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import qstream as qs
from cli.main import app
from qstream.errors import StoreError
from qstream.io.storage.names import check_key, name_of, tensor_key

from ..support.memory_peak import run_child

runner = CliRunner()


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def safetensors_file(path: Path, tensors: dict[str, np.ndarray], header_extra=None) -> Path:
    """A safetensors file written by hand (names no library would accept included)."""
    tags = {"float32": "F32", "float16": "F16"}
    header, blobs, off = dict(header_extra or {}), [], 0
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {
            "dtype": tags[a.dtype.name],
            "shape": list(a.shape),
            "data_offsets": [off, off + len(raw)],
        }
        off += len(raw)
        blobs.append(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return path


def snapshot(root: Path, skip: Path | None = None) -> dict[str, str]:
    """Every entry under ``root`` (not following links) with a hash of its content, except
    the subtree ``skip``."""
    out = {}
    for here, dirs, files in os.walk(root):
        if skip is not None and Path(here) == skip:
            dirs[:] = []
            continue
        dirs[:] = [d for d in dirs if skip is None or Path(here, d) != skip]
        for name in dirs + files:
            p = Path(here, name)
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


@pytest.fixture
def sandbox(tmp_path):
    """A folder of the user's things beside and around the destination."""
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "keep.txt").write_text("mine")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("notes")
    (tmp_path / "a" / "b").mkdir(parents=True)
    return tmp_path


CRAFTED = ["../../victim", "../x", "../../../../../../tmp/qstream-escape", "a/../../b"]


def _tensors(names, rank=2):
    rng = np.random.default_rng(0)
    shape = (4, 8) if rank == 2 else (6,)
    return {n: rng.standard_normal(shape).astype(np.float32) for n in names}


# ---------------------------------------------------------------- names are data


@pytest.mark.parametrize("rank", [1, 2])
def test_crafted_tensor_names_stay_inside_dst_and_keep_their_names(sandbox, rank):
    tensors = _tensors([*CRAFTED, "ok.weight"], rank)
    ck = safetensors_file(sandbox / "ck.safetensors", tensors)
    dst = sandbox / "a" / "b" / "out.zarr"
    before = snapshot(sandbox, skip=dst)
    r = cli("convert", ck, dst)
    assert r.exit_code == 0, r.output
    assert snapshot(sandbox, skip=dst) == before
    assert not Path("/tmp/qstream-escape").exists()
    ck_out = qs.open_quantized(dst)
    assert list(ck_out) == list(tensors)
    for name, x in tensors.items():
        got = ck_out[name][...]
        tol = 0 if rank == 1 else np.abs(x).max(axis=1, keepdims=True) / 127
        assert np.all(np.abs(got - x) <= tol + 1e-7)
    # every entry of DST is a direct, plainly named child
    assert all(check_key(p.name, dst) == p.name for p in dst.iterdir() if p.is_dir())
    # dequantize and export of the output stay inside their own destinations too
    before = snapshot(sandbox, skip=sandbox / "r")
    qs.dequantize_store(dst, sandbox / "r" / "restored.zarr")
    qs.export_safetensors(dst, sandbox / "r" / "e.safetensors", format="qstream")
    assert snapshot(sandbox, skip=sandbox / "r") == before
    from safetensors.numpy import load_file

    exported = load_file(str(sandbox / "r" / "e.safetensors"))
    assert set(tensors) <= set(exported)


def test_crafted_npz_member_names_stay_inside_dst(sandbox):
    path = sandbox / "ck.npz"
    with zipfile.ZipFile(path, "w") as zf:
        for name, x in _tensors(["../x", "../../victim", "w"]).items():
            with zf.open(name + ".npy", "w") as f:
                np.lib.format.write_array(f, x)
    dst = sandbox / "out" / "q.zarr"
    before = snapshot(sandbox, skip=dst)
    qs.convert_checkpoint(path, dst)
    assert snapshot(sandbox, skip=dst) == before
    assert set(qs.open_quantized(dst)) == {"../x", "../../victim", "w"}


def test_a_safetensors_destination_never_empties_the_folder_it_is_written_in(sandbox):
    ck = safetensors_file(sandbox / "ck.safetensors", _tensors(["../x", "../../victim", "w"]))
    dst = sandbox / "out" / "model.safetensors"
    before = snapshot(sandbox / "out")
    for overwrite in ([], ["--overwrite"], ["--overwrite"]):
        r = cli("convert", ck, dst, "--format", "qstream", *overwrite)
        assert r.exit_code == 0, r.output
        after = snapshot(sandbox / "out")
        assert {k: v for k, v in after.items() if k in before} == before
        assert set(after) - set(before) == {"model.safetensors"}
    assert (sandbox / "victim" / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("bad", ["x\x00y", "bad\ud800name", ""])
def test_names_with_nul_surrogates_or_nothing_are_refused_with_a_targeted_error(sandbox, bad):
    header = json.dumps({bad: {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}})
    raw = header.encode("utf-8", "surrogatepass")
    raw += b" " * (-len(raw) % 8)
    ck = sandbox / "ck.safetensors"
    ck.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(16))
    dst = sandbox / "q.zarr"
    r = cli("convert", ck, dst)
    assert r.exit_code == 2
    assert "internal error" not in r.output
    assert "tensor name" in r.output or "invalid JSON" in r.output, r.output
    assert not dst.exists() or not any(p.name != ".qstream-lock" for p in dst.iterdir())


@given(st.text(min_size=1, max_size=300))
def test_tensor_keys_are_one_safe_component_and_reversible(name):
    try:
        key = tensor_key(name)
    except StoreError:
        assert any(0xD800 <= ord(c) <= 0xDFFF or ord(c) < 32 or ord(c) == 127 for c in name) or (
            any(__import__("unicodedata").category(c) in ("Cc", "Cs") for c in name)
        )
        return
    assert "/" not in key and "\\" not in key and key not in (".", "..")
    assert not key.startswith((".", "_")) and len(key) <= 160
    assert check_key(key, "dst") == key
    if "~" not in key:
        assert name_of(key) == name


def test_distinct_names_get_distinct_keys():
    names = ["a/b", "a%2Fb", "a.b", "A.b", ".x", "%2Ex", "_x", "%5Fx", "x" * 400, "x" * 401]
    keys = [tensor_key(n) for n in names]
    assert len(set(keys)) == len(keys)


# ---------------------------------------------------------------- crafted outputs


def _crafted_checkpoint(tmp_path: Path, key: str, version: int = 2) -> Path:
    """A converted checkpoint whose index (version 2) or root metadata (version 1, whose
    root listed every tensor) points a tensor at ``key``."""
    ck = safetensors_file(tmp_path / "ck.safetensors", _tensors(["w"]))
    out = tmp_path / "crafted.zarr"
    qs.convert_checkpoint(ck, out)
    if version == 2:
        batch = out / "_index" / "b000000" / "zarr.json"
        doc = json.loads(batch.read_text())
        doc["attributes"]["rows"][0]["key"] = key
        batch.write_text(json.dumps(doc))
        return out
    doc = json.loads((out / "zarr.json").read_text())
    meta = doc["attributes"]["qstream_checkpoint"]
    for k in ("version", "index"):
        meta.pop(k)
    meta["tensors"] = {"w": {"key": key, "kept": False}}
    (out / "zarr.json").write_text(json.dumps(doc))
    return out


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("key", ["../victim", "/etc", "w/../../victim", ".."])
def test_a_crafted_converted_checkpoint_is_refused_by_every_reader(sandbox, key, version):
    out = _crafted_checkpoint(sandbox, key, version)
    before = snapshot(sandbox, skip=sandbox / "r")
    with pytest.raises(StoreError, match="not a path inside it"):
        qs.open_quantized(out)
    for args in (
        ("dequantize", out, sandbox / "r" / "d.zarr"),
        ("export", out, sandbox / "r" / "e.safetensors"),
        ("inspect", out),
    ):
        r = cli(*args)
        code = 1 if args[0] == "inspect" else 2  # (refused in the plan; inspect has none)
        assert r.exit_code == code and "not a path inside it" in r.output, r.output
    ck = sandbox / "ck.safetensors"
    r = cli("convert", ck, out, "--overwrite")  # replacing it deletes nothing outside
    assert r.exit_code == 1 and "not a path inside it" in r.output
    assert snapshot(sandbox, skip=sandbox / "r") == before


def test_a_link_inside_an_output_is_never_followed_out(sandbox):
    out = _crafted_checkpoint(sandbox, "w")
    w = out / "w"
    for p in sorted(w.rglob("*"), reverse=True):
        p.unlink() if not p.is_dir() or p.is_symlink() else p.rmdir()
    w.rmdir()
    w.symlink_to(sandbox / "victim")
    before = snapshot(sandbox / "victim")
    with pytest.raises(StoreError, match="w is a link inside the output"):
        qs.open_quantized(out)["w"]
    r = cli("convert", sandbox / "ck.safetensors", out, "--overwrite")
    assert snapshot(sandbox / "victim") == before, r.output
    # the tensor's own place: the link itself is removed, never what it points to
    assert r.exit_code == 0 and not w.is_symlink(), r.output
    assert qs.open_quantized(out)["w"].shape == (4, 8)


def test_a_child_path_is_refused_when_it_meets_a_link_or_leaves_its_root(sandbox):
    """Any link below the root is refused, wherever it leads (qstream never writes one into
    an output), naming it; so are components that leave the root, and FIFOs."""
    from qstream.paths import child

    root = sandbox / "root"
    (root / "b").mkdir(parents=True)
    (root / "inside").symlink_to(root / "b")
    (root / "out").symlink_to(sandbox / "victim")
    (root / "self").symlink_to(root)
    (root / "dangling").symlink_to(sandbox / "nowhere")
    (root / "b" / "deep").symlink_to(sandbox / "victim")
    (root / "f").write_text("x")
    os.mkfifo(root / "b" / "fifo")
    for key in ("new", "b", "b/c", "f", "new/x/y"):
        assert child(str(root), key) == os.path.join(root, *key.split("/"))
    links = {"inside": "inside", "out": "out", "self": "self", "dangling": "dangling"}
    links.update({"out/x": "out", "b/deep": "b/deep", "b/deep/x": "b/deep"})
    for key, link in links.items():
        with pytest.raises(StoreError, match="is a link inside the output") as e:
            child(str(root), key)
        assert str(e.value).startswith(f"{os.path.join(root, link)} is a link"), e.value
    for key in ("", ".", "..", "b/../..", "b//c"):
        with pytest.raises(StoreError, match="leads outside it"):
            child(str(root), key)
    with pytest.raises(StoreError, match="not a regular file or folder"):
        child(str(root), "b/fifo")
    with pytest.raises(StoreError, match="a file where qstream keeps a folder"):
        child(str(root), "f/x")


# ---------------------------------------------------------------- destinations


def test_overwrite_never_deletes_a_zarr_node_qstream_did_not_write(sandbox):
    ck = safetensors_file(sandbox / "ck.safetensors", _tensors(["w"]))
    home = sandbox / "home"
    home.mkdir()
    (home / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group"}))
    (home / "photos").mkdir()
    (home / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    (home / ".git").mkdir()
    before = snapshot(home)
    for args in ([], ["--overwrite"]):
        r = cli("convert", ck, home, *args)
        assert r.exit_code == 2 and "did not write" in r.output, r.output
    assert snapshot(home) == before


def test_crafted_qstream_metadata_cannot_make_overwrite_delete_user_files(sandbox):
    """A root whose metadata claims the user's folders as tensors: replacing it removes only
    nodes that are qstream's by their own metadata, file by file."""
    ck = safetensors_file(sandbox / "ck.safetensors", _tensors(["w"]))
    home = sandbox / "home"
    home.mkdir()
    meta = {"tensors": {"photos": {}, "data": {}}, "complete": True}  # (as version 1 wrote)
    doc = {"zarr_format": 3, "node_type": "group", "attributes": {"qstream_checkpoint": meta}}
    (home / "zarr.json").write_text(json.dumps(doc))
    (home / "photos").mkdir()
    (home / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    (home / "data").mkdir()
    (home / "data" / "c.0").write_bytes(b"user data")
    r = cli("convert", ck, home, "--overwrite")
    assert r.exit_code == 0, r.output
    assert (home / "photos" / "cat.jpg").read_bytes() == b"\xff\xd8"
    assert (home / "data" / "c.0").read_bytes() == b"user data"


@pytest.mark.parametrize("layout", ["file", "index"])
def test_a_checkpoint_is_never_its_own_destination(sandbox, layout):
    from safetensors.numpy import save_file

    tensors = _tensors(["a.weight", "b.weight"])
    if layout == "file":
        src = sandbox / "model.safetensors"
        save_file(tensors, str(src))
        dsts = [src]
    else:
        d = sandbox / "sharded"
        d.mkdir()
        save_file({"a.weight": tensors["a.weight"]}, str(d / "model-00001-of-00002.safetensors"))
        save_file({"b.weight": tensors["b.weight"]}, str(d / "model-00002-of-00002.safetensors"))
        wmap = {
            "a.weight": "model-00001-of-00002.safetensors",
            "b.weight": "model-00002-of-00002.safetensors",
        }
        src = d / "model.safetensors.index.json"
        src.write_text(json.dumps({"weight_map": wmap}))
        dsts = [d / "model-00001-of-00002.safetensors", d / "model.safetensors", src]
    before = snapshot(sandbox)
    for dst in dsts:
        r = cli("convert", src, dst, "--overwrite")
        if str(dst).endswith(".json"):  # not a destination at all: refused by its name
            assert r.exit_code == 2 and "writes no .json file" in r.output, (dst, r.output)
            continue
        assert r.exit_code == 2, (dst, r.output)
        assert "overlaps the source" in r.output or "named like the checkpoint" in r.output
    assert snapshot(sandbox) == before


def test_export_never_replaces_a_file_qstream_did_not_write(sandbox):
    ck = safetensors_file(sandbox / "ck.safetensors", _tensors(["w"]))
    q = sandbox / "q.zarr"
    qs.convert_checkpoint(ck, q)
    mine = sandbox / "mine.safetensors"
    mine.write_bytes(b"precious")
    for overwrite in (False, True):
        with pytest.raises(StoreError, match="not a qstream export"):
            qs.export_safetensors(q, mine, overwrite=overwrite, format="qstream")
    assert mine.read_bytes() == b"precious"


# ---------------------------------------------------------------- shard indexes


@pytest.mark.parametrize("shard", ["../secret.safetensors", "/abs/secret.safetensors", "link"])
def test_a_shard_index_cannot_name_files_outside_its_folder(sandbox, shard):
    from safetensors.numpy import save_file

    secret = sandbox / "secret.safetensors"
    save_file({"secret": np.ones((2, 2), np.float32)}, str(secret))
    d = sandbox / "ck"
    d.mkdir()
    if shard == "link":
        (d / "link").symlink_to(secret)
    elif shard.startswith("/abs"):
        shard = str(secret)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"secret": shard}}))
    r = cli("convert", d, sandbox / "q.zarr")
    assert r.exit_code == 2
    assert "outside" in r.output and str(secret) not in r.output.replace(shard, ""), r.output
    assert not (sandbox / "q.zarr").exists()


def test_a_hugging_face_cache_snapshot_with_links_into_its_blobs_converts(tmp_path):
    from safetensors.numpy import save_file

    repo = tmp_path / "models--org--m"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    save_file(_tensors(["w"]), str(repo / "blobs" / "f00d"))
    (snap / "model.safetensors").symlink_to("../../blobs/f00d")
    report = qs.convert_checkpoint(snap, tmp_path / "q.zarr")
    assert list(report["tensors"]) == ["w"]


# ---------------------------------------------------------------- special files


def _fifo_run(args, timeout=60):
    code = "import sys; from cli.main import main; sys.argv[0] = 'qstream'; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
@pytest.mark.parametrize("where", ["checkpoint", "shard", "chunk", "metadata"])
def test_fifos_are_refused_without_blocking(tmp_path, where):
    dst = tmp_path / "q.zarr"
    if where == "checkpoint":
        src = tmp_path / "m.safetensors"
        os.mkfifo(src)
        args = ["convert", src, dst]
    elif where == "shard":
        d = tmp_path / "ck"
        d.mkdir()
        os.mkfifo(d / "s.safetensors")
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"w": "s.safetensors"}})
        )
        args = ["convert", d, dst]
    else:
        src = tmp_path / "src.zarr"
        a = zarr.create_array(str(src), shape=(8, 8), chunks=(4, 8), dtype="f4")
        a[...] = 1.0
        victim = src / ("c/1/0" if where == "chunk" else "zarr.json")
        body = victim.read_bytes()
        victim.unlink()
        os.mkfifo(victim)
        if where == "metadata":
            (tmp_path / "doc.json").write_bytes(body)
        args = ["quantize", src, dst]
    r = _fifo_run(args)
    # (each command's plan refuses it: 2)
    assert r.returncode == 2, r.stderr
    assert "not a regular file" in r.stderr and "internal error" not in r.stderr, r.stderr


# ---------------------------------------------------------------- any name, any metadata

NAME_PARTS = st.sampled_from(
    [
        "..",
        ".",
        "/",
        "\\",
        "a",
        "W.weight",
        "%2F",
        "~",
        "zarr.json",
        ".git",
        "_x",
        "CON",
        "é",
        "x.partial",
        "",
        " ",
        "//",
        "data",
        "scale",
    ]
)
NAMES = st.lists(
    st.lists(NAME_PARTS, min_size=1, max_size=5).map("".join), min_size=1, max_size=5, unique=True
).filter(lambda ns: all(ns))


@given(names=NAMES)
def test_any_tensor_names_leave_everything_outside_dst_unchanged(tmp_path_factory, names):
    box = tmp_path_factory.mktemp("box")
    (box / "victim").mkdir()
    (box / "victim" / "keep.txt").write_text("mine")
    (box / "a" / "b").mkdir(parents=True)
    rng = np.random.default_rng(0)
    tensors = {
        n: rng.standard_normal((3, 4) if i % 2 else (5,)).astype(np.float32)
        for i, n in enumerate(names)
    }
    ck = safetensors_file(box / "ck.safetensors", tensors)
    out = box / "a" / "b" / "out"
    before = snapshot(box, skip=out)
    qs.convert_checkpoint(ck, out / "q.zarr")
    qs.dequantize_store(out / "q.zarr", out / "r.zarr")
    qs.export_safetensors(out / "q.zarr", out / "e.safetensors", format="qstream")
    qs.convert_checkpoint(ck, out / "q.zarr", overwrite=True)
    assert snapshot(box, skip=out) == before
    assert list(qs.open_quantized(out / "q.zarr")) == names


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | NAME_PARTS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAME_PARTS, inner, max_size=3),
    max_leaves=8,
)


@given(
    tensors=st.dictionaries(NAME_PARTS, JSONISH, max_size=4),
    top=st.dictionaries(st.sampled_from(["complete", "version", "source", "x"]), JSONISH),
)
def test_crafted_root_metadata_is_refused_or_read_and_never_escapes(tmp_path_factory, tensors, top):
    box = tmp_path_factory.mktemp("crafted")
    (box / "victim").mkdir()
    (box / "victim" / "keep.txt").write_text("mine")
    ck = safetensors_file(box / "ck.safetensors", _tensors(["w"]))
    out = box / "out" / "q.zarr"
    qs.convert_checkpoint(ck, out)
    doc = json.loads((out / "zarr.json").read_text())
    meta = {**doc["attributes"]["qstream_checkpoint"], **top, "tensors": tensors}
    meta.pop("version", None)  # a root of version 1 lists its tensors itself
    doc["attributes"]["qstream_checkpoint"] = meta
    (out / "zarr.json").write_text(json.dumps(doc))
    batch = out / "_index" / "b000000" / "zarr.json"  # and an index batch of crafted rows
    rows = [
        {"name": n, "pos": i, **(v if isinstance(v, dict) else {"key": v})}
        for i, (n, v) in enumerate(tensors.items())
    ]
    batch.write_text(
        json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {"rows": rows}})
    )
    before = snapshot(box, skip=box / "out")
    calls = (
        lambda: qs.open_quantized(out, allow_incomplete=True)["w"],
        lambda: qs.dequantize_store(out, box / "out" / "r.zarr"),
        lambda: qs.export_safetensors(out, box / "out" / "e.safetensors"),
        lambda: qs.convert_checkpoint(ck, out, overwrite=True),
    )
    for call in calls:
        # refused (or no such tensor): what matters is what it touched
        with contextlib.suppress(qs.QStreamError, KeyError):
            call()
    assert snapshot(box, skip=box / "out") == before


# ---------------------------------------------------------------- bounded work


def _declared(path: Path, shape, chunks, fmt=3, compressor=None) -> Path:
    """A Zarr array of a declared shape and no chunks (all read as the fill value)."""
    path.mkdir()
    if fmt == 3:
        doc = {
            "zarr_format": 3,
            "node_type": "array",
            "shape": list(shape),
            "data_type": "float32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunks)}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0.0,
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        }
        (path / "zarr.json").write_text(json.dumps(doc))
    else:
        doc = {
            "zarr_format": 2,
            "shape": list(shape),
            "chunks": list(chunks),
            "dtype": "<f4",
            "compressor": compressor,
            "fill_value": 0.0,
            "order": "C",
            "filters": None,
        }
        (path / ".zarray").write_text(json.dumps(doc))
    return path


def _peak_run(args, timeout=120):
    """Run the CLI in a child; (exit code, stderr, its own peak RSS in MB: VmHWM, see
    tests/support/memory_peak.py)."""
    r = run_child(args, timeout=timeout)
    return r.returncode, r.stderr, r.peak >> 20


@pytest.mark.parametrize(
    "case, message",
    [
        ("huge-shape", "more than qstream's limit"),
        ("tiny-chunks", "rechunk it"),
        ("huge-chunk", "at least twice that"),
        ("many-channels", "per-channel statistics of 4,194,304 channels"),
    ],
)
def test_resource_bombs_are_refused_before_any_work_naming_the_bound(tmp_path, case, message):
    src = {
        "huge-shape": lambda: _declared(tmp_path / "s.zarr", (10**9, 10**9), (1000, 1000)),
        "tiny-chunks": lambda: _declared(tmp_path / "s.zarr", (4096, 4096), (1, 1)),
        "huge-chunk": lambda: _declared(
            tmp_path / "s.zarr", (16384, 16384), (16384, 16384), 2, {"id": "zlib", "level": 1}
        ),
        "many-channels": lambda: _declared(tmp_path / "s.zarr", (4 << 20, 8), (1 << 18, 8)),
    }[case]()
    rc, err, peak = _peak_run(
        ["quantize", src, tmp_path / "q.zarr", "--axis", "0", "--max-memory", "64MiB"]
    )
    assert rc == 2 and message in err and "internal error" not in err, err
    assert peak < 400, peak  # the interpreter, not the bomb
    assert not (tmp_path / "q.zarr").exists()


def test_a_compressed_chunk_that_decodes_past_its_size_is_refused_in_bounded_memory(tmp_path):
    import zlib

    src = _declared(tmp_path / "s.zarr", (4096, 1024), (1024, 1024), 2, {"id": "zlib", "level": 9})
    co = zlib.compressobj(9)
    bomb = b"".join(co.compress(bytes(1 << 24)) for _ in range(64)) + co.flush()  # 1 GiB
    for i in range(4):
        (src / f"{i}.0").write_bytes(bomb)
    rc, err, peak = _peak_run(["quantize", src, tmp_path / "q.zarr", "--max-memory", "64MiB"])
    assert rc == 1 and "decodes to more than 4194304 bytes" in err, err
    assert peak < 400, peak


def test_num_bins_beyond_the_limit_is_refused_in_recipe_terms(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[defaults]\nmethod = "entropy"\nnum_bins = 2000000000\n')
    ck = safetensors_file(tmp_path / "ck.safetensors", _tensors(["w"]))
    r = cli("convert", ck, tmp_path / "q.zarr", "--recipe", recipe)
    assert r.exit_code == 2 and "recipe [defaults]: num_bins must be between" in r.output


@pytest.mark.parametrize(
    "text, message",
    [
        ('[defaults]\nnum_bins = "many"\n', "num_bins must be an integer"),
        ('[defaults]\naxis = "0"\n', "axis must be an integer"),
        ('[[rules]]\npattern = 3\naction = "keep"\n', "has no pattern"),
        ('[[rules]]\npattern = "*"\nspec = { symmetric = "yes" }\n', "symmetric must be true"),
        ("a = " + "[" * 5000 + "]" * 5000 + "\n", "recipe"),
    ],
)
def test_wrong_typed_or_nested_recipes_get_targeted_errors(tmp_path, text, message):
    recipe = tmp_path / "r.toml"
    recipe.write_text(text)
    ck = safetensors_file(tmp_path / "ck.safetensors", _tensors(["w"]))
    r = cli("convert", ck, tmp_path / "q.zarr", "--recipe", recipe)
    assert r.exit_code == 2 and message in r.output and "internal error" not in r.output


def test_a_deeply_nested_safetensors_header_is_refused_with_one_line(tmp_path):
    raw = b'{"a":' * 100000 + b"1" + b"}" * 100000
    (tmp_path / "ck.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    r = cli("convert", tmp_path / "ck.safetensors", tmp_path / "q.zarr")
    assert r.exit_code == 2 and "nested too deeply" in r.output


def test_a_legacy_torch_file_converts_with_weights_only(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "old.pt"
    torch.save({"w": torch.randn(4, 8)}, str(path), _use_new_zipfile_serialization=False)
    report = qs.convert_checkpoint(path, tmp_path / "q.zarr")
    assert list(report["tensors"]) == ["w"]


# ---------------------------------------------------------------- links and FIFOs inside


def _quantized(tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "src.zarr"
    a = zarr.create_array(str(src), shape=(64, 32), chunks=(16, 32), dtype="f4")
    a[...] = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
    q = tmp_path / "q.zarr"
    qs.quantize_store(src, q, qs.QuantSpec(axis=0))
    return src, q


def test_a_member_replaced_by_a_link_is_never_written_through(sandbox):
    src, q = _quantized(sandbox)
    before = snapshot(sandbox / "victim")
    for p in sorted((q / "data").rglob("*"), reverse=True):
        p.unlink()
    (q / "data").rmdir()
    (q / "data").symlink_to(sandbox / "victim")
    r = cli("quantize", src, q, "--dtype", "int4", "--overwrite")
    assert r.exit_code == 0, r.output
    assert snapshot(sandbox / "victim") == before
    assert not (q / "data").is_symlink() and qs.open_quantized(q).spec.dtype == "int4"


def test_a_lock_file_planted_as_a_link_is_refused(sandbox):
    src = sandbox / "src.zarr"
    zarr.create_array(str(src), shape=(8, 8), dtype="f4")[...] = 1.0
    out = sandbox / "out.zarr"
    out.mkdir()
    (out / ".qstream-lock").symlink_to(sandbox / "victim" / "created")
    r = cli("quantize", src, out)
    assert r.exit_code == 1 and "is a link" in r.output, r.output
    assert not (sandbox / "victim" / "created").exists()


def test_links_inside_a_converted_checkpoint_or_a_zarr_checkpoint_are_never_read(sandbox):
    secret = sandbox / "victim" / "secret.bin"
    secret.write_bytes(bytes(range(24)))
    ck = safetensors_file(sandbox / "ck.safetensors", {"norm": np.ones(24, np.float32)})
    out = sandbox / "out.zarr"
    qs.convert_checkpoint(ck, out)
    chunk = next(p for p in (out / "norm").rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk.unlink()
    chunk.symlink_to(secret)
    for args in (("export", out, sandbox / "leak.safetensors"), ("dequantize", out, sandbox / "r")):
        r = cli(*args)
        code = 2 if args[0] == "export" else 1  # (export's plan opens the tensors)
        assert r.exit_code == code and "holds a link" in r.output, r.output
    assert not (sandbox / "leak.safetensors").exists()
    # a Zarr group given as checkpoint: no link out of it
    g = zarr.open_group(str(sandbox / "ckg.zarr"), mode="w")
    g.create_array("w", shape=(6,), chunks=(6,), dtype="f4")[...] = 1.0
    c = next(
        p for p in (sandbox / "ckg.zarr" / "w").rglob("*") if p.is_file() and p.name != "zarr.json"
    )
    c.unlink()
    c.symlink_to(secret)
    r = cli("convert", sandbox / "ckg.zarr", sandbox / "o.safetensors")
    assert r.exit_code == 2 and "outside it" in r.output, r.output


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
@pytest.mark.parametrize("where", ["scale", "kept"])
def test_fifos_inside_outputs_are_refused_without_blocking(tmp_path, where):
    if where == "scale":
        _, out = _quantized(tmp_path)
        target, cmds = (
            out / "scale" / "c.0",
            [("inspect", out), ("dequantize", out, tmp_path / "d")],
        )
    else:
        ck = safetensors_file(tmp_path / "ck.safetensors", {"norm": np.ones(24, np.float32)})
        out = tmp_path / "out.zarr"
        qs.convert_checkpoint(ck, out)
        target = next(p for p in (out / "norm").rglob("*") if p.is_file() and p.name != "zarr.json")
        cmds = [("export", out, tmp_path / "e.safetensors")]
    target.unlink()
    os.mkfifo(target)
    for args in cmds:
        r = _fifo_run(args)
        code = 2 if args[0] in ("dequantize", "export") else 1  # (refused in the plan)
        assert r.returncode == code and "not a regular file" in r.stderr, r.stderr


def test_overwrite_removes_only_chunk_files_from_qstreams_own_members(sandbox):
    src, q = _quantized(sandbox)
    (q / "data" / "c").mkdir()
    (q / "data" / "c" / "main.c").write_text("int main;")
    (q / "notes.txt").write_text("mine")
    qs.quantize_store(src, q, qs.QuantSpec(axis=1), overwrite=True)
    assert (q / "data" / "c" / "main.c").read_text() == "int main;"
    assert (q / "notes.txt").read_text() == "mine"


def test_a_damaged_output_replaced_meanwhile_by_another_job_is_not_repaired_over_it(tmp_path):
    src, q = _quantized(tmp_path)
    from qstream.io.outputs.destination import Destination

    qs.quantize_store(src, q, qs.QuantSpec(axis=1), overwrite=True)  # another job's now
    dest = Destination(q, "quantized", "not-this-job")
    with (
        pytest.raises(StoreError, match="holds a different job"),
        dest.claim(overwrite=False, repair=True),
    ):
        pass
    assert qs.open_quantized(q).spec.axis == 1


@pytest.mark.parametrize("case", ["npz-member", "zarr-chunk", "kept-chunk"])
def test_checkpoint_pieces_read_whole_are_held_to_the_memory_bound(tmp_path, case):
    if case == "npz-member":
        path = tmp_path / "bomb.npz"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf, zf.open("w.npy", "w") as f:
            np.lib.format.write_array_header_1_0(
                f, {"descr": "<f4", "fortran_order": False, "shape": (16384, 16384)}
            )
            for _ in range(64):
                f.write(bytes(1 << 24))
        src, message = path, "at least twice that"
    else:
        g = zarr.open_group(str(tmp_path / "ck.zarr"), mode="w")
        shape = (1 << 28,) if case == "kept-chunk" else (16384, 16384)
        g.create_array("w", shape=shape, chunks=shape, dtype="f4", fill_value=0)
        src, message = tmp_path / "ck.zarr", "at least twice that"
    rc, err, peak = _peak_run(["convert", src, tmp_path / "q.zarr", "--max-memory", "64MiB"])
    assert rc == 2 and message in err, err
    assert peak < 400, peak


def test_a_crafted_output_declaring_billions_of_parameters_is_refused_before_reading(tmp_path):
    _, q = _quantized(tmp_path)
    for m in ("scale", "zero_point"):
        doc = json.loads((q / m / "zarr.json").read_text())
        doc["shape"] = [1 << 28]
        (q / m / "zarr.json").write_text(json.dumps(doc))
    rc, err, peak = _peak_run(["inspect", q])
    assert rc == 1 and "does not describe its arrays" in err, err
    assert peak < 400, peak


def test_a_second_conversion_to_the_same_safetensors_waits_for_the_first(tmp_path):
    """While one run converts and exports (its working group locked), another run of the
    same conversion is refused, not handed a working group the first one is removing."""
    from qstream.io.outputs.destination import locked

    ck = safetensors_file(tmp_path / "ck.safetensors", _tensors(["a.weight", "b.weight"]))
    out = tmp_path / "out" / "model.safetensors"
    out.parent.mkdir()
    with locked(f"{out}.qstream-work"):  # the first run, between conversion and export
        r = _fifo_run(["convert", ck, out])
        assert r.returncode == 75 and "being written by another qstream process" in r.stderr
        assert not out.exists()
    r = cli("convert", ck, out)
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.parent.iterdir()) == ["config.json", "model.safetensors"]
