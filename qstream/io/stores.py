"""Open Zarr sources and destinations from paths, URLs, store objects or arrays.

Paths: a local directory, a ``.zip`` file, ``memory://name`` (a process-wide in-memory store,
handy in notebooks and tests), or any fsspec URL (``s3://...``) with ``storage_options``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import StoreError
from .chunks import ChunkFiles, chunk_files
from .paths import refuse_special

MEMORY_STORES: dict[str, Any] = {}
BACKENDS = ("fsspec", "obstore")  # how URLs (s3://, gs://, ...) are opened


_STORE_LIBRARIES = ("obstore", "botocore", "aiobotocore", "s3fs", "fsspec", "aiohttp", "urllib3")


def one_line(e: BaseException) -> str:
    """An exception's message on one line (its first line that says something)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0][:300] if lines else type(e).__name__


def store_failure(e: BaseException, where) -> StoreError | None:
    """A one-line :class:`StoreError` naming ``where`` (a URL) and the cause, for a failure
    raised by a store library (obstore, fsspec, s3fs, botocore, aiohttp) or the network;
    None for anything else."""
    import asyncio

    top = type(e).__module__.split(".")[0]
    network = isinstance(e, (TimeoutError, asyncio.TimeoutError, ConnectionError))
    if (top not in _STORE_LIBRARIES and not network) or isinstance(e, StoreError):
        return None
    text = one_line(e)
    lower = str(e).lower()
    if "timed out" in lower or "timeout" in lower or isinstance(e, TimeoutError):
        cause = f"no answer from the store within its timeout ({text})"
    elif "connect" in lower and ("refused" in lower or "error" in lower):
        cause = f"cannot connect ({text})"
    else:
        cause = text
    return StoreError(f"{display(where)}: {type(e).__name__}: {cause}")


@contextlib.contextmanager
def store_errors(where):
    """Failures of store libraries inside the body as one-line :class:`StoreError` naming
    ``where`` (see :func:`store_failure`)."""
    try:
        yield
    except Exception as e:
        err = store_failure(e, where)
        if err is None:
            raise
        raise err from None


def store_timeout() -> float:
    """Seconds after which a request to an object store that makes no progress fails, its
    retries included (``QSTREAM_STORE_TIMEOUT``, default 60): a dead endpoint ends a job
    with an error, not a hang."""
    raw = os.environ.get("QSTREAM_STORE_TIMEOUT", "60")
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        from ..errors import InvalidParameterError

        raise InvalidParameterError(f"QSTREAM_STORE_TIMEOUT must be seconds > 0, got {raw!r}")
    return value


def _obstore_options(options: dict | None) -> dict:
    """obstore's options with qstream's timeouts and retries where the caller set none: a
    stalled connection fails after a third of :func:`store_timeout`, and retries stop once
    it has passed."""
    import datetime

    t = store_timeout()
    out = dict(options or {})
    client = {
        "connect_timeout": datetime.timedelta(seconds=min(10.0, t / 4)),
        "read_timeout": datetime.timedelta(seconds=t / 3),
        "timeout": datetime.timedelta(seconds=max(300.0, 5 * t)),  # big chunks on slow links
        **dict(out.get("client_options") or {}),
    }
    retry = {
        "max_retries": 2,
        "retry_timeout": datetime.timedelta(seconds=t),
        **dict(out.get("retry_config") or {}),
    }
    return {**out, "client_options": client, "retry_config": retry}


def _fsspec_options(url: str, options: dict | None) -> dict:
    """fsspec's options with qstream's timeouts and retries (S3: botocore's connect/read
    timeouts and attempts) where the caller set none."""
    out = dict(options or {})
    if url.split("://", 1)[0] in ("s3", "s3a"):
        t = store_timeout()
        config = {
            "connect_timeout": min(10.0, t / 4),
            "read_timeout": t / 3,
            "retries": {"total_max_attempts": 2, "mode": "standard"},
            **dict(out.get("config_kwargs") or {}),
        }
        out["config_kwargs"] = config
    return out


def with_backend(target, backend: str | None, storage_options: dict | None, *, read_only: bool):
    """``target`` as the object its backend opens: a URL with ``backend="obstore"`` becomes a
    ``zarr.storage.ObjectStore`` (``storage_options`` are obstore's config, e.g. ``endpoint``,
    ``access_key_id``, ``region``, ``client_options``); anything else is returned as is (fsspec
    opens URLs later, with ``storage_options`` as fsspec's)."""
    from ..errors import InvalidParameterError

    if backend not in (None, *BACKENDS):
        raise InvalidParameterError(f"store must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend != "obstore" or not isinstance(target, (str, os.PathLike)):
        return target
    url = os.fspath(target)
    if "://" not in url or url.startswith("memory://"):
        return target  # local paths and in-memory stores need no object store
    try:
        import obstore.store
        import zarr
    except ImportError:
        raise InvalidParameterError(
            "store='obstore' needs the obstore package: pip install 'qstream-zarr[s3]'"
        ) from None
    try:
        inner = obstore.store.from_url(url, **_obstore_options(storage_options))
    except Exception as e:
        raise StoreError(f"cannot open {url} with obstore: {type(e).__name__}: {e}") from None
    return zarr.storage.ObjectStore(inner, read_only=read_only)


def open_store(path, *, mode: str, storage_options: dict | None):
    import zarr

    from .zarr_ext import register_zarr_types

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
        try:
            store = zarr.storage.FsspecStore.from_url(
                p, storage_options=_fsspec_options(p, storage_options), read_only=mode == "r"
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


MAX_PIECES = 1024  # a block of more stored chunks is read whole, not processed chunk by chunk
ZARR_READ_CHUNKS = 4096  # stored chunks per read through zarr (it plans every chunk at once)


@dataclass
class Source:
    """A readable array: a Zarr array or an in-memory NumPy array / memmap."""

    array: Any  # zarr.Array or np.ndarray
    description: dict
    files: ChunkFiles | None = field(default=None, repr=False)  # direct chunk reads
    # checkpoint tensors' regions mapped from their files (False: read, which costs less for
    # a small tensor than a mapping of its own)
    maps: bool = field(default=True, repr=False)
    # all of its values, read once and kept (a small tensor, read by every pass of its job)
    pinned: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.files is None and self.description.get("kind") == "zarr":
            self.files = chunk_files(self.array)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> np.dtype:
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
    def compressors(self):
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

    def view(self, key: tuple[slice, ...]) -> np.ndarray | None:
        """The region ``key`` without a copy (a mapped uncompressed chunk, a NumPy source's
        own memory, or a checkpoint tensor's mapped file), or None: then use :meth:`read`."""
        if self.pinned is not None:
            return self.pinned[key]
        if self.files is not None:
            return self.files.view(key)
        if isinstance(self.array, np.ndarray):
            return self.array[key]
        from .checkpoints import CheckpointTensor

        if isinstance(self.array, CheckpointTensor) and self.maps:  # mapped from its file
            return self.array.view(key)
        return None

    def read(self, key: tuple[slice, ...], out: np.ndarray | None = None) -> np.ndarray:
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

    def _zarr_parts(self, key):
        """``key`` cut along its outer axes into regions of at most :data:`ZARR_READ_CHUNKS`
        stored chunks (zarr plans a read's chunks all at once: millions of tiny chunks would
        take gigabytes)."""
        grid = getattr(self.array, "chunks", None)
        if not grid or not key:
            return [key]
        return list(_cut(key, tuple(grid), ZARR_READ_CHUNKS))

    def _get(self, key):
        try:
            return self.array[key]
        except Exception as e:  # zarr raises on chunks that decode to the wrong size, ...
            if isinstance(e, StoreError):
                raise
            raise StoreError(
                f"{self.description.get('path')}: cannot read region"
                f" {_region_text(key)}{self._chunk_text(key)}: {type(e).__name__}: {e}"
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

    def _chunk_text(self, key) -> str:
        grid = self.chunks
        if not grid or not key:
            return ""
        first = tuple(k.start // c for k, c in zip(key, grid, strict=True))
        last = tuple(max(k.start, k.stop - 1) // c for k, c in zip(key, grid, strict=True))
        return f" (chunk {first})" if first == last else f" (chunks {first} to {last})"


_DOCS = ("zarr.json", ".zarray", ".zattrs", ".zgroup")


def _count_files(root: str) -> int:
    """Chunk files below an array's directory (not its metadata or temporary files)."""
    n = 0
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.name not in _DOCS and not entry.name.endswith(".partial"):
                    n += 1
    return n


def _cut(key, grid, limit: int):
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


def _region_text(key) -> str:
    return "[" + ", ".join(f"{k.start}:{k.stop}" for k in key) + "]"


class ArrayWriter:
    """Writes chunk-aligned regions of a Zarr array: straight to its chunk files where
    :func:`~qstream.io.chunks.chunk_files` allows, else through zarr."""

    def __init__(self, array) -> None:
        self.array = array
        self.files = chunk_files(array)

    def __setitem__(self, key: tuple[slice, ...], value: np.ndarray) -> None:
        if self.files is not None:
            self.files.write(key, value)
        else:
            # a copy: zarr's MemoryStore keeps the caller's buffer itself for an uncompressed
            # chunk, and the engine reuses its buffers for the next block
            self.array[key] = np.array(value, copy=True)


def stored_sizes(store, prefix: str = "") -> dict[str, int]:
    """Every key below ``prefix`` of ``store`` (relative to the prefix) and its size in
    bytes, from one listing (object stores: a paginated LIST, no object is read)."""
    import zarr
    from zarr.core.sync import sync

    prefix = prefix.strip("/")
    if isinstance(store, zarr.storage.LocalStore):
        top = os.path.join(str(store.root), prefix)
        out = {}
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

    async def sizes():
        return {
            key[len(prefix) :].lstrip("/"): await store.getsize(key)
            async for key in store.list_prefix(prefix)
        }

    return sync(sizes())


def location(target) -> str | None:
    """Where ``target`` (a path, URL, ``zarr.Array`` or store) lives, spelled one way only: an
    absolute path with links resolved, or a URL with its path normalised; None for
    in-memory objects that have no address (NumPy arrays)."""
    import zarr

    if isinstance(target, zarr.Array):
        store, path = target.store_path.store, target.store_path.path
        root = location(store)
        return None if root is None else location(f"{root.rstrip('/')}/{path}")
    if isinstance(target, zarr.storage.LocalStore):
        return location(str(target.root))
    if isinstance(target, zarr.storage.FsspecStore):
        proto = target.fs.protocol
        proto = proto[0] if isinstance(proto, (tuple, list)) else proto
        return location(f"{proto}://{target.path.rstrip('/')}")
    if isinstance(target, zarr.storage.ObjectStore):
        return _object_store_location(target.store)
    if not isinstance(target, (str, os.PathLike)):
        for name, mem in MEMORY_STORES.items():
            if mem is target:
                return f"memory://{name}"
        return None
    p = os.fspath(target)
    if "://" in p and not p.startswith("file://"):
        scheme, rest = p.split("://", 1)
        parts = [q for q in rest.split("/") if q not in ("", ".")]
        return f"{scheme.lower()}://{'/'.join(parts)}"
    return os.path.realpath(os.path.abspath(os.path.expanduser(p.removeprefix("file://"))))


def display(target) -> str:
    """How messages and reports name ``target``: a path or URL as given, a store by its URL."""
    if isinstance(target, (str, os.PathLike)):
        return os.fspath(target)
    return location(target) or str(target)


def _object_store_location(inner) -> str | None:
    """The URL of an obstore store (S3, GCS, Azure or local)."""
    kind = type(inner).__name__
    prefix = str(getattr(inner, "prefix", None) or "").strip("/")
    config = getattr(inner, "config", None) or {}
    if kind == "LocalStore":
        return location(str(inner.prefix))
    scheme, bucket = {
        "S3Store": ("s3", config.get("bucket")),
        "GCSStore": ("gs", config.get("bucket")),
        "AzureStore": ("az", config.get("container_name")),
    }.get(kind, (None, None))
    if scheme is None or not bucket:
        return None
    return location(f"{scheme}://{bucket}/{prefix}")


def inside(a: str | None, b: str | None) -> bool:
    """Whether location ``a`` is ``b`` or lies inside it."""
    if a is None or b is None:
        return False
    return a == b or a.startswith(b.rstrip("/") + "/")


def open_source(src, *, storage_options: dict | None = None, path: str | None = None) -> Source:
    """Open ``src`` (path/URL of a Zarr v2 or v3 array, a ``zarr.Array``, or a NumPy array)."""
    import zarr

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
    if isinstance(src, zarr.Array):
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
    try:
        store = open_store(src, mode="r", storage_options=storage_options)
        node = zarr.open(store=store, mode="r", path=path or "")
    except StoreError:
        raise
    except FileNotFoundError:
        raise StoreError(f"{src} {_what_is(src)}") from None
    except Exception as e:  # corrupt metadata, unreadable zip, ...
        raise StoreError(f"cannot open {src} as Zarr: {type(e).__name__}: {e}") from None
    if not isinstance(node, zarr.Array):
        raise StoreError(f"{src} {_what_is(src)}")
    where = location(src) or str(src)
    if path:
        where = f"{where}/{path}"
    if isinstance(store, zarr.storage.LocalStore):  # no FIFO in it, and no link out of it
        from .paths import check_tree

        check_tree(os.path.join(str(store.root), path or ""), "Zarr source", links="inside")
    return Source(node, _describe(node, where))


_CHECKPOINT = "; checkpoints are read by qstream.convert_checkpoint"


def _what_is(src) -> str:
    """What a path that is not a Zarr array is, and what reads it (for error messages)."""
    text = str(src)
    if "://" in text and not text.startswith("file://"):
        return "holds no Zarr array"
    p = Path(text.removeprefix("file://"))
    if not p.exists():
        return "does not exist"
    if p.is_file():
        kinds = {
            ".npy": "a NumPy .npy file",
            ".npz": "a NumPy .npz archive",
            ".safetensors": "a safetensors checkpoint",
            ".pt": "a torch checkpoint",
            ".bin": "a torch checkpoint",
        }
        if p.suffix in kinds:
            return f"is {kinds[p.suffix]}, not a Zarr array{_CHECKPOINT}"
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


def _digest(a: np.ndarray) -> str:
    """A digest of ``a``'s values (its bytes in C order) for job identity: tile hashes of a
    parallel 64-bit kernel (:mod:`qstream.kernels.digest`), then BLAKE2b over them."""
    import hashlib

    from ..kernels.digest import TILE, tile_hashes

    flat = a.reshape(-1) if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(-1)
    raw = flat.view(np.uint8)
    whole = raw.size // 8 * 8
    words = raw[:whole].view(np.uint64) if raw.ctypes.data % 8 == 0 else None
    if words is None:  # not 8-byte aligned (a view into a larger buffer): aligned copy
        words = np.frombuffer(raw[:whole].tobytes(), np.uint64)
    tiles = np.empty(max(1, -(-raw.size // TILE)), np.uint64)
    tile_hashes(words, np.ascontiguousarray(raw[whole:]), tiles)
    h = hashlib.blake2b(digest_size=16)
    h.update(np.int64(raw.size).tobytes())
    h.update(tiles.tobytes())
    return h.hexdigest()


def _describe(a, where: str) -> dict:
    return {
        "kind": "zarr",
        "path": where,
        "shape": list(a.shape),
        "dtype": np.dtype(a.dtype).name,
        "chunks": list(a.chunks),
        "shards": list(a.shards) if getattr(a, "shards", None) else None,
        "zarr_format": a.metadata.zarr_format,
    }


def open_group(dst, *, mode: str, storage_options: dict | None = None):
    """Open (``mode="r"``/``"a"``) or create (``"w"``) a Zarr v3 group."""
    import zarr

    store = open_store(dst, mode="r" if mode == "r" else "w", storage_options=storage_options)
    try:
        return zarr.open_group(store=store, mode=mode, zarr_format=3 if mode == "w" else None)
    except zarr.errors.ContainsArrayError:
        raise StoreError(
            f"{dst} is a plain Zarr array, not a qstream quantized array (a group)"
        ) from None
    except FileNotFoundError as e:
        raise StoreError(f"no Zarr group at {dst}: {e}") from None
    except PermissionError as e:
        raise StoreError(f"cannot write {dst}: {e}") from None
    except Exception as e:
        raise StoreError(f"cannot open {dst} as a Zarr group: {type(e).__name__}: {e}") from None
