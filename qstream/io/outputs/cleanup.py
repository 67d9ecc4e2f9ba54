"""Removing qstream's own output that a job replaces, and what killed writers left behind.

qstream replaces only the files it writes, node by node (:func:`remove_output`): of every
node, only the metadata and member arrays qstream writes, and only where the node's own
metadata says qstream wrote it; anything else stays. :func:`clean_partials` removes the
temporary files and unpublished folders of killed writers, which are never part of a finished
output. Whether a destination may be replaced at all is decided before
(:mod:`qstream.io.outputs.destination`).

Nothing is followed through a link (whoever made it): a link found where one of qstream's
own members lies (a tensor's group, ``_packs``, ``_index``, a pack, a batch, a member array)
is removed itself, never what it points to; a link anywhere else on the way is refused
(:func:`qstream.paths.walk_below`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any

from ...errors import StoreError
from ...paths import child, local_path, remove_child
from ..storage import (
    ARRAY_KEY,
    check_key,
    delete_keys,
    entry_kind,
    is_array_doc,
    is_array_doc_at,
    is_plain_dir,
    open_store,
    remove_array_files,
    remove_if_empty,
    remove_partials,
)
from .existing import Existing, classify_meta, node_at
from .ondisk import LOCK, MEMBERS, OPTIONAL_MEMBERS, TMP_PREFIX
from .pack_layout import clean_partial_packs, remove_packs
from .rootindex import INDEX, RootIndex

_INDEX_KEY = re.compile(r"zarr\.json|b\d+/zarr\.json")  # a converted checkpoint's index


def remove_output(
    dst: object, existing: Existing, storage_options: dict[str, Any] | None = None
) -> None:
    """Remove qstream's own output at ``dst`` (what :func:`~qstream.io.outputs.destination.decide`
    said to replace), file by file: of every node, only the metadata and member arrays
    qstream writes, and only where the node's own metadata says qstream wrote it; anything
    else stays. Keys of a converted or restored checkpoint's tensors are checked
    (:func:`~qstream.io.storage.names.check_key`) and never lead outside ``dst``."""
    if existing.kind not in ("quantized", "checkpoint", "restored", "dequantized", "kept"):
        raise StoreError(f"{dst}: not qstream's output; nothing is removed")
    if isinstance(dst, (str, os.PathLike)) and os.fspath(dst).endswith(".zip"):
        return  # a zip output is replaced whole when the new one is packed
    local = local_path(dst)
    if local is not None:
        _remove_local(local, existing, dst)
        clean_partials(dst)
        return
    from zarr.core.sync import sync

    store = open_store(dst, mode="w", storage_options=storage_options)
    try:
        _remove_stored(store, "", existing, dst, sync)
    except (OSError, ValueError) as e:
        if isinstance(e, StoreError):
            raise
        raise StoreError(f"cannot remove the old output {dst}: {type(e).__name__}: {e}") from None


def _tensor_keys(existing: Existing, dst: object, store: Any = None) -> list[str]:
    """The checked keys of a converted or restored checkpoint's tensors (a converted
    checkpoint's from its index, see :mod:`qstream.io.outputs.rootindex`)."""
    if existing.kind == "checkpoint":
        rows = RootIndex.open(dst, existing.meta, store).rows()
        return [r.get("key", n) for n, r in rows.items()]
    tensors = existing.meta.get("tensors", {}) if isinstance(existing.meta, dict) else None
    if not isinstance(tensors, dict):
        raise StoreError(f"{dst}: its metadata lists no tensors; the output is damaged")
    return [
        check_key(e.get("key", n) if isinstance(e, dict) else n, dst) for n, e in tensors.items()
    ]


def _remove_stored(store: Any, prefix: str, existing: Existing, dst: object, sync: Any) -> None:
    """:func:`remove_output` on a store (object store, memory): the node at ``prefix``."""
    from zarr.core.buffer import default_buffer_prototype

    if existing.kind in ("checkpoint", "restored"):
        for key in _tensor_keys(existing, dst, store):
            raw = sync(store.get(f"{prefix}{key}/zarr.json", default_buffer_prototype()))
            try:
                doc = json.loads(raw.to_bytes()) if raw is not None else None
            except (ValueError, RecursionError):
                doc = None
            node = classify_meta(doc) if isinstance(doc, dict) else Existing("foreign")
            if node.kind in ("quantized", "dequantized", "kept"):
                _remove_stored(store, f"{prefix}{key}/", node, dst, sync)
        delete_keys(store, f"{prefix}{INDEX}/", _INDEX_KEY, sync)
    elif existing.kind == "quantized":
        for m in (*MEMBERS, *OPTIONAL_MEMBERS):
            raw = sync(store.get(f"{prefix}{m}/zarr.json", default_buffer_prototype()))
            if raw is not None and is_array_doc(raw.to_bytes()):  # its own metadata says so
                delete_keys(store, f"{prefix}{m}/", ARRAY_KEY, sync)
    else:  # an array: its chunk keys
        delete_keys(store, prefix, ARRAY_KEY, sync)
    sync(store.delete(f"{prefix}zarr.json"))


def _remove_local(local: str, existing: Existing, dst: object) -> None:
    """Remove a local node qstream wrote (see :func:`remove_output`)."""
    if existing.kind in ("checkpoint", "restored"):
        keys = _tensor_keys(existing, dst)
        for key in keys:
            parent, _, name = key.rpartition("/")
            folder = child(local, parent, dst) if parent else local
            path = os.path.join(folder, name)
            if is_plain_dir(folder, name):
                node = node_at(path)
                if node.kind in ("quantized", "dequantized", "kept"):
                    _remove_local(path, node, path)
                    remove_child(path, LOCK)  # (no job runs on it: the root is locked)
                    remove_if_empty(path)
                    if os.path.lexists(path):  # (what qstream did not write stays)
                        refuse_links(path, local)
        for key in keys:  # the folders of an earlier version's nested names, if left empty
            parts = key.split("/")
            for i in range(len(parts) - 1, 0, -1):
                remove_if_empty(os.path.join(local, *parts[:i]))
        if existing.kind == "checkpoint":
            remove_packs(local)
        _remove_index(local)
        remove_child(local, "zarr.json")
        return
    if existing.kind == "quantized":
        for m in (*MEMBERS, *OPTIONAL_MEMBERS):
            path = os.path.join(local, m)
            if is_plain_dir(local, m) and is_array_doc_at(path):  # its own metadata says so
                remove_array_files(path)
                remove_if_empty(path)
        remove_child(local, "zarr.json")
        return
    remove_array_files(local)  # a dequantized or kept array


def _remove_index(local: str) -> None:
    """Remove a converted checkpoint's index (its batch documents and its own)."""
    index = os.path.join(local, INDEX)
    if not is_plain_dir(local, INDEX):
        return
    for entry in os.scandir(index):
        if entry.name.startswith("b") and is_plain_dir(index, entry.name):
            remove_partials(entry.path, recurse=False)
            remove_child(entry.path, "zarr.json")
            remove_if_empty(entry.path)
    remove_partials(index, recurse=False)
    remove_child(index, "zarr.json")
    remove_if_empty(index)


def clean_partials(dst: object) -> None:
    """Remove the temporary files of killed writers from a local output (its root and its
    member arrays): they are never part of a finished output."""
    local = local_path(dst)
    if local is None or not os.path.isdir(local):
        return
    remove_partials(local, recurse=False)
    for name in (*MEMBERS, *OPTIONAL_MEMBERS, INDEX):
        if entry_kind(os.path.join(local, name)) == "dir":  # (a link: never followed)
            remove_partials(os.path.join(local, name), recurse=True)
    for entry in os.scandir(local):  # groups a killed writer was building (never published)
        if entry.name.startswith(TMP_PREFIX) and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
    clean_partial_packs(local)


def refuse_links(folder: str, root: str) -> None:
    """Refuse, naming it, a link left in ``folder`` (a tensor's place in the output ``root``,
    emptied of what qstream wrote there: the tensor is written there next, never through it).
    Walked without following links."""
    for here, dirs, files in os.walk(folder):
        for name in sorted(dirs + files):
            entry = os.path.join(here, name)
            if os.path.islink(entry):
                raise StoreError(
                    f"{entry} is a link inside the output {root}, where qstream writes a tensor;"
                    " qstream never writes through a link in an output: remove it"
                )
