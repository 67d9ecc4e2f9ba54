"""Metadata documents qstream writes itself on a local disk (``qstream.io.storage.localmeta``): the
same documents zarr writes (arrays' byte for byte; groups' compact, without zarr's indents),
never replacing a node that exists, readable by zarr at once."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

import qstream as qs
from qstream.io.outputs import qarray
from qstream.io.outputs.progress_log import ProgressLog
from qstream.io.zarr_types.zarr_ext import PackBits
from qstream.qtypes import qtype

MEMBERS = {
    "data": {
        "shape": (64, 256),
        "chunks": (16, 256),
        "dtype": qtype("uint4").dtype,
        "serializer": PackBits(),
        "fill_value": 0,
        "compressors": zarr.codecs.ZstdCodec(level=3),
        "config": qarray.WRITE_ALL_CHUNKS,
        "chunk_key_encoding": qarray.FLAT_KEYS,
        "dimension_names": ["dim_0", "dim_1"],
    },
    "scale": {
        "shape": (64, 2),
        "chunks": (16, 2),
        "dtype": np.float16,
        "fill_value": 0,
        "compressors": None,
        "chunk_key_encoding": qarray.FLAT_KEYS,
        "dimension_names": ["dim_0", "block_1"],
    },
    ProgressLog.NAME: ProgressLog.array_spec(3, 8),
}


def _docs(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("zarr.json"))}


def test_documents_are_the_bytes_zarr_itself_writes(tmp_path):
    ours, theirs = tmp_path / "ours.zarr", tmp_path / "theirs.zarr"
    attrs = {"qstream": {"ready": False, "spec": {"dtype": "uint4", "block_size": 128}}}
    group = qarray.create_group(str(ours), attrs)
    arrays = qarray.create_arrays(group, MEMBERS)
    ref = zarr.create_group(str(theirs), attributes=attrs, zarr_format=3)
    for name, kw in MEMBERS.items():
        ref.create_array(name, **kw)
    a, b = _docs(ours), _docs(theirs)
    assert json.loads(a.pop("zarr.json")) == json.loads(b.pop("zarr.json"))  # groups: compact
    assert a == b  # arrays: byte for byte
    assert sorted(_docs(ours)) == [
        "_progress/zarr.json",
        "data/zarr.json",
        "scale/zarr.json",
        "zarr.json",
    ]
    # the returned objects work, and what they write zarr reads back
    arrays["scale"][...] = np.arange(128, dtype=np.float16).reshape(64, 2)
    x = np.random.default_rng(0).integers(0, 16, (64, 256)).astype(np.uint8)
    arrays["data"][...] = x
    back = zarr.open_group(str(ours), mode="r")
    np.testing.assert_array_equal(back["data"][...], x)
    np.testing.assert_array_equal(back["scale"][...].reshape(-1), np.arange(128))
    assert arrays["data"].config.write_empty_chunks is True  # the config keyword applies


def test_an_attribute_update_replaces_the_whole_document_and_the_open_group_sees_it(tmp_path):
    path = tmp_path / "g.zarr"
    group = qarray.create_group(str(path), {"qstream": {"ready": False}, "other": 1})
    qarray.set_meta(group, {"ready": True, "n": [1, 2]})
    on_disk = json.loads((path / "zarr.json").read_text())
    assert on_disk["attributes"] == {"qstream": {"ready": True, "n": [1, 2]}, "other": 1}
    assert group.attrs["qstream"] == {"ready": True, "n": [1, 2]}
    assert zarr.open_group(str(path), mode="r").attrs.asdict() == on_disk["attributes"]
    assert [p.name for p in path.iterdir()] == ["zarr.json"]  # no temporary file stays


def test_a_new_node_never_replaces_a_document_that_exists(tmp_path):
    path = tmp_path / "g.zarr"
    group = qarray.create_group(str(path), {"qstream": {}})
    (path / "scale").mkdir()
    foreign = b'{"zarr_format": 3, "node_type": "array", "someone": "else"}'
    (path / "scale" / "zarr.json").write_bytes(foreign)
    with pytest.raises(qs.StoreError, match="created by another process"):
        qarray.create_arrays(group, MEMBERS)
    assert (path / "scale" / "zarr.json").read_bytes() == foreign
    assert not list(path.rglob("*.partial"))
    with pytest.raises(qs.StoreError, match="created by another process"):
        qarray.create_group(str(path), {"qstream": {}})  # nor a group over a group
    assert json.loads((path / "zarr.json").read_text())["attributes"] == {"qstream": {}}


def test_attributes_set_on_one_output_never_reach_the_next_one_made_from_the_same_spec(
    tmp_path,
):
    first = qarray.create_arrays(qarray.create_group(str(tmp_path / "a.zarr"), {}), MEMBERS)
    first[ProgressLog.NAME].attrs.update({"written": "later"})  # zarr updates in place
    second = qarray.create_arrays(qarray.create_group(str(tmp_path / "b.zarr"), {}), MEMBERS)
    assert "written" not in second[ProgressLog.NAME].attrs
    doc = json.loads((tmp_path / "b.zarr" / ProgressLog.NAME / "zarr.json").read_text())
    assert doc["attributes"] == {"channels": 3, "worst_groups": 8}
