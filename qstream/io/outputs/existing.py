"""What a destination holds now, read without changing it.

A destination is qstream's only if qstream's own metadata says so: a ``zarr.json`` whose
attributes carry a qstream output of a known kind (:func:`classify_meta`). What a job may do
with what it finds is decided by :func:`qstream.io.outputs.destination.decide`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from ...errors import StoreError
from ...paths import local_path, local_zip
from ..storage import PARTIAL, open_store, read_local_doc
from .ondisk import LOCK


@dataclass(frozen=True)
class Existing:
    """What a destination holds now.

    ``kind``: ``absent``, ``empty``, ``quantized`` (a qstream quantized group),
    ``checkpoint`` (a converted checkpoint), ``dequantized`` (a qstream dequantize output),
    ``restored`` (a dequantized checkpoint),
    ``zarr`` (any other Zarr array or group), ``file`` or ``foreign`` (a directory or store
    holding other things).
    """

    kind: str
    meta: dict[str, Any] | None = None


def classify_meta(doc: dict[str, Any]) -> Existing:
    """What the Zarr node whose ``zarr.json`` is ``doc`` is (see :class:`Existing`)."""
    attrs = doc.get("attributes") or {}
    if not isinstance(attrs, dict):
        return Existing("zarr")
    node = doc.get("node_type")
    if node == "group" and isinstance(attrs.get("qstream"), dict):
        return Existing("quantized", attrs["qstream"])
    if node == "group" and isinstance(attrs.get("qstream_checkpoint"), dict):
        return Existing("checkpoint", attrs["qstream_checkpoint"])
    if node == "group" and isinstance(attrs.get("qstream_restored"), dict):
        return Existing("restored", attrs["qstream_restored"])
    q = attrs.get("qstream")
    if node == "array" and isinstance(q, dict) and "dequantized_from" in q:
        return Existing("dequantized", q)
    if node == "array" and isinstance(q, dict) and q.get("kept") is True:
        return Existing("kept", q)
    return Existing("zarr")


def node_at(path: str) -> Existing:
    """What the local Zarr node at ``path`` is (by its ``zarr.json``)."""
    doc = read_local_doc(os.path.join(path, "zarr.json"))
    return Existing("foreign") if doc is None else classify_meta(doc)


def inspect_destination(dst: object, storage_options: dict[str, Any] | None = None) -> Existing:
    """Look at ``dst`` without changing it (see :class:`Existing`)."""
    local = local_path(dst)
    if local is not None:
        if not os.path.lexists(local):
            return Existing("absent")
        if not os.path.isdir(local):
            return Existing("file")
        names = [n for n in os.listdir(local) if n != LOCK and not n.endswith(PARTIAL)]
        if not names:
            return Existing("empty")
        if "zarr.json" in names:
            return node_at(local)
        if ".zarray" in names or ".zgroup" in names:
            return Existing("zarr")
        return Existing("foreign")
    path = local_zip(dst)
    if path is not None:
        if not os.path.lexists(path):
            return Existing("absent")
        import zipfile

        try:
            with zipfile.ZipFile(path) as zf:
                doc = json.loads(zf.read("zarr.json"))
        except (OSError, KeyError, ValueError, RecursionError, zipfile.BadZipFile):
            return Existing("file")
        return classify_meta(doc) if isinstance(doc, dict) else Existing("file")
    # memory:// and object stores
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    store = open_store(dst, mode="w", storage_options=storage_options)
    try:
        raw = sync(store.get("zarr.json", default_buffer_prototype()))
        if raw is not None:
            doc = json.loads(raw.to_bytes())
            return classify_meta(doc) if isinstance(doc, dict) else Existing("foreign")
        return Existing("empty") if sync(store.is_empty("")) else Existing("foreign")
    except (OSError, ValueError, RecursionError) as e:
        raise StoreError(f"cannot read {dst}: {type(e).__name__}: {e}") from None


def is_checkpoint(path: object, storage_options: dict[str, Any] | None = None) -> bool:
    """Whether ``path`` is the root of a converted checkpoint."""
    return inspect_destination(path, storage_options).kind == "checkpoint"
