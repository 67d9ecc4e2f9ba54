"""The SQNR table's "without the imatrix" figures of a GGUF export: the weighted tensor's
baseline rows (every ``rows // 256``-th) quantized again without the importance weights, the
file's values compared on the same rows (``gain_db``), the same figures whatever the slab
size, and every row of a tensor of fewer than 512 rows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qstream.compat.gguf import dequantize, quantize
from qstream.exports.gguf.tensors import BASELINE_ROWS, ErrorSums, float_tensor


def _weighted_sqnr(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    x, y, w = (np.asarray(v, np.float64) for v in (x, y, w))
    return 10 * math.log10(float((w * x * x).sum()) / float((w * (x - y) ** 2).sum()))


def _export_errors(x: np.ndarray, w: np.ndarray, gtype: str, slab_bytes: int) -> dict:
    errors = ErrorSums()
    t = float_tensor("blk.0.ffn_down.weight", x, gtype, None, slab_bytes, errors, imatrix=w)
    for r0 in range(0, t.rows, t.step):
        t.read(r0, min(t.rows, r0 + t.step))
    return errors.summary()


@pytest.mark.parametrize(("rows", "gtype"), [(1100, "Q4_K"), (300, "Q4_K"), (777, "Q3_K")])
def test_the_baseline_is_the_strided_rows_quantized_without_the_imatrix(rows, gtype):
    rng = np.random.default_rng(rows)
    x = (rng.standard_t(5, (rows, 512)) * 0.02).astype(np.float32)
    w = rng.lognormal(0, 1.5, 512).astype(np.float32)
    stride = max(1, rows // BASELINE_ROWS)
    picked = x[::stride]
    plain = dequantize(quantize(picked, gtype), gtype, picked.shape)
    weighted = dequantize(quantize(x, gtype, imatrix=w), gtype, x.shape)[::stride]
    reports = [_export_errors(x, w, gtype, b) for b in (512 * 4 * 7, 512 * 4 * 64, 1 << 24)]
    for e in reports:
        base = e["without_imatrix"]
        assert base["rows"] == len(picked) and base["of_rows"] == rows
        assert base["count"] == picked.size
        assert base["weighted_sqnr_db"] == pytest.approx(_weighted_sqnr(picked, plain, w), 1e-12)
        gain = _weighted_sqnr(picked, weighted, w) - _weighted_sqnr(picked, plain, w)
        assert base["gain_db"] == pytest.approx(gain, abs=1e-9)
        assert base["gain_db"] > 0  # (llama.cpp's weighted search lowers the weighted error)
    # the same bits whatever the slab size (rows picked by their index in the tensor)
    assert reports[0] == reports[1] == reports[2]
    if rows < 2 * BASELINE_ROWS:  # every row: the full tensor's figures
        assert reports[0]["without_imatrix"]["rows"] == rows


def test_a_tensor_without_importance_weights_has_no_baseline():
    x = np.random.default_rng(0).standard_normal((600, 256)).astype(np.float32)
    errors = ErrorSums()
    t = float_tensor("blk.0.ffn_down.weight", x, "Q4_K", None, 1 << 20, errors)
    t.read(0, t.rows)
    assert "without_imatrix" not in errors.summary()
