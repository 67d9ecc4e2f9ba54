"""What a job may write over: nothing but its own outputs. Also job identity (the same job
however its source path is spelled), already-complete re-runs, corrupt and missing source
chunks, edge shapes and strict specs and recipes."""

from __future__ import annotations

import json
import os
import pickle

import numcodecs
import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

import qstream as qs
from cli.main import app
from qstream.errors import InvalidParameterError, StoreError
from qstream.spec import QuantSpec

runner = CliRunner()


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def src(tmp_path):
    x = (np.random.default_rng(0).standard_normal((64, 300)) * 0.02).astype(np.float32)
    a = zarr.create_array(str(tmp_path / "src.zarr"), shape=x.shape, chunks=(16, 300), dtype="f4")
    a[...] = x
    return tmp_path / "src.zarr"


def _tree(path):
    return {
        str(p.relative_to(path)): p.read_bytes() if p.is_file() else None
        for p in sorted(path.rglob("*"))
    }


# ---------------------------------------------------------------- destination rules


def test_a_directory_of_other_files_is_never_deleted(src, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    before = _tree(notes)
    qs.quantize_store(src, tmp_path / "q.zarr")
    for overwrite in (False, True):
        with pytest.raises(StoreError, match="not empty and is not a Zarr store"):
            qs.quantize_store(src, notes, overwrite=overwrite)
        with pytest.raises(StoreError, match="not empty and is not a Zarr store"):
            qs.dequantize_store(tmp_path / "q.zarr", notes, overwrite=overwrite)
    r = cli("quantize", src, notes, "--overwrite")
    assert r.exit_code == 2 and "will not delete it" in r.output  # (refused by the plan)
    assert _tree(notes) == before


def test_a_zarr_node_qstream_did_not_write_is_never_replaced(src, tmp_path):
    other = tmp_path / "other.zarr"
    zarr.create_array(str(other), shape=(3,), dtype="i4")[...] = [1, 2, 3]
    (other / "notes.txt").write_text("mine")
    before = _tree(other)
    for overwrite in (False, True):
        with pytest.raises(StoreError, match=r"did not write; .*will not delete it"):
            qs.quantize_store(src, other, overwrite=overwrite)
    r = cli("quantize", src, other, "--overwrite")
    assert r.exit_code == 2 and "--overwrite" in r.output and "overwrite=True" not in r.output
    assert _tree(other) == before


def test_a_file_is_refused(src, tmp_path):
    f = tmp_path / "file.zarr"
    f.write_text("data")
    with pytest.raises(StoreError, match="is a file"):
        qs.quantize_store(src, f, overwrite=True)
    assert f.read_text() == "data"


@pytest.mark.parametrize("where", ["same", "inside", "containing"])
def test_a_destination_overlapping_the_source_is_refused(src, tmp_path, where):
    dst = {"same": src, "inside": src / "q", "containing": tmp_path}[where]
    before = _tree(src)
    with pytest.raises(StoreError, match="overlaps the source"):
        qs.quantize_store(src, dst, overwrite=True)
    assert _tree(src) == before
    q = tmp_path / "q.zarr"
    qs.quantize_store(src, q)
    with pytest.raises(StoreError, match="overlaps the source"):
        qs.dequantize_store(q, q / "d" if where == "inside" else q, overwrite=True)


def test_overwrite_replaces_only_qstreams_own_members(src, tmp_path):
    q = tmp_path / "q.zarr"
    qs.quantize_store(src, q, QuantSpec(axis=0))
    (q / "README.txt").write_text("mine")
    with pytest.raises(StoreError, match="holds a different job"):
        qs.quantize_store(src, q, QuantSpec(axis=1))
    report = qs.quantize_store(src, q, QuantSpec(axis=1), overwrite=True)
    assert not report.already_complete
    assert (q / "README.txt").read_text() == "mine"
    assert qs.open_quantized(q).spec.axis == 1


def test_the_same_job_with_its_path_spelled_differently_is_already_complete(src, tmp_path):
    q = tmp_path / "q.zarr"
    first = qs.quantize_store(src, q, QuantSpec(axis=0))
    assert not first.already_complete
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        for spelled in ("src.zarr", str(src) + "/", f"{tmp_path}/../{tmp_path.name}//src.zarr"):
            again = qs.quantize_store(spelled, "q.zarr", QuantSpec(axis=0))
            assert again.already_complete and again.error == first.error
        r = cli("quantize", "src.zarr", "q.zarr", "--axis", "0")
        assert r.exit_code == 0 and "already complete" in r.output
        r = cli("quantize", str(src), "q.zarr", "--axis", "0", "--json")
        assert json.loads(r.stdout)["already_complete"] is True
    finally:
        os.chdir(cwd)


def test_a_different_numpy_source_is_a_different_job(tmp_path):
    x = np.ones((8, 8), np.float32)
    qs.quantize_store(x, tmp_path / "q.zarr")
    assert qs.quantize_store(x.copy(), tmp_path / "q.zarr").already_complete
    with pytest.raises(StoreError, match="different job"):
        qs.quantize_store(x * 2, tmp_path / "q.zarr")


def test_dequantize_refuses_foreign_outputs_and_reports_a_finished_run(src, tmp_path):
    q, d = tmp_path / "q.zarr", tmp_path / "d.zarr"
    qs.quantize_store(src, q)
    assert not qs.dequantize_store(q, d)["already_complete"]
    assert qs.dequantize_store(q, d)["already_complete"]
    with pytest.raises(StoreError, match="pass overwrite=True"):
        qs.dequantize_store(q, d, dtype="float16")
    qs.dequantize_store(q, d, dtype="float16", overwrite=True)
    assert zarr.open_array(str(d)).dtype == np.float16


def test_convert_refuses_a_foreign_directory(tmp_path):
    from pathlib import Path

    ckpt = Path(__file__).resolve().parents[2] / "samples" / "tiny-transformer.safetensors"
    notes = tmp_path / "out"
    notes.mkdir()
    (notes / "keep.txt").write_text("x")
    r = cli("convert", ckpt, notes, "--overwrite")
    assert r.exit_code == 2 and "will not delete it" in r.output
    assert (notes / "keep.txt").read_text() == "x"


# ---------------------------------------------------------------- corrupt and missing chunks


def _zstd_source(tmp_path, x):
    a = zarr.create_array(
        str(tmp_path / "z.zarr"),
        shape=x.shape,
        chunks=(16, x.shape[1]),
        dtype="f4",
        compressors=zarr.codecs.ZstdCodec(level=1),
    )
    a[...] = x
    return tmp_path / "z.zarr"


@pytest.mark.parametrize("damage", ["short-frame", "garbage", "truncated"])
def test_a_corrupt_chunk_names_the_array_and_chunk_and_marks_nothing_complete(tmp_path, damage):
    x = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
    path = _zstd_source(tmp_path, x)
    chunk = path / "c" / "2" / "0"
    raw = chunk.read_bytes()
    chunk.write_bytes(
        {
            "short-frame": numcodecs.Zstd(level=1).encode(x[32:40]),  # valid, half the bytes
            "garbage": os.urandom(len(raw)),
            "truncated": raw[: len(raw) // 2],
        }[damage]
    )
    for spec in (QuantSpec(), QuantSpec(scale=0.01)):
        dst = tmp_path / f"q-{spec.method}-{spec.scale}.zarr"
        with pytest.raises(StoreError, match=r"corrupt chunk .*z\.zarr/c/2/0"):
            qs.quantize_store(path, dst)
        if dst.exists():
            with pytest.raises(StoreError, match="incomplete"):
                qs.open_quantized(dst)


def test_a_corrupt_chunk_read_through_zarr_is_a_store_error_too(tmp_path):
    x = np.random.default_rng(1).standard_normal((64, 256)).astype("f4")
    a = zarr.create_array(  # sharded: read through zarr, not the direct chunk reader
        str(tmp_path / "sh.zarr"), shape=x.shape, chunks=(16, 256), shards=(32, 256), dtype="f4"
    )
    a[...] = x
    shard = tmp_path / "sh.zarr" / "c" / "1" / "0"
    shard.write_bytes(os.urandom(shard.stat().st_size))
    with pytest.raises(StoreError, match=r"sh\.zarr: cannot read region \[0:64, 0:256\] \(chunks"):
        qs.quantize_store(tmp_path / "sh.zarr", tmp_path / "q.zarr")


def test_missing_chunks_read_as_the_fill_value_and_are_counted(tmp_path):
    x = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
    path = _zstd_source(tmp_path, x)
    (path / "c" / "1" / "0").unlink()
    report = qs.quantize_store(path, tmp_path / "q.zarr", QuantSpec(scale=0.01))
    assert report.missing_chunks == 1
    q = qs.open_quantized(tmp_path / "q.zarr").quantized(...)
    assert not q[16:32].any() and q[:16].any()


# ---------------------------------------------------------------- edge shapes


@pytest.mark.parametrize(
    "spec",
    [QuantSpec(), QuantSpec(method="percentile"), QuantSpec(scale=0.5, zero_point=3)],
    ids=["minmax", "percentile", "explicit"],
)
def test_a_0d_source_quantizes_per_tensor(tmp_path, spec):
    x = np.array(1.25, np.float32)
    report = qs.quantize_store(x, tmp_path / "q.zarr", spec)
    arr = qs.open_quantized(tmp_path / "q.zarr")
    assert arr.shape == () and report.error["count"] == 1
    want = qs.quantize(x, arr.scale, arr.zero_point.astype(np.int64), dtype="int8")
    np.testing.assert_array_equal(arr.quantized(...), want)
    with pytest.raises(InvalidParameterError, match="0-d array has no axis"):
        qs.quantize_store(x, tmp_path / "a.zarr", QuantSpec(axis=0))


@pytest.mark.parametrize(
    "spec",
    [QuantSpec(), QuantSpec(axis=0), QuantSpec(axis=1), QuantSpec(axis=1, block_size=32)],
    ids=["tensor", "axis0", "axis1", "blocked"],
)
def test_an_empty_source_gives_an_empty_complete_output(tmp_path, spec):
    a = zarr.create_array(str(tmp_path / "e.zarr"), shape=(0, 100), chunks=(8, 100), dtype="f4")
    report = qs.quantize_store(a, tmp_path / "q.zarr", spec)
    arr = qs.open_quantized(tmp_path / "q.zarr")
    assert arr.shape == (0, 100) and arr[...].shape == (0, 100)
    assert report.error["count"] == 0
    d = qs.dequantize_store(tmp_path / "q.zarr", tmp_path / "d.zarr")
    assert d["shape"] == [0, 100]
    r = cli("quantize", tmp_path / "e.zarr", tmp_path / "c.zarr", "--axis", "0")
    assert r.exit_code == 0, r.output


# ---------------------------------------------------------------- strict specs and recipes


def test_unknown_spec_keys_are_errors_naming_the_key():
    with pytest.raises(InvalidParameterError, match=r"'methd' \(did you mean 'method'\?\)"):
        QuantSpec.from_dict({"methd": "percentile"})
    with pytest.raises(InvalidParameterError, match=r"'percentil'.*valid keys: dtype, axis"):
        QuantSpec.from_dict({"method": "percentile", "percentil": 99.0})


@pytest.mark.parametrize(
    "text",
    [
        "[defaults]\nmethd = 'percentile'\n",
        "[[rules]]\npattern = '*'\nspec = { percentil = 99.0 }\n",
        "[[rules]]\npatern = '*'\naction = 'keep'\n",
        "[[rules]]\npattern = '*'\naction = 'skip'\n",
    ],
)
def test_recipe_typos_are_usage_errors(tmp_path, text):
    from pathlib import Path

    ckpt = Path(__file__).resolve().parents[2] / "samples" / "tiny-transformer.safetensors"
    recipe = tmp_path / "r.toml"
    recipe.write_text(text)
    with pytest.raises(InvalidParameterError):
        qs.Recipe.load(recipe)
    r = cli("convert", ckpt, tmp_path / "c.zarr", "--recipe", recipe)
    assert r.exit_code == 2 and r.output.startswith("error:") and "Traceback" not in r.output
    assert not (tmp_path / "c.zarr").exists()


# ---------------------------------------------------------------- per-block work


def test_block_work_pickles_with_a_path_source_and_gives_the_same_result(src, tmp_path):
    from qstream.engine.blocks.work import RangesWork
    from qstream.engine.jobs.job import QuantizeJob

    job = QuantizeJob(str(src), QuantSpec(axis=0), max_memory=1 << 20)
    work = RangesWork(job.plan, job.ref)
    blob = pickle.dumps(work)
    assert len(blob) < 4096  # names the job, carries no data
    again = pickle.loads(blob)
    for b in job.blocks:
        got, want = again(b), work(b)
        np.testing.assert_array_equal(got.min, want.min)
        np.testing.assert_array_equal(got.count, want.count)
    in_memory = QuantizeJob(np.ones((4, 4), np.float32), QuantSpec())
    with pytest.raises(TypeError, match="cannot be sent to another process"):
        pickle.dumps(RangesWork(in_memory.plan, in_memory.ref))
