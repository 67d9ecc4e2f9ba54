"""Tensors a conversion keeps: stored as they are, in their own type, beside the quantized."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from ..core.layout import dimension_names
from ..errors import StoreError
from ..io import compression as compressions
from ..io import destination, publish
from ..io.checkpoints import read_rows
from .plan import check_fits

#: a kept tensor of at most this many bytes is read and written whole (local outputs)
WHOLE = 16 << 20
#: the bytes of rows a larger one is read and written in, through zarr
ROWS = 16 << 20


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
    from ..qtypes import float_dtype

    dtype = np.dtype(t.dtype)
    kept = float_dtype(as_dtype) if as_dtype else dtype
    stored = kept
    check_fits(max_memory, getattr(t, "chunks", None), dtype, 1, tuple(t.shape))
    remove_own(path, storage_options)  # what a killed run left of this tensor
    kw = {
        "shape": t.shape,
        "dtype": stored,
        "compressors": compressions.compressors(compression),
        "dimension_names": dimension_names(len(t.shape)),
    }
    attrs = {"qstream": {"kept": True, "dtype": kept.name}}
    local = destination.local_path(path)
    n = math.prod(t.shape)
    if local is not None and t.shape and 0 < n * max(dtype.itemsize, stored.itemsize) <= WHOLE:
        # a small tensor, written whole at once (the common case: norms, biases): no round
        # trips through zarr's event loop, which one thread runs for every worker
        values = read_rows(t, (slice(0, t.shape[0]),), dtype).astype(kept, copy=False)
        os.makedirs(os.path.dirname(local), exist_ok=True)
        publish.write_array(local, kw, values, attrs, empty=False)  # (as zarr)
    else:
        _write_with_zarr(t, path, kw, attrs, kept, storage_options if local is None else None)
    return {"kept": True, "error": None, "bytes_after": int(math.prod(t.shape) * stored.itemsize)}


def _write_with_zarr(
    t: Any,
    path: str,
    kw: dict[str, Any],
    attrs: dict[str, Any],
    kept: np.dtype[Any],
    storage_options: dict | None,
) -> None:
    """Store ``t`` at ``path`` through zarr, ``ROWS`` bytes of rows at a time."""
    import zarr

    from ..io.zarr_ext import register_zarr_types

    register_zarr_types()  # (bfloat16)
    a = zarr.create_array(path, **kw, attributes=attrs, storage_options=storage_options)
    dtype = np.dtype(t.dtype)
    if math.prod(t.shape):
        rows = max(1, ROWS // max(1, math.prod(t.shape[1:]) * dtype.itemsize))
        n = t.shape[0] if t.shape else 1
        for r in range(0, n, rows):
            key = (slice(r, min(n, r + rows)),) if t.shape else ()
            a[key] = read_rows(t, key, dtype).astype(kept, copy=False)
