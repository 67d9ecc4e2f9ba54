"""Deleting a Zarr node's own files, and nothing else.

An array's own files are its ``zarr.json`` and its chunk files (flat ``c.0.1`` or nested
``c/0/1``): :func:`remove_array_files` deletes only those (and the temporary files of killed
writers) from a local directory, :func:`delete_keys` only the keys a pattern matches from a
store. Whether a node is qstream's to delete is decided above (:mod:`qstream.io.outputs.cleanup`):
these functions are told what to remove. No link is followed: the folders they remove from
are walked from the root this process holds (:func:`qstream.paths.confined`), entries are
looked at without following them, and a link is unlinked, never what it points to.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from typing import Any

from ...paths import confined, remove_child
from .chunks import PARTIAL
from .localmeta import read_local_doc

_CHUNK_KEY = re.compile(r"c(?:[./]\d+)*")  # an array's chunk keys (flat "c.0.1" or "c/0/1")
ARRAY_KEY = re.compile(r"zarr\.json|c(?:[./]\d+)*")  # an array's own keys, below its prefix


def delete_keys(store: Any, prefix: str, pattern: re.Pattern[str], sync: Any) -> None:
    """Delete the keys below ``prefix`` of the zarr ``store`` (relative to the prefix) that
    ``pattern`` matches in full; ``sync`` is zarr's ``sync``."""

    async def keys() -> list[str]:
        return [k async for k in store.list_prefix(prefix)]

    for key in sync(keys()):
        if pattern.fullmatch(key[len(prefix) :]):
            sync(store.delete(key))


def is_array_doc(raw: bytes) -> bool:
    """Whether ``raw`` is the ``zarr.json`` of an array."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and doc.get("node_type") == "array"


def is_array_doc_at(path: str) -> bool:
    """Whether the local directory ``path`` holds an array's ``zarr.json``."""
    doc = read_local_doc(os.path.join(path, "zarr.json"))
    return doc is not None and doc.get("node_type") == "array"


def remove_array_files(directory: str) -> None:
    """Remove a Zarr array's own files from ``directory``: its chunk files (flat ``c.0.1``, or
    nested ``c/0/1``: only files whose path is chunk coordinates, and the folders they leave
    empty) and temporary files, then its ``zarr.json``. Nothing else is touched, and nothing
    is followed through a link (``directory`` is walked first; a chunk file that is a link
    is unlinked)."""
    for entry in os.scandir(confined(directory)):
        if entry.name == "c" and entry.is_dir(follow_symlinks=False):
            _remove_chunk_folder(entry.path)
        elif (_CHUNK_KEY.fullmatch(entry.name) or entry.name.endswith(PARTIAL)) and (
            entry.is_file(follow_symlinks=False) or entry.is_symlink()
        ):
            remove_child(directory, entry.name)
    remove_child(directory, "zarr.json")


def _remove_chunk_folder(folder: str) -> None:
    """Remove the nested chunk files below ``folder`` (``c``): entries named by a number (or
    temporary files), recursively, and the folders left empty; links only unlinked."""
    for entry in os.scandir(folder):
        if entry.name.isdigit() and entry.is_dir(follow_symlinks=False):
            _remove_chunk_folder(entry.path)
        elif (entry.name.isdigit() or entry.name.endswith(PARTIAL)) and (
            entry.is_file(follow_symlinks=False) or entry.is_symlink()
        ):
            remove_child(folder, entry.name)
    remove_if_empty(folder)


def remove_if_empty(directory: str) -> None:
    """Remove ``directory`` if it is empty (else, or if it is gone, nothing)."""
    with contextlib.suppress(OSError):
        os.rmdir(directory)


def remove_partials(directory: str, *, recurse: bool) -> None:
    """Remove the temporary files (``*.partial``) of killed writers from ``directory`` (and
    its subfolders with ``recurse``; links are not followed)."""
    for entry in os.scandir(confined(directory)):
        if entry.name.endswith(PARTIAL) and entry.is_file(follow_symlinks=False):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
        elif recurse and entry.is_dir(follow_symlinks=False):
            remove_partials(entry.path, recurse=True)


def entry_kind(path: str) -> str | None:
    """``dir``, ``link``, ``other`` or None (absent), the entry itself (never followed)."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(mode):
        return "link"
    return "dir" if stat.S_ISDIR(mode) else "other"


def is_plain_dir(folder: str, name: str) -> bool:
    """Whether ``folder/name``, the place of one of qstream's own members being replaced, is a
    folder (not followed): a link there is removed (the link, never what it points to) and
    gives False, as does anything absent or not a folder. ``folder`` is walked first
    (:func:`~qstream.paths.confined`)."""
    path = os.path.join(confined(folder), name)
    kind = entry_kind(path)
    if kind == "link":  # never qstream's: the link goes, not what it points to
        remove_child(folder, name)
    return kind == "dir"
