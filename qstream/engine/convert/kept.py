"""Tensors a conversion keeps: stored as they are, in their own type, beside the quantized."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ...budget import check_fits
from ...core import dimension_names
from ...errors import StoreError
from ...io.checkpoints import read_rows
from ...io.outputs import FLAT_KEYS, destination, publish, qarray
from ...io.storage import ALL_CHUNKS, auto_chunks
from ...io.storage import compression as compressions

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
    from ...qtypes import float_dtype

    dtype = np.dtype(t.dtype)
    kept = float_dtype(as_dtype) if as_dtype else dtype
    stored = kept
    check_fits(max_memory, getattr(t, "chunks", None), dtype, 1, tuple(t.shape))
    remove_own(path, storage_options)  # what a killed run left of this tensor
    kw = {
        "shape": t.shape,
        # (the chunks zarr picks when given none, as earlier versions let it: made without
        # zarr-python, which a conversion then need not import, ~0.2 s)
        "chunks": auto_chunks(tuple(t.shape), stored.itemsize),
        "dtype": stored,
        "compressors": compressions.compressors(compression),
        "dimension_names": dimension_names(len(t.shape)),
    }
    attrs = {"qstream": {"kept": True, "dtype": kept.name, ALL_CHUNKS: True}}
    local = destination.local_path(path)
    store_kept(
        local if local is not None else path,
        kw,
        attrs,
        lambda key: read_rows(t, key, dtype).astype(kept, copy=False),
        itemsize=max(dtype.itemsize, stored.itemsize),
        local=local is not None,
        storage_options=storage_options if local is None else None,
    )
    return {"kept": True, "error": None, "bytes_after": int(math.prod(t.shape) * stored.itemsize)}


def store_kept(
    path: str,
    kw: dict[str, Any],
    attrs: dict[str, Any],
    rows: Callable[[tuple[slice, ...]], np.ndarray],
    *,
    itemsize: int,
    local: bool,
    storage_options: dict | None = None,
) -> None:
    """Write the new array ``path`` (``create_array`` keywords ``kw``, attributes ``attrs``)
    from ``rows(key)``, the values of a range of rows (``itemsize``: the bytes a value takes
    in memory). Small and ``local`` (the common case: norms, biases): read and written whole
    at once, as small quantized tensors are, with zarr's own files and no round trips through
    zarr's event loop, which one thread runs for every worker; else through zarr, ``ROWS``
    bytes of rows at a time. Its chunk files lie side by side (``c.0``, as the quantized
    members' do): no chunk folder to create per kept tensor."""
    kw = {**kw, "chunk_key_encoding": FLAT_KEYS}
    shape = tuple(kw["shape"])
    if local and shape and 0 < math.prod(shape) * itemsize <= WHOLE:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        publish.write_array(path, kw, rows((slice(0, shape[0]),)), attrs)
        return
    import zarr

    from ...io.zarr_types.zarr_ext import register_zarr_types

    register_zarr_types()  # (bfloat16)
    every = qarray.WRITE_ALL_CHUNKS  # (all-zero chunks too: an absent one is damage)
    a = zarr.create_array(
        path, **kw, attributes=attrs, storage_options=storage_options, config=every
    )
    if math.prod(shape):
        step = max(1, ROWS // max(1, math.prod(shape[1:]) * itemsize))
        n = shape[0] if shape else 1
        for r in range(0, n, step):
            key = (slice(r, min(n, r + step)),) if shape else ()
            a[key] = rows(key)
