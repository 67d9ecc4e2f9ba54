"""A histogram method's per-channel ranges are searched by the worker that counted the block,
and a block read as one piece is counted and searched a group of channels at a time in one
reused histogram (``budget.HISTOGRAM_GROUP_BYTES``): the calibration, the codes, the
parameters and the report are those of all the block's channels at once, bit for bit, with
Numba's kernels and with their NumPy twins."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qstream import budget
from qstream.engine.jobs import QuantizeJob, calibrated_in_memory
from qstream.engine.run import InlineExecutor
from qstream.kernels.numpy_twins import using_numpy_kernels
from qstream.spec import QuantSpec


def _source(shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(11)
    x = rng.standard_t(3, shape) * rng.uniform(0.01, 20, (shape[0],) + (1,) * (len(shape) - 1))
    x[3] = 0.0  # a channel of zeros
    x[4] = 1.5  # of one value
    x[7].flat[::5] = np.nan  # with NaN among its values
    x[8].flat[1] = np.inf
    x[9] = np.nan  # a channel with no finite value
    return x.astype(np.float32)


def _run(x: np.ndarray, spec: QuantSpec, twins: bool) -> tuple[str, list[bytes]]:
    with using_numpy_kernels(twins):
        job = QuantizeJob(x, spec, executor=InlineExecutor(), compression="none")
        job.source.pinned = x
        try:
            cal, out = calibrated_in_memory(job)
        finally:
            job.close()
    arrays = [out.data, out.scale, out.zero_point, *vars(out.errors).values()]
    return json.dumps(cal.to_dict()), [np.asarray(a).tobytes() for a in arrays]


@pytest.mark.parametrize("twins", [True, False], ids=["numpy-twins", "kernels"])
@pytest.mark.parametrize(
    "spec_d",
    [
        {"method": "percentile", "percentile": 99.9},
        {"method": "percentile", "percentile": 99.0, "symmetric": False, "dtype": "uint8"},
        {"method": "entropy"},
        {"method": "mse", "num_bins": 512},
    ],
    ids=["percentile", "percentile-asymmetric", "entropy", "mse"],
)
@pytest.mark.parametrize(
    ("shape", "axis"),
    [((203, 96), 0), ((70, 6, 11), 0), ((40, 90), 1)],
    ids=["rows", "3-d", "columns"],  # (columns: channels not the rows, counted all at once)
)
def test_channels_searched_in_groups_give_the_ranges_of_all_at_once(
    monkeypatch, twins, spec_d, shape, axis
):
    spec = QuantSpec.from_dict(
        {"dtype": "int8", "axis": axis, "nan_policy": "zero_point", **spec_d}
    )
    x = _source(shape)
    monkeypatch.setattr(budget, "HISTOGRAM_GROUP_BYTES", 1 << 40)  # (every channel at once)
    whole = _run(x, spec, twins)
    # groups of 1, 7 and 64 channels: the last group of each shorter than the others
    for channels in (1, 7, 64):
        monkeypatch.setattr(budget, "HISTOGRAM_GROUP_BYTES", channels * spec.num_bins * 8)
        assert _run(x, spec, twins) == whole, channels


def test_a_block_of_several_pieces_is_counted_piece_by_piece_and_searched_whole(
    tmp_path, monkeypatch
):
    """A chunked source whose block holds several stored chunks of each channel: its
    histograms gather every piece before the search (no group searched on part of its
    values), the same ranges as the block read whole."""
    import zarr

    x = _source((64, 300))
    z = zarr.create_array(str(tmp_path / "x.zarr"), shape=x.shape, chunks=(64, 7), dtype="f4")
    z[...] = x
    spec = QuantSpec(
        dtype="int8", axis=0, method="percentile", percentile=99.0, nan_policy="zero_point"
    )
    monkeypatch.setattr(budget, "HISTOGRAM_GROUP_BYTES", spec.num_bins * 8)  # (a channel)
    with using_numpy_kernels(True):
        job = QuantizeJob(z, spec, executor=InlineExecutor(), compression="none")
        try:
            pieces = job.source.pieces(job.blocks[0].key)
            cal = job.calibration()
        finally:
            job.close()
    assert len(pieces) > 1
    assert json.loads(json.dumps(cal.to_dict())) == json.loads(_run(x, spec, True)[0])
