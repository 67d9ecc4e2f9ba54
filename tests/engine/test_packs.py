"""Packs: runs of small, alike tensors of a converted checkpoint stored stacked (issue 24).

A packed tensor reads exactly as the same tensor converted into a group of its own (codes,
parameters, values, error figures); plain Zarr reads a pack with no qstream code; a kill at
any write of a packed conversion, then a re-run, gives the uninterrupted run's files; an
overwrite removes qstream's packs and nothing else; crafted rows are refused.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import zarr
from safetensors.numpy import save_file

import qstream as qs
from qstream.spec import QuantSpec
from qstream.spec.recipe import Recipe

from ..support.kill_hook import KILL_HOOK, SWEEPS, kill_points


def _experts(path: Path, dtype=np.float32, layers: int = 3, experts: int = 8) -> list[str]:
    rng = np.random.default_rng(11)
    tensors = {}
    for layer in range(layers):
        for e in range(experts):
            scale = 1 + (layer * experts + e) % 7
            x = (rng.standard_normal((16, 24)) * scale).astype(np.float32)
            tensors[f"model.layers.{layer}.mlp.experts.{e}.up_proj.weight"] = x.astype(dtype)
        tensors[f"model.layers.{layer}.norm.weight"] = rng.standard_normal(24).astype(dtype)
        tensors[f"model.layers.{layer}.router.weight"] = rng.standard_normal((8, 24)).astype(dtype)
    save_file(tensors, str(path))
    return list(tensors)


def _four_to_a_pack(path: Path, count: int) -> list[str]:
    """``count`` experts of 16 KiB: four to a pack under ``max_memory=1 << 20`` (64 KiB
    blocks)."""
    rng = np.random.default_rng(0)
    tensors = {
        f"model.layers.{i // 8}.mlp.experts.{i % 8}.up_proj.weight": rng.standard_normal(
            (64, 64)
        ).astype(np.float32)
        for i in range(count)
    }
    save_file(tensors, str(path))
    return list(tensors)


SPECS = [
    {"dtype": "int8", "axis": 0},
    {"dtype": "int8", "axis": None},
    {"dtype": "uint8", "axis": None, "symmetric": False},
    {"dtype": "int4", "axis": 1, "block_size": 8, "method": "dynamic"},
    {"dtype": "uint4", "axis": 1, "block_size": 8, "symmetric": False},
    {"dtype": "int4", "axis": 0, "block_size": 4},
    {"dtype": "float8_e4m3fn", "axis": 0},
    {"dtype": "int4", "axis": 1, "block_size": 8, "scale_dtype": "float16"},
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: "-".join(f"{v}" for v in s.values()))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_packed_tensors_read_exactly_as_tensors_converted_one_by_one(tmp_path, spec, dtype):
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    names = _experts(tmp_path / "ck.safetensors", dt)
    recipe = Recipe(defaults=QuantSpec(**spec))
    qs.convert_checkpoint(tmp_path / "ck.safetensors", tmp_path / "p", recipe, packs=True)
    qs.convert_checkpoint(tmp_path / "ck.safetensors", tmp_path / "g", recipe, packs=False)
    assert (tmp_path / "p" / "_packs").is_dir() and not (tmp_path / "g" / "_packs").exists()
    p, g = qs.open_quantized(tmp_path / "p"), qs.open_quantized(tmp_path / "g")
    assert list(p) == list(g) == names
    packed = 0
    for n in names:
        a, b = p[n], g[n]
        rp, rg = p.tensors[n], g.tensors[n]
        if not isinstance(b, qs.QuantizedArray):  # kept: stored as it is, both ways
            assert np.array_equal(np.asarray(a[...]), np.asarray(b[...]))
            continue
        packed += "pack" in rp
        assert a.shape == b.shape and a.spec == b.spec
        assert np.array_equal(a.quantized(), b.quantized()), n
        assert np.array_equal(a.scale, b.scale) and np.array_equal(a.zero_point, b.zero_point)
        assert np.array_equal(a[...].view(np.uint32), b[...].view(np.uint32)), n
        assert np.array_equal(a[2:5].view(np.uint32), b[2:5].view(np.uint32)), n
        for k in ("sqnr_db", "mse", "max_abs", "cosine"):
            assert rp["error"][k] == pytest.approx(rg["error"][k], rel=1e-9, abs=1e-12), (n, k)
        for k in ("clipped", "nonfinite"):
            assert rp["error"][k] == rg["error"][k]
        assert {k: v for k, v in rp.items() if k not in ("error", "pack", "slot", "passes")} == {
            k: v for k, v in rg.items() if k not in ("error", "passes")
        }
    assert packed == 27  # every expert, and the routers (one a layer, gathered into a pack)


def test_packs_converted_one_after_another_in_one_thread_keep_their_own_codes(
    tmp_path, monkeypatch
):
    """A pack's codes are written from its worker's own buffer, not a copy: on one worker,
    each pack is written before the next one's codes take that buffer."""
    from qstream.engine.run import executors, pipeline

    monkeypatch.setattr(pipeline, "default_workers", lambda: 1)
    monkeypatch.setattr(executors, "default_workers", lambda: 1)
    names = _four_to_a_pack(tmp_path / "ck.safetensors", 24)
    ck, bound = tmp_path / "ck.safetensors", 1 << 20
    qs.convert_checkpoint(ck, tmp_path / "p", packs=True, max_memory=bound)
    qs.convert_checkpoint(ck, tmp_path / "g", packs=False, max_memory=bound)
    assert len(list((tmp_path / "p" / "_packs").glob("p*"))) == 6
    p, g = qs.open_quantized(tmp_path / "p"), qs.open_quantized(tmp_path / "g")
    for n in names:
        assert "pack" in p.tensors[n]
        assert np.array_equal(p[n].quantized(), g[n].quantized()), n


def test_a_pack_is_plain_zarr_one_tensor_per_index_of_its_first_axis(tmp_path):
    names = _experts(tmp_path / "ck.safetensors")
    qs.convert_checkpoint(tmp_path / "ck.safetensors", tmp_path / "p", packs=True)
    ck = qs.open_quantized(tmp_path / "p")
    for n in names[:8]:
        row = ck.tensors[n]
        pack = zarr.open_group(str(tmp_path / "p" / "_packs" / row["pack"]), mode="r")
        meta = pack.attrs["qstream_pack"]
        assert meta["tensors"]["name"][row["slot"]] == n
        assert pack["data"].shape[1:] == (16, 24)
        assert np.array_equal(pack["data"][row["slot"]], ck[n].quantized())
        assert np.array_equal(pack["scale"][row["slot"]], ck[n].scale)
        assert pack["data"].metadata.dimension_names[0] == "tensor"


def test_float_columns_are_stored_as_float64_bytes_and_read_back_as_the_lists_they_were():
    from qstream.io.outputs.pack_layout import decoded_columns
    from qstream.io.storage.columns import float_column

    odd = [0.1, -0.0, 5e-324, 1e308, np.inf, -np.inf, np.nan, -1.5]
    sq = np.array([40.5, np.inf, -np.inf, np.nan])
    worst = np.array([[1.0, np.inf], [2.5, 3.0], [np.nan, 4.0], [5.0, 6.0]])
    cols = {
        "name": ["a", "b", "c", "d"],
        "min": float_column(np.array(odd)),
        "error": {
            "sqnr_db": float_column(sq),
            "clipped": [0, 1, 2, 3],
            "worst_channel": [[3, 1], [0, 2], [1, 0], [2, 3]],
            "worst_sqnr_db": float_column(worst),
            "worst_max_abs": float_column(worst * 2),
        },
    }
    assert set(cols["min"]) == {"float64"}  # (bytes, base64: not spelled out value by value)
    got = decoded_columns(json.loads(json.dumps(cols)))
    assert got["name"] == cols["name"] and got["error"]["clipped"] == [0, 1, 2, 3]
    assert np.array_equal(np.array(got["min"]), np.array(odd), equal_nan=True)
    assert [np.signbit(v) for v in got["min"][:2]] == [False, True]  # -0.0 kept
    # non-finite SQNRs read as the strings every report uses; other figures stay numbers
    assert got["error"]["sqnr_db"] == [40.5, "inf", "-inf", "nan"]
    assert got["error"]["worst_sqnr_db"] == [[1.0, "inf"], [2.5, 3.0], ["nan", 4.0], [5.0, 6.0]]
    assert got["error"]["worst_max_abs"][0] == [2.0, np.inf]
    assert len(got["error"]["worst_max_abs"]) == 4


def test_figures_are_listed_as_float64_bytes_only_where_they_read_back_the_same():
    from qstream.io.storage.columns import float_values, listed_floats

    def back(name, values):
        stored = json.loads(json.dumps(listed_floats(name, values)))
        return stored, (float_values(stored, name) if isinstance(stored, dict) else stored)

    odd = [0.25, -0.0, 5e-324, np.inf, -np.inf, np.nan]
    stored, got = back("mse", odd)
    assert set(stored) == {"float64"}
    assert np.array_equal(np.array(got), np.array(odd), equal_nan=True)
    assert np.signbit(got[1]) and all(type(v) is float for v in got)
    stored, got = back("sqnr_db", [41.5, "inf", "-inf", "nan"])  # (as every report has them)
    assert set(stored) == {"float64"} and got == [41.5, "inf", "-inf", "nan"]
    for name, values in [
        ("sqnr_db", [41.5, np.inf]),  # (would read back as the text "inf")
        ("clipped", [0, 3]),
        ("mse", [0.5, 1]),
        ("mse", [0.5, None]),
        ("sqnr_db", [41.5, "Infinity"]),
        ("mse", []),
    ]:
        stored, got = back(name, values)
        assert stored == got == values, (name, values)


def test_the_index_lists_a_packs_figures_as_bytes_and_reads_every_row_as_converted(tmp_path):
    """The root's index rows, read back, are the rows the conversion returned, value for
    value (the error figures' floats stored as bytes); an index whose batches list every
    value in JSON, as earlier versions wrote them, reads the same."""
    from qstream.io.outputs.rootindex import ROW_KEYS, RootIndex
    from qstream.io.storage.columns import float_values

    _experts(tmp_path / "ck.safetensors")
    out = qs.convert_checkpoint(tmp_path / "ck.safetensors", tmp_path / "p", packs=True)
    packed = [n for n, r in out["tensors"].items() if "pack" in r]
    assert len(packed) == 27

    def rows():
        meta = json.loads((tmp_path / "p" / "zarr.json").read_text())["attributes"]
        return RootIndex.open(tmp_path / "p", meta["qstream_checkpoint"]).rows()

    def same(a, b):
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)

    same(rows(), out["tensors"])
    for row in out["tensors"].values():  # (a pack's rows have the keys one by one rows have)
        assert list(row) == [k for k in ROW_KEYS if k in row]
    docs = sorted((tmp_path / "p" / "_index").glob("b*/zarr.json"))
    encoded = 0
    for path in docs:
        doc = json.loads(path.read_text())
        columns = doc["attributes"].get("columns", {})
        for k, v in columns.items():
            if isinstance(v, dict):
                encoded += 1
                columns[k] = json.loads(json.dumps(float_values(v, k.removeprefix("error."))))
        path.write_text(json.dumps(doc))
    assert encoded >= 5  # (sqnr_db, mse, max_abs, cosine, clip_fraction of the packs)
    same(rows(), out["tensors"])
    assert qs.open_quantized(tmp_path / "p").tensors == out["tensors"]


def _converted_with_pack_edited(tmp_path, edit) -> tuple[str, str]:
    """Convert the experts' checkpoint with packs, apply ``edit`` to the ``qstream_pack``
    attributes of the first expert's pack; (that tensor's name, its pack)."""
    _experts(tmp_path / "ck.safetensors")
    qs.convert_checkpoint(tmp_path / "ck.safetensors", tmp_path / "p", packs=True)
    name = "model.layers.0.mlp.experts.0.up_proj.weight"
    pack = qs.open_quantized(tmp_path / "p").tensors[name]["pack"]
    doc_path = tmp_path / "p" / "_packs" / pack / "zarr.json"
    doc = json.loads(doc_path.read_text())
    edit(doc["attributes"]["qstream_pack"])
    doc_path.write_text(json.dumps(doc))
    return name, pack


@pytest.mark.parametrize(
    ("column", "message"),
    [
        ({"float64": "not base64!"}, "not base64"),
        ({"float64": "AAAA"}, "not float64 values"),  # 3 bytes
        ({"float64": "AAAAAAAAAAA=", "x": 1}, "neither a list nor float64"),
        ({"float32": "AAAAAAAAAAA="}, "neither a list nor float64"),
    ],
)
def test_a_damaged_float_column_is_refused_naming_the_pack(tmp_path, column, message):
    def damage(meta):
        meta["tensors"]["error"]["mse"] = column

    name, pack = _converted_with_pack_edited(tmp_path, damage)
    with pytest.raises(qs.StoreError, match=f"{pack}.*damaged or crafted.*{message}"):
        qs.open_quantized(tmp_path / "p")[name]


def test_a_pack_whose_worst_channels_are_not_lists_is_refused_naming_the_pack(tmp_path):
    def damage(meta):
        meta["tensors"]["error"]["worst_channel"][0] = 3

    name, pack = _converted_with_pack_edited(tmp_path, damage)
    with pytest.raises(qs.StoreError, match=f"{pack}.*damaged or crafted.*not a list"):
        qs.open_quantized(tmp_path / "p")[name]


def test_a_pack_of_a_newer_version_is_refused(tmp_path):
    name, _ = _converted_with_pack_edited(tmp_path, lambda meta: meta.update(version=99))
    with pytest.raises(qs.StoreError, match="version 99, newer than this qstream reads"):
        qs.open_quantized(tmp_path / "p")[name]


def test_a_rerun_makes_again_a_finished_pack_whose_columns_are_damaged(tmp_path):
    names = _experts(tmp_path / "ck.safetensors")
    root = tmp_path / "p"
    qs.convert_checkpoint(tmp_path / "ck.safetensors", root, packs=True)
    # as a run killed after publishing its last pack and before listing its tensors leaves it
    rows = qs.open_quantized(root).tensors
    batches = sorted(b for b in (root / "_index").iterdir() if b.is_dir())

    def listed_in(batch):
        attrs = json.loads((batch / "zarr.json").read_text())["attributes"]
        return [r["name"] for r in attrs["rows"]] if "rows" in attrs else attrs["columns"]["name"]

    at = max(i for i, b in enumerate(batches) if "pack" in rows[listed_in(b)[0]])
    listed = listed_in(batches[at])
    name = listed[0]
    pack = rows[name]["pack"]
    for b in batches[at:]:
        (b / "zarr.json").unlink()
        b.rmdir()
    doc = json.loads((root / "zarr.json").read_text())
    doc["attributes"]["qstream_checkpoint"]["complete"] = False
    (root / "zarr.json").write_text(json.dumps(doc))
    pack_doc = root / "_packs" / pack / "zarr.json"
    doc = json.loads(pack_doc.read_text())
    doc["attributes"]["qstream_pack"]["tensors"]["error"]["mse"] = {"float64": "not base64!"}
    pack_doc.write_text(json.dumps(doc))
    qs.convert_checkpoint(tmp_path / "ck.safetensors", root, packs=True)  # resumes
    qs.convert_checkpoint(tmp_path / "ck.safetensors", tmp_path / "g", packs=True)
    p, g = qs.open_quantized(root), qs.open_quantized(tmp_path / "g")
    assert list(p) == list(g) == names
    assert p.tensors[name]["pack"] == pack
    for n in listed:
        assert p[n].report == g[n].report, n
        assert np.array_equal(p[n].quantized(), g[n].quantized()), n


def test_a_rerun_under_another_memory_bound_never_replaces_a_pack_listed_tensors_are_in(
    tmp_path,
):
    """Packs are planned from max_memory: a re-run under another bound packs the tensors
    still to convert otherwise, and its packs' numbers may be those of packs the first run
    listed. Those are never replaced: every tensor then reads as in an uninterrupted run."""
    rng = np.random.default_rng(8)
    names = [
        f"model.layers.{i}.mlp.experts.{e}.up_proj.weight" for i in range(4) for e in range(64)
    ]
    save_file(
        {n: rng.standard_normal((16, 64)).astype(np.float32) for n in names},
        tmp_path / "ck.safetensors",
    )
    root = tmp_path / "p"
    qs.convert_checkpoint(tmp_path / "ck.safetensors", root, packs=True, max_memory=1 << 20)
    rows = qs.open_quantized(root).tensors
    names = list(rows)  # (in the checkpoint's order)
    assert rows[names[-1]]["pack"] == "p000015"  # (16 tensors a pack)
    # as a run killed after listing 12 packs leaves it
    for b in sorted(b for b in (root / "_index").iterdir() if b.is_dir())[12:]:
        (b / "zarr.json").unlink()
        b.rmdir()
    doc = json.loads((root / "zarr.json").read_text())
    doc["attributes"]["qstream_checkpoint"]["complete"] = False
    (root / "zarr.json").write_text(json.dumps(doc))
    assert len(qs.open_quantized(root, allow_incomplete=True).tensors) == 192
    qs.convert_checkpoint(tmp_path / "ck.safetensors", root, packs=True, max_memory=4 << 20)
    g = tmp_path / "g"
    qs.convert_checkpoint(tmp_path / "ck.safetensors", g, packs=True, max_memory=4 << 20)
    p, g = qs.open_quantized(root), qs.open_quantized(g)
    assert list(p) == list(g) == names
    assert {p.tensors[n]["pack"] for n in names[:192]} == {f"p{i:06d}" for i in range(12)}
    for n in names:
        assert p[n].report == g[n].report, n
        assert np.array_equal(p[n].quantized(), g[n].quantized()), n
        assert np.array_equal(p[n].scale, g[n].scale), n


def test_a_version_1_pack_with_its_columns_as_lists_still_reads(tmp_path):
    from qstream.io.outputs.pack_layout import decoded_columns

    names = _experts(tmp_path / "ck.safetensors")
    qs.convert_checkpoint(tmp_path / "ck.safetensors", tmp_path / "p", packs=True)
    before = qs.open_quantized(tmp_path / "p")
    packed = [n for n in names if "pack" in before.tensors[n]]
    reports = {n: before[n].report for n in packed}
    values = {n: before[n][...] for n in packed}
    for doc_path in (tmp_path / "p" / "_packs").glob("p*/zarr.json"):
        doc = json.loads(doc_path.read_text())
        meta = doc["attributes"]["qstream_pack"]
        assert meta["version"] == 2
        # version 1 wrote every column as a JSON list (non-finite SQNRs as strings)
        meta["tensors"] = decoded_columns(meta["tensors"])
        meta["version"] = 1
        doc_path.write_text(json.dumps(doc))
    after = qs.open_quantized(tmp_path / "p")
    for n in packed:
        assert after[n].report == reports[n], n
        assert np.array_equal(after[n][...].view(np.uint32), values[n].view(np.uint32))


def test_runs_are_packed_as_they_lie_and_alike_tensors_left_alone_are_gathered():
    from qstream.engine.convert.pack_plan import plan_packs

    class T:
        def __init__(self, shape):
            self.shape, self.dtype = shape, np.dtype(np.float32)

    spec = QuantSpec(dtype="int8", axis=0)
    e, g = (T((16, 24)), spec), (T((8, 24)), spec)
    entries = [e, e, e, g, None, e, e, e, g, None, e, g, (T((8, 24)), QuantSpec(dtype="int4"))]
    assert plan_packs(entries, None) == [[0, 1, 2], [3, 8, 11], [5, 6, 7]]


def test_many_tensors_are_packed_by_default_and_few_are_not(tmp_path, monkeypatch):
    from qstream.engine.convert import convert_checkpoint as checkpoint

    _experts(tmp_path / "ck.safetensors")
    qs.convert_checkpoint(tmp_path / "ck.safetensors", tmp_path / "few")
    assert not (tmp_path / "few" / "_packs").exists()
    monkeypatch.setattr(checkpoint, "AUTO_PACK_TENSORS", 20)
    qs.convert_checkpoint(tmp_path / "ck.safetensors", tmp_path / "many")
    assert (tmp_path / "many" / "_packs").is_dir()
    assert qs.open_quantized(tmp_path / "many").meta["layout"] == "packed"


def test_from_64_tensors_a_checkpoint_is_packed_by_default(tmp_path):
    """Below the default count each tensor is a group of its own; from it, runs of alike
    tensors are packed (a few dozen tensors already cost more as groups than as packs), and
    read as the same values and reports as groups of their own."""
    from safetensors.numpy import save_file

    from qstream.engine.convert import convert_checkpoint as checkpoint

    assert checkpoint.AUTO_PACK_TENSORS == 64
    rng = np.random.default_rng(3)
    for count in (63, 64):
        x = {f"model.experts.{i:02d}.weight": rng.standard_normal((4, 8)).astype(np.float32)
             for i in range(count)}  # fmt: skip
        ck = tmp_path / f"{count}.safetensors"
        save_file(x, str(ck))
        qs.convert_checkpoint(ck, tmp_path / f"{count}")
        assert (tmp_path / f"{count}" / "_packs").is_dir() == (count == 64), count
        qs.convert_checkpoint(ck, tmp_path / f"{count}-groups", packs=False)
        got = qs.open_quantized(tmp_path / f"{count}")
        want = qs.open_quantized(tmp_path / f"{count}-groups")
        for n in x:
            assert np.array_equal(got[n].quantized(...), want[n].quantized(...)), n
            assert np.array_equal(got[n].scale, want[n].scale), n
            # (a pack lists its tensors' figures and worst channels, not the channel summary)
            brief, full = got[n].report["error"], want[n].report["error"]
            assert {k: full[k] for k in brief if k != "worst_channels"} == {
                k: v for k, v in brief.items() if k != "worst_channels"
            }, n
            pairs = zip(brief["worst_channels"], full["worst_channels"], strict=True)
            assert all(b == {k: f[k] for k in b} for b, f in pairs), n


def _grouped_output(tmp_path: Path, seed: int) -> tuple[dict[str, np.ndarray], Path, Path]:
    """80 small alike tensors (packed by today's default) converted one group per tensor
    (``packs=False``, as the default made them before 2026-11-26): (tensors, checkpoint,
    output)."""
    rng = np.random.default_rng(seed)
    x = {f"model.experts.{i:02d}.weight": rng.standard_normal((4, 8)).astype(np.float32)
         for i in range(80)}  # fmt: skip
    save_file(x, str(tmp_path / "ck.safetensors"))
    ck, root = tmp_path / "ck.safetensors", tmp_path / "out"
    qs.convert_checkpoint(ck, root, packs=False)
    return x, ck, root


def test_a_default_rerun_keeps_the_layout_of_an_earlier_run_of_the_job(tmp_path):
    """An output made one group per tensor (as the default made it below 512 tensors before
    2026-11-26) is found complete, or resumed, as it is by a default re-run; not refused."""
    x, ck, root = _grouped_output(tmp_path, 4)
    before = {n: qs.open_quantized(root)[n].quantized(...) for n in x}
    last = qs.open_quantized(root).key_of("model.experts.79.weight")
    qs.convert_checkpoint(ck, root)  # found complete (the default now packs 80 tensors)
    assert not (root / "_packs").exists()
    doc = json.loads((root / "zarr.json").read_text())
    doc["attributes"]["qstream_checkpoint"]["complete"] = False  # (as a killed run leaves it)
    (root / "zarr.json").write_text(json.dumps(doc))
    batch = sorted((root / "_index").glob("b*"))[-1]  # (its tensors: not listed, as if killed)
    shutil.rmtree(batch)
    shutil.rmtree(root / last)
    qs.convert_checkpoint(ck, root)  # resumed one group per tensor
    assert not (root / "_packs").exists()
    after = qs.open_quantized(root)
    assert after.meta.get("layout") != "packed"
    for n in x:
        assert np.array_equal(after[n].quantized(...), before[n]), n
    with pytest.raises(qs.StoreError, match="overwrite"):  # (asked for: another job)
        qs.convert_checkpoint(ck, root, packs=True)


def test_packs_in_flight_stay_within_the_memory_bound_however_many_workers(tmp_path, monkeypatch):
    """A machine with many cores has many default workers; the packs converted at once are
    still as many as ``max_memory`` holds (a block budget each), not one per worker."""
    import threading
    import time

    from qstream.budget import budget_units
    from qstream.engine.convert import pack_writer as packs
    from qstream.engine.run import executors, pipeline

    _four_to_a_pack(tmp_path / "ck.safetensors", 48)
    monkeypatch.setattr(pipeline, "default_workers", lambda: 32)
    monkeypatch.setattr(executors, "default_workers", lambda: 32)
    running, most, lock = [0], [0], threading.Lock()
    convert_pack = packs.convert_pack

    def counted(*args, **kwargs):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            time.sleep(0.05)  # (so that the packs the workers may take overlap)
            return convert_pack(*args, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(packs, "convert_pack", counted)
    qs.convert_checkpoint(
        tmp_path / "ck.safetensors", tmp_path / "p", packs=True, max_memory=1 << 20
    )
    assert len(list((tmp_path / "p" / "_packs").glob("p*"))) == 12
    assert 2 <= most[0] <= budget_units(1 << 20) == 4


def test_an_overwrite_takes_the_default_layout_not_the_earlier_runs(tmp_path):
    _, ck, root = _grouped_output(tmp_path, 5)
    assert not (root / "_packs").exists()
    qs.convert_checkpoint(ck, root, overwrite=True)  # (made again: the default packs 80)
    assert (root / "_packs").is_dir()
    assert qs.open_quantized(root).meta["layout"] == "packed"


def test_a_rerun_with_packs_turned_off_is_another_job(tmp_path):
    _experts(tmp_path / "ck.safetensors")
    qs.convert_checkpoint(tmp_path / "ck.safetensors", tmp_path / "p", packs=True)
    with pytest.raises(qs.StoreError, match="overwrite"):
        qs.convert_checkpoint(tmp_path / "ck.safetensors", tmp_path / "p", packs=False)
    r = qs.convert_checkpoint(tmp_path / "ck.safetensors", tmp_path / "p", packs=True)
    assert r["already_complete"]


def test_overwrite_removes_qstream_packs_and_keeps_foreign_files(tmp_path):
    _experts(tmp_path / "ck.safetensors")
    dst = tmp_path / "p"
    qs.convert_checkpoint(tmp_path / "ck.safetensors", dst, packs=True)
    (dst / "_packs" / "notes.txt").write_text("mine")
    (dst / "_packs" / "p999999").mkdir()
    (dst / "_packs" / "p999999" / "zarr.json").write_text('{"zarr_format": 3}')
    qs.convert_checkpoint(tmp_path / "ck.safetensors", dst, packs=False, overwrite=True)
    assert (dst / "_packs" / "notes.txt").read_text() == "mine"
    assert (dst / "_packs" / "p999999" / "zarr.json").exists()
    assert sorted(p.name for p in (dst / "_packs").iterdir()) == ["notes.txt", "p999999"]
    ck = qs.open_quantized(dst)
    assert not any("pack" in r for r in ck.tensors.values())


def test_nonfinite_values_in_a_pack_are_refused_naming_the_tensor(tmp_path):
    rng = np.random.default_rng(1)
    tensors = {f"e.{i}.weight": rng.standard_normal((8, 8)).astype(np.float32) for i in range(6)}
    tensors["e.3.weight"][2, 5] = np.nan
    save_file(tensors, str(tmp_path / "ck.safetensors"))
    with pytest.raises(qs.NonFiniteInputError, match=r"e\.3\.weight.*\(2, 5\)"):
        qs.convert_checkpoint(tmp_path / "ck.safetensors", tmp_path / "p", packs=True)


def test_crafted_pack_rows_are_refused(tmp_path):
    _experts(tmp_path / "ck.safetensors")
    dst = tmp_path / "p"
    qs.convert_checkpoint(tmp_path / "ck.safetensors", dst, packs=True)
    batch = next(p for p in sorted((dst / "_index").iterdir()) if p.is_dir())
    doc = json.loads((batch / "zarr.json").read_text())
    columns = doc["attributes"]["columns"]  # (a pack's rows: one list per key)
    name, pack = columns["name"][1], columns["pack"][1]
    for key, bad in (("pack", "../../x"), ("slot", 10_000), ("slot", "0"), ("pack", 7)):
        crafted = json.loads(json.dumps(doc))
        crafted["attributes"]["columns"][key][1] = bad
        (batch / "zarr.json").write_text(json.dumps(crafted))
        with pytest.raises(qs.StoreError, match="damaged"):  # (the path says "crafted")
            qs.open_quantized(dst)[name][...]
    crafted = json.loads(json.dumps(doc))
    crafted["attributes"]["columns"]["slot"].pop()
    (batch / "zarr.json").write_text(json.dumps(crafted))
    with pytest.raises(qs.StoreError, match=r"damaged"):
        qs.open_quantized(dst)
    (batch / "zarr.json").write_text(json.dumps(doc))
    data = dst / "_packs" / pack / "data" / "zarr.json"
    meta = json.loads(data.read_text())
    meta["shape"][0] = 1
    meta["chunk_grid"]["configuration"]["chunk_shape"][0] = 1
    data.write_text(json.dumps(meta))
    with pytest.raises(qs.StoreError, match="does not hold"):
        qs.open_quantized(dst)[name][...]


def test_a_crafted_spec_in_a_pack_is_refused_for_each_of_its_tensors(tmp_path):
    _experts(tmp_path / "ck.safetensors")
    dst = tmp_path / "p"
    qs.convert_checkpoint(tmp_path / "ck.safetensors", dst, packs=True)
    ck = qs.open_quantized(dst)
    packed = [n for n in ck if ck.tensors[n].get("pack") is not None]
    pack = ck.tensors[packed[0]]["pack"]
    names = [n for n in packed if ck.tensors[n]["pack"] == pack]
    doc_path = dst / "_packs" / pack / "zarr.json"
    doc = json.loads(doc_path.read_text())
    key = next(k for k in doc["attributes"] if isinstance(doc["attributes"][k], dict))
    for bad in ({"dtype": "int9"}, {"dtype": "int8", "axis": "x"}, "int8"):
        crafted = json.loads(json.dumps(doc))
        crafted["attributes"][key]["spec"] = bad
        doc_path.write_text(json.dumps(crafted))
        ck = qs.open_quantized(dst)  # (each pack's spec is parsed once, for all its tensors)
        for name in names[:2]:
            with pytest.raises(qs.StoreError, match="damaged or crafted"):
                ck[name]
    doc_path.write_text(json.dumps(doc))  # the pack's own spec: its tensors read again
    values = qs.open_quantized(dst)[names[0]][...]
    assert list(values.shape) == ck.tensors[names[0]]["shape"] and np.isfinite(values).all()


def test_packed_checkpoint_exports_and_restores_as_the_one_by_one_conversion(tmp_path):
    names = _experts(tmp_path / "ck.safetensors")
    for layout, packs in (("p", True), ("g", False)):
        qs.convert_checkpoint(tmp_path / "ck.safetensors", tmp_path / layout, packs=packs)
        (tmp_path / f"{layout}x").mkdir()
        qs.export_safetensors(tmp_path / layout, tmp_path / f"{layout}x" / "model.safetensors")
        qs.dequantize_store(tmp_path / layout, tmp_path / f"{layout}.restored")
    p, g = (
        _safetensors(tmp_path / "px" / "model.safetensors"),
        _safetensors(tmp_path / "gx" / "model.safetensors"),
    )
    assert p[1] == g[1]  # the tensors' bytes, then their entries and metadata
    jobs = [h["__metadata__"].pop("qstream_job") for h in (p[0], g[0])]
    assert jobs[0] != jobs[1]  # (the job names its source)
    assert p[0] == g[0]
    rp = zarr.open_group(str(tmp_path / "p.restored"), mode="r")
    rg = zarr.open_group(str(tmp_path / "g.restored"), mode="r")
    for n in names:
        assert np.asarray(rp[n][...]).tobytes() == np.asarray(rg[n][...]).tobytes(), n


def _safetensors(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def test_a_dask_conversion_writes_the_local_runs_packs(tmp_path):
    pytest.importorskip("distributed")
    from qstream.engine.run.dask import local_client

    _experts(tmp_path / "ck.safetensors")
    qs.convert_checkpoint(tmp_path / "ck.safetensors", tmp_path / "local", packs=True)
    with local_client(2):
        qs.convert_checkpoint(
            tmp_path / "ck.safetensors", tmp_path / "dask", packs=True, executor="dask"
        )
    assert _tree(tmp_path / "dask", packs_only=True) == _tree(tmp_path / "local", packs_only=True)
    assert json.dumps(qs.open_quantized(tmp_path / "dask").tensors) == json.dumps(
        qs.open_quantized(tmp_path / "local").tensors
    )


def _tree(root: Path, *, packs_only: bool = False) -> dict[str, bytes]:
    """Every file below ``root`` (the packs and the index, or all but the root's and the
    groups' documents, which carry timings) by its relative path."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if not p.is_file():
            continue
        if packs_only and not rel.startswith(("_packs/", "_index/")):
            continue
        out[rel] = p.read_bytes()
    return out


def _root_meta(root: Path) -> dict:
    """The root's own metadata (its document carries nothing that names the run)."""
    return json.loads((root / "zarr.json").read_text())["attributes"]["qstream_checkpoint"]


CHILD = KILL_HOOK + textwrap.dedent(
    """
    import json, sys
    import qstream as qs

    src, dst = sys.argv[1:3]
    r = qs.convert_checkpoint(src, dst, max_memory=1 << 20, packs=True)
    print(json.dumps({"rows": r["tensors"]}))
    print(json.dumps({"events": count[0]}))
    """
)


def _child(src, dst, kill_at=None):
    env = {**os.environ, "NUMBA_CACHE_DIR": os.environ.get("NUMBA_CACHE_DIR", "")}
    if kill_at is not None:
        env["KILL_AT"] = str(kill_at)
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(src), str(dst)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize("sweep", SWEEPS)
def test_sigkill_during_a_packed_conversion_then_rerun_gives_the_same_files(tmp_path, sweep):
    src = tmp_path / "ck.safetensors"
    _experts(src, layers=4, experts=12)
    ref = _child(src, tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr[-2000:]
    lines = ref.stdout.strip().splitlines()
    events = json.loads(lines[-1])["events"]
    want = _tree(tmp_path / "ref", packs_only=True)
    assert any(k.startswith("_packs/p") for k in want)
    rng = random.Random(7)
    every = {0, 1, events // 2, events - 2, events - 1, *rng.sample(range(events), 5)}
    for n in kill_points(sweep, every, {1, events // 2, events - 2}):
        d = tmp_path / f"k{n}"
        killed = _child(src, d, kill_at=n)
        assert killed.returncode == -signal.SIGKILL, (n, killed.stderr[-2000:])
        again = _child(src, d)
        assert again.returncode == 0, (n, again.stderr[-2000:])
        assert _tree(d, packs_only=True) == want, n
        assert _root_meta(d) == _root_meta(tmp_path / "ref"), n
        assert json.loads(again.stdout.splitlines()[0]) == json.loads(lines[0]), n
        assert not [p for p in d.rglob("*") if p.name.startswith(".qstream-tmp-")], n


def test_a_pack_read_in_place_is_the_files_bytes_and_never_writes_the_file(tmp_path):
    from qstream.errors import StoreError
    from qstream.io.checkpoints.open import map_file_run

    path = tmp_path / "run.bin"
    values = np.arange(3 * 5000, dtype=np.float32).reshape(3, 5000)
    raw = b"\x00" * 12 + values.tobytes()  # a run that starts off a page boundary
    path.write_bytes(raw)
    mapped = map_file_run(str(path), 12, (3, 5000), np.dtype(np.float32))
    assert mapped is not None and mapped.flags.c_contiguous and mapped.flags.writeable
    np.testing.assert_array_equal(mapped, values)
    mapped[0, 0] = -1.0  # (copy on write: the file keeps its bytes)
    assert path.read_bytes() == raw
    # a start not aligned for the type: left to positioned reads
    assert map_file_run(str(path), 10, (2,), np.dtype(np.float32)) is None
    assert map_file_run(str(path), 12, (0, 5000), np.dtype(np.float32)) is None
    with pytest.raises(StoreError, match="ended early"):
        map_file_run(str(path), 12, (4, 5000), np.dtype(np.float32))
