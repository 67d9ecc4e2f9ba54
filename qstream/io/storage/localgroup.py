"""Reading local Zarr v3 groups and arrays without zarr's event loop.

A conversion's outputs hold thousands of small groups: opening each through zarr costs an
event-loop hop per document. :class:`LocalGroup` opens a local group from its documents
(members made from their own documents, whose parsed form is shared by identical documents,
each walked from the group without following a link: :func:`qstream.paths.walk_below`),
and :func:`read_all` reads a whole array straight from its chunk files where it can.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ...input_files import open_regular
from ...paths import local_path, walk_below
from .chunks import chunk_files
from .localmeta import read_local_doc
from .stores import all_chunks, open_store, read_region

_PARSED: dict[bytes, Any] = {}  # array documents -> their parsed metadata


def read_all(arr: Any, *, required: bool | None = None) -> np.ndarray[Any, Any]:
    """All of the Zarr array ``arr``: straight from its chunk files where it can (no event
    loop hop: a conversion's small parameter arrays are read by the thousand). ``required``:
    an absent chunk is refused, not read as the fill value (see
    :attr:`~qstream.io.storage.chunks.ChunkFiles.required`; None: where the array says every
    chunk was written, :func:`~qstream.io.storage.stores.all_chunks`)."""
    if required is None:
        required = all_chunks(arr)
    files = chunk_files(arr, required=required) if arr.shape else None
    if files is None:
        return read_region(arr, tuple(slice(0, n) for n in arr.shape))
    out = np.empty(arr.shape, files.dtype if not files.bits else arr.dtype)
    files.read(tuple(slice(0, n) for n in arr.shape), out)
    return out


class LocalGroup:
    """A Zarr v3 group on a local disk, opened from its documents without zarr's event loop
    (members are made from their own documents, whose parsed form is shared by identical
    documents): ``attrs``, ``store_path``, ``group[name]`` (an array, or a group)."""

    def __init__(self, path: str, doc: dict[str, Any]) -> None:
        import zarr

        self.path = path
        self.attrs: dict[str, Any] = doc.get("attributes") or {}
        self.store_path = zarr.storage.StorePath(zarr.storage.LocalStore(path), "")

    def __getitem__(self, name: str) -> Any:
        import zarr
        from zarr.core.array import AsyncArray
        from zarr.core.metadata.v3 import ArrayV3Metadata

        # (no link on the way from the group, nor at the document, is followed)
        doc_path = walk_below(self.path, [*name.split("/"), "zarr.json"], "the output")
        try:
            with open_regular(doc_path, "Zarr metadata", follow=False) as f:
                raw = f.read()
        except (FileNotFoundError, NotADirectoryError):
            raise KeyError(name) from None
        meta = _PARSED.get(raw)
        if meta is None:
            doc = json.loads(raw)
            if doc.get("node_type") != "array" or doc.get("zarr_format") != 3:
                return zarr.open(self.store_path.store, mode="r", path=name)
            meta = ArrayV3Metadata.from_dict(doc)
            if len(_PARSED) >= 256:
                _PARSED.clear()
            _PARSED[raw] = meta
        return zarr.Array(AsyncArray(meta, zarr.storage.StorePath(self.store_path.store, name)))


def open_local(path: object) -> LocalGroup | None:
    """``path`` opened as a :class:`LocalGroup` when it is a local Zarr v3 group."""
    local = local_path(path)
    if local is None:
        return None
    open_store(path, mode="r", storage_options=None)  # (its checks, and the types registered)
    doc = read_local_doc(os.path.join(local, "zarr.json"))
    if doc is None or doc.get("node_type") != "group" or doc.get("zarr_format") != 3:
        return None
    return LocalGroup(local, doc)
