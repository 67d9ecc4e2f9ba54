"""Zarr groups as checkpoints (a directory or a ``.zip``): every floating-point array."""

from __future__ import annotations

import math
import os
import zipfile

import numpy as np

from ...errors import StoreError
from ...input_files import check_tree
from ..storage import one_line
from .dtypes import BF16
from .tensor import CheckpointTensor


def open_zarr(path: str) -> dict[str, CheckpointTensor]:
    """Every floating-point array of a Zarr group (names relative to it, joined by '/')."""
    import zarr

    if not path.endswith(".zip"):  # no FIFO in it, and no link out of it
        check_tree(path, "Zarr checkpoint", links="inside")
    try:
        store = zarr.storage.ZipStore(path, mode="r") if path.endswith(".zip") else path
        node = zarr.open(store, mode="r")
        if isinstance(node, zarr.Array):
            members = [(os.path.splitext(os.path.basename(path.rstrip("/")))[0], node)]
        else:
            members = sorted(
                (n, a) for n, a in node.members(max_depth=None) if isinstance(a, zarr.Array)
            )
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise StoreError(f"Zarr store {path}: cannot open ({one_line(e)})") from None
    out: dict[str, CheckpointTensor] = {}
    for name, a in members:
        dtype = np.dtype(a.dtype)
        if dtype.kind == "f" or dtype == BF16:
            shape = tuple(a.shape)
            stored = tuple(getattr(a, "shards", None) or a.chunks) if shape else None
            out[name] = CheckpointTensor(
                name, shape, dtype, math.prod(shape) * dtype.itemsize, a, chunks=stored
            )
    return out
