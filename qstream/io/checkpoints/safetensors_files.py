"""Local safetensors checkpoints: one file, or shards named by a ``*.safetensors.index.json``.

A file's header is parsed and checked (:mod:`qstream.io.checkpoints.safetensors_header`); its
tensors are
memory-mapped on use (bf16 included). An index's shards must be files of its own folder (or,
for a Hugging Face cache snapshot, its repository's ``blobs``): nothing outside is read.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np

from ...errors import StoreError
from ...input_files import kind_of, open_regular
from ...paths import is_inside
from .mapped_files import FileMap, memmap_tensor
from .safetensors_header import MAX_HEADER, header_tensors, json_object
from .tensor import CheckpointTensor


def open_safetensors(path: str, only: set[str] | None = None) -> dict[str, CheckpointTensor]:
    """Parse and validate a safetensors header; map the tensors (all, or those in ``only``)."""
    where = f"safetensors file {path}"
    try:
        with open_regular(path, "safetensors file") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise StoreError(f"{where} is truncated: {size} bytes, no header length")
            (n,) = struct.unpack("<Q", head)
            if 8 + n > size:
                raise StoreError(f"{where}: header length {n} is beyond the file size {size}")
            if n > MAX_HEADER:
                raise StoreError(
                    f"{where}: header of {n} bytes is above the format's limit of {MAX_HEADER}"
                )
            raw = f.read(n)
    except FileNotFoundError:
        raise StoreError(f"no such file: {path}") from None
    fmap = FileMap(path)

    def make(name: str, dtype: np.dtype[Any], shape: list[int], at: int) -> CheckpointTensor:
        return memmap_tensor(name, fmap, at, dtype, shape)

    return header_tensors(where, raw, n, size, only, make)


def open_safetensors_index(path: str) -> dict[str, CheckpointTensor]:
    """A sharded safetensors checkpoint: ``weight_map`` maps tensor names to shard files,
    which must lie in the index's folder (see :func:`check_shard`)."""
    with open_regular(path, "safetensors index") as f:
        raw = f.read(MAX_HEADER + 1)
    if len(raw) > MAX_HEADER:
        raise StoreError(f"safetensors index {path} is larger than {MAX_HEADER} bytes")
    index = json_object(raw, f"safetensors index {path}: invalid JSON")
    wmap = index.get("weight_map")
    if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
        raise StoreError(f"safetensors index {path}: no valid 'weight_map' object")
    base = os.path.dirname(path)
    shards: dict[str, dict[str, CheckpointTensor]] = {}
    for shard in dict.fromkeys(wmap.values()):
        shard_path = check_shard(path, base, shard)
        if kind_of(shard_path) != "file":
            what = "names a missing shard" if kind_of(shard_path) is None else "names a shard that"
            tail = "" if kind_of(shard_path) is None else " is not a regular file"
            raise StoreError(f"safetensors index {path} {what}: {shard!r}{tail}")
        shards[shard] = open_safetensors(shard_path, {k for k, v in wmap.items() if v == shard})
    out: dict[str, CheckpointTensor] = {}
    for name, shard in wmap.items():
        if name not in shards[shard]:
            raise StoreError(f"safetensors index {path}: tensor {name!r} is not in shard {shard!r}")
        out[name] = shards[shard][name]
    return out


def check_shard(index: str, base: str, shard: str) -> str:
    """The path of the shard file ``shard`` named by ``index``: a plain relative path inside
    the index's folder ``base`` (no ``..``, no absolute path, no link that leads out of the
    folder; a Hugging Face cache snapshot's links into its repository's ``blobs`` are in)."""
    parts = shard.replace("\\", "/").split("/")
    if (
        not shard
        or os.path.isabs(shard)
        or "\\" in shard
        or "\x00" in shard
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise StoreError(
            f"safetensors index {index} names a shard outside its folder: {shard!r}; shards"
            " must be files beside the index"
        )
    path = os.path.join(base, *parts)
    if not any(is_inside(path, root) for root in checkpoint_roots(base)):
        raise StoreError(
            f"safetensors index {index}: shard {shard!r} is a link to a file outside the"
            " checkpoint's folder; copy the shards into it (or pass the folder they are in)"
        )
    return path


def checkpoint_roots(base: str) -> list[str]:
    """Where the files of the checkpoint folder ``base`` may lie: the folder, and for a
    Hugging Face cache snapshot (``.../snapshots/<revision>``) its repository's ``blobs``."""
    roots = [base]
    parent = os.path.dirname(os.path.abspath(base))
    if os.path.basename(parent) == "snapshots":
        roots.append(os.path.join(os.path.dirname(parent), "blobs"))
    return roots
