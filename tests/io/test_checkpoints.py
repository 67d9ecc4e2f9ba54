"""Checkpoint readers: every format read whole and by slices, bit-exactly and lazily; errors."""

import json
import struct
import sys
import zipfile

import ml_dtypes
import numpy as np
import pytest
import zarr
from safetensors import safe_open
from safetensors.numpy import save_file as save_numpy

from qstream.errors import StoreError
from qstream.io.checkpoints.open import CheckpointTensor, open_checkpoint

# the tensors are made with torch (on Python 3.12, .ci/run's second leg, the test extras have no
# torch: PyPI's wheels for it are multi-GB CUDA builds)
torch = pytest.importorskip("torch")
from safetensors.torch import save_file as save_torch  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
KEYS = [
    (),
    (...,),
    1,
    -1,
    (slice(1, 3),),
    (..., 2),
    (slice(None, None, -2), slice(1, None)),
    (0, slice(4, 1, -1)),
    (slice(2, 2),),
    (np.int64(2), 3),
]


def _np(t: torch.Tensor) -> np.ndarray:
    """A torch tensor as NumPy, bf16 as ml_dtypes.bfloat16."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    return t.numpy()


def _assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert type(got) is np.ndarray and got.flags.c_contiguous
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()


def _check(t: CheckpointTensor, want: np.ndarray, keys=KEYS) -> None:
    """Shape, dtype, size and every key of ``keys`` (those valid for ``want``) bit-exactly."""
    assert (t.shape, t.dtype, t.ndim, t.size) == (want.shape, want.dtype, want.ndim, want.size)
    assert t.nbytes == want.nbytes
    _assert_same(t[...], want)
    for key in keys:
        try:
            expected = want[key]
        except IndexError:
            continue
        _assert_same(t[key], np.asarray(expected))


@pytest.fixture
def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(6, 8, generator=g),
        "layers.0.attn.q": torch.randn(5, 7, generator=g).to(torch.float16),
        "layers.0.mlp.up": torch.randn(4, 6, 3, generator=g).to(torch.bfloat16),
        "layers.0.norm": torch.randn(9, generator=g, dtype=torch.float64),
        "position_ids": torch.arange(12, dtype=torch.int64).reshape(3, 4),
        "mask": torch.rand(4, 4, generator=g) > 0.5,
        "scale": torch.tensor(0.5, dtype=torch.bfloat16),
        "empty": torch.zeros(0, 3),
    }


def _st_file(path, header: dict, data: bytes = b"", *, length: int | None = None):
    """Hand-built safetensors bytes (for corrupt files)."""
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


# -- safetensors -----------------------------------------------------------------------------


def test_safetensors_torch_writer(tmp_path, tensors):
    path = tmp_path / "model.safetensors"
    save_torch(tensors, str(path), metadata={"format": "pt"})
    ckpt = open_checkpoint(path)
    assert set(ckpt) == set(tensors)
    for name, t in tensors.items():
        _check(ckpt[name], _np(t))
    assert ckpt["layers.0.mlp.up"].dtype == BF16


def test_safetensors_numpy_writer(tmp_path):
    rng = np.random.default_rng(1)
    arrays = {
        "w": rng.standard_normal((7, 5)).astype(np.float32),
        "h": rng.standard_normal((3, 9)).astype(np.float16),
        "d": rng.standard_normal((4, 4)),
        "i8": rng.integers(-128, 127, (3, 5), dtype=np.int8),
        "u8": rng.integers(0, 255, (3, 5), dtype=np.uint8),
        "i16": rng.integers(-9, 9, (2, 5), dtype=np.int16),
        "i32": rng.integers(-9, 9, (2, 5), dtype=np.int32),
    }
    path = tmp_path / "np.safetensors"
    save_numpy(arrays, str(path))
    ckpt = open_checkpoint(str(path))
    for name, a in arrays.items():
        _check(ckpt[name], a)


def test_safetensors_slices_are_lazy_memmap_views(tmp_path):
    # A 64 MiB tensor in a sparse file: opening and slicing map it, never read it whole.
    path = tmp_path / "big.safetensors"
    n = 64 * 2**20
    header = json.dumps(
        {"big": {"dtype": "F32", "shape": [n // 4096, 1024], "data_offsets": [0, n]}}
    )
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header.encode())
        f.truncate(8 + len(header) + n)
        f.seek(8 + len(header) + 5 * 4096)
        f.write(np.arange(1024, dtype="<f4").tobytes())
    t = open_checkpoint(path)["big"]
    mapped = t.source[...]  # (viewed when indexed)
    assert isinstance(mapped, np.memmap) and mapped.filename == str(path)
    row = t[5]
    assert not np.shares_memory(row, mapped)
    np.testing.assert_array_equal(row, np.arange(1024, dtype=np.float32))
    assert t[5:7, :3].nbytes == 24


def test_safetensors_bf16_memmap(tmp_path, tensors):
    path = tmp_path / "m.safetensors"
    save_torch(tensors, str(path))
    t = open_checkpoint(path)["layers.0.mlp.up"]
    mapped = t.source[...]
    assert isinstance(mapped, np.memmap) and mapped.dtype == BF16 and t.source.dtype == BF16


def _save_sharded(tmp_path, tensors, names_by_shard: dict[str, list[str]]):
    weight_map = {}
    for shard, names in names_by_shard.items():
        save_torch({n: tensors[n] for n in names}, str(tmp_path / shard))
        weight_map.update(dict.fromkeys(names, shard))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return index, weight_map


def test_safetensors_sharded(tmp_path, tensors):
    names = list(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[:3],
        "model-00002-of-00002.safetensors": names[3:],
    }
    index, weight_map = _save_sharded(tmp_path, tensors, shards)
    for path in (index, tmp_path):
        ckpt = open_checkpoint(path)
        assert list(ckpt) == list(weight_map)
        for name, t in tensors.items():
            _check(ckpt[name], _np(t))


def test_safetensors_directory_without_index(tmp_path, tensors):
    save_torch({"b": tensors["embed.weight"]}, str(tmp_path / "b.safetensors"))
    save_torch({"a": tensors["layers.0.mlp.up"]}, str(tmp_path / "a.safetensors"))
    ckpt = open_checkpoint(tmp_path)
    assert list(ckpt) == ["a", "b"]
    _check(ckpt["a"], _np(tensors["layers.0.mlp.up"]))


# -- NumPy -----------------------------------------------------------------------------------


def test_npy(tmp_path):
    rng = np.random.default_rng(2)
    cases = {
        "c": rng.standard_normal((6, 8)).astype(np.float32),
        "f": np.asfortranarray(rng.standard_normal((6, 8)).astype(np.float16)),
        "big_endian": rng.standard_normal((6, 8)).astype(">f8"),
    }
    for name, a in cases.items():
        np.save(tmp_path / f"{name}.npy", a)
        ckpt = open_checkpoint(tmp_path / f"{name}.npy")
        assert list(ckpt) == [name]
        assert isinstance(ckpt[name].source, np.memmap)
        _check(ckpt[name], a.astype(a.dtype.newbyteorder("=")))


@pytest.mark.parametrize("compressed", [False, True])
def test_npz(tmp_path, compressed):
    rng = np.random.default_rng(3)
    arrays = {
        "w": rng.standard_normal((6, 8)).astype(np.float32),
        "f": np.asfortranarray(rng.standard_normal((5, 7))),
        "h": rng.standard_normal((4, 6, 3)).astype(np.float16),
        "be": rng.standard_normal((6, 4)).astype(">f4"),
        "ids": np.arange(10, dtype=np.int32),
    }
    path = tmp_path / "w.npz"
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    ckpt = open_checkpoint(path)
    assert list(ckpt) == list(arrays)
    for name, a in arrays.items():
        assert isinstance(ckpt[name].source[...], np.memmap) != compressed
        _check(ckpt[name], a.astype(a.dtype.newbyteorder("=")))


# -- Zarr ------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".zarr", ".zip"])
def test_zarr_group(tmp_path, suffix):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((6, 8)).astype(np.float32)
    b = rng.standard_normal((5, 7)).astype(np.float16)
    path = tmp_path / f"g{suffix}"
    store = zarr.storage.ZipStore(path, mode="w") if suffix == ".zip" else path
    g = zarr.open_group(store, mode="w")
    g.create_array("w", shape=a.shape, chunks=(4, 4), dtype=a.dtype)[...] = a
    g.create_group("layer").create_array("h", shape=b.shape, chunks=(2, 3), dtype=b.dtype)[...] = b
    g.create_array("ids", shape=(4,), dtype=np.int32)[...] = np.arange(4, dtype=np.int32)
    if suffix == ".zip":
        store.close()
    ckpt = open_checkpoint(path)
    assert list(ckpt) == ["layer/h", "w"]
    assert isinstance(ckpt["w"].source, zarr.Array)
    _check(ckpt["w"], a)
    _check(ckpt["layer/h"], b)


# -- torch -----------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".pt", ".bin"])
def test_torch_state_dict(tmp_path, tensors, suffix):
    path = tmp_path / f"model{suffix}"
    nested = {"model": {"embed": tensors["embed.weight"]}, "step": 7}
    torch.save({**tensors, **nested, "t": tensors["embed.weight"].t()}, path)
    ckpt = open_checkpoint(path)
    assert list(ckpt) == [*tensors, "model.embed", "t"]
    for name, t in tensors.items():
        _check(ckpt[name], _np(t))
    _check(ckpt["model.embed"], _np(tensors["embed.weight"]))
    _check(ckpt["t"], _np(tensors["embed.weight"]).T)  # a non-contiguous tensor


def test_torch_single_tensor(tmp_path):
    path = tmp_path / "w.pt"
    torch.save(torch.randn(3, 4).to(torch.bfloat16), path)
    ckpt = open_checkpoint(path)
    assert list(ckpt) == ["w"] and ckpt["w"].dtype == BF16


def test_torch_missing(tmp_path, monkeypatch):
    path = tmp_path / "model.pt"
    path.write_bytes(b"x")
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(StoreError, match=r"needs torch: pip install 'qstream-zarr\[torch\]'"):
        open_checkpoint(path)


# -- indexing --------------------------------------------------------------------------------


def test_bad_keys(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((3, 4), np.float32))
    t = open_checkpoint(tmp_path / "a.npy")["a"]
    with pytest.raises(IndexError):
        t[0, 0, 0]
    with pytest.raises(IndexError):
        t[3]
    with pytest.raises(IndexError):
        t[..., ...]
    with pytest.raises(TypeError):
        t[[0, 1]]
    with pytest.raises(TypeError):
        t[None]


# -- errors ----------------------------------------------------------------------------------


def _raises(path, *words: str) -> None:
    with pytest.raises(StoreError) as info:
        open_checkpoint(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg, msg
    for w in words:
        assert w in msg, msg


F32_2x2 = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}


@pytest.mark.parametrize(
    ("name", "header", "data", "length", "words"),
    [
        ("trunc_data", F32_2x2, b"\0" * 8, None, ["'w'", "truncated"]),
        ("long_header", F32_2x2, b"\0" * 16, 10**6, ["header length 1000000"]),
        ("bad_offsets", {"w": {**F32_2x2["w"], "data_offsets": [16, 0]}}, b"", None, ["'w'"]),
        ("size_mismatch", {"w": {**F32_2x2["w"], "data_offsets": [0, 12]}}, b"\0" * 16, None, []),
        ("bad_dtype", {"w": {**F32_2x2["w"], "dtype": "X9"}}, b"\0" * 16, None, ["'X9'", "'w'"]),
        ("bad_shape", {"w": {**F32_2x2["w"], "shape": [2, -2]}}, b"\0" * 16, None, ["'w'"]),
    ],
)
def test_safetensors_corrupt(tmp_path, name, header, data, length, words):
    _raises(_st_file(tmp_path / f"{name}.safetensors", header, data, length=length), *words)


def _two(a: list[int], b: list[int]) -> dict:
    return {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": a},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": b},
    }


@pytest.mark.parametrize(
    ("name", "header", "data", "words"),
    [
        ("aliasing", _two([0, 8], [0, 8]), b"\0" * 8, ["'b'", "inside the bytes before it"]),
        ("overlapping", _two([0, 8], [4, 12]), b"\0" * 12, ["'b'", "inside the bytes before it"]),
        ("hole_first", _two([4, 12], [12, 20]), b"\0" * 20, ["'a'", "leaves 4 bytes"]),
        ("hole_between", _two([0, 8], [12, 20]), b"\0" * 20, ["'b'", "leaves 4 bytes"]),
        ("trailing", _two([0, 8], [8, 16]), b"\0" * 20, ["end at byte 16 of", "20 bytes"]),
        ("metadata", {"__metadata__": {"n": 1}, **_two([0, 8], [8, 16])}, b"\0" * 16,
         ["__metadata__"]),
    ],
)  # fmt: skip
def test_safetensors_headers_the_format_refuses_are_refused_as_its_library_does(
    tmp_path, name, header, data, words
):
    path = _st_file(tmp_path / f"{name}.safetensors", header, data)
    _raises(path, *words)
    with pytest.raises(Exception):  # noqa: B017 (the reference refuses it too)
        safe_open(str(path), framework="np")


def test_a_null_metadata_and_an_unread_tensor_of_an_unknown_type_are_taken(tmp_path):
    header = {"__metadata__": None, **_two([0, 8], [8, 16])}
    header["b"].update(dtype="F8_E8M0", shape=[8])  # (a type qstream does not read, unread)
    path = _st_file(tmp_path / "m.safetensors", header, b"\0" * 16)
    from qstream.io.checkpoints.safetensors_files import open_safetensors

    assert list(open_safetensors(str(path), only={"a"})) == ["a"]
    safe_open(str(path), framework="np")  # (the reference takes it too)


def test_safetensors_invalid_json_and_short(tmp_path):
    path = tmp_path / "json.safetensors"
    path.write_bytes(struct.pack("<Q", 5) + b"{nope")
    _raises(path, "invalid JSON")
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\1\0\0")
    _raises(short, "truncated")


def test_missing_files(tmp_path):
    for name in ("nope.safetensors", "nope.npz", "nope.npy", "nope.pt", "nope.zarr"):
        _raises(tmp_path / name, "no such file")


def test_index_missing_shard(tmp_path, tensors):
    index, _ = _save_sharded(tmp_path, tensors, {"a.safetensors": ["embed.weight"]})
    data = json.loads(index.read_text())
    data["weight_map"]["extra"] = "b.safetensors"
    index.write_text(json.dumps(data))
    _raises(index, "missing shard", "b.safetensors")
    data["weight_map"]["extra"] = "a.safetensors"
    index.write_text(json.dumps(data))
    _raises(index, "'extra'", "a.safetensors")


def test_unsupported_and_corrupt_others(tmp_path):
    unknown = tmp_path / "model.h5"
    unknown.write_bytes(b"x")
    _raises(unknown, "supported formats", ".safetensors", ".npz")
    _raises(tmp_path, "supported formats")  # holds no checkpoint yet
    for name in ("bad.npz", "bad.npy", "bad.pt"):
        (tmp_path / name).write_bytes(b"not a checkpoint")
        _raises(tmp_path / name)
    with zipfile.ZipFile(tmp_path / "trunc.npz", "w") as zf:
        zf.writestr("w.npy", b"\x93NUMPY\x01\x00" + b"v" * 10)
    _raises(tmp_path / "trunc.npz", "'w'")


def test_dtype_facts_are_right_for_each_dtype_object_and_remembered_within_a_bound():
    from qstream.io.checkpoints import dtypes as checkpoint_dtypes
    from qstream.io.checkpoints.dtypes import BF16, dtype_facts

    assert dtype_facts(np.dtype("<f4")) == (np.dtype("float32"), "float32", True)
    assert dtype_facts(BF16).name == "bfloat16"
    for _ in range(1000):  # a big-endian dtype read from a file is a new object each time
        big = np.dtype(">f4")
        facts = dtype_facts(big)
        assert facts.dtype == big and facts.name == "float32" and not facts.native
    assert len(checkpoint_dtypes._FACTS) <= checkpoint_dtypes._MAX_FACTS
