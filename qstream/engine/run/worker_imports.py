"""What worker threads may import, imported before any pool starts (issue 44).

qstream imports lazily to start fast, but an ``import`` that first runs in a worker thread can
meet another thread's import of a module it needs: Python's module locks then raise
``_DeadlockError`` (seen as ``deadlock detected by _ModuleLock('zarr.abc.codec')`` in one
conversion in two, where one worker imported zarr to write a kept bf16 tensor while another
imported qstream's sub-byte data types, which import zarr too). Every pool calls
:func:`ready_for_workers` in the thread that starts it, so that a worker finds every module it
asks for already loaded; a job adds the group its plan needs (zarr-python) that would be
wasted on others. ``tests/support/worker_imports.py`` watches every test for a module first
loaded by a worker thread of qstream's.
"""

from __future__ import annotations

import importlib
import sys

# qstream's own modules that block work imports lazily
BASE = (
    "qstream.calibration.histogram",
    "qstream.calibration.params",
    "qstream.spec.views",
    "qstream.core.affine",
    "qstream.io.outputs.codec",
    "qstream.io.outputs.scientific",
    "qstream.io.storage.stores",
)
# the kernels (Numba's dispatchers), or for a job that runs the NumPy twins, those
KERNELS = (
    "qstream.kernels.affine",
    "qstream.kernels.bits",
    "qstream.kernels.blocked",
    "qstream.kernels.error_stats",
    "qstream.kernels.offset",
    "qstream.kernels.packing",
    "qstream.kernels.quantize_sums",
    "qstream.kernels.rounding",
    "qstream.kernels.search",
    "qstream.kernels.stats",
)
TWINS = ("qstream.kernels.numpy_twins",)
# zarr-python, and qstream's data types and codec for it (a kept bf16 tensor, sub-byte codes,
# a store that is not a local folder)
ZARR = ("zarr", "zarr.core.array", "zarr.storage", "qstream.io.zarr_types.zarr_ext")

_loaded: set[str] = set()


def ready_for_workers(*, zarr: bool | None = None) -> None:
    """Import what block work may import, in the calling thread (the one about to start a
    pool): :data:`BASE` always, and :data:`KERNELS` (:data:`TWINS` for a job that runs the
    NumPy twins, :func:`qstream.kernels.numpy_twins.numpy_kernels`); :data:`ZARR` when ``zarr``
    (None: when zarr-python is loaded already, as it is wherever a Zarr store was opened).
    Cheap once done. (qstream's own zstd chunks need nothing more: their codec,
    :class:`~qstream.io.storage.chunkcodecs.ZstdFrames`, loads with the storage modules.)"""
    from ...kernels.numpy_twins import numpy_kernels

    if zarr is None:
        zarr = "zarr" in sys.modules
    twins = numpy_kernels()
    groups = ((BASE, True), (TWINS, twins), (KERNELS, not twins), (ZARR, zarr))
    for group, wanted in groups:
        if wanted and group[0] not in _loaded:
            for name in group:
                importlib.import_module(name)
            _loaded.add(group[0])
