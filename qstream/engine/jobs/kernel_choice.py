"""Which kernels a job runs: Numba's, or their NumPy twins (:mod:`qstream.kernels.numpy_twins`),
which give the kernels' codes and parameters bit for bit and their error sums to float64
rounding, and never load Numba. Importing Numba and loading its cached kernels takes ~0.3 s,
more than a small job computes.

The choice is made from the job alone (its shape, source type and spec), never from how it
runs: a resumed run takes the kernels its first run took, and a Dask run those of a local one.
A conversion makes it once for all its tensors
(:func:`~qstream.engine.convert.convert_checkpoint.small_job`); a store job for its array
(:func:`small_array_job`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from ml_dtypes import bfloat16

from ... import budget
from ...spec import QuantSpec

#: source dtypes the NumPy twins read (FP8 weights decoded with their scales do not qualify)
TWIN_SOURCES = frozenset(np.dtype(d) for d in ("float16", "float32", "float64", bfloat16))


def twins_cover(spec: QuantSpec, dtype: Any) -> bool:
    """Whether the NumPy twins run every kernel a job of ``spec`` on a ``dtype`` source
    calls: an integer type of 8 or 16 bits, per tensor or per channel, minmax or percentile
    ranges (or given parameters), any round mode, on float16, bfloat16, float32 or float64
    values."""
    qt = spec.qtype
    return not (
        qt.is_float
        or qt.bits not in (8, 16)
        or spec.block_size
        or spec.float_offset
        or spec.method not in ("minmax", "percentile")
        or np.dtype(dtype) not in TWIN_SOURCES
    )


def small_array(shape: tuple[int, ...]) -> bool:
    """Whether an array of ``shape`` is small enough for a job on it to run NumPy rather than
    load Numba: at most :data:`~qstream.budget.NUMPY_JOB` elements (an empty array: the
    kernels, as before; ``QSTREAM_NUMPY_JOB=0``: never)."""
    return 0 < math.prod(shape) <= budget.NUMPY_JOB


def small_array_job(shape: tuple[int, ...], dtype: Any, spec: QuantSpec) -> bool:
    """Whether a store job quantizing an array of ``shape`` and ``dtype`` with ``spec`` runs
    the NumPy twins: a small array (:func:`small_array`) and a spec and type they cover
    (:func:`twins_cover`)."""
    return small_array(shape) and twins_cover(spec, dtype)
