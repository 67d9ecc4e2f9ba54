"""Readable arrays: a Zarr array, a NumPy array or a checkpoint tensor, read by regions.

A :class:`Source` reads a job's input block by block: straight from the chunk files where
:func:`~qstream.io.storage.chunks.chunk_files` allows (mapped when uncompressed), else through zarr
in
parts of a bounded number of chunks; a checkpoint tensor's regions are mapped from its file or
read into the caller's buffer. :class:`ArrayWriter` writes chunk-aligned regions the same way.
Sources are opened by :func:`qstream.io.storage.stores.open_source`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import StoreError
from .chunks import PARTIAL, ChunkFiles, chunk_files

MAX_PIECES = 1024  # a block of more stored chunks is read whole, not processed chunk by chunk
ZARR_READ_CHUNKS = 4096  # stored chunks per read through zarr (it plans every chunk at once)


@dataclass
class Source:
    """A readable array: a Zarr array or an in-memory NumPy array / memmap."""

    array: Any  # zarr.Array, np.ndarray, or an array-like (a checkpoint tensor)
    description: dict[str, Any]
    files: ChunkFiles | None = field(default=None, repr=False)  # direct chunk reads
    # checkpoint tensors' regions mapped from their files (False: read, which costs less for
    # a small tensor than a mapping of its own)
    maps: bool = field(default=True, repr=False)
    # all of its values, read once and kept (a small tensor, read by every pass of its job)
    pinned: np.ndarray[Any, Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.files is None and self.description.get("kind") == "zarr":
            self.files = chunk_files(self.array)

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape."""
        return tuple(self.array.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        """The array's element type (as stored)."""
        return np.dtype(self.array.dtype)

    @property
    def chunks(self) -> tuple[int, ...] | None:
        """The stored chunks (shards if sharded; a checkpoint tensor's, see
        ``CheckpointTensor.chunks``), or None for arrays read by any region."""
        if self.description.get("kind") != "zarr":
            return (
                getattr(self.array, "chunks", None)
                if self.description.get("kind") == "array"
                else None
            )
        shards = getattr(self.array, "shards", None)
        return tuple(shards or self.array.chunks)

    @property
    def compressors(self) -> Any:
        """The source's compressors for a Zarr v3 source (outputs reuse them), else "auto"."""
        if self.description.get("kind") == "zarr" and self.description.get("zarr_format") == 3:
            return self.array.compressors
        return "auto"

    def pieces(self, key: tuple[slice, ...]) -> list[tuple[slice, ...]]:
        """The region ``key`` cut where stored chunks end, in C order (``[key]`` when the
        source has no chunk files of its own)."""
        if self.files is None:
            return [key]
        if self.files.count(key) > MAX_PIECES:
            return [key]  # tiny chunks: the block is read into one buffer, chunk by chunk
        return [
            tuple(
                slice(k.start + o.start, k.start + o.stop) for k, o in zip(key, outer, strict=True)
            )
            for _, _, outer in self.files.chunks_of(key)
        ]

    def view(self, key: tuple[slice, ...]) -> np.ndarray[Any, Any] | None:
        """The region ``key`` without a copy (a mapped uncompressed chunk, a NumPy source's
        own memory, or a checkpoint tensor's mapped file), or None: then use :meth:`read`."""
        if self.pinned is not None:
            return self.pinned[key]
        if self.files is not None:
            return self.files.view(key)
        if isinstance(self.array, np.ndarray):
            return self.array[key]
        if self.maps and _maps_regions(self.array):  # mapped from its file
            mapped: np.ndarray[Any, Any] | None = self.array.view(key)
            return mapped
        return None

    def read(
        self, key: tuple[slice, ...], out: np.ndarray[Any, Any] | None = None
    ) -> np.ndarray[Any, Any]:
        """The values of the region ``key`` as a C-contiguous array (written into ``out``, of
        the region's shape and the source's dtype, when given)."""
        if self.files is not None:
            if out is None:
                out = np.empty(tuple(k.stop - k.start for k in key), self.dtype)
            self.files.read(key, out)
            return out
        if out is not None and hasattr(self.array, "read_into") and self.array.read_into(key, out):
            return out  # a checkpoint tensor's bytes read straight into ``out``
        parts = list(self._zarr_parts(key)) if self.description.get("kind") == "zarr" else [key]
        if len(parts) == 1:
            values = self._get(key)
            if out is None:
                return np.ascontiguousarray(values)
            out[...] = values
            return out
        if out is None:
            out = np.empty(tuple(k.stop - k.start for k in key), self.dtype)
        for part in parts:
            at = tuple(
                slice(p.start - k.start, p.stop - k.start) for p, k in zip(part, key, strict=True)
            )
            out[at] = self._get(part)
        return out

    def _zarr_parts(self, key: tuple[slice, ...]) -> list[tuple[slice, ...]]:
        """``key`` cut along its outer axes into regions of at most :data:`ZARR_READ_CHUNKS`
        stored chunks (zarr plans a read's chunks all at once: millions of tiny chunks would
        take gigabytes)."""
        grid = getattr(self.array, "chunks", None)
        if not grid or not key:
            return [key]
        return list(_cut(key, tuple(grid), ZARR_READ_CHUNKS))

    def _get(self, key: tuple[slice, ...]) -> Any:
        try:
            return self.array[key]
        except Exception as e:  # zarr raises on chunks that decode to the wrong size, ...
            if isinstance(e, StoreError):
                raise
            from .backends import store_cause  # (a store's failure: one line, its cause)

            raise StoreError(
                f"{self.description.get('path')}: cannot read region"
                f" {_region_text(key)}{self._chunk_text(key)}: {store_cause(e)}"
            ) from None

    def missing_chunks(self) -> int:
        """Stored chunks (shards) the source lacks: they read as the fill value."""
        if self.description.get("kind") != "zarr":
            return 0
        a = self.array
        grid = self.chunks or ()
        total = math.prod(-(-s // c) for s, c in zip(a.shape, grid, strict=True)) if a.shape else 1
        if self.files is not None:  # counted from the directory listing, entry by entry
            return max(0, total - _count_files(self.files.root))
        from zarr.core.sync import sync

        store, prefix = a.store_path.store, a.store_path.path

        async def count() -> int:  # keys as they are listed (none held)
            n = 0
            async for key in store.list_prefix(prefix):
                n += key.rsplit("/", 1)[-1] not in _DOCS
            return n

        try:
            return max(0, total - sync(count()))
        except Exception:  # a store that cannot list its keys
            return 0

    def _chunk_text(self, key: tuple[slice, ...]) -> str:
        grid = self.chunks
        if not grid or not key:
            return ""
        first = tuple(k.start // c for k, c in zip(key, grid, strict=True))
        last = tuple(max(k.start, k.stop - 1) // c for k, c in zip(key, grid, strict=True))
        return f" (chunk {first})" if first == last else f" (chunks {first} to {last})"


_DOCS = ("zarr.json", ".zarray", ".zattrs", ".zgroup")


def _maps_regions(array: object) -> bool:
    """Whether ``array`` maps regions of its file (``view(key)``, None where it cannot) and
    reads them into buffers (``read_into``): a checkpoint tensor
    (:class:`qstream.io.checkpoints.open.CheckpointTensor`). Known by those methods, as
    ``read_into`` is in :meth:`Source.read`: checkpoint sources are read through this module,
    which does not import them."""
    return callable(getattr(array, "read_into", None)) and callable(getattr(array, "view", None))


def _count_files(root: str) -> int:
    """Chunk files below an array's directory (not its metadata or temporary files)."""
    n = 0
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.name not in _DOCS and not entry.name.endswith(PARTIAL):
                    n += 1
    return n


def _cut(key: tuple[slice, ...], grid: tuple[int, ...], limit: int) -> Iterator[tuple[slice, ...]]:
    """Regions covering ``key`` in C order, each touching at most ``limit`` chunks of
    ``grid`` (cut along the first axis whose chunk rows are too many, recursively)."""
    counts = [-(-k.stop // c) - k.start // c for k, c in zip(key, grid, strict=True)]
    if math.prod(counts) <= limit or not key:
        yield key
        return
    rest = math.prod(counts[1:])
    rows = max(1, limit // max(1, rest))
    step = rows * grid[0]
    start = key[0].start
    while start < key[0].stop:
        stop = min(key[0].stop, (start // grid[0]) * grid[0] + step)
        if rest > limit:  # one chunk row is too many: cut the inner axes too
            for inner in _cut(key[1:], grid[1:], limit):
                yield (slice(start, stop), *inner)
        else:
            yield (slice(start, stop), *key[1:])
        start = stop


def _region_text(key: tuple[slice, ...]) -> str:
    return "[" + ", ".join(f"{k.start}:{k.stop}" for k in key) + "]"


class ArrayWriter:
    """Writes chunk-aligned regions of a Zarr array: straight to its chunk files where
    :func:`~qstream.io.storage.chunks.chunk_files` allows, else through zarr."""

    def __init__(self, array: Any) -> None:
        self.array = array
        self.files = chunk_files(array)

    def __setitem__(self, key: tuple[slice, ...], value: np.ndarray[Any, Any]) -> None:
        if self.files is not None:
            self.files.write(key, value)
        else:
            # a copy: zarr's MemoryStore keeps the caller's buffer itself for an uncompressed
            # chunk, and the engine reuses its buffers for the next block
            self.array[key] = np.array(value, copy=True)
