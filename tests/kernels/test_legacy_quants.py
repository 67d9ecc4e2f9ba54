"""Q5_0 and Q5_1 (with and without an importance matrix) and Q4_0 / Q4_1 with one, against
llama.cpp's own C quantizer, ``ggml_quantize_chunk`` (through ctypes on llama-cpp-python's
ggml library, as :mod:`tests.kernels.test_kquants`): identical bytes; Q5_0 / Q5_1 blocks read
back equal to gguf-py's ``gguf.quants.dequantize``."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qstream.compat import gguf as q
from qstream.compat import gguf_legacy as lg
from qstream.errors import InvalidParameterError, NonFiniteInputError
from tests.kernels.test_kquants import _LIB, _imatrix, _random_rows, adversarial_rows

SIZE = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24}
TYPES = tuple(SIZE)


def ggml_quantize(x: np.ndarray, qtype: str, imatrix: np.ndarray | None = None) -> np.ndarray:
    """llama.cpp's bytes for the 2-D float32 ``x`` (one imatrix weight per column)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, n = x.shape
    out = np.zeros((rows, n // 32 * SIZE[qtype]), np.uint8)
    w = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32)
    with np.errstate(all="ignore"):
        written = _LIB.ggml_quantize_chunk(
            q.TYPE_ID[qtype], x.ctypes.data, out.ctypes.data, 0, rows, n,
            None if w is None else w.ctypes.data,
        )  # fmt: skip
    assert written == out.nbytes
    return out


def assert_same_blocks(ours: np.ndarray, theirs: np.ndarray, qtype: str) -> None:
    """Equal bytes; on failure, name the first differing blocks."""
    a = ours.reshape(-1, SIZE[qtype])
    b = theirs.reshape(-1, SIZE[qtype])
    assert a.shape == b.shape
    bad = np.nonzero((a != b).any(axis=1))[0]
    assert bad.size == 0, f"{qtype}: {bad.size} of {a.shape[0]} blocks differ, first {bad[:8]}"


@pytest.mark.parametrize("imatrix", ["none", "positive", "with-zeros"])
@pytest.mark.parametrize("dist", ["normal", "uniform", "heavy-tailed"])
@pytest.mark.parametrize("qtype", TYPES)
def test_random_rows_give_llama_cpp_bytes(qtype: str, dist: str, imatrix: str) -> None:
    rng = np.random.default_rng(zlib.crc32(f"legacy-{qtype}-{dist}-{imatrix}".encode()))
    x = _random_rows(dist, rng, 24, 896)  # (Qwen2.5-0.5B's hidden size: 28 blocks of 32)
    w = _imatrix(imatrix, 896, rng)
    assert_same_blocks(q.quantize(x, qtype, imatrix=w), ggml_quantize(x, qtype, w), qtype)


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
    assert_same_blocks(q.quantize(x, qtype, imatrix=w), ggml_quantize(x, qtype, w), qtype)


def test_the_parallel_kernels_give_llama_cpp_bytes() -> None:
    # more than runtime.SERIAL_BELOW values: the parallel builds run, not their serial twins
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 1024)).astype(np.float32)
    w = _imatrix("positive", 1024, rng)
    for qtype in TYPES:
        assert_same_blocks(q.quantize(x, qtype, imatrix=w), ggml_quantize(x, qtype, w), qtype)
    for qtype in ("Q5_0", "Q5_1"):
        assert_same_blocks(q.quantize(x, qtype), ggml_quantize(x, qtype), qtype)


def test_a_per_expert_imatrix_weighs_each_expert_by_its_own_row() -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 4, 64)).astype(np.float32)
    w = rng.random((3, 64)).astype(np.float32)
    for qtype in TYPES:
        ours = q.quantize(x, qtype, imatrix=w)
        for e in range(3):
            assert_same_blocks(ours[e], ggml_quantize(x[e], qtype, w[e]), qtype)


def _block(kind: str, rng_values: list[float], at: int, v: float) -> np.ndarray:
    b = np.zeros(32, np.float32)
    if kind == "one":
        b[at] = v
    elif kind == "values":
        b[:] = rng_values
    elif kind == "constant":
        b[:] = v
    return b


finite32 = st.floats(allow_nan=False, allow_infinity=False, width=32)
magnitude = st.sampled_from([1.0, 1e-3, 1e-20, 1e-38, 1e-42, 1e20, 1e38])


@settings(max_examples=60, deadline=None)
@given(
    qtype=st.sampled_from(TYPES),
    kinds=st.lists(st.sampled_from(["zero", "one", "values", "constant"]), min_size=1,
                   max_size=4),
    data=st.data(),
    weighted=st.booleans(),
)  # fmt: skip
def test_any_finite_rows_give_llama_cpp_bytes(
    qtype: str, kinds: list[str], data: st.DataObject, weighted: bool
) -> None:
    """Rows of blocks that are all zero, hold one non-zero, a constant or any values, at
    magnitudes from subnormal to near the float32 limit."""
    if not weighted and qtype in ("Q4_0", "Q4_1"):
        weighted = True  # (without weights these are gguf-py's rule, tested elsewhere)
    blocks = []
    for kind in kinds:
        scale = np.float32(data.draw(magnitude))
        values = data.draw(st.lists(st.one_of(finite32, st.floats(-4, 4, width=32)),
                                    min_size=32, max_size=32))  # fmt: skip
        at = data.draw(st.integers(0, 31))
        v = data.draw(st.floats(-4, 4, width=32))
        with np.errstate(over="ignore"):
            blocks.append(_block(kind, values, at, v) * scale)
    x = np.concatenate(blocks).reshape(1, -1)
    x[~np.isfinite(x)] = 0
    w = None
    if weighted:
        w = np.array(
            data.draw(st.lists(st.floats(0, 1e6, width=32), min_size=x.size, max_size=x.size)),
            np.float32,
        )
    assert_same_blocks(q.quantize(x, qtype, imatrix=w), ggml_quantize(x, qtype, w), qtype)


@pytest.mark.parametrize("qtype", ["Q5_0", "Q5_1"])
def test_dequantize_gives_gguf_py_values(qtype: str) -> None:
    import gguf
    from gguf.quants import dequantize as gguf_dequantize

    rng = np.random.default_rng(5)
    x = np.concatenate([adversarial_rows(512, rng), _random_rows("heavy-tailed", rng, 8, 512)])
    quantized = ggml_quantize(x, qtype, _imatrix("positive", 512, rng))
    noise = rng.integers(0, 256, (16, quantized.shape[1]), dtype=np.uint8)  # any bytes
    raw = np.concatenate([quantized, noise])
    theirs = gguf_dequantize(raw, gguf.GGMLQuantizationType[qtype])
    ours = q.dequantize(raw, qtype)
    assert ours.shape == theirs.shape == (raw.shape[0], 512)
    same = (ours.view(np.uint32) == theirs.view(np.uint32)) | (np.isnan(ours) & np.isnan(theirs))
    assert same.all(), f"{qtype}: {np.count_nonzero(~same)} values differ"
    assert q.dequantize(raw, qtype, (raw.shape[0], 2, 256)).shape == (raw.shape[0], 2, 256)


def test_unweighted_q5_equals_gguf_py_quantize_too() -> None:
    import gguf
    from gguf.quants import quantize as gguf_quantize

    x = np.random.default_rng(2).standard_normal((8, 256)).astype(np.float32)
    for qtype in ("Q5_0", "Q5_1"):
        theirs = gguf_quantize(x, gguf.GGMLQuantizationType[qtype])
        assert q.quantize(x, qtype).tobytes() == theirs.tobytes()


def test_shapes_and_refusals() -> None:
    assert q.byte_shape((3, 896), "Q5_0") == (3, 616)
    assert q.byte_shape((2, 64), "Q5_1") == (2, 48)
    assert q.quantize(np.zeros((0, 64), np.float32), "Q5_1").shape == (0, 48)
    with pytest.raises(NonFiniteInputError, match="NaN or infinite"):
        q.quantize(np.full((1, 32), np.inf, np.float32), "Q5_0")
    with pytest.raises(NonFiniteInputError, match="importance matrix"):
        q.quantize(np.ones((1, 32), np.float32), "Q4_0", imatrix=np.full(32, np.nan))
    with pytest.raises(InvalidParameterError, match=r"\[64\]"):
        q.quantize(np.ones((1, 64), np.float32), "Q4_1", imatrix=np.ones(32))
    with pytest.raises(InvalidParameterError, match="multiple of 32"):
        lg.quantize(np.ones((1, 48), np.float32), "Q5_1")
    with pytest.raises(InvalidParameterError, match="gguf-py's rule"):
        lg.quantize(np.ones((1, 32), np.float32), "Q4_0")
    with pytest.raises(InvalidParameterError, match="not Q8_0"):
        q.quantize(np.ones((1, 32), np.float32), "Q8_0", imatrix=np.ones(32))
    with pytest.raises(InvalidParameterError, match="whole blocks of 22 bytes"):
        q.dequantize(np.zeros((1, 21), np.uint8), "Q5_0")


def test_an_importance_matrix_changes_the_bytes_and_lowers_the_weighted_error() -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_t(3, (64, 256)).astype(np.float32)
    w = (rng.random(256) ** 4 * 10).astype(np.float32)
    for qtype in TYPES:
        plain = q.quantize(x, qtype)
        weighted = q.quantize(x, qtype, imatrix=w)
        assert plain.tobytes() != weighted.tobytes()
        err = [float((((q.dequantize(b, qtype) - x) ** 2) * w).sum()) for b in (plain, weighted)]
        assert err[1] < err[0], (qtype, err)


@pytest.mark.parametrize("qtype", ["Q5_0", "Q5_1"])
def test_blocks_of_subnormals_give_llama_cpp_bytes(qtype: str) -> None:
    # a scale whose inverse overflows: codes from x * inf (and 0 * inf, NaN) as ggml casts them
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((6, 64)) * 1e-41).astype(np.float32)
    x[:, ::3] = 0
    x[1] = np.abs(x[1])
    x[2, :32] = -np.abs(x[2, :32])
    x[3] = 0
    x[3, 5] = 3e-45  # (the smallest subnormal: a scale of 0)
    assert_same_blocks(q.quantize(x, qtype), ggml_quantize(x, qtype), qtype)
