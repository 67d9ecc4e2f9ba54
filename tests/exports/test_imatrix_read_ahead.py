"""Importance-matrix sums read the next block in a thread while this one is squared: the
same bytes as one block at a time, and the two blocks held stay under the memory bound."""

from __future__ import annotations

import numpy as np
import pytest

from qstream.exports.gguf import importance

zarr = pytest.importorskip("zarr")


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    """A 32 MiB float32 array in 1,024-row storage chunks, with some float16-sized and huge
    values (the row order of their squares' sum shows in the bits)."""
    rng = np.random.default_rng(11)
    path = tmp_path_factory.mktemp("ahead") / "acts.zarr"
    arr = zarr.open_group(str(path), mode="w").create_array(
        "x", shape=(8192, 1024), dtype="f4", chunks=(1024, 1024), compressors=None
    )
    for r in range(0, 8192, 2048):
        v = rng.standard_normal((2048, 1024)) * rng.choice([1e-3, 1.0, 1e12], (2048, 1024))
        arr[r : r + 2048] = v.astype(np.float32)
    return arr


def test_read_ahead_sums_equal_one_block_at_a_time(dump):
    """A bound under which two blocks fit in its quarter reads ahead; a smaller one does not;
    both give the row-by-row float64 sum's bytes."""
    x = dump[:]
    want = np.zeros(1024)
    for r in range(0, 8192, 512):  # (row by row: NumPy's reduction along the rows)
        rows = np.concatenate([want[None], x[r : r + 512].astype(np.float64) ** 2])
        want = np.add.reduce(rows, axis=0)
    for bound in (256 << 20, 16 << 20):
        sums, count = importance.square_sums(dump, bound)
        assert count == 8192 and sums.tobytes() == want.tobytes()


def test_read_ahead_holds_two_blocks_at_most(dump, monkeypatch):
    """With reads of one storage chunk (4 MiB) and a 32 MiB bound (two blocks just fit in its
    quarter), the traced peak (the two blocks, Zarr's copies while one is read, the squares'
    scratch) stays under half the bound, whatever the order in which the reading thread and
    the squares finish."""
    import tracemalloc

    monkeypatch.setattr(importance, "READ_BYTES", 4 << 20)
    importance.square_sums(dump[:4], 1 << 20)
    bound = 32 << 20
    tracemalloc.start()
    try:
        importance.square_sums(dump, bound)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= bound // 2


@pytest.mark.parametrize("read_bytes", [16 << 20, 512 * 96 * 4])
def test_chunk_files_read_directly_give_zarrs_values_with_missing_chunks_as_fill(
    tmp_path, monkeypatch, read_bytes
):
    """A local array's chunk files are read straight into reused buffers: the sums of what
    zarr itself reads (a chunk never written reads as the fill value; a partial last chunk;
    float16 values widened), whether the blocks are read ahead or not."""
    monkeypatch.setattr(importance, "READ_BYTES", read_bytes)  # (small: read ahead)
    rng = np.random.default_rng(3)
    group = zarr.open_group(str(tmp_path / "acts.zarr"), mode="w")
    for dtype, fill in (("f4", 0.0), ("f2", 1.5)):
        arr = group.create_array(dtype, shape=(5000, 96), dtype=dtype, chunks=(512, 96),
                                 compressors=None, fill_value=fill)  # fmt: skip
        arr[:1024] = rng.standard_normal((1024, 96)).astype(dtype)
        arr[2048:] = rng.standard_normal((2952, 96)).astype(dtype)  # (1024:2048 never written)
        assert importance.chunk_files(arr) is not None
        values = arr[:]
        for bound in (64 << 20, 4 << 20, 1 << 20):
            got, n = importance.square_sums(arr, bound)
            want, _ = importance.square_sums(values, bound)
            assert n == 5000 and got.tobytes() == want.tobytes()
        assert float(want[0]) > 1024 * fill * fill
