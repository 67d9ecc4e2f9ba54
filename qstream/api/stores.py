"""Quantize, dequantize and calibrate Zarr stores out of core (the jobs are in
:mod:`qstream.engine.job`, the on-disk format in :mod:`qstream.io.qarray`)."""

from __future__ import annotations

from collections.abc import Callable

from ..engine.job import QuantizeJob
from ..engine.job import dequantize as _dequantize
from ..spec import Calibration, QuantReport, QuantSpec


def calibrate(
    src,
    spec: QuantSpec | None = None,
    *,
    max_memory: int | None = None,
    progress: Callable | None = None,
    storage_options: dict | None = None,
) -> Calibration:
    """Gather statistics from ``src`` and derive the scale/zero point ``spec`` asks for
    (writes nothing)."""
    job = QuantizeJob(
        src, spec or QuantSpec(), max_memory=max_memory, storage_options=storage_options
    )
    return job.calibration(progress)


def quantize_store(
    src,
    dst,
    spec: QuantSpec | None = None,
    *,
    max_memory: int | None = None,
    progress: Callable | None = None,
    overwrite: bool = False,
    resume: bool = True,
    storage_options: dict | None = None,
) -> QuantReport:
    """Quantize the array ``src`` into the quantized group ``dst``.

    ``src``: a path/URL of a Zarr array (v2 or v3), a ``zarr.Array`` or a NumPy array.
    ``dst``: a local directory, a ``.zip`` path, ``memory://name`` or an fsspec URL; it must
    be new, empty, or an output of qstream (see below); never the source or a place inside it.
    ``max_memory`` bounds the working memory (bytes, default 1 GiB): the blocks in flight and
    the calibration histograms. ``progress(done, total)`` is called as blocks land.

    Re-running a job (same spec, same source however its path is spelled) on its unfinished
    output resumes it, and the result and report are bit-identical to an uninterrupted run
    (``resume=False`` refuses instead); on its finished output it returns the stored report
    with ``already_complete=True``. ``overwrite=True`` replaces another job's output or a
    Zarr node; a destination holding anything else (files, a non-Zarr directory) is always
    refused. A local destination is locked while a job writes it.
    """
    job = QuantizeJob(
        src, spec or QuantSpec(), max_memory=max_memory, storage_options=storage_options
    )
    return job.run(dst, progress=progress, overwrite=overwrite, resume=resume)


def dequantize_store(
    src,
    dst,
    *,
    dtype="float32",
    max_memory: int | None = None,
    progress: Callable | None = None,
    overwrite: bool = False,
    storage_options: dict | None = None,
) -> dict:
    """Dequantize the quantized group ``src`` into a plain Zarr array ``dst`` of ``dtype``
    (float32, float16 or bfloat16), under the same destination rules as
    :func:`quantize_store`."""
    return _dequantize(
        src,
        dst,
        dtype=dtype,
        max_memory=max_memory,
        progress=progress,
        overwrite=overwrite,
        storage_options=storage_options,
    )
