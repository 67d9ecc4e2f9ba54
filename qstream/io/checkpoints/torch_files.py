"""torch checkpoints: ``.pt`` / ``.pth`` / ``.bin`` state dicts, loaded with
``torch.load(..., weights_only=True, mmap=True)`` (no code in them runs; their storage is
memory-mapped, so a tensor's region is read when it is indexed)."""

from __future__ import annotations

import functools
import math
import os
import zipfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from ...errors import StoreError
from ..storage import one_line
from .dtypes import BF16
from .tensor import CheckpointTensor

TORCH_EXTS = (".pt", ".pth", ".bin")


def open_torch(path: str) -> dict[str, CheckpointTensor]:
    """A torch state dict (nested dicts flattened with '.'; non-tensor values skipped)."""
    try:
        import torch
    except ImportError:
        raise StoreError(
            "reading .pt/.bin needs torch: pip install 'qstream-zarr[torch]'"
        ) from None
    # a zip (torch >= 1.6) file is memory-mapped; an older, legacy file cannot be, and is read
    # whole (still with weights_only: no code in it runs)
    legacy = not zipfile.is_zipfile(path)
    try:
        obj = torch.load(path, weights_only=True, mmap=not legacy, map_location="cpu")
    except Exception as e:  # torch raises many types (RuntimeError, UnpicklingError, ...)
        raise StoreError(f"torch checkpoint {path}: cannot load ({one_line(e)})") from None
    dtypes = {
        torch.float64: np.dtype("f8"),
        torch.float32: np.dtype("f4"),
        torch.float16: np.dtype("f2"),
        torch.bfloat16: BF16,
        torch.int64: np.dtype("i8"),
        torch.int32: np.dtype("i4"),
        torch.int16: np.dtype("i2"),
        torch.int8: np.dtype("i1"),
        torch.uint8: np.dtype("u1"),
        torch.bool: np.dtype("?"),
    }
    if isinstance(obj, torch.Tensor):
        obj = {os.path.splitext(os.path.basename(path))[0]: obj}
    if not isinstance(obj, dict):
        raise StoreError(f"torch checkpoint {path}: not a state dict ({type(obj).__name__})")
    out: dict[str, CheckpointTensor] = {}
    for name, t in _flatten(obj):
        if not isinstance(t, torch.Tensor):
            continue
        if t.dtype not in dtypes:
            raise StoreError(f"torch checkpoint {path}: tensor {name!r}: unsupported {t.dtype}")
        dtype = dtypes[t.dtype]
        shape = tuple(t.shape)
        nbytes = math.prod(shape) * dtype.itemsize
        out[name] = CheckpointTensor(
            name, shape, dtype, nbytes, t, functools.partial(_torch_read, t)
        )
    return out


def _flatten(d: dict[Any, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _flatten(v, name + ".")
        else:
            yield name, v


def _torch_read(t: Any, key: tuple[int | slice, ...]) -> np.ndarray:
    """Slice a tensor (a view of the memory-mapped storage) and view it as NumPy."""
    import torch

    part = t[key]
    if part.dtype == torch.bfloat16:
        return part.view(torch.int16).numpy().view(BF16)
    return part.numpy()
