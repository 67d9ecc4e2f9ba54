"""K-quants (Q2_K..Q6_K) against llama.cpp's own C quantizer, ``ggml_quantize_chunk``, called
through ctypes on the ggml library llama-cpp-python ships (or the one named by the
``QSTREAM_GGML_LIB`` environment variable): identical bytes with and without an importance
matrix; dequantized values identical to gguf-py's ``gguf.quants.dequantize``."""

from __future__ import annotations

import ctypes
import os
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qstream.compat import gguf_kquants as kq
from qstream.errors import InvalidDTypeError, InvalidParameterError, NonFiniteInputError

TYPES = kq.TYPES


def _library_path() -> str | None:
    try:
        import llama_cpp
    except ImportError:
        llama_cpp = None
    if llama_cpp is not None:
        folder = Path(llama_cpp.__file__).parent / "lib"
        for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
            if (folder / name).exists():
                return str(folder / name)
    return os.environ.get("QSTREAM_GGML_LIB") or None


_PATH = _library_path()
if _PATH is None:
    pytest.skip(
        "no ggml library: install llama-cpp-python or set QSTREAM_GGML_LIB",
        allow_module_level=True,
    )
_LIB = ctypes.CDLL(_PATH)
_LIB.ggml_quantize_chunk.restype = ctypes.c_size_t
_LIB.ggml_quantize_chunk.argtypes = [
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_int64,
    ctypes.c_int64,
    ctypes.c_int64,
    ctypes.c_void_p,
]
_LIB.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
_LIB.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]


def ggml_quantize(x: np.ndarray, qtype: str, imatrix: np.ndarray | None = None) -> np.ndarray:
    """llama.cpp's bytes for the 2-D float32 ``x`` (one imatrix weight per column)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, n = x.shape
    out = np.zeros(kq.byte_shape(x.shape, qtype), np.uint8)
    w = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32)
    with np.errstate(all="ignore"):
        written = _LIB.ggml_quantize_chunk(
            kq.TYPE_ID[qtype], x.ctypes.data, out.ctypes.data, 0, rows, n,
            None if w is None else w.ctypes.data,
        )  # fmt: skip
    assert written == out.nbytes
    return out


def assert_same_blocks(ours: np.ndarray, theirs: np.ndarray, qtype: str) -> None:
    """Equal bytes; on failure, name the first differing super-blocks."""
    size = kq.TYPE_SIZE[qtype]
    a = ours.reshape(-1, size)
    b = theirs.reshape(-1, size)
    bad = np.nonzero((a != b).any(axis=1))[0]
    assert bad.size == 0, (
        f"{qtype}: {bad.size} of {a.shape[0]} super-blocks differ, first {bad[:8]}"
    )


def _imatrix(kind: str, n: int, rng: np.random.Generator) -> np.ndarray | None:
    if kind == "none":
        return None
    w = (rng.random(n) * 4).astype(np.float32)
    if kind == "with-zeros":
        w[rng.random(n) < 0.3] = 0
        w[:16] = 0  # a whole sub-block without weight
    return w


def _random_rows(dist: str, rng: np.random.Generator, rows: int, n: int) -> np.ndarray:
    if dist == "normal":
        return rng.standard_normal((rows, n)).astype(np.float32) * np.float32(0.02)
    if dist == "uniform":
        return rng.uniform(-1, 3, (rows, n)).astype(np.float32)
    return rng.standard_t(1.5, (rows, n)).astype(np.float32)  # heavy tails: outliers


def adversarial_rows(n: int, rng: np.random.Generator) -> np.ndarray:
    """Rows at the edges of the scale searches: empty, single values, extreme magnitudes
    (squares overflowing to inf, values below GROUP_MAX_EPS, float16 subnormal scales)."""
    rows = []
    zero = np.zeros(n, np.float32)
    rows.append(zero)
    for at, v in ((0, 1.0), (5, -3.5), (300 % n, 2e-3), (n - 1, -1e30)):
        r = zero.copy()
        r[at] = v
        rows.append(r)
    rows += [np.full(n, v, np.float32) for v in (0.7, -3.0, 1e-30, 3.4e38, 1e-40)]
    rows.append(np.where(np.arange(n) % 2, 1.0, -1.0).astype(np.float32))
    rows.append(np.where(np.arange(n) % 2, 5.0, 0.0).astype(np.float32))
    for scale in (1e30, 1e19, 1e-6, 1e-10, 1e-30, 6e-5):
        rows.append((rng.standard_normal(n) * scale).astype(np.float32))
    spikes = zero.copy()
    spikes[::37] = 1e30
    rows.append(spikes)
    mixed = rng.standard_normal(n).astype(np.float32)
    mixed[::50] = 1e25
    rows.append(mixed)
    rows.append(np.abs(rng.standard_normal(n)).astype(np.float32))  # all positive: min 0
    rows.append(-np.abs(rng.standard_normal(n)).astype(np.float32))  # all negative
    return np.stack(rows)


@pytest.mark.parametrize("imatrix", ["none", "positive", "with-zeros"])
@pytest.mark.parametrize("dist", ["normal", "uniform", "heavy-tailed"])
@pytest.mark.parametrize("qtype", TYPES)
def test_random_rows_give_llama_cpp_bytes(qtype: str, dist: str, imatrix: str) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{qtype}-{dist}-{imatrix}".encode()))
    x = _random_rows(dist, rng, 24, 768)
    w = _imatrix(imatrix, 768, rng)
    assert_same_blocks(kq.quantize(x, qtype, imatrix=w), ggml_quantize(x, qtype, w), qtype)


@pytest.mark.parametrize("imatrix", ["none", "positive", "with-zeros", "all-zero", "huge"])
@pytest.mark.parametrize("qtype", TYPES)
def test_adversarial_rows_give_llama_cpp_bytes(qtype: str, imatrix: str) -> None:
    rng = np.random.default_rng(7)
    x = adversarial_rows(512, rng)
    if imatrix == "all-zero":
        w: np.ndarray | None = np.zeros(512, np.float32)
    elif imatrix == "huge":
        w = np.full(512, 1e30, np.float32)
    else:
        w = _imatrix(imatrix, 512, rng)
    assert_same_blocks(kq.quantize(x, qtype, imatrix=w), ggml_quantize(x, qtype, w), qtype)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_the_parallel_kernel_gives_llama_cpp_bytes(qtype: str) -> None:
    # more than runtime.SERIAL_BELOW values: the parallel build runs, not its serial twin
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 1024)).astype(np.float32)
    w = _imatrix("positive", 1024, rng)
    for weights in (None, w):
        assert_same_blocks(
            kq.quantize(x, qtype, imatrix=weights), ggml_quantize(x, qtype, weights), qtype
        )


def test_a_per_expert_imatrix_weighs_each_expert_by_its_own_row() -> None:
    # llama-quantize hands expert e the weights imatrix[e * n : (e + 1) * n]
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 4, 256)).astype(np.float32)
    w = rng.random((3, 256)).astype(np.float32)
    ours = kq.quantize(x, "Q4_K", imatrix=w)
    for e in range(3):
        assert_same_blocks(ours[e], ggml_quantize(x[e], "Q4_K", w[e]), "Q4_K")


finite32 = st.floats(allow_nan=False, allow_infinity=False, width=32)


# (rows of 256-512 drawn floats: Hypothesis discards the draws that outgrow its buffer, now
# and then more than its health check allows, a failure of the generator, not of the test)
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(
    qtype=st.sampled_from(TYPES),
    blocks=st.integers(1, 2),
    data=st.data(),
    weighted=st.booleans(),
)
def test_any_finite_rows_give_llama_cpp_bytes(
    qtype: str, blocks: int, data: st.DataObject, weighted: bool
) -> None:
    n = 256 * blocks
    scale = data.draw(st.sampled_from([1.0, 1e-3, 1e-20, 1e20]))
    values = data.draw(
        st.lists(
            st.one_of(finite32, st.floats(-4, 4, width=32), st.just(0.0)),
            min_size=n,
            max_size=n,
        )
    )
    x = (np.array(values, np.float32) * np.float32(scale)).reshape(1, n)
    x[~np.isfinite(x)] = 0
    w = None
    if weighted:
        w = np.array(
            data.draw(st.lists(st.floats(0, 1e6, width=32), min_size=n, max_size=n)), np.float32
        )
    assert_same_blocks(kq.quantize(x, qtype, imatrix=w), ggml_quantize(x, qtype, w), qtype)


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_gives_gguf_py_values(qtype: str) -> None:
    import gguf
    from gguf.quants import dequantize as gguf_dequantize

    rng = np.random.default_rng(5)
    x = np.concatenate([adversarial_rows(512, rng), _random_rows("heavy-tailed", rng, 8, 512)])
    quantized = ggml_quantize(x, qtype, _imatrix("positive", 512, rng))
    # any bytes at all, with float16 scales that are finite (NaN payloads aside)
    noise = rng.integers(0, 256, (16, quantized.shape[1]), dtype=np.uint8)
    raw = np.concatenate([quantized, noise])
    theirs = gguf_dequantize(raw, gguf.GGMLQuantizationType[qtype])
    ours = kq.dequantize(raw, qtype)
    assert ours.shape == theirs.shape == (raw.shape[0], 512)
    same = (ours.view(np.uint32) == theirs.view(np.uint32)) | (np.isnan(ours) & np.isnan(theirs))
    assert same.all(), f"{qtype}: {np.count_nonzero(~same)} values differ"
    assert kq.dequantize(raw, qtype, (raw.shape[0], 2, 256)).shape == (raw.shape[0], 2, 256)


def test_byte_shape_counts_super_blocks() -> None:
    assert kq.byte_shape((3, 512), "Q4_K") == (3, 288)
    assert kq.byte_shape((2, 5, 256), "Q6_K") == (2, 5, 210)
    assert kq.byte_shape((1024,), "q2_k") == (336,)
    assert kq.quantize(np.zeros((0, 256), np.float32), "Q3_K").shape == (0, 110)


@pytest.mark.parametrize(
    ("x", "kwargs", "error", "words"),
    [
        (np.full((1, 256), np.nan, np.float32), {}, NonFiniteInputError, "NaN or infinite"),
        (np.full((1, 256), np.inf, np.float32), {}, NonFiniteInputError, "NaN or infinite"),
        (
            np.ones((1, 256), np.float32),
            {"imatrix": np.full(256, np.nan, np.float32)},
            NonFiniteInputError,
            "importance matrix",
        ),
        (np.ones((1, 256), np.float32), {"imatrix": np.ones(128)}, InvalidParameterError, "[256]"),
        (np.ones((2, 100), np.float32), {}, InvalidParameterError, "multiple of 256"),
        (np.ones((2, 256), np.int32), {}, InvalidDTypeError, "floating"),
    ],
)
def test_refusals_name_the_problem_before_any_work(
    x: np.ndarray, kwargs: dict, error: type, words: str
) -> None:
    with pytest.raises(error) as caught:
        kq.quantize(x, "Q4_K", **kwargs)
    assert words in str(caught.value)
    assert "\n" not in str(caught.value)


def test_unknown_types_and_torn_blocks_are_refused() -> None:
    with pytest.raises(InvalidParameterError, match="unknown K-quant type"):
        kq.quantize(np.ones((1, 256), np.float32), "Q4_0")
    with pytest.raises(InvalidParameterError, match="whole super-blocks of 144 bytes"):
        kq.dequantize(np.zeros((1, 100), np.uint8), "Q4_K")
    with pytest.raises(InvalidParameterError, match="hold 256 values"):
        kq.dequantize(np.zeros((1, 144), np.uint8), "Q4_K", (2, 256))


def test_no_k_quant_needs_an_imatrix_in_ggml() -> None:
    # (so the reference calls without one above run the same code llama-quantize does)
    assert not any(_LIB.ggml_quantize_requires_imatrix(kq.TYPE_ID[t]) for t in TYPES)
