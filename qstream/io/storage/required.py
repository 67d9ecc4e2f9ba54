"""Arrays read through zarr (object, memory and zip stores) whose every chunk was written: an
absent chunk is refused when zarr asks for it, as :class:`~qstream.io.storage.chunks.ChunkFiles`
refuses it for local files, instead of zarr's fill value. No request is added: the store's
own answer to the read (nothing there) is what is refused."""

from __future__ import annotations

import functools
from typing import Any

from .chunks import missing_chunk
from .locations import location

_DOCUMENTS = ("zarr.json", ".zarray", ".zattrs", ".zgroup")


@functools.cache
def _store_class() -> Any:
    from zarr.storage import WrapperStore

    class ChunksRequired(WrapperStore):  # type: ignore[type-arg]
        """A store whose absent keys (but documents) are refused when read."""

        async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
            got = await self._store.get(key, prototype, byte_range)
            if got is None and not key.endswith(_DOCUMENTS):
                where = location(self._store) or str(self._store)
                raise missing_chunk(f"{where.rstrip('/')}/{key}")
            return got

    return ChunksRequired


def require_chunks(arr: Any) -> Any:
    """``arr`` (a ``zarr.Array``) read through a store that refuses an absent chunk."""
    import zarr
    from zarr.core.array import AsyncArray

    path = arr.store_path
    store = _store_class()(path.store)
    return zarr.Array(AsyncArray(arr.metadata, zarr.storage.StorePath(store, path.path)))
