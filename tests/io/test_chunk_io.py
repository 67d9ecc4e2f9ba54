"""Direct chunk I/O (qstream.io.storage.chunks) against zarr itself: what it writes zarr reads back,
what zarr wrote it reads, and every layout it does not reproduce is left to zarr."""

import os
import threading
from dataclasses import fields

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

from qstream.budget import Block, plan_blocks
from qstream.engine.run import pipeline
from qstream.errors import StoreError
from qstream.io.outputs.progress_log import ProgressLog
from qstream.io.storage import chunks as chunk_io
from qstream.io.storage.chunkcodecs import ZstdFrames, decode_bounded
from qstream.io.storage.chunks import chunk_files
from qstream.io.storage.stores import ArrayWriter, open_source
from qstream.spec import ErrorStats, WorstGroups

SHAPE, CHUNKS = (50, 37), (16, 10)  # edge chunks on both axes

LAYOUTS = {
    "v3-raw": {"compressors": None},
    "v3-zstd": {"compressors": ZstdCodec(level=3)},
    "v3-gzip": {"compressors": GzipCodec(level=5)},
    "v3-blosc": {"compressors": BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle")},
    "v3-flat-keys": {
        "compressors": None,
        "chunk_key_encoding": {"name": "default", "separator": "."},
    },
    "v2-raw": {"zarr_format": 2, "compressors": None},
    "v2-zstd": {"zarr_format": 2, "compressors": numcodecs.Zstd(level=1)},
    "v2-blosc": {"zarr_format": 2, "compressors": numcodecs.Blosc()},
}


def _array(path, layout, dtype="float32", fill_value=0.5, **kw):
    return zarr.create_array(
        str(path),
        shape=SHAPE,
        chunks=CHUNKS,
        dtype=dtype,
        fill_value=fill_value,
        overwrite=True,
        **{**LAYOUTS[layout], **kw},
    )


def _data(dtype="float32"):
    return np.random.default_rng(0).standard_normal(SHAPE).astype(dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_reads_what_zarr_wrote_including_missing_chunks(tmp_path, layout):
    a = _array(tmp_path / "a.zarr", layout)
    x = _data()
    a[:32] = x[:32]  # rows 32.. never written: zarr reads the fill value
    files = chunk_files(a)
    assert files is not None
    want = a[...]
    for region in [
        (slice(0, 50), slice(0, 37)),
        (slice(3, 41), slice(7, 30)),
        (slice(48, 50), slice(36, 37)),
    ]:
        out = np.empty(tuple(s.stop - s.start for s in region), np.float32)
        files.read(region, out)
        np.testing.assert_array_equal(out, want[region])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_zarr_reads_what_direct_writes_wrote(tmp_path, layout):
    a = _array(tmp_path / "a.zarr", layout)
    x = _data()
    writer = ArrayWriter(a)
    assert writer.files is not None
    for b in plan_blocks(SHAPE, CHUNKS):  # edge chunks included (padded with the fill value)
        writer[b.key] = np.ascontiguousarray(x[b.key])
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"))[...], x)
    assert not [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".partial")]


def test_writes_must_cover_whole_chunks(tmp_path):
    files = chunk_files(_array(tmp_path / "a.zarr", "v3-raw"))
    with pytest.raises(ValueError, match="not aligned"):
        files.write((slice(0, 8), slice(0, 37)), np.zeros((8, 37), np.float32))


def test_uncompressed_chunks_map_without_a_copy(tmp_path):
    a = _array(tmp_path / "a.zarr", "v3-raw")
    x = _data()
    a[...] = x
    src = open_source(str(tmp_path / "a.zarr"))
    v = src.view((slice(16, 32), slice(10, 20)))  # exactly one stored chunk
    np.testing.assert_array_equal(v, x[16:32, 10:20])
    assert v.flags.c_contiguous and v.flags.writeable  # a private mapping: plain arrays
    assert src.view((slice(10, 20), slice(0, 10))) is None  # spans two chunks
    pieces = src.pieces((slice(10, 40), slice(5, 25)))
    assert pieces[0] == (slice(10, 16), slice(5, 10)) and len(pieces) == 9
    zstd = _array(tmp_path / "z.zarr", "v3-zstd")
    zstd[...] = x
    assert open_source(str(tmp_path / "z.zarr")).view((slice(0, 16), slice(0, 10))) is None


@pytest.mark.parametrize(
    "make",
    [
        lambda p: zarr.create_array(
            str(p), shape=SHAPE, chunks=(8, 10), shards=(16, 20), dtype="f4"
        ),
        lambda p: zarr.create_array(
            str(p),
            shape=SHAPE,
            chunks=CHUNKS,
            dtype="f4",
            filters=[zarr.codecs.TransposeCodec(order=(1, 0))],
        ),
        lambda p: zarr.create_array(str(p), shape=SHAPE, chunks=CHUNKS, dtype=">f4", zarr_format=2),
        lambda p: zarr.create_array(
            str(p),
            shape=SHAPE,
            chunks=CHUNKS,
            dtype="f4",
            zarr_format=2,
            filters=[numcodecs.Shuffle(elementsize=4)],
        ),
        lambda p: zarr.create_array(
            str(p), shape=SHAPE, chunks=CHUNKS, dtype="f4", zarr_format=2, order="F"
        ),
        lambda p: zarr.create_array(
            zarr.storage.MemoryStore(), shape=SHAPE, chunks=CHUNKS, dtype="f4"
        ),
    ],
    ids=["sharded", "transpose", "big-endian", "v2-filters", "v2-F-order", "memory-store"],
)
def test_layouts_it_does_not_reproduce_are_left_to_zarr(tmp_path, make):
    a = make(tmp_path / "a.zarr")
    assert chunk_files(a) is None
    x = _data()
    a[...] = x
    src = open_source(a)
    np.testing.assert_array_equal(src.read((slice(3, 41), slice(7, 30))), x[3:41, 7:30])


def test_corrupt_chunks_are_named(tmp_path):
    for layout in ("v3-raw", "v3-zstd"):
        a = _array(tmp_path / f"{layout}.zarr", layout)
        a[...] = _data()
        files = chunk_files(a)
        path = os.path.join(files.root, files.encode_key((1, 1)))
        with open(path, "r+b") as f:
            f.truncate(7)
        with pytest.raises(StoreError, match=r"corrupt chunk .*c/1/1"):
            files.read((slice(16, 32), slice(10, 20)), np.empty((16, 10), np.float32))


def test_direct_io_falls_back_where_the_file_system_refuses_it(tmp_path, monkeypatch):
    a = zarr.create_array(
        str(tmp_path / "a.zarr"), shape=(512, 1024), chunks=(256, 1024), dtype="f4"
    )
    files = chunk_files(a)
    assert files.direct  # the default
    real_open = os.open

    def refusing(path, flags, *args, **kwargs):
        if flags & os.O_DIRECT:
            raise OSError(22, "Invalid argument")  # as a file system without O_DIRECT
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(chunk_io.os, "open", refusing)
    x = np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024)  # 1 MiB chunks
    files.write((slice(0, 512), slice(0, 1024)), x)
    assert files.direct is False  # turned off, written through the page cache
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"))[...], x)


def test_direct_writes_of_unaligned_lengths_and_buffers(tmp_path, monkeypatch):
    monkeypatch.setattr(chunk_io, "DIRECT_MIN", 1)
    a = zarr.create_array(
        str(tmp_path / "a.zarr"),
        shape=(1001, 777),
        chunks=(1001, 777),
        dtype="i1",
        compressors=None,
    )
    files = chunk_files(a)
    files.direct = True
    x = np.random.default_rng(1).integers(-128, 127, (1001, 777), dtype=np.int8)
    backing = np.empty(x.nbytes + 1, np.int8)[1:]  # deliberately not 4 KiB aligned
    backing[:] = x.reshape(-1)
    files.write((slice(0, 1001), slice(0, 777)), backing.reshape(x.shape))
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"))[...], x)


@pytest.mark.parametrize("where", ["local", "memory"])
def test_progress_snapshot_round_trips_and_replaces_its_chunk_whole(tmp_path, where):
    store = str(tmp_path / "g.zarr") if where == "local" else zarr.storage.MemoryStore()
    group = zarr.open_group(store=store, mode="w")
    spec = ProgressLog.array_spec(5, WorstGroups.KEEP)
    log = ProgressLog(group.create_array(ProgressLog.NAME, **spec))
    assert log.array.nchunks_initialized == 0  # no snapshot yet: reads as "nothing landed"
    done, empty, none_worst = log.load()
    assert done == 0 and none_worst.index.size == 0 and empty.count.tolist() == [0] * 5
    rng = np.random.default_rng(1)
    stats = ErrorStats(
        *(
            rng.integers(0, 2**50, 5) if f.name in ErrorStats.INTS else rng.random(5)
            for f in fields(ErrorStats)
        )
    )
    worst = WorstGroups.of([3.5, -1.0, 7.25], [40, 2**40, 7], [0.5, 0.25, 0.125])
    log.save(17, stats, worst)
    done, back, worst_back = ProgressLog.open(group).load()
    assert done == 17
    for f in fields(WorstGroups):
        np.testing.assert_array_equal(getattr(worst_back, f.name), getattr(worst, f.name))
    assert worst_back.index.tolist() == [2**40, 40, 7]
    for f in fields(ErrorStats):
        np.testing.assert_array_equal(getattr(back, f.name), getattr(stats, f.name))
        assert getattr(back, f.name).dtype == getattr(stats, f.name).dtype
    if where == "local":  # one chunk file, replaced by a rename: no temporary file stays
        files = os.listdir(tmp_path / "g.zarr" / "_progress" / "c")
        assert files == ["0"]


def test_pipeline_merges_in_block_order_and_stops_at_the_first_error():
    blocks = [Block(i, (slice(i, i + 1),)) for i in range(40)]
    seen = []

    def work(b):
        if b.index % 5 == 0:  # uneven work: later blocks often finish first
            threading.Event().wait(0.002)
        return b.index

    pipeline.run(blocks, work, lambda b, r: seen.append(r), workers=4, inflight=6)
    assert seen == list(range(40))

    def failing(b):
        if b.index == 9:
            raise RuntimeError("block 9")
        return b.index

    merged = []
    with pytest.raises(RuntimeError, match="block 9"):
        pipeline.run(blocks, failing, lambda b, r: merged.append(r), workers=3)
    assert merged == list(range(9))


@pytest.mark.parametrize("level", [0, 1, 3, -5, 19])
@pytest.mark.parametrize("checksum", [False, True])
def test_zstd_frames_are_the_frames_numcodecs_writes_and_reads(level, checksum):
    import zstandard
    from numcodecs import zstd as numcodecs_zstd

    rng = np.random.default_rng(level + 40)
    for x in (  # (no empty chunk: zarr writes none, and numcodecs cannot read its own)
        np.zeros(1, np.uint8),
        (rng.standard_normal(5000) * 30).astype(np.int8),
        rng.standard_normal((300, 7)).astype(np.float32),
    ):
        ours = ZstdFrames(level, checksum)
        theirs = numcodecs.Zstd(level=level, checksum=checksum)
        frame = ours.encode(x)
        major, minor, micro = zstandard.ZSTD_VERSION
        same_lib = major * 10000 + minor * 100 + micro == numcodecs_zstd.VERSION_NUMBER
        if same_lib:  # (the same libzstd makes the same bytes)
            assert frame == theirs.encode(x)
        back = np.empty_like(x)
        theirs.decode(frame, out=back)
        assert back.tobytes() == x.tobytes()
        back[...] = 1
        ours.decode(theirs.encode(x), out=back)
        assert back.tobytes() == x.tobytes()
        assert ours.decode(frame) == x.tobytes()


def test_zstd_frames_refuse_a_frame_of_another_size_or_none_declared():
    import zstandard

    x = np.arange(100, dtype=np.int32)
    frame = ZstdFrames().encode(x)
    with pytest.raises(StoreError, match="declares 400 bytes, not 396"):
        ZstdFrames().decode(frame, out=np.empty(99, np.int32))
    streamed = zstandard.ZstdCompressor().compressobj()  # (a stream: no content size)
    unsized = streamed.compress(x.tobytes()) + streamed.flush()
    for bad in (unsized, b"garbage!", frame[:3]):
        with pytest.raises(StoreError, match="does not declare its size"):
            ZstdFrames().decode(bad, out=np.empty(100, np.int32))
        flat = np.zeros(400, np.uint8)
        with pytest.raises(StoreError, match="does not declare its size"):
            decode_bounded(ZstdFrames(), np.frombuffer(bad, np.uint8), flat)
    flat = np.zeros(400, np.uint8)
    assert decode_bounded(ZstdFrames(), np.frombuffer(frame, np.uint8), flat) == 400
    assert flat.view(np.int32).tolist() == x.tolist()
    assert decode_bounded(ZstdFrames(), np.frombuffer(frame, np.uint8), flat[:10]) == 400


def test_corrupt_chunks_of_qstreams_own_zstd_frames_are_named(tmp_path):
    import dataclasses

    from qstream.io.storage import plain_array

    x = np.random.default_rng(5).standard_normal((32, 20)).astype(np.float32)
    kw = {"shape": x.shape, "chunks": (16, 10), "dtype": "float32", "compressors": "auto"}
    _, files = plain_array(kw)
    assert isinstance(files.codec, ZstdFrames)
    root = tmp_path / "a"
    root.mkdir()
    files = dataclasses.replace(files, root=str(root), atomic=False)
    files.write((slice(0, 32), slice(0, 20)), x, made={str(root)})
    back = np.empty_like(x)
    files.read((slice(0, 32), slice(0, 20)), back)
    assert back.tobytes() == x.tobytes()
    path = root / files.encode_key((1, 1))
    good = path.read_bytes()
    other = ZstdFrames().encode(x[:8, :10].copy())  # (a whole frame, of half the chunk's bytes)
    # cut in its header, cut in its block, of another size, not zstd (a block's bytes changed
    # in place decode to other values: zarr's frames carry no checksum, numcodecs' reads them too)
    for bad in (good[:7], good[:-5], other, b"not a frame at all"):
        path.write_bytes(bad)
        with pytest.raises(StoreError, match=r"corrupt chunk .*c.1.1"):
            files.read((slice(16, 32), slice(10, 20)), np.empty((16, 10), np.float32))
