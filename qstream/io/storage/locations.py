"""Where a source or destination lives, spelled one way: to compare locations and to name them.

:func:`location` turns a path, URL, ``zarr.Array`` or store into an absolute path with links
resolved or a normalised URL (``memory://name`` for qstream's in-memory stores,
:data:`MEMORY_STORES`); :func:`inside` compares two; :func:`display` names one in messages.
"""

from __future__ import annotations

import os
import sys
from typing import Any

MEMORY_STORES: dict[str, Any] = {}  # memory://name -> its zarr MemoryStore (process-wide)


def imported_zarr() -> Any:
    """zarr-python once something has imported it (waiting for an import under way in
    another thread), else None: until then no zarr object exists, and a job that makes none
    need not pay for the import (0.2 s)."""
    if "zarr" not in sys.modules:
        return None
    import zarr

    return zarr


def location(target: object) -> str | None:
    """Where ``target`` (a path, URL, ``zarr.Array`` or store) lives, spelled one way only: an
    absolute path with links resolved, or a URL with its path normalised; None for
    in-memory objects that have no address (NumPy arrays)."""
    if isinstance(target, str | os.PathLike):
        p = os.fspath(target)
        if "://" in p and not p.startswith("file://"):
            scheme, rest = p.split("://", 1)
            parts = [q for q in rest.split("/") if q not in ("", ".")]
            return f"{scheme.lower()}://{'/'.join(parts)}"
        return os.path.realpath(os.path.abspath(os.path.expanduser(p.removeprefix("file://"))))
    zarr = imported_zarr()
    if zarr is not None:
        if isinstance(target, zarr.Array):
            store, path = target.store_path.store, target.store_path.path
            root = location(store)
            return None if root is None else location(f"{root.rstrip('/')}/{path}")
        if isinstance(target, zarr.storage.LocalStore):
            return location(str(target.root))
        if isinstance(target, zarr.storage.FsspecStore):
            proto = target.fs.protocol
            proto = proto[0] if isinstance(proto, tuple | list) else proto
            return location(f"{proto}://{target.path.rstrip('/')}")
        if isinstance(target, zarr.storage.ObjectStore):
            return _object_store_location(target.store)
    for name, mem in MEMORY_STORES.items():
        if mem is target:
            return f"memory://{name}"
    return None


def display(target: object) -> str:
    """How messages and reports name ``target``: a path or URL as given, a store by its URL."""
    if isinstance(target, str | os.PathLike):
        return os.fspath(target)
    return location(target) or str(target)


def _object_store_location(inner: Any) -> str | None:
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
