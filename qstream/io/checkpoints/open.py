"""Read model checkpoints tensor by tensor, by slices, without loading whole files.

:func:`open_checkpoint` maps every tensor of a checkpoint to a tensor whose ``t[key]`` reads
just that region (a :class:`~qstream.io.checkpoints.tensor.CheckpointTensor`). Supported
inputs, each read by its own module:

- safetensors: one ``.safetensors`` file, a ``*.safetensors.index.json`` (sharded), or a
  directory holding either (the header is parsed here; data is memory-mapped, bf16 included;
  :mod:`~qstream.io.checkpoints.safetensors_files`), or any of those in an object store, read by
  byte
  ranges (:mod:`~qstream.io.checkpoints.remote_safetensors`); a file qstream exported reads as its
  dequantized values (:mod:`~qstream.io.checkpoints.exported`);
- ``.npy`` (memory-mapped) and ``.npz`` (stored members memory-mapped inside the zip;
  compressed members are decompressed whole on first access); bfloat16 and float8_e5m2
  arrays that ``np.save`` wrote (NumPy itself reads them as raw bytes, or not at all) read
  as those types (:mod:`~qstream.io.checkpoints.npy_files`);
- a Zarr group (directory or ``.zip``): every floating-point array, recursively
  (:mod:`~qstream.io.checkpoints.zarr_groups`);
- torch ``.pt`` / ``.pth`` / ``.bin`` state dicts (``torch.load(..., mmap=True)``;
  :mod:`~qstream.io.checkpoints.torch_files`).

:class:`CheckpointSource` is how any process (a Dask worker too) opens one for a conversion.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import StoreError
from ...paths import is_inside, kind_of, refuse_special
from ..storage import location
from .ct_formats import read_quantized
from .export_meta import read_json, source_config
from .exported import DequantizedTensor, maybe_dequantizing
from .fp8 import ScaleRule, pair_scales
from .npy_files import open_npy, open_npz
from .remote import RemoteFolder, is_url, split_url
from .remote_safetensors import open_remote
from .safetensors_files import checkpoint_roots, open_safetensors, open_safetensors_index
from .tensor import CheckpointTensor as CheckpointTensor
from .tensor import TensorLike
from .tensor import map_file_run as map_file_run
from .tensor import read_file_run as read_file_run
from .tensor import read_rows as read_rows
from .torch_files import TORCH_EXTS, open_torch
from .zarr_groups import open_zarr

SUPPORTED_FORMATS = (
    ".safetensors, *.safetensors.index.json, a safetensors directory, .npy, .npz, "
    "a Zarr group (directory or .zip), torch .pt/.pth/.bin, .gguf"
)


def open_checkpoint(
    path: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    store: str | None = None,
) -> dict[str, TensorLike]:
    """Open a checkpoint and return its tensors by name, in the order of the file(s).

    Nothing but headers is read here. Raises :class:`~qstream.errors.StoreError` for missing,
    truncated, corrupt or unsupported inputs. ``path`` may be an object-store URL of a
    safetensors file, a folder or a ``*.safetensors.index.json``: its tensors are then read by
    byte ranges through ``store`` (``"fsspec"`` or ``"obstore"``, with ``storage_options``).
    """
    p = os.fspath(path)
    if is_url(p):
        tensors = dict(open_remote(p, storage_options, store))
        return read_quantized(tensors, _remote_config(p, storage_options, store), p)
    kind = kind_of(p)
    if kind is None:
        raise StoreError(f"no such file or directory: {p}")
    if kind == "special":
        refuse_special(p, "checkpoint")
    if kind == "dir":
        return _open_directory(p)
    low = p.lower()
    if low.endswith((".index.json", ".safetensors")):
        # qstream's own exports: their values
        opened = open_safetensors_index(p) if low.endswith(".json") else open_safetensors(p)
        return _as_quantized(p, maybe_dequantizing(p, opened))
    if low.endswith(".npy"):
        return dict(open_npy(p))
    if low.endswith(".npz"):
        return dict(open_npz(p))
    if low.endswith(".zip"):
        return dict(open_zarr(p))
    if low.endswith(TORCH_EXTS):
        return dict(open_torch(p))
    if low.endswith(".gguf"):
        from .gguf_source import open_gguf

        return open_gguf(p)  # (its tensors under their Hugging Face names where known)
    raise StoreError(f"unsupported checkpoint {p}: supported formats are {SUPPORTED_FORMATS}")


def _as_quantized(path: str, tensors: dict[str, TensorLike]) -> dict[str, TensorLike]:
    """``tensors`` read as the quantization the ``config.json`` beside them names (or
    refused, before any tensor is read); qstream's own exports already read as their values."""
    if any(isinstance(t, DequantizedTensor) for t in tensors.values()):
        return tensors
    cfg = source_config(path)
    doc = read_json(cfg) if cfg is not None else None
    if cfg is not None and doc is None:
        raise StoreError(f"{cfg}: not a readable JSON object (a model config.json)")
    return read_quantized(tensors, doc, path)


def _remote_config(
    url: str, storage_options: dict[str, Any] | None, store: str | None
) -> dict[str, Any] | None:
    """The ``config.json`` beside a checkpoint URL (a folder's, or a file's folder's)."""
    low = url.lower().rstrip("/")
    base = split_url(url)[0] if low.endswith((".safetensors", ".json")) else url.rstrip("/")
    folder = RemoteFolder(base, store, storage_options)
    size = folder.size("config.json")
    if size is None:
        return None
    try:
        doc = json.loads(folder.read("config.json", 0, min(size, 100 << 20)))
    except ValueError:
        raise StoreError(f"{folder.where('config.json')}: not a JSON object") from None
    return doc if isinstance(doc, dict) else None


def _open_directory(path: str) -> dict[str, TensorLike]:
    """A Zarr group, or a folder of safetensors files (one index, or files without one)."""
    names = os.listdir(path)
    if any(n in names for n in ("zarr.json", ".zgroup", ".zarray")):
        return dict(open_zarr(path))
    # qstream's own exports: their values
    if "model.safetensors.index.json" in names:
        index = os.path.join(path, "model.safetensors.index.json")
        return _as_quantized(path, maybe_dequantizing(index, open_safetensors_index(index)))
    indexes = sorted(n for n in names if n.endswith(".safetensors.index.json"))
    if len(indexes) == 1:
        index = os.path.join(path, indexes[0])
        return _as_quantized(path, maybe_dequantizing(index, open_safetensors_index(index)))
    files = sorted(n for n in names if n.endswith(".safetensors"))
    if not files or indexes:
        raise StoreError(
            f"directory {path} is neither a Zarr group nor a safetensors checkpoint with "
            f"one index (supported formats: {SUPPORTED_FORMATS})"
        )
    out: dict[str, TensorLike] = {}
    for fname in files:
        full = os.path.join(path, fname)
        if not any(is_inside(full, root) for root in checkpoint_roots(path)):
            raise StoreError(
                f"{full} is a link to a file outside the checkpoint's folder; copy the file"
                " into it (or pass the file itself)"
            )
        for name, t in maybe_dequantizing(full, open_safetensors(full)).items():
            if name in out:
                raise StoreError(f"tensor {name!r} is in two files of the folder {path}")
            out[name] = t
    return _as_quantized(path, out)


@dataclass(frozen=True)
class CheckpointSource:
    """How any process opens a checkpoint for a conversion: its path or URL, the store
    options of a URL, and the recipe's FP8 scale pairing (``ScaleRule.to_dict()``). Picklable:
    a Dask worker opens the checkpoint itself (headers only) and reads its own regions."""

    path: str
    storage_options: dict[str, Any] | None = field(default=None, compare=False)
    store: str | None = None
    scales: dict[str, Any] | None = None

    def open_raw(self) -> dict[str, TensorLike]:
        """The checkpoint's tensors as stored."""
        return open_checkpoint(self.path, storage_options=self.storage_options, store=self.store)

    def pair(self, tensors: Mapping[str, TensorLike]) -> dict[str, TensorLike]:
        """``tensors`` with FP8 weights paired with their scales (see
        ``qstream.io.checkpoints.fp8``)."""
        return pair_scales(tensors, ScaleRule.from_dict(self.scales))

    def open(self) -> dict[str, TensorLike]:
        """The tensors a conversion converts (FP8 ones as float32, scales consumed)."""
        return self.pair(self.open_raw())


def source_locations(path: str | os.PathLike[str], tensors: Mapping[str, TensorLike]) -> list[str]:
    """Where the checkpoint ``path`` (opened as ``tensors``) lives: its own location and
    every file its tensors are mapped from (a sharded index's shards), links resolved."""
    own = location(path)
    assert own is not None  # (a path or a URL always has one)
    files = {f[0] for t in tensors.values() if (f := getattr(t, "file", None)) is not None}
    return sorted({own} | {os.path.realpath(f) for f in files})
