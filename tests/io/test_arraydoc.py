"""Plain arrays' documents written without zarr-python (:mod:`qstream.io.storage.arraydoc`): the
same
JSON and chunk names as ``zarr.create_array``; everything else is left to zarr; a conversion
of a checkpoint of many small tensors runs with zarr-python never imported, and writes the
files a run with it writes."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file
from zarr.codecs import ZstdCodec
from zarr.storage import MemoryStore

from qstream.io.storage.arraydoc import auto_chunks, plain_array
from qstream.io.storage.localmeta import encode_doc

DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
DTYPES += ["float16", "float32", "float64", np.float32]
ENCODINGS = [None, {"name": "default", "separator": "."}, {"name": "default", "separator": "/"}]


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_plain_arrays_document_is_the_one_zarr_writes(dtype):
    cases = itertools.product(
        [None, "auto"], ENCODINGS, [False, True], [(7,), (256, 128), (3, 5, 7)], [0, 0.0, None]
    )
    for compressors, encoding, named, shape, fill in cases:
        kw = {"shape": shape, "chunks": tuple(max(1, n // 2) for n in shape), "dtype": dtype}
        kw["compressors"] = compressors
        if encoding is not None:
            kw["chunk_key_encoding"] = encoding
        if named:
            kw["dimension_names"] = [f"d{i}" for i in range(len(shape))]
        if fill is not None:
            kw["fill_value"] = fill
        got = plain_array(kw)
        assert got is not None, kw
        doc, files = got
        made = zarr.create_array(MemoryStore(), **kw)
        assert json.loads(doc) == json.loads(encode_doc(made.metadata)), kw
        coords = (1,) * len(shape)
        assert files.encode_key(coords) == made.metadata.encode_chunk_key(coords)
        assert files.chunks == made.chunks and files.dtype == np.dtype(dtype)


@pytest.mark.parametrize(
    "kw",
    [
        {"dtype": ml_dtypes.bfloat16},  # qstream's registered data type
        {"dtype": ">f4"},
        {"fill_value": 1},
        {"fill_value": float("nan")},
        {"compressors": [ZstdCodec(level=3)]},
        {"serializer": "packbits"},
        {"chunk_key_encoding": {"name": "v2", "separator": "."}},
        {"chunks": None},
        {"shape": (), "chunks": ()},
        {"attributes": {"a": 1}, "order": "F"},
    ],
)
def test_anything_else_is_left_to_zarr(kw):
    base = {"shape": (8, 4), "chunks": (8, 4), "dtype": "float32", "compressors": None}
    kw = {**base, **kw}
    if kw["chunks"] is None:
        del kw["chunks"]
    assert plain_array(kw) is None


@settings(max_examples=300, deadline=None)
@given(
    shape=st.lists(
        st.one_of(st.integers(0, 70_000), st.sampled_from([1 << 20, 3 << 19, 10**7])),
        max_size=4,
    ),
    dtype=st.sampled_from(["int8", "float16", "float32", "float64", "complex128"]),
)
def test_the_chunks_zarr_picks_when_given_none_are_auto_chunks(shape, dtype):
    made = zarr.create_array(MemoryStore(), shape=tuple(shape), dtype=dtype)
    assert auto_chunks(tuple(shape), np.dtype(dtype).itemsize) == made.chunks


def test_a_conversion_of_small_tensors_runs_without_zarr_and_writes_the_same_files(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        f"model.layers.{i}.mlp.down_proj.weight": rng.standard_normal((64, 32)) for i in range(40)
    }
    tensors.update(
        {f"model.layers.{i}.proj.weight": rng.standard_normal((48, 16)) for i in range(3)}
    )
    # kept as they are (1-D): one chunk each, and one of several chunks
    tensors.update({f"model.layers.{i}.norm.weight": rng.standard_normal(64) for i in range(3)})
    tensors["model.embed_scale"] = rng.standard_normal(300_000)
    save_file(
        {k: v.astype(np.float32) for k, v in tensors.items()}, str(tmp_path / "m.safetensors")
    )
    code = textwrap.dedent("""
        import importlib.abc, sys
        class NoZarr(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "zarr" or name.startswith("zarr."):
                    raise ImportError("zarr-python was imported")
        sys.meta_path.insert(0, NoZarr())
        import qstream as qs
        for compression in ("none", "auto"):
            for packs in (False, True):
                out = f"{sys.argv[2]}{compression}-{packs}"
                qs.convert_checkpoint(sys.argv[1], out, compression=compression, packs=packs)
        """)
    r = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "m.safetensors"), str(tmp_path / "free-")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    import qstream as qs

    for compression, packs in itertools.product(("none", "auto"), (False, True)):
        with_zarr = tmp_path / f"zarr-{compression}-{packs}"
        qs.convert_checkpoint(
            tmp_path / "m.safetensors", with_zarr, compression=compression, packs=packs
        )
        free = tmp_path / f"free-{compression}-{packs}"
        assert _tree(free) == _tree(with_zarr)
        out = qs.open_quantized(str(free))
        ref = qs.open_quantized(str(with_zarr))
        for name in tensors:
            np.testing.assert_array_equal(out[name][...], ref[name][...])
    packed = [p for p in (tmp_path / "free-auto-True" / "_packs").iterdir() if p.is_dir()]
    data = zarr.open_array(str(packed[0] / "data"))  # plain zarr reads what qstream wrote
    assert data.shape[0] > 1 and data.compressors
    small = zarr.open_array(
        str(tmp_path / "free-auto-False" / "model.layers.0.proj.weight" / "data")
    )
    assert small.shape == (48, 16) and small.compressors
    kept = zarr.open_array(str(tmp_path / "free-auto-True" / "model.embed_scale"))
    assert kept.chunks == auto_chunks(kept.shape, 4) != kept.shape
    np.testing.assert_array_equal(kept[...], tensors["model.embed_scale"].astype(np.float32))


def _tree(root: Path) -> dict[str, object]:
    """Every file below ``root``: chunk files' bytes; documents parsed, without the figures
    that name the run (its time and destination)."""
    out: dict[str, object] = {}
    for here, _, files in os.walk(root):
        for f in files:
            path = Path(here, f)
            rel = str(path.relative_to(root))
            if f != "zarr.json":
                out[rel] = path.read_bytes()
                continue
            doc = json.loads(path.read_bytes())
            report = doc.get("attributes", {}).get("qstream", {}).get("report")
            if isinstance(report, dict):
                report.pop("seconds", None)
                report.pop("destination", None)
            out[rel] = doc
    return out
