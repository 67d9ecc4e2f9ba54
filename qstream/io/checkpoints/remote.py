"""Checkpoint files in object stores (``s3://``, ``gs://``, ...), read by byte ranges.

A :class:`RemoteFolder` is a folder URL opened through the store layer the Zarr paths use
(:func:`qstream.io.storage.stores.with_backend` for obstore,
:func:`qstream.io.storage.stores.open_store` for
fsspec: the same timeouts, retries and one-line errors); a :class:`RangedTensor` is one
tensor's bytes in one of its files, read region by region with ranged GETs (a whole file is
never fetched). Both are small picklable values: a Dask worker opens its own store (once per
process) and reads its own ranges.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from ...errors import StoreError

_STORES: dict[tuple[str, str | None, str], Any] = {}
_STORES_LOCK = threading.Lock()
RUNS_PER_BATCH = 1024  # byte runs of one region fetched in one batch of ranged requests
BATCH_SPAN = 16 << 20  # bytes a batch of runs may span (obstore coalesces nearby ranges)
MAX_LISTING = 100_000  # names of a checkpoint folder qstream lists


def is_url(path: object) -> bool:
    """Whether ``path`` is an object-store URL a checkpoint can be read from by ranges."""
    p = str(path)
    return "://" in p and not p.startswith(("file://", "memory://"))


# formats qstream reads from local files only (mapped or loaded whole), by their suffix
LOCAL_ONLY = {
    ".npy": "a .npy file",
    ".npz": "a .npz file",
    ".zip": "a zipped Zarr group",
    ".pt": "a torch file",
    ".pth": "a torch file",
    ".bin": "a torch file",
}


def refuse_local_only(url: str, kind: str | None = None) -> None:
    """Refuse a URL naming a file of a format qstream reads from local paths only (.npy/.npz,
    a zipped Zarr group, torch files; ``kind``: that format whatever the suffix), before any
    byte of it is read: a
    :class:`~qstream.io.checkpoints.ct_formats.LayoutRefused` (the command line's exit 2)."""
    from .ct_formats import LayoutRefused

    low = url.lower().rstrip("/")
    for suffix, named in [*LOCAL_ONLY.items(), ("", kind)]:
        if named and low.endswith(suffix):
            raise LayoutRefused(
                f"{url}: {named} is read from a local path, not from a URL (download it first);"
                " a checkpoint URL names a .safetensors file, a *.safetensors.index.json, a"
                " folder holding either, or a .gguf file"
            )


def split_url(url: str) -> tuple[str, str]:
    """``(folder URL, file name)`` of the object ``url``."""
    folder, _, name = url.rstrip("/").rpartition("/")
    if "://" not in folder or not folder.split("://", 1)[1]:
        raise StoreError(f"{url}: a checkpoint URL names a bucket and an object or folder in it")
    return folder, name


def _prototype() -> Any:
    from zarr.core.buffer import default_buffer_prototype

    return default_buffer_prototype()


@dataclass(frozen=True)
class RemoteFolder:
    """A folder of an object store, opened with ``backend`` (``"fsspec"``, default, or
    ``"obstore"``) and its ``storage_options``."""

    url: str
    backend: str | None = None
    storage_options: dict[str, Any] | None = field(default=None, compare=False)

    def store(self) -> Any:
        """The zarr store of the folder, opened once per process."""
        key = (
            self.url,
            self.backend,
            json.dumps(self.storage_options, sort_keys=True, default=repr),
        )
        with _STORES_LOCK:
            store = _STORES.get(key)
            if store is None:
                from ..storage import open_store, with_backend

                target = with_backend(self.url, self.backend, self.storage_options, read_only=True)
                store = _STORES[key] = open_store(
                    target, mode="r", storage_options=self.storage_options
                )
            return store

    def where(self, name: str) -> str:
        """The URL of the object ``name`` of the folder (the folder's own for ``""``)."""
        return f"{self.url}/{name}" if name else self.url

    def _run(self, name: str, coro_of: Callable[[Any], Coroutine[Any, Any, Any]]) -> Any:
        from zarr.core.sync import sync

        from ..storage import one_line, store_errors

        try:
            with store_errors(self.where(name)):
                return sync(coro_of(self.store()))
        except (FileNotFoundError, StoreError):
            raise
        except OSError as e:  # s3fs's errors once its retries are spent
            raise StoreError(f"{self.where(name)}: {type(e).__name__}: {one_line(e)}") from None

    def size(self, name: str) -> int | None:
        """The size of the object ``name`` (one HEAD request), or None if there is none."""
        try:
            return int(self._run(name, lambda s: s.getsize(name)))
        except FileNotFoundError:
            return None

    def read(self, name: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object ``name`` (one ranged request; fewer bytes
        when the object ends before ``end``)."""
        from zarr.abc.store import RangeByteRequest

        if end <= start:
            return b""
        buf = self._run(
            name, lambda s: s.get(name, _prototype(), byte_range=RangeByteRequest(start, end))
        )
        if buf is None:
            raise StoreError(f"{self.where(name)}: no such object")
        return buf.to_bytes()

    def read_runs(self, name: str, runs: list[tuple[int, int]]) -> list[bytes]:
        """The byte runs ``[(start, end), ...]`` of the object ``name`` (requests made at
        once, as the backend batches them)."""
        from zarr.abc.store import RangeByteRequest

        if len(runs) == 1:
            return [self.read(name, *runs[0])]
        ranges = [(name, RangeByteRequest(a, b)) for a, b in runs]
        bufs = self._run(name, lambda s: s.get_partial_values(_prototype(), ranges))
        if any(b is None for b in bufs):
            raise StoreError(f"{self.where(name)}: no such object")
        return [b.to_bytes() for b in bufs]

    def names(self) -> list[str]:
        """The names directly in the folder (at most :data:`MAX_LISTING`)."""

        async def listing(store: Any) -> list[str]:
            out = []
            async for n in store.list_dir(""):
                out.append(n)
                if len(out) > MAX_LISTING:
                    break
            return out

        found = self._run("", listing)
        if len(found) > MAX_LISTING:
            raise StoreError(
                f"{self.url} lists more than {MAX_LISTING:,} names; pass the checkpoint's"
                " .safetensors file or its .index.json"
            )
        return sorted(n.rstrip("/") for n in found)


class RangedTensor:
    """A tensor's values at ``offset`` of the object ``name`` (C order), read by ranges:
    ``t[key]`` fetches the byte runs of the region only (one run for a range of rows)."""

    __slots__ = ("dtype", "folder", "name", "offset", "shape")

    def __init__(
        self, folder: RemoteFolder, name: str, offset: int, dtype: DTypeLike, shape: Iterable[int]
    ) -> None:
        self.folder, self.name, self.offset = folder, name, int(offset)
        self.dtype, self.shape = np.dtype(dtype), tuple(int(s) for s in shape)

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)

    def read_run(self, first: int, out: np.ndarray) -> None:
        """The bytes at ``first`` (relative to the tensor) into ``out`` (C-contiguous)."""
        raw = self.folder.read(self.name, self.offset + first, self.offset + first + out.nbytes)
        if len(raw) != out.nbytes:
            raise StoreError(
                f"{self.folder.where(self.name)}: the object ended early (got {len(raw)} of"
                f" {out.nbytes} bytes at {self.offset + first})"
            )
        out.reshape(-1).view(np.uint8)[...] = np.frombuffer(raw, np.uint8)

    def __getitem__(self, key: tuple[int | slice, ...]) -> np.ndarray:
        """The region ``key`` (ints and forward slices, one per axis)."""
        box: list[tuple[int, int]] = []  # (start, stop) per axis
        inner: list[int | slice] = []  # the key relative to the box
        for k, n in zip(key, self.shape, strict=True):
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                stop = max(start, stop)
                box.append((start, stop))
                inner.append(slice(0, stop - start, step))
            else:
                box.append((k, k + 1))
                inner.append(0)
        shape = tuple(b - a for a, b in box)
        out = np.empty(shape, self.dtype)
        if out.size:
            self._read_box(box, out)
        return out[tuple(inner)]

    def _read_box(self, box: list[tuple[int, int]], out: np.ndarray) -> None:
        item = self.dtype.itemsize
        strides = [math.prod(self.shape[d + 1 :]) * item for d in range(len(self.shape))]
        # the runs: the box's last axes that are whole belong to one run, with the axis before
        d = len(self.shape) - 1
        while d > 0 and box[d] == (0, self.shape[d]):
            d -= 1
        run = (box[d][1] - box[d][0]) * strides[d] if self.shape else item
        outer = [range(a, b) for a, b in box[:d]] if self.shape else []
        base = box[d][0] * strides[d] if self.shape else 0
        starts = [
            base + sum(i * s for i, s in zip(idx, strides, strict=False))
            for idx in itertools.product(*outer)
        ]
        flat = out.reshape(-1).view(np.uint8)
        per = max(1, min(RUNS_PER_BATCH, BATCH_SPAN // max(1, run)))
        for b in range(0, len(starts), per):
            part = starts[b : b + per]
            runs = [(self.offset + s, self.offset + s + run) for s in part]
            for j, raw in enumerate(self.folder.read_runs(self.name, runs)):
                if len(raw) != run:
                    raise StoreError(
                        f"{self.folder.where(self.name)}: the object ended early (got"
                        f" {len(raw)} of {run} bytes at {runs[j][0]})"
                    )
                at = (b + j) * run
                flat[at : at + run] = np.frombuffer(raw, np.uint8)
