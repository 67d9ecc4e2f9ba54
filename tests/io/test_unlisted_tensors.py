"""What an interrupted conversion finished but had not listed is found without the source,
and a folder qstream did not write (a link planted in it) is passed over, not refused."""

from __future__ import annotations

import os

import numpy as np

import qstream as qs
from qstream.io.outputs.pack_layout import unlisted_tensors
from qstream.spec import Recipe


def test_a_folder_qstream_did_not_write_is_passed_over_when_finding_unlisted_tensors(tmp_path):
    x = np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32)
    qs.quantize_store(x, tmp_path / "done.zarr", qs.QuantSpec(dtype="int8"))
    root = tmp_path / "ck"
    (root / "extra").mkdir(parents=True)
    os.symlink(tmp_path / "done.zarr" / "zarr.json", root / "extra" / "zarr.json")
    (root / "other").mkdir()
    (root / "other" / "zarr.json").write_text("not json")
    assert unlisted_tensors(str(root), set()) == set()


def test_a_rule_matching_nothing_is_hinted_with_a_name_holding_its_plain_parts():
    class T:
        shape, dtype = (4, 4), np.dtype(np.float32)

    names = {"model.layers.0.attn.weight": T(), "model.layers.0.mlp.weight": T()}
    r = Recipe.from_dict({"rules": [{"pattern": "layers.*.mlp.*", "action": "keep"}]})
    (said,) = r.check(names)
    assert said.endswith("(names look like 'model.layers.0.mlp.weight')"), said
