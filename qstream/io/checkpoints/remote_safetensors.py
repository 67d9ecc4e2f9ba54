"""Safetensors checkpoints in object stores: a file, an index or a folder, by URL.

Only headers are fetched here (a HEAD for the size, then one ranged request, two for a header
of more than :data:`HEADER_PREFIX` bytes); each tensor is a
:class:`~qstream.io.checkpoints.remote.RangedTensor` read region by region. The header checks are
those
of local files (:mod:`qstream.io.checkpoints.safetensors_header`); an index's shards must be
objects of
its own folder.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from ...errors import StoreError
from .dtypes import native
from .remote import RangedTensor, RemoteFolder, refuse_local_only, split_url
from .safetensors_header import MAX_HEADER, header_tensors, json_object
from .tensor import CheckpointTensor

HEADER_PREFIX = 64 << 10  # bytes of a remote safetensors file read first (most headers fit)


def open_remote(
    url: str, storage_options: dict[str, Any] | None, store: str | None
) -> dict[str, CheckpointTensor]:
    """A safetensors checkpoint at an object-store URL: a file, an index or a folder."""
    low = url.lower().rstrip("/")
    refuse_local_only(url)
    if low.endswith((".safetensors", ".index.json")):
        base, name = split_url(url)
        folder = RemoteFolder(base, store, storage_options)
        if low.endswith(".index.json"):
            return open_remote_index(folder, name)
        return open_remote_safetensors(folder, name)
    folder = RemoteFolder(url.rstrip("/"), store, storage_options)
    names = folder.names()
    indexes = [n for n in names if n.endswith(".safetensors.index.json")]
    if "model.safetensors.index.json" in names:
        return open_remote_index(folder, "model.safetensors.index.json")
    if len(indexes) == 1:
        return open_remote_index(folder, indexes[0])
    files = [n for n in names if n.endswith(".safetensors")]
    if not files or indexes:
        what = "is empty or missing" if not names else "is not a safetensors checkpoint"
        raise StoreError(
            f"{url} {what}: a checkpoint URL names a .safetensors file, a"
            " *.safetensors.index.json, or a folder holding either (one index)"
        )
    out: dict[str, CheckpointTensor] = {}
    for fname in files:
        for name, t in open_remote_safetensors(folder, fname).items():
            if name in out:
                raise StoreError(f"tensor {name!r} is in two files of the folder {url}")
            out[name] = t
    return out


def open_remote_safetensors(
    folder: RemoteFolder, fname: str, only: set[str] | None = None
) -> dict[str, CheckpointTensor]:
    """A safetensors object's header, read with one ranged request (two for a header of
    more than :data:`HEADER_PREFIX` bytes) after a HEAD for its size; its tensors read by
    ranges (:class:`~qstream.io.checkpoints.remote.RangedTensor`)."""
    where = f"safetensors file {folder.where(fname)}"
    size = folder.size(fname)
    if size is None:
        raise StoreError(f"no such object: {folder.where(fname)}")
    head = folder.read(fname, 0, min(size, HEADER_PREFIX))
    if len(head) < 8:
        raise StoreError(f"{where} is truncated: {size} bytes, no header length")
    (n,) = struct.unpack("<Q", head[:8])
    if 8 + n > size:
        raise StoreError(f"{where}: header length {n} is beyond the file size {size}")
    if n > MAX_HEADER:
        raise StoreError(
            f"{where}: header of {n} bytes is above the format's limit of {MAX_HEADER}"
        )
    raw = head[8 : 8 + n]
    if len(raw) < n:
        raw += folder.read(fname, len(head), 8 + n)
    if len(raw) != n:
        raise StoreError(f"{where}: the header ended early ({len(raw)} of {n} bytes)")

    def make(name: str, dtype: np.dtype[Any], shape: list[int], at: int) -> CheckpointTensor:
        dims = tuple(int(s) for s in shape)
        src = RangedTensor(folder, fname, at, dtype, dims)
        nbytes = math.prod(dims) * dtype.itemsize
        return CheckpointTensor(name, dims, native(dtype), nbytes, src, remote=src)

    return header_tensors(where, raw, n, size, only, make)


def open_remote_index(folder: RemoteFolder, fname: str) -> dict[str, CheckpointTensor]:
    """A sharded checkpoint in an object store: its shards are objects of the index's folder
    (plain relative names, as :func:`~qstream.io.checkpoints.safetensors_files.check_shard`
    requires of
    local shards)."""
    where = f"safetensors index {folder.where(fname)}"
    size = folder.size(fname)
    if size is None:
        raise StoreError(f"no such object: {folder.where(fname)}")
    if size > MAX_HEADER:
        raise StoreError(f"{where} is larger than {MAX_HEADER} bytes")
    index = json_object(folder.read(fname, 0, size), f"{where}: invalid JSON")
    wmap = index.get("weight_map")
    if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
        raise StoreError(f"{where}: no valid 'weight_map' object")
    prefix = fname.rpartition("/")[0]
    shards: dict[str, dict[str, CheckpointTensor]] = {}
    for shard in dict.fromkeys(wmap.values()):
        parts = shard.split("/")
        if (
            not shard
            or shard.startswith("/")
            or "\\" in shard
            or "\x00" in shard
            or "://" in shard
            or any(p in ("", ".", "..") for p in parts)
        ):
            raise StoreError(
                f"{where} names a shard outside its folder: {shard!r}; shards must be objects"
                " beside the index"
            )
        key = f"{prefix}/{shard}" if prefix else shard
        names = {k for k, v in wmap.items() if v == shard}
        try:
            shards[shard] = open_remote_safetensors(folder, key, names)
        except StoreError as e:
            if str(e).startswith("no such object"):
                raise StoreError(f"{where} names a missing shard: {shard!r}") from None
            raise
    out: dict[str, CheckpointTensor] = {}
    for name, shard in wmap.items():
        if name not in shards[shard]:
            raise StoreError(f"{where}: tensor {name!r} is not in shard {shard!r}")
        out[name] = shards[shard][name]
    return out
