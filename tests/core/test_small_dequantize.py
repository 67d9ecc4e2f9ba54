"""A small region is dequantized with NumPy (no kernel loaded): the same bytes as the
kernel gives, for every integer type, layout (per tensor, per axis, blocks with a short last
block), zero point type, scale type and output type."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qstream import budget
from qstream.core import affine
from qstream.core.layout import plan_layout
from qstream.qtypes import QTYPES

INTS = ["int8", "uint8", "int16", "uint16", "int32", "int4", "uint4", "int2"]
OUTS = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16]


F64, F32 = np.dtype(np.float64), np.dtype(np.float32)
# The default run's combinations of (code type, output type, scale type, zero-point type):
# each code type, output type and parameter type once at least, 8 kernel builds in all
# (`pytest -m slow` draws from every combination: ~26 builds, ~20 s of first compiles).
SOME = [
    ("int8", np.float32, None, None),
    ("uint8", np.float64, F64, F32),
    ("int16", np.float16, None, F64),
    ("uint16", ml_dtypes.bfloat16, F64, None),
    ("int32", np.float32, F64, F64),
    ("int4", np.float64, None, F32),
    ("uint4", np.float16, F64, None),
    ("int2", ml_dtypes.bfloat16, None, None),
]


@st.composite
def cases(draw, every_combination=True):
    if every_combination:
        name = draw(st.sampled_from(INTS))
        out = np.dtype(draw(st.sampled_from(OUTS)))
        scale_dtype = draw(st.sampled_from([None, F64]))
        zp_dtype = draw(st.sampled_from([None, F64, F32]))
    else:
        name, out, scale_dtype, zp_dtype = draw(st.sampled_from(SOME))
        out = np.dtype(out)
    qt = QTYPES[name]
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=1, max_size=3)))
    axis = draw(st.one_of(st.none(), st.integers(0, len(shape) - 1)))
    block = None
    if axis is not None and draw(st.booleans()):
        block = draw(st.integers(1, max(1, shape[axis])))
    if axis is None:
        pshape: tuple[int, ...] = ()
    else:
        pshape = list(shape)
        pshape[axis] = -(-shape[axis] // block) if block else shape[axis]
        pshape = tuple(pshape) if block else (shape[axis],)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    lo, hi = qt.qrange(False)
    q = rng.integers(lo, hi, size=shape, endpoint=True).astype(qt.dtype)
    mags = np.array([1e-30, 1e-8, 3e-3, 0.1, 7.0, 1e20])
    scale = (rng.choice(mags, pshape) * rng.uniform(0.5, 2.0, pshape)).astype(np.float32)
    zp = None
    if draw(st.booleans()):
        zp = rng.integers(lo, hi, size=pshape, endpoint=True).astype(qt.dtype)
    return q, scale, zp, plan_layout(shape, pshape, axis, block), qt, out, scale_dtype, zp_dtype


@settings(max_examples=300, deadline=None)
@given(cases(every_combination=False))
def test_numpy_path_gives_the_kernels_bytes(case):
    _same_bytes(case)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(cases())
def test_numpy_path_gives_the_kernels_bytes_for_every_combination_of_types(case):
    _same_bytes(case)


def _same_bytes(case):
    q, scale, zp, layout, qt, out, scale_dtype, zp_dtype = case
    kw = {"scale_dtype": scale_dtype, "zp_dtype": zp_dtype}
    old = affine.NUMPY_BELOW, budget.NUMPY_JOB
    with np.errstate(all="ignore"):  # (float16 outputs overflow to inf: both paths alike)
        small = affine.affine_dequantize(q, scale, zp, layout, qt, out, **kw)
        affine.NUMPY_BELOW = budget.NUMPY_JOB = -1  # (the kernel, loaded or not)
        try:
            assert not affine.numpy_dequantizes(q.size)
            kernel = affine.affine_dequantize(q, scale, zp, layout, qt, out, **kw)
        finally:
            affine.NUMPY_BELOW, budget.NUMPY_JOB = old
    assert small.dtype == kernel.dtype
    assert small.tobytes() == kernel.tobytes()


def _read_fresh(path, key: str) -> tuple[bool, bytes]:
    """``qs.open_quantized(path)[key]`` in a fresh process: (whether it imported Numba, the
    values' bytes)."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, qstream as qs\n"
        f"v = qs.open_quantized({str(path)!r})[{key}]\n"
        "print('numba' in sys.modules)\n"
        "sys.stdout.buffer.write(np.ascontiguousarray(v).tobytes())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    flag, raw = done.stdout.split(b"\n", 1)
    return flag == b"True", raw


def test_a_first_small_read_of_an_int8_output_loads_no_kernel(tmp_path):
    import qstream as qs

    x = np.random.default_rng(0).standard_normal((300, 400)).astype(np.float32)
    qs.quantize_store(x, tmp_path / "q.zarr")
    want = qs.open_quantized(tmp_path / "q.zarr")[100:104, 0:8]
    numba, raw = _read_fresh(tmp_path / "q.zarr", "100:104, 0:8")
    assert raw == want.tobytes()
    assert not numba, "the first 4x8 read of an int8 per-tensor output imported numba"


def test_a_whole_read_of_a_small_output_loads_no_kernel_and_gives_the_kernels_bytes(
    tmp_path, monkeypatch
):
    """Reading a per-channel output of 120,000 values whole in a fresh process (more than
    ``NUMPY_BELOW``, at most ``NUMPY_JOB``, no kernel loaded yet): NumPy, the kernel's bytes."""
    import qstream as qs

    x = np.random.default_rng(1).standard_normal((300, 400)).astype(np.float32)
    qs.quantize_store(x, tmp_path / "q.zarr", qs.QuantSpec(axis=0, dtype="uint8"))
    monkeypatch.setattr(budget, "NUMPY_JOB", -1)  # (here: the kernel)
    monkeypatch.setattr(affine, "NUMPY_BELOW", -1)
    want = qs.open_quantized(tmp_path / "q.zarr")[...]
    assert x.size > 1 << 16
    numba, raw = _read_fresh(tmp_path / "q.zarr", "...")
    assert raw == want.tobytes()
    assert not numba, "a whole read of a small output imported numba"
