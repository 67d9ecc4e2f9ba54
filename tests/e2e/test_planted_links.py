"""Links planted inside qstream's outputs by others (issue 51, item 1).

An output copied or downloaded from elsewhere, or a shared folder, can carry symbolic links:
``DST/_packs -> ../userdir`` had a resumed or overwriting conversion write its packs into the
user's folder. Whatever the place of a link in a real output (its packs, index, tensor groups,
member arrays, chunk files, documents), and whatever the command (convert, quantize,
dequantize, export, inspect; a resume, an overwrite, a finished run), nothing outside the
output changes, and the command either succeeds without following the link (what it writes or
reads is what it gives without the link) or refuses with one line naming it: never an internal
error. Checked by hashing a sandbox around the output, whose folders and files are what the
links point to (copies of the output's own nodes, so a followed link would look valid).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file
from typer.testing import CliRunner

import qstream as qs
from cli.main import app
from qstream.errors import StoreError

from .test_untrusted import snapshot

runner = CliRunner()

EXPERTS = 66  # a run of alike tensors: a pack (>= 64)
MM = ("--max-memory", "1MiB")


def cli(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    out = {
        f"model.layers.0.mlp.experts.{i}.down_proj.weight": rng.standard_normal((8, 16)).astype(
            np.float32
        )
        for i in range(EXPERTS)
    }
    # several chunks (with MM): a quantize job of its own, resumed block by block
    big = rng.standard_normal((512, 256)).astype(np.float32)
    out["model.layers.0.self_attn.o_proj.weight"] = big
    out["model.norm.weight"] = np.linspace(0.5, 1.5, 16, dtype=np.float32)
    return out


def _entries(root: Path) -> list[str]:
    """Every entry below ``root`` (relative, ``/``-separated), in a fixed order."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name != ".qstream-lock")


def _incomplete(dst: Path, key: str) -> None:
    """Mark the output at ``dst`` unfinished (its root document's ``key`` attributes)."""
    doc = json.loads((dst / "zarr.json").read_text())
    doc["attributes"][key]["complete"] = False
    (dst / "zarr.json").write_text(json.dumps(doc))


class Templates(dict[str, Any]):
    """The outputs and what they give (a short repr: hypothesis prints its arguments)."""

    def __repr__(self) -> str:
        return "templates"


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    """Real outputs, made once: a converted checkpoint (packs, a tensor's own group, a kept
    tensor, the index), a quantized array, a restored checkpoint; and what each gives."""
    home = tmp_path_factory.mktemp("templates")
    ck = home / "moe.safetensors"
    save_file(_tensors(), str(ck))
    src = home / "src.zarr"
    a = zarr.create_array(str(src), shape=(64, 32), chunks=(16, 32), dtype="f4")
    a[...] = np.random.default_rng(3).standard_normal((64, 32)).astype(np.float32)
    out = Templates(ck=ck, src=src)
    out["checkpoint"] = home / "checkpoint.zarr"
    out["quantized"] = home / "quantized.zarr"
    out["restored"] = home / "restored.zarr"
    for args in (
        ("convert", ck, out["checkpoint"], *MM),
        ("quantize", src, out["quantized"], "--axis", "0"),
        ("dequantize", out["checkpoint"], out["restored"]),
        ("dequantize", out["quantized"], home / "dequantized.zarr"),
    ):  # (as the commands below make them: the same jobs)
        r = cli(*args)
        assert r.exit_code == 0, r.output
    assert (out["checkpoint"] / "_packs").is_dir()
    out["dequantized"] = home / "dequantized.zarr"
    out["restored_array"] = zarr.open_array(str(out["dequantized"]), mode="r")[...]
    # what reading them gives, without any link
    ckpt = qs.open_quantized(out["checkpoint"])
    out["values"] = {n: ckpt[n][...] for n in ckpt}
    out["array"] = qs.open_quantized(out["quantized"])[...]
    out["export"] = home / "e.safetensors"
    qs.export_safetensors(out["checkpoint"], out["export"], format="qstream")
    out["exported"] = load_file(str(out["export"]))
    return out


# (kind of output, command); DST is the planted output, SRC its source, OUT a new place
COMMANDS = [
    ("checkpoint", ("convert", "CK", "DST", *MM)),  # finished: nothing to do
    ("checkpoint", ("convert", "CK", "DST", *MM, "--overwrite")),
    ("checkpoint-resume", ("convert", "CK", "DST", *MM)),  # unfinished, its index emptied
    ("checkpoint", ("dequantize", "DST", "OUT")),
    ("checkpoint", ("export", "DST", "OUT.safetensors", "--format", "qstream")),
    ("checkpoint", ("inspect", "DST")),
    ("quantized", ("quantize", "SRC", "DST", "--axis", "0", "--overwrite")),
    ("quantized", ("quantize", "SRC", "DST", "--axis", "0", "--dtype", "int4", "--overwrite")),
    ("quantized", ("quantize", "SRC", "DST", "--axis", "0")),  # finished: nothing to do
    ("quantized-resume", ("quantize", "SRC", "DST", "--axis", "0")),
    ("quantized", ("dequantize", "DST", "OUT")),
    ("quantized", ("inspect", "DST")),
    ("restored", ("dequantize", "CKDST", "DST", "--overwrite")),
    ("restored-resume", ("dequantize", "CKDST", "DST")),
    ("dequantized", ("dequantize", "QDST", "DST", "--overwrite")),
    ("dequantized", ("dequantize", "QDST", "DST")),  # finished: nothing to do
    ("dequantized-resume", ("dequantize", "QDST", "DST")),
]
# names of qstream's own entries a link may be planted under, beside what is there
NEW_NAMES = ["c.0.1", "zarr.json", "b000000", "b000007", "p000001", "data", "0", "c"]


def _plant(box: Path, dst: Path, rel: str) -> Path:
    """Replace (or add) ``dst/rel`` by a link to a copy of what it held, in ``box/user``
    (a folder for a folder, a file for a file; a chunk file's copy with other bytes, so that
    a value read through the link would show). Returns the link."""
    link = dst / rel
    user = box / "user"
    user.mkdir(exist_ok=True)
    (user / "keep.txt").write_text("mine")
    target = user / f"t{len(list(user.iterdir()))}"
    if link.is_dir() and not link.is_symlink():
        shutil.copytree(link, target, symlinks=True)
        shutil.rmtree(link)
    elif link.exists():
        raw = link.read_bytes()
        target.write_bytes(raw if link.name.endswith(".json") else bytes(b ^ 0x5A for b in raw))
        link.unlink()
    else:  # a new entry under one of qstream's names: a folder holding a document and files
        target.mkdir()
        (target / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"}')
        (target / "c.0").write_bytes(b"user data")
    link.symlink_to(os.path.relpath(target, link.parent))
    return link


def _refused_naming(output: str, link: Path, dst: Path) -> bool:
    """Whether the command's one-line error names the link (by its path, or by its place in
    the tree the error names)."""
    text = " ".join(output.split())
    rel = str(link.relative_to(dst))
    return "link" in text and (rel in text or link.name in text)


def _check_result(kind: str, cmd: tuple, templates: Templates, dst: Path, out: Path) -> None:
    """A command that succeeded with a link planted gave what it gives without it; an
    output it finished either reads the same or refuses the link it still holds."""
    verb = cmd[0]
    try:
        if verb == "convert":
            ck = qs.open_quantized(dst)
            for name, x in templates["values"].items():
                np.testing.assert_array_equal(ck[name][...], x)
        elif verb == "quantize":
            q = qs.open_quantized(dst)
            assert isinstance(q, qs.QuantizedArray)
            assert q.spec.dtype == ("int4" if "int4" in cmd else "int8")
            if "int4" not in cmd:
                np.testing.assert_array_equal(q[...], templates["array"])
        elif verb == "dequantize" and kind.startswith("dequantized"):
            got = zarr.open_array(str(dst), mode="r")[...]
            np.testing.assert_array_equal(got, templates["restored_array"])
        elif verb == "dequantize" and kind.startswith("restored"):
            for name, x in templates["values"].items():
                got = zarr.open_array(str(dst / name), mode="r")[...]
                np.testing.assert_array_equal(got, x)
    except StoreError as e:
        assert "link" in str(e), e
    if verb == "dequantize" and kind in ("checkpoint", "quantized") and out.exists():
        if kind == "checkpoint":
            for name, x in templates["values"].items():
                got = zarr.open_array(str(out / name), mode="r")[...]
                np.testing.assert_array_equal(got, x)
        else:
            np.testing.assert_array_equal(
                zarr.open_array(str(out), mode="r")[...], templates["array"]
            )
    if verb == "export":
        exported = load_file(str(out) + ".safetensors")
        assert exported.keys() == templates["exported"].keys()
        for name, x in templates["exported"].items():
            np.testing.assert_array_equal(exported[name], x)


@settings(
    max_examples=int(os.environ.get("PLANTED_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_a_link_planted_anywhere_in_an_output_is_never_followed(templates, tmp_path_factory, data):
    kind, cmd = data.draw(st.sampled_from(COMMANDS), label="command")
    base = kind.removesuffix("-resume")
    box = tmp_path_factory.mktemp("planted")
    dst = box / "dst.zarr"
    shutil.copytree(templates[base], dst, symlinks=True)
    if kind == "checkpoint-resume":
        _incomplete(dst, "qstream_checkpoint")
        _incomplete(dst / "model.layers.0.self_attn.o_proj.weight", "qstream")  # (its job too)
        for batch in (dst / "_index").glob("b*"):
            shutil.rmtree(batch)
    elif kind == "quantized-resume":
        _incomplete(dst, "qstream")
    elif kind == "restored-resume":
        _incomplete(dst, "qstream_restored")
    elif kind == "dequantized-resume":
        _incomplete(dst, "qstream")
    entries = _entries(dst)
    folders = [e for e in entries if (dst / e).is_dir()]
    new = [f"{d}/{n}" for d in folders for n in NEW_NAMES if f"{d}/{n}" not in entries]
    rel = data.draw(st.sampled_from(entries + new), label="link")
    link = _plant(box, dst, rel)
    out = box / "out"
    names = {
        "CK": templates["ck"],
        "SRC": templates["src"],
        "DST": dst,
        "CKDST": templates["checkpoint"],  # (read only)
        "QDST": templates["quantized"],
        "OUT": out,
        "OUT.safetensors": f"{out}.safetensors",
    }
    args = [names.get(a, a) for a in cmd]
    before = snapshot(box, skip=dst)
    before_user = snapshot(box / "user")
    r = cli(*args)
    event(f"{kind} {cmd[0]}{' --overwrite' if '--overwrite' in cmd else ''}: exit {r.exit_code}")
    assert "internal error" not in r.output and "Traceback" not in r.output, r.output
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    after = {k: v for k, v in snapshot(box, skip=dst).items() if not k.startswith("out")}
    assert after == {k: v for k, v in before.items() if not k.startswith("out")}, (rel, cmd)
    assert snapshot(box / "user") == before_user, (rel, cmd)
    if r.exit_code:
        assert r.exit_code in (1, 2), r.output
        assert _refused_naming(r.output, link, dst), (rel, cmd, r.output)
        errors = [ln for ln in r.output.splitlines() if ln.startswith("error")]
        assert len(errors) == 1 and r.output.rstrip().endswith(errors[0]), r.output  # one line
        return
    _check_result(kind, cmd, templates, dst, out)


@pytest.mark.parametrize("member", ["_packs", "_index", "model.norm.weight"])
def test_a_members_link_in_a_converted_checkpoint_is_removed_by_overwrite_never_followed(
    templates, tmp_path, member
):
    """The reported cases: ``DST/_packs -> ../userdir`` (and the index, a tensor's folder)
    then ``qstream convert moe.safetensors DST --overwrite``: the link itself is removed (its
    place is qstream's own member being replaced), nothing is written into ``userdir``; the
    index cannot be read through a link, so replacing an output whose index is one is
    refused, naming it."""
    dst = tmp_path / "DST"
    shutil.copytree(templates["checkpoint"], dst, symlinks=True)
    user = tmp_path / "userdir"
    shutil.copytree(dst / member, user)
    shutil.rmtree(dst / member)
    (dst / member).symlink_to("../userdir")
    before = snapshot(user)
    r = cli("convert", templates["ck"], dst, *MM, "--overwrite")
    assert snapshot(user) == before
    if member == "_index":
        assert r.exit_code == 1, r.output
        assert f"{dst / member} is a link inside the converted checkpoint" in r.output
        return
    assert r.exit_code == 0, r.output
    assert not (dst / member).is_symlink() and (dst / member).is_dir()
    ck = qs.open_quantized(dst)
    for name, x in templates["values"].items():
        np.testing.assert_array_equal(ck[name][...], x)


@pytest.mark.parametrize("member", ["_packs", "_packs/p000000", "_index/b000000"])
def test_a_resumed_conversion_refuses_a_link_where_it_writes_naming_it(templates, tmp_path, member):
    dst = tmp_path / "DST"
    shutil.copytree(templates["checkpoint"], dst, symlinks=True)
    _incomplete(dst, "qstream_checkpoint")
    for batch in (dst / "_index").glob("b*"):
        if not member.startswith("_index"):
            shutil.rmtree(batch)
    user = tmp_path / "userdir"
    user.mkdir()
    (user / "keep.txt").write_text("mine")
    if (dst / member).exists():
        shutil.rmtree(dst / member)
    (dst / member).symlink_to(os.path.relpath(user, (dst / member).parent))
    r = cli("convert", templates["ck"], dst, *MM)
    assert r.exit_code == 1, r.output
    assert f"{dst / member} is a link inside the converted checkpoint" in r.output, r.output
    assert sorted(p.name for p in user.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize(
    "member",
    [
        "_packs/p000000/data/c.0.0.0",
        "_packs/p000000/scale",
        "model.layers.0.self_attn.o_proj.weight/data/c.3.0",
        "model.norm.weight/c.0",
        "_index/b000000/zarr.json",
    ],
)
def test_a_finished_conversion_run_again_refuses_a_link_anywhere_in_it_naming_it(
    templates, tmp_path, member
):
    """A re-run of a finished conversion walks the whole finished tree (not only the root):
    a link planted deep inside it (a pack's chunk file, a member folder) is refused, naming
    it, instead of the output being reported complete."""
    dst = tmp_path / "DST"
    shutil.copytree(templates["checkpoint"], dst, symlinks=True)
    link = _plant(tmp_path, dst, member)
    before = snapshot(tmp_path / "user")
    r = cli("convert", templates["ck"], dst, *MM)
    assert r.exit_code in (1, 2), r.output  # (refused as the plan is made, or once locked)
    assert "already complete" not in r.output
    assert f"holds a link ({member})" in " ".join(r.output.split()), r.output
    assert snapshot(tmp_path / "user") == before
    assert link.is_symlink()  # (not removed: qstream did not write it)
    link.unlink()  # (without it, the same output is finished again)
    if (templates["checkpoint"] / member).is_dir():
        shutil.copytree(templates["checkpoint"] / member, dst / member)
    else:
        shutil.copy(templates["checkpoint"] / member, dst / member)
    r = cli("convert", templates["ck"], dst, *MM)
    assert r.exit_code == 0 and "already complete" in r.output, r.output


def test_a_finished_restored_checkpoint_run_again_refuses_a_link_inside_it(templates, tmp_path):
    dst = tmp_path / "DST"
    shutil.copytree(templates["restored"], dst, symlinks=True)
    member = "model.norm.weight/c.0"
    _plant(tmp_path, dst, member)
    r = cli("dequantize", templates["checkpoint"], dst)
    assert r.exit_code in (1, 2), r.output
    assert f"holds a link ({member})" in " ".join(r.output.split()), r.output


def test_the_clean_partials_of_a_root_never_follow_its_index_out(templates, tmp_path):
    """A killed writer's temporary files are removed from the index folder, never from the
    folder a link there points to."""
    from qstream.io.outputs.cleanup import clean_partials

    dst = tmp_path / "DST"
    shutil.copytree(templates["checkpoint"], dst, symlinks=True)
    user = tmp_path / "userdir"
    user.mkdir()
    (user / "draft.partial").write_text("mine")
    shutil.rmtree(dst / "_index")
    (dst / "_index").symlink_to("../userdir")
    clean_partials(dst)
    assert (user / "draft.partial").read_text() == "mine"


def test_held_roots_are_walked_below_and_released(tmp_path):
    """Below a held root, the lowest layer's paths are walked without following links; a
    folder found plain is not looked at again while the root is held; nothing is left held."""
    from qstream import paths

    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (root / "l").symlink_to("../elsewhere")
    with paths.held(str(root)):
        assert paths.confined(str(root / "a" / "b" / "c.0")) == str(root / "a" / "b" / "c.0")
        with pytest.raises(StoreError, match=r"root/l is a link inside the output"):
            paths.confined(str(root / "l" / "zarr.json"))
        rel = os.path.relpath(root / "l" / "x", os.getcwd())  # (a relative spelling too)
        with pytest.raises(StoreError, match="is a link"):
            paths.confined(rel)
        assert paths.confined(str(tmp_path / "elsewhere" / "x"))  # (not below: not looked at)
    assert paths.confined(str(root / "l" / "x"))  # released
    assert not paths._HELD and not paths._ROOTS


def _chunks_into_a_link(tmp_path):
    """``(files, user)``: the 4 x 4 int8 array at ``tmp_path/dst/data`` in chunks of 2 x 4 under
    nested keys (``c/0/0``), whose ``c`` folder is a link to the folder ``tmp_path/user``."""
    from qstream.io.storage.arraydoc import ChunkKey
    from qstream.io.storage.chunks import ChunkFiles

    root = tmp_path / "dst" / "data"
    root.mkdir(parents=True)
    user = tmp_path / "user"
    user.mkdir()
    (root / "c").symlink_to("../../user")
    files = ChunkFiles(
        root=str(root),
        shape=(4, 4),
        chunks=(2, 4),
        dtype=np.dtype("int8"),
        fill_value=0,
        codec=None,
        encode_key=ChunkKey("/"),
    )
    return files, user


def test_chunk_files_below_a_held_root_are_never_written_through_a_link(tmp_path):
    """The lowest layer of a block's write: a chunk folder that is a link (nested keys,
    ``c/0``) below a held root is refused, naming it, before anything is written."""
    from qstream import paths

    files, user = _chunks_into_a_link(tmp_path)
    with paths.held(str(tmp_path / "dst")), pytest.raises(StoreError, match=r"data/c is a link"):
        files.write((slice(0, 4), slice(0, 4)), np.ones((4, 4), np.int8))
    assert list(user.iterdir()) == []


def test_chunk_files_made_from_a_held_descriptor_are_never_written_through_a_link(tmp_path):
    """A node being built (``root_fd``: its array folder's descriptor, held by the publisher)
    makes its chunk files relative to that descriptor: a nested chunk folder that is a link
    is refused the same, naming it; flat keys land in the folder itself."""
    from dataclasses import replace

    from qstream.io.storage.arraydoc import ChunkKey

    files, user = _chunks_into_a_link(tmp_path)
    files.atomic = False
    root = tmp_path / "dst" / "data"
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(StoreError, match=r"data/c is a link inside"):
            replace(files, root_fd=fd).write((slice(0, 4), slice(0, 4)), np.ones((4, 4), np.int8))
        assert list(user.iterdir()) == []
        flat = replace(files, encode_key=ChunkKey("."), root_fd=fd)
        flat.write((slice(0, 4), slice(0, 4)), np.arange(16, dtype=np.int8).reshape(4, 4))
    finally:
        os.close(fd)
    assert (root / "c.1.0").read_bytes() == bytes(range(8, 16))


# ---------------------------------------------------------------- a link swapped in meanwhile

RENAME_EXCHANGE = 2  # renameat2(2): swap two entries atomically (Linux)


def _exchanger():
    """``exchange(a, b)``: swap the entries ``a`` and ``b`` in one step (renameat2), or None
    where the C library lacks it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return None
    at_cwd = -100

    def exchange(a: Path, b: Path) -> None:
        if fn(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), RENAME_EXCHANGE) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(a))

    return exchange


class Swapper:
    """A thread that, once ``place`` holds a chunk file, swaps it for a link to ``outside``
    and back, over and over (each swap atomic: ``place`` is always the folder or the link),
    until stopped; then leaves the folder in place."""

    def __init__(self, place: Path, outside: Path, exchange) -> None:
        import threading

        self.place, self.outside, self.exchange = place, outside, exchange
        self.aside = place.parent / f"{place.name}-aside"  # (the link while the folder is in)
        self.swaps = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import time

        # (from the first chunk file on: the job is writing blocks into the folder)
        while not self.stop.is_set() and not any(self.place.glob("c*")):
            time.sleep(0.0005)
        if self.stop.is_set():
            return
        # what the link shows: a copy of the folder's document (a followed link looks valid)
        doc = self.place / "zarr.json"
        if doc.exists():
            shutil.copy(doc, self.outside / "zarr.json")
        self.aside.symlink_to(os.path.relpath(self.outside, self.aside.parent))
        linked = False
        while not self.stop.is_set():
            self.exchange(self.place, self.aside)
            linked = not linked
            self.swaps += 1
            time.sleep(0.0005 if linked else 0.001)
        if linked:
            self.exchange(self.place, self.aside)
        self.aside.unlink()

    def __enter__(self) -> Swapper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def test_a_folder_swapped_for_a_link_while_a_job_writes_is_never_written_through(tmp_path):
    """A real race (TOCTOU): while ``qstream quantize`` writes its output block by block, a
    thread swaps the output's ``data`` folder (once it holds a chunk file) for a link to a
    folder outside, and back, every millisecond or so (each swap atomic). Before chunk files
    were written relative to a descriptor, chunks landed outside in every run of this test.
    Every chunk file and document is written relative to a descriptor opened from the
    output's root without following a link, so nothing outside changes; the run either
    finishes (its output reads as a run without the race gives) or refuses in one line
    naming the link."""
    exchange = _exchanger()
    if exchange is None:
        pytest.skip("renameat2 is not available")
    src = tmp_path / "src.zarr"
    a = zarr.create_array(str(src), shape=(4096, 256), chunks=(16, 256), dtype="f4")
    x = np.random.default_rng(5).standard_normal((4096, 256)).astype(np.float32)
    a[...] = x
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    before = snapshot(outside)
    dst = tmp_path / "dst.zarr"
    member = "data"
    with Swapper(dst / member, outside, exchange) as swapper:
        r = cli("quantize", src, dst, "--axis", "0", "--max-memory", "1MiB")
    after = snapshot(outside)
    after.pop("zarr.json", None)  # (the swapper's own copy)
    assert after == before, (sorted(after), r.output[-300:])
    assert swapper.swaps >= 1  # (the link was in place while the job wrote)
    assert "internal error" not in r.output and "Traceback" not in r.output, r.output
    if r.exit_code:
        errors = [ln for ln in r.output.splitlines() if ln.startswith("error")]
        assert len(errors) == 1 and r.output.rstrip().endswith(errors[0]), r.output
        assert f"{dst / member} is a link inside" in " ".join(r.output.split()), r.output
        return
    expected = tmp_path / "expected.zarr"
    assert cli("quantize", src, expected, "--axis", "0", "--max-memory", "1MiB").exit_code == 0
    np.testing.assert_array_equal(qs.open_quantized(dst)[...], qs.open_quantized(expected)[...])


@pytest.mark.parametrize("member", [False, True])
def test_a_node_whose_folder_is_swapped_for_a_link_while_built_is_never_published(
    tmp_path, monkeypatch, member
):
    """A published node is built through its folders' held descriptors. If the hidden folder
    (or a member's) is moved away while it is written and a link put in its place, the
    build is refused, naming it, and the link is never renamed into the output."""
    from qstream import paths
    from qstream.io.outputs import publish

    out = tmp_path / "out.zarr"
    out.mkdir()
    user = tmp_path / "user"
    user.mkdir()
    real = publish._fill_array

    def racing(fd, where, *args, **kwargs):
        # (another user who can write in the output, meanwhile)
        os.rename(where, tmp_path / "moved")
        os.symlink(user, where)
        return real(fd, where, *args, **kwargs)

    monkeypatch.setattr(publish, "_fill_array", racing)
    kw = {"shape": (4, 8), "chunks": (2, 8), "dtype": "int8", "compressors": None}
    values = np.ones((4, 8), np.int8)
    with paths.held(str(out)), pytest.raises(StoreError, match="was replaced while qstream"):
        if member:
            publish.write_group(str(out / "t"), {}, {"data": (kw, values, None)})
        else:
            publish.write_array(str(out / "t"), kw, values, None)
    assert not os.path.lexists(out / "t")
    assert [p.name for p in out.iterdir()] == []  # (no hidden folder or link left)
    assert list(user.iterdir()) == []
