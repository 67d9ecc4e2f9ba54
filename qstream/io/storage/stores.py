"""Open Zarr sources and destinations from paths, URLs, store objects or arrays.

Paths: a local directory, a ``.zip`` file, ``memory://name`` (a process-wide in-memory store,
handy in notebooks and tests), or any fsspec URL (``s3://...``) with ``storage_options``.
:func:`open_store` opens a store, :func:`open_group` a group in it, :func:`open_source` a
readable array (a :class:`~qstream.io.storage.sources.Source`); where things live and how they are
named: :mod:`qstream.io.storage.locations`; URLs' backends, timeouts and errors:
:mod:`qstream.io.storage.backends`.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ...errors import StoreError
from ...input_files import check_tree, refuse_special
from .backends import (
    BACKENDS,
    fsspec_options,
    one_line,
    store_errors,
    store_failure,
    store_timeout,
    with_backend,
)
from .locations import MEMORY_STORES, display, imported_zarr, inside, location
from .sources import MAX_PIECES, ZARR_READ_CHUNKS, ArrayWriter, Source

__all__ = [  # (also here: the names of qstream.io.storage.backends, .locations and .sources)
    "BACKENDS",
    "MAX_PIECES",
    "MEMORY_STORES",
    "ZARR_READ_CHUNKS",
    "ArrayWriter",
    "Source",
    "display",
    "inside",
    "location",
    "one_line",
    "open_group",
    "open_source",
    "open_store",
    "store_errors",
    "store_failure",
    "store_timeout",
    "stored_sizes",
    "with_backend",
]


def open_store(path: Any, *, mode: str, storage_options: dict[str, Any] | None) -> Any:
    """The zarr store of ``path`` (``mode`` ``"r"``: it must exist; ``"w"``: made if absent);
    a store object is returned as it is."""
    import zarr

    from ..zarr_types.zarr_ext import register_zarr_types

    register_zarr_types()  # qstream's sub-byte data types and codec, also without entry points

    if not isinstance(path, (str, os.PathLike)):
        return path  # a zarr store object already
    p = os.fspath(path)
    if p.startswith("memory://"):
        name = p[len("memory://") :]
        if mode == "r" and name not in MEMORY_STORES:
            raise StoreError(f"no in-memory store named {p!r}")
        return MEMORY_STORES.setdefault(name, zarr.storage.MemoryStore())
    if "://" in p and not p.startswith("file://"):
        options = fsspec_options(p, storage_options)  # (its refusals are its own)
        try:
            store = zarr.storage.FsspecStore.from_url(
                p, storage_options=options, read_only=mode == "r"
            )
        except Exception as e:  # an unknown protocol, a missing fsspec backend, bad options
            raise StoreError(f"cannot open {p}: {one_line(e)}") from None
        if p.split("://", 1)[0] in ("s3", "s3a") and hasattr(store.fs, "retries"):
            store.fs.retries = 1  # s3fs's own retries on top of botocore's attempts
        return store
    p = p.removeprefix("file://")
    if p.endswith(".zip"):
        if mode == "r" and not os.path.exists(p):
            raise StoreError(f"no such file: {p}")
        refuse_special(p, "zip store")
        return zarr.storage.ZipStore(p, mode="r" if mode == "r" else "a")
    if mode == "r" and not os.path.exists(p):
        raise StoreError(f"no such Zarr store: {p}")
    if mode == "r":  # zarr would wait forever on a FIFO in place of a metadata document
        for doc in ("zarr.json", ".zarray", ".zgroup", ".zattrs"):
            refuse_special(os.path.join(p, doc), "Zarr metadata document")
    return zarr.storage.LocalStore(p, read_only=mode == "r")


def stored_sizes(store: Any, prefix: str = "") -> dict[str, int]:
    """Every key below ``prefix`` of ``store`` (relative to the prefix) and its size in
    bytes, from one listing (object stores: a paginated LIST, no object is read)."""
    import zarr
    from zarr.core.sync import sync

    prefix = prefix.strip("/")
    if isinstance(store, zarr.storage.LocalStore):
        top = os.path.join(str(store.root), prefix)
        out: dict[str, int] = {}
        for here, _, files in os.walk(top):
            for name in files:
                full = os.path.join(here, name)
                with contextlib.suppress(FileNotFoundError):
                    out[os.path.relpath(full, top).replace(os.sep, "/")] = os.lstat(full).st_size
        return out
    if isinstance(store, zarr.storage.ObjectStore):
        import obstore

        entries = obstore.list(store.store, prefix=prefix or None)
        return {
            m["path"][len(prefix) :].lstrip("/"): int(m["size"]) for batch in entries for m in batch
        }
    if isinstance(store, zarr.storage.FsspecStore):
        root = f"{store.path.rstrip('/')}/{prefix}".rstrip("/") + "/"
        found = sync(store.fs._find(root, detail=True))
        return {
            name[len(root) :]: int(info.get("size") or 0)
            for name, info in found.items()
            if name.startswith(root)
        }

    async def sizes() -> dict[str, int]:
        return {
            key[len(prefix) :].lstrip("/"): await store.getsize(key)
            async for key in store.list_prefix(prefix)
        }

    listed: dict[str, int] = sync(sizes())
    return listed


#: an array's ``attrs["qstream"]`` flag: every chunk was written (all-zero ones too), so an
#: absent one is damage (a kept tensor of a conversion; earlier versions left zero chunks out)
ALL_CHUNKS = "all_chunks"


def all_chunks(arr: Any) -> bool:
    """Whether the Zarr array ``arr`` says every chunk of it was written (:data:`ALL_CHUNKS`)."""
    try:
        own = arr.attrs.get("qstream")
    except (AttributeError, TypeError, ValueError):
        return False
    return isinstance(own, dict) and own.get(ALL_CHUNKS) is True


def read_region(arr: Any, key: tuple[slice, ...]) -> np.ndarray:
    """The values of the region ``key`` (step-1 slices; ``()`` for a 0-d array) of the Zarr
    array ``arr`` (a kept tensor of an output, say): from its chunk files where it can, a
    corrupt chunk named (and an absent one refused where the array says every chunk was
    written: :func:`all_chunks`); else through zarr, whose errors become one
    :class:`StoreError` naming the array and the region. Axes past ``key``'s are taken
    whole."""
    key = (*key, *(slice(0, n) for n in arr.shape[len(key) :]))
    source = open_source(arr)
    if source.files is not None:  # (an absent chunk of an array written whole: refused)
        source.files.required = all_chunks(arr)
    values = source.read(key)
    return values.reshape([k.stop - k.start for k in key])  # (a 0-d array stays one)


def open_source(
    src: Any, *, storage_options: dict[str, Any] | None = None, path: str | None = None
) -> Source:
    """Open ``src`` (path/URL of a Zarr v2 or v3 array, a ``zarr.Array``, or a NumPy array)."""
    if isinstance(src, np.ndarray):
        desc = {
            "kind": "numpy",
            "path": "array",
            "shape": list(src.shape),
            "dtype": src.dtype.name,
            # no address: the values themselves say whether a re-run is the same job
            "digest": _digest(src),
        }
        return Source(src, desc)
    imported = imported_zarr()
    if imported is not None and isinstance(src, imported.Array):
        return Source(src, _describe(src, location(src) or str(src.store_path)))
    if all(hasattr(src, a) for a in ("shape", "dtype", "__getitem__")) and not isinstance(
        src, (str, os.PathLike)
    ):  # a lazy array-like, e.g. a checkpoint tensor read by slices
        name = getattr(src, "name", type(src).__name__)
        desc = {
            "kind": "array",
            "path": str(name),
            "shape": list(src.shape),
            "dtype": np.dtype(src.dtype).name,
        }
        return Source(src, desc)
    import zarr

    try:
        store = open_store(src, mode="r", storage_options=storage_options)
        node = zarr.open(store=store, mode="r", path=path or "")
    except StoreError:
        raise
    except FileNotFoundError:
        raise StoreError(f"{src} {_what_is(src)}") from None
    except Exception as e:  # the store failing (its own cause), corrupt metadata, ...
        err = store_failure(e, src)
        if err is not None:
            raise err from None
        raise StoreError(f"cannot open {display(src)} as Zarr: {type(e).__name__}: {e}") from None
    if not isinstance(node, zarr.Array):
        raise StoreError(f"{src} {_what_is(src)}")
    where = location(src) or str(src)
    if path:
        where = f"{where}/{path}"
    if isinstance(store, zarr.storage.LocalStore):  # no FIFO in it, and no link out of it
        check_tree(os.path.join(str(store.root), path or ""), "Zarr source", links="inside")
    return Source(node, _describe(node, where))


_CHECKPOINT = "; checkpoints are read by qstream.convert_checkpoint"


_FILE_KINDS = {
    ".npy": "a NumPy .npy file",
    ".npz": "a NumPy .npz archive",
    ".safetensors": "a safetensors checkpoint",
    ".pt": "a torch checkpoint",
    ".bin": "a torch checkpoint",
}


def _what_is(src: object) -> str:
    """What a path that is not a Zarr array is, and what reads it (for error messages)."""
    text = str(src)
    if "://" in text and not text.startswith("file://"):
        return "holds no Zarr array"
    p = Path(text.removeprefix("file://"))
    if not p.exists():
        return "does not exist"
    if p.is_file():
        if p.suffix in _FILE_KINDS:
            return f"is {_FILE_KINDS[p.suffix]}, not a Zarr array{_CHECKPOINT}"
        if p.name.endswith(".index.json"):
            return f"is a sharded checkpoint index, not a Zarr array{_CHECKPOINT}"
        return "is a file, not a Zarr array"
    meta = p / "zarr.json"
    if meta.is_file() or (p / ".zgroup").is_file():
        try:
            attrs = json.loads(meta.read_text()).get("attributes", {}) if meta.is_file() else {}
        except (OSError, ValueError):
            attrs = {}
        if "qstream" in attrs:
            return (
                "is a qstream quantized group, not a plain array; qstream.dequantize_store"
                " restores it"
            )
        return "is a Zarr group, not an array (pass the array's path inside it)"
    if any(p.glob("*.safetensors")):
        return f"is a folder of safetensors files, not a Zarr array{_CHECKPOINT}"
    return "is a folder that is not a Zarr array"


def _digest(a: np.ndarray[Any, Any]) -> str:
    """A digest of ``a``'s values (its bytes in C order) for job identity: tile hashes of a
    parallel 64-bit kernel (:mod:`qstream.kernels.digest`), then BLAKE2b over them."""
    import hashlib

    from ...kernels.digest import TILE, tile_hashes
    from ...kernels.runtime import run

    flat = a.reshape(-1) if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(-1)
    raw = flat.view(np.uint8)
    whole = raw.size // 8 * 8
    words = raw[:whole].view(np.uint64) if raw.ctypes.data % 8 == 0 else None
    if words is None:  # not 8-byte aligned (a view into a larger buffer): aligned copy
        words = np.frombuffer(raw[:whole].tobytes(), np.uint64)
    tiles = np.empty(max(1, -(-raw.size // TILE)), np.uint64)
    run(tile_hashes, words, np.ascontiguousarray(raw[whole:]), tiles)
    h = hashlib.blake2b(digest_size=16)
    h.update(np.int64(raw.size).tobytes())
    h.update(tiles.tobytes())
    return h.hexdigest()


def _describe(a: Any, where: str) -> dict[str, Any]:
    return {
        "kind": "zarr",
        "path": where,
        "shape": list(a.shape),
        "dtype": np.dtype(a.dtype).name,
        "chunks": list(a.chunks),
        "shards": list(a.shards) if getattr(a, "shards", None) else None,
        "zarr_format": a.metadata.zarr_format,
    }


def open_group(
    dst: Any, *, mode: Literal["r", "a", "w"], storage_options: dict[str, Any] | None = None
) -> Any:
    """Open (``mode="r"``/``"a"``) or create (``"w"``) a Zarr v3 group (``zarr.Group``)."""
    import zarr

    store = open_store(dst, mode="r" if mode == "r" else "w", storage_options=storage_options)
    try:
        return zarr.open_group(store=store, mode=mode, zarr_format=3 if mode == "w" else None)
    except zarr.errors.ContainsArrayError:
        try:  # (one qstream dequantized: said, with where it came from)
            own = zarr.open_array(store=store, mode="r").attrs.get("qstream")
            came = own.get("dequantized_from") if isinstance(own, dict) else None
        except Exception:
            came = None
        what = f" (values qstream dequantized from {came}: read it with zarr)" if came else ""
        raise StoreError(
            f"{dst} is a plain Zarr array{what}, not a qstream quantized array (a group)"
        ) from None
    except FileNotFoundError as e:
        text = str(dst)
        local = Path(text.removeprefix("file://"))
        if ("://" not in text or text.startswith("file://")) and local.is_file():
            kind = _FILE_KINDS.get(local.suffix, "a file")
            raise StoreError(f"{dst} is {kind}, not a Zarr group") from None
        raise StoreError(f"no Zarr group at {dst}: {e}") from None
    except PermissionError as e:
        raise StoreError(f"cannot write {dst}: {e}") from None
    except Exception as e:
        err = store_failure(e, dst)
        if err is not None:
            raise err from None
        raise StoreError(f"cannot open {dst} as a Zarr group: {type(e).__name__}: {e}") from None
