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

:func:`describe_stored` says what quantized format a safetensors model checkpoint is stored in
(``compressed-tensors float-quantized (FP8, per channel)``, ``DeepSeek fp8 blocks 128x128``,
``gpt-oss MXFP4 experts``, ``GPTQ 4-bit, groups of 128``, ...) from its ``config.json`` and
headers alone, and whether qstream decodes it.

:class:`CheckpointSource` is how any process (a Dask worker too) opens one for a conversion.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import StoreError
from ...input_files import kind_of, refuse_special
from ...paths import is_inside
from ..storage import location
from .ct_formats import (
    CT_FORMATS,
    FOREIGN,
    LayoutRefused,
    check_quant_config,
    quant_config,
    read_quantized,
)
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
    byte ranges through ``store`` (``"fsspec"`` or ``"obstore"``, with ``storage_options``),
    or of a ``.gguf`` file (its header and tensors read by ranges too).
    """
    p = os.fspath(path)
    if is_url(p) and p.lower().endswith(".gguf"):  # read by ranges, as a local GGUF file
        from .gguf_source import open_gguf

        return open_gguf(p, storage_options=storage_options, store=store)
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


# -- what a model checkpoint is stored as (qstream inspect) ------------------------------

_CT_KIND = {
    "nvfp4-pack-quantized": "NVFP4",
    "mxfp4-pack-quantized": "MXFP4",
    "mxfp8-quantized": "MXFP8",
}


def describe_stored(
    path: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    store: str | None = None,
) -> dict[str, Any]:
    """A safetensors model checkpoint (a folder, a ``.safetensors`` file or an index) as
    stored: ``quantization`` names its format (``not quantized`` for plain values),
    ``decoded`` says whether qstream reads it as values (else ``refused``: why), then the
    tensor count per stored dtype, the stored bytes and ``tensor_list`` (every tensor's name,
    stored dtype, shape and bytes, as stored). Reads the headers and ``config.json`` only; a
    URL's by ranges through ``store`` with ``storage_options``."""
    p = os.fspath(path)
    if is_url(p):
        tensors: Mapping[str, TensorLike] = open_remote(p, storage_options, store)
        doc = _remote_config(p, storage_options, store)
    else:
        tensors = _stored_tensors(p)
        cfg = source_config(p)
        doc = read_json(cfg) if cfg is not None else None
    quantization, refused = name_format(tensors, doc, p)
    types: dict[str, int] = {}
    listed = []
    for name, t in tensors.items():
        dt = np.dtype(t.dtype).name
        types[dt] = types.get(dt, 0) + 1
        listed.append({"name": name, "dtype": dt, "shape": list(t.shape), "bytes": int(t.nbytes)})
    return {
        "file": p,
        "format": "safetensors",
        "quantization": quantization,
        "decoded": refused is None,
        "refused": refused,
        "tensors": len(tensors),
        "types": dict(sorted(types.items(), key=lambda item: -item[1])),
        "bytes": sum(int(t.nbytes) for t in tensors.values()),
        "tensor_list": listed,
    }


def _stored_tensors(p: str) -> dict[str, TensorLike]:
    """The tensors of a safetensors checkpoint as stored (no decoding)."""
    if os.path.isdir(p):
        names = sorted(os.listdir(p))
        indexes = [n for n in names if n.endswith(".safetensors.index.json")]
        if len(indexes) == 1:
            return dict(open_safetensors_index(os.path.join(p, indexes[0])))
        files = [n for n in names if n.endswith(".safetensors")]
        if indexes or not files:
            raise StoreError(f"{p} is not a safetensors checkpoint with one index")
        out: dict[str, TensorLike] = {}
        for f in files:
            out.update(open_safetensors(os.path.join(p, f)))
        return out
    if p.endswith(".json"):
        return dict(open_safetensors_index(p))
    return dict(open_safetensors(p))


def name_format(
    tensors: Mapping[str, TensorLike], doc: Mapping[str, Any] | None, where: str
) -> tuple[str, str | None]:
    """``(the format's name, None)`` for a layout qstream decodes, ``(name, why refused)``
    for one it refuses."""
    try:
        qc = quant_config(doc)
    except LayoutRefused as e:
        return "unreadable quantization_config", str(e)
    if qc is None:
        for name in tensors:
            for suffix, what in FOREIGN:
                if name.endswith(suffix):
                    return what, "no quantization_config names the layout"
        return "not quantized", None
    method = str(qc.get("quant_method"))
    try:
        check_quant_config(qc, where)
        refused = None
    except LayoutRefused as e:
        refused = str(e)
    if method == "fp8":
        block = qc.get("weight_block_size")
        shape = "x".join(str(b) for b in block) if isinstance(block, list) else None
        return (f"DeepSeek fp8 blocks {shape}" if shape else "fp8 (per tensor)"), refused
    if method == "mxfp4":
        return "gpt-oss MXFP4 experts (*_blocks + *_scales)", refused
    if method != "compressed-tensors":
        bits, group = (
            qc.get("bits") or qc.get("w_bit"),
            qc.get("group_size") or qc.get("q_group_size"),
        )
        parts = [f"{bits}-bit" if bits else None, f"groups of {group}" if group else None]
        if qc.get("desc_act"):
            parts.append("act-order")
        detail = ", ".join(p for p in parts if p)
        return f"{method.upper()}{f' {detail}' if detail else ''}", refused
    groups = [g for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict)]
    names = [_ct_group(g, qc.get("format")) for g in groups] or [f"{qc.get('format')}"]
    return "compressed-tensors " + "; ".join(dict.fromkeys(names)), refused


def _ct_group(group: Mapping[str, Any], top: Any) -> str:
    fmt = str(group.get("format") or top)
    w = group.get("weights") or {}
    if fmt in _CT_KIND:
        kind = _CT_KIND[fmt]
    elif fmt == "float-quantized":
        kind = f"FP{w.get('num_bits', 8)}"
    elif fmt in CT_FORMATS:
        kind = f"INT{w.get('num_bits', 8)}"
    else:
        return fmt
    strategy = w.get("strategy")
    how = {"tensor": "per tensor", "channel": "per channel"}.get(str(strategy))
    if strategy == "block" and w.get("block_structure"):
        how = "blocks " + "x".join(str(b) for b in w["block_structure"])
    elif strategy in ("group", "tensor_group") and w.get("group_size"):
        how = f"groups of {w['group_size']}"
    if w.get("symmetric") is False:
        how = f"{how}, zero points" if how else "zero points"
    return f"{fmt} ({kind}{f', {how}' if how and fmt not in _CT_KIND else ''})"
