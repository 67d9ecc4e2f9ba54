"""The figures a pack lists for each of its tensors: error columns and calibration ranges.

A pack's tensors are one job's channels (or, blocked, one error pass each); their figures are
folded back per tensor from the job's per-channel sums, as columns of the pack's document
(:mod:`qstream.io.outputs.pack_layout`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...core import normalize_axis, plan_layout
from ...io.storage import float_column
from ...spec import ErrorStats, QuantSpec, RangeStats, merge_into
from ..blocks import block_errors_fused


def tensor_ranges(stats: RangeStats, n: int) -> dict[str, dict[str, str]]:
    """Each tensor's calibration range (its channels' finite min and max; 0 where none is
    finite), as columns ``min`` and ``max`` (:func:`~qstream.io.storage.columns.float_column`)."""
    lo = np.where(stats.count > 0, stats.min, np.inf).reshape(n, -1).min(axis=1)
    hi = np.where(stats.count > 0, stats.max, -np.inf).reshape(n, -1).max(axis=1)
    return {
        "min": float_column(np.where(np.isfinite(lo), lo, 0.0)),
        "max": float_column(np.where(np.isfinite(hi), hi, 0.0)),
    }


WORST = 5  # channels listed per tensor (worst SQNR first)


def brief_errors(errors: ErrorStats, n: int, worst: int = WORST) -> dict[str, Any]:
    """The error figures of ``n`` tensors from the per-channel sums ``errors`` (the tensors'
    channels one after another), as columns (one per figure, a value per tensor; floating
    point ones as :func:`~qstream.io.storage.columns.float_column`): the figures of
    :meth:`~qstream.spec.ErrorStats.summary` and, with several channels, the ``worst``
    channels by SQNR (``worst_channel``: a list per tensor; ``worst_sqnr_db`` and
    ``worst_max_abs``: their figures, the tensors' one after another); not the per-channel
    distribution. :func:`~qstream.io.outputs.pack_layout.decoded_columns` reads them as lists."""
    from ...spec.views import channel_sqnr

    def total(a: np.ndarray) -> np.ndarray:
        return a.reshape(n, -1).sum(axis=1)

    count = total(errors.count)
    x2, e2 = total(errors.sum_x2), total(errors.sum_e2)
    xy, y2 = total(errors.sum_xy), total(errors.sum_y2)
    clipped = total(errors.clipped)
    nan, pinf, ninf = total(errors.nan), total(errors.posinf), total(errors.neginf)
    with np.errstate(divide="ignore", invalid="ignore"):
        sqnr = np.where(e2 == 0, np.inf, np.where(x2 == 0, -np.inf, 10.0 * np.log10(x2 / e2)))
        mse = np.where(count > 0, e2 / np.maximum(count, 1), 0.0)
        denom = np.sqrt(x2 * y2)
        cosine = np.where(denom > 0, xy / denom, np.where((x2 == 0) & (y2 == 0), 1.0, 0.0))
        clip_fraction = np.where(count > 0, clipped / np.maximum(count, 1), 0.0)
    cols: dict[str, Any] = {
        "sqnr_db": float_column(sqnr),
        "mse": float_column(mse),
        "max_abs": float_column(errors.max_abs.reshape(n, -1).max(axis=1)),
        "cosine": float_column(cosine),
        "clipped": clipped.tolist(),
        "clip_fraction": float_column(clip_fraction),
        "nonfinite": (nan + pinf + ninf).tolist(),
        "count": count.tolist(),
        "nan": nan.tolist(),
        "posinf": pinf.tolist(),
        "neginf": ninf.tolist(),
    }
    channels = errors.count.size // max(n, 1)
    if channels > 1:
        sq = channel_sqnr(errors.sum_x2, errors.sum_e2).reshape(n, channels)
        order = np.argsort(sq, axis=1, kind="stable")[:, :worst]
        cols["worst_channel"] = order.tolist()
        cols["worst_sqnr_db"] = float_column(np.take_along_axis(sq, order, axis=1))
        mx = errors.max_abs.reshape(n, channels)
        cols["worst_max_abs"] = float_column(np.take_along_axis(mx, order, axis=1))
    return cols


def blocked_errors(
    x: np.ndarray, q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, spec: QuantSpec
) -> dict[str, Any]:
    """The blocked tensors' error columns: one error pass over each tensor."""
    assert spec.axis is not None  # (a blocked spec has an axis)
    qt = spec.qtype
    lo_q = qt.qrange(spec.narrow_range)[0]
    axis = normalize_axis(spec.axis, x.ndim - 1)
    layout = plan_layout(x.shape[1:], scale.shape[1:], axis, spec.block_size)
    total = ErrorStats.empty(x.shape[0])
    for i in range(x.shape[0]):
        err = block_errors_fused(x[i], q[i], scale[i], zero_point[i], layout, qt, lo_q, None)
        merge_into(total, err, i)
    return brief_errors(total, x.shape[0])
