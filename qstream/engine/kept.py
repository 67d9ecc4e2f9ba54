"""Tensors a conversion keeps: stored as they are, in their own type, beside the quantized."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..core.layout import dimension_names
from ..errors import StoreError
from ..io import compression as compressions
from ..io import destination
from ..io.checkpoints import read_rows
from .plan import check_fits


def remove_own(path: str, storage_options: dict | None = None) -> None:
    """Remove what a killed run of this job left at a tensor's ``path`` (only a node qstream
    wrote: a kept or restored array, or a quantized group that its own job did not finish)."""
    existing = destination.inspect_destination(path, storage_options)
    if existing.kind in ("kept", "dequantized"):
        destination.remove_output(path, existing, storage_options)
    elif existing.kind == "empty":
        destination.clean_partials(path)
    elif existing.kind != "absent":
        raise StoreError(f"{path} holds something qstream did not write there; remove it")


def keep_tensor(
    t: Any,
    path: str,
    compression: str,
    max_memory: int | None = None,
    as_dtype: str | None = None,
    *,
    storage_options: dict | None = None,
) -> dict[str, Any]:
    """Store the tensor ``t`` as it is (``as_dtype``: its values rounded to that float type
    first, to nearest even), in its own type (bfloat16 too: the ``bfloat16`` Zarr data type,
    registered by qstream; outputs of earlier versions hold it widened to float32, their
    attributes naming bfloat16, and read the same)."""
    import zarr

    from ..io.zarr_ext import register_zarr_types
    from ..qtypes import float_dtype

    dtype = np.dtype(t.dtype)
    kept = float_dtype(as_dtype) if as_dtype else dtype
    stored = kept
    check_fits(max_memory, getattr(t, "chunks", None), dtype, 1, tuple(t.shape))
    remove_own(path, storage_options)  # what a killed run left of this tensor
    register_zarr_types()  # (bfloat16)
    a = zarr.create_array(
        path,
        shape=t.shape,
        dtype=stored,
        compressors=compressions.compressors(compression),
        dimension_names=dimension_names(len(t.shape)),
        attributes={"qstream": {"kept": True, "dtype": kept.name}},
        storage_options=storage_options if destination.local_path(path) is None else None,
    )
    if math.prod(t.shape):
        rows = max(1, (16 << 20) // max(1, math.prod(t.shape[1:]) * dtype.itemsize))
        n = t.shape[0] if t.shape else 1
        for r in range(0, n, rows):
            key = (slice(r, min(n, r + rows)),) if t.shape else ()
            a[key] = read_rows(t, key, dtype).astype(kept).astype(stored)
    return {"kept": True, "error": None, "bytes_after": int(math.prod(t.shape) * stored.itemsize)}
