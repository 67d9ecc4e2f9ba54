"""Writing a finished node whole: built in a hidden folder beside its place, renamed into it.

A small tensor's quantized group (or a pack of them, :mod:`qstream.io.outputs.pack_layout`) is
written at
once, with its values, instead of member by member: the node is made in a folder named
``.qstream-tmp-*`` (:data:`~qstream.io.outputs.ondisk.TMP_PREFIX`) next to where it goes and renamed
into place, so it is whole or absent. A killed writer's folder is never published; it is
removed by :func:`~qstream.io.outputs.cleanup.clean_partials` of the root. Local outputs only. The
node's folder is opened once from the root this process holds (:func:`~qstream.paths.opened`),
the hidden folder made and held open in it (:func:`~qstream.paths.made_folder`), and every
folder and file of the node made relative to the descriptors held, the node renamed relative
to its folder's: a link on the way, even one swapped in while the node is written, is refused,
never followed, and one at the place itself (which the rename never follows) is named when
the rename fails. No path is walked again inside the node (a pack of 10 files and folders: 12
``openat`` calls, 45 when each file walked its path from the root), but by the arrays
zarr-python writes itself (a scalar). Each folder held is checked to be still in its place
when it is done (:func:`~qstream.paths.made_folder`): one moved away and replaced meanwhile
is refused, so a link swapped in is never renamed into the output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import StoreError
from ...paths import local_path, made_folder, opened, remove_child, write_new_in
from ..storage import chunk_files, encode_doc, group_doc, plain_array
from .ondisk import TMP_PREFIX, WRITE_ALL_CHUNKS, array_metadata

# create_array keywords -> (metadata, document, chunk files)
_PREPARED: dict[str, tuple[Any, bytes, Any]] = {}

# one member: (create_array keywords, values or None, attributes or None)
Member = tuple[dict[str, Any], Any, dict[str, Any] | None]


def _prepared(kw: dict[str, Any]) -> tuple[Any, bytes, Any]:
    """``(metadata, zarr.json bytes, ChunkFiles or None)`` of an array made with ``kw`` (no
    ``config``), made once per keywords: the many small tensors of a conversion share them.
    The chunk files' ``root`` is to be set (``dataclasses.replace``)."""
    key = repr(sorted(kw.items()))
    got = _PREPARED.get(key)
    if got is None:
        plain = plain_array(kw)  # (most arrays: no zarr-python needed)
        if plain is not None:
            got = (None, *plain)
        else:
            import zarr
            from zarr.core.array import AsyncArray

            meta = array_metadata(kw)
            store = zarr.storage.LocalStore(os.sep)  # (a location for chunk_files to accept)
            files = chunk_files(zarr.Array(AsyncArray(meta, zarr.storage.StorePath(store, "x"))))
            got = (meta, encode_doc(meta), files)
        if len(_PREPARED) >= 256:
            _PREPARED.clear()
        _PREPARED[key] = got
    return got


def write_array(
    path: str, kw: dict[str, Any], values: Any, attrs: dict[str, Any], *, empty: bool = True
) -> None:
    """A new array at the local ``path`` (absent) holding ``values``, complete at once (built
    beside its place and renamed into it, as :func:`write_group` does). ``empty=False``:
    chunks of zero bytes are left out, as ``zarr.create_array`` and a write leave them."""
    _publish(path, lambda fd, where: _fill_array(fd, where, kw, values, attrs, empty=empty))


def _fill_array(
    fd: int,
    where: str,
    kw: dict[str, Any],
    values: Any,
    attrs: dict[str, Any] | None,
    *,
    empty: bool = True,
) -> None:
    """The array made with ``kw`` and ``attrs``, holding ``values`` (or none), written into the
    new folder ``where``, whose descriptor ``fd`` is held."""
    meta, doc, files = _prepared({k: v for k, v in kw.items() if k != "config"})
    if attrs:  # (the prepared document with these attributes, by the C encoder)
        parsed = json.loads(doc)
        parsed["attributes"] = attrs
        doc = json.dumps(parsed, allow_nan=True, separators=(",", ":")).encode()
    write_new_in(fd, "zarr.json", doc, os.path.join(where, "zarr.json"))
    if values is None:
        return
    values = np.asarray(values)
    if files is None or not values.shape:
        _zarr_write(os.path.dirname(where), os.path.basename(where), meta, values, empty)
    else:
        out = dataclasses.replace(files, root=where, atomic=False, root_fd=fd)
        out.write(tuple(slice(0, n) for n in values.shape), values, made={where}, empty=empty)


def _publish(path: str, build: Callable[[int, str], None]) -> None:
    """``build(fd, folder)`` a node in a hidden folder beside the local ``path`` (``fd``: the
    folder's descriptor, which every file of the node is made relative to), then rename it
    into place (an existing node is never replaced); nothing is left if it fails."""
    local = local_path(path)
    if local is None:
        raise StoreError(f"cannot write {path}: nodes are written whole in a local directory")
    # no link on the way (the place itself: a rename never follows a link there, and fails)
    folder, name = os.path.split(local)
    hidden = f"{TMP_PREFIX}{uuid.uuid4().hex}"
    try:
        with opened(folder) as dfd:
            with made_folder(dfd, hidden, os.path.join(folder, hidden)) as fd:
                build(fd, os.path.join(folder, hidden))
            os.replace(hidden, name, src_dir_fd=dfd, dst_dir_fd=dfd)  # published whole
    except BaseException as e:
        with contextlib.suppress(OSError, StoreError):
            remove_child(folder, hidden)
        if isinstance(e, OSError) and e.errno in _OCCUPIED and os.path.lexists(local):
            raise _occupied(local) from None
        if isinstance(e, OSError) and not isinstance(e, StoreError):
            raise StoreError(f"cannot write {path}: {e}") from None
        raise


_OCCUPIED = (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR)


def _occupied(local: str) -> StoreError:
    """The error for a node's place that still holds what qstream did not write (left by
    the removal of what qstream wrote there), naming it: a link first, else a file."""
    if os.path.islink(local):
        return StoreError(f"{local} is a link; qstream never writes through a link in an output")
    left = []
    for here, dirs, files in os.walk(local):  # (links are listed, never followed)
        for name in sorted(dirs + files):
            entry = os.path.join(here, name)
            if os.path.islink(entry):
                return StoreError(
                    f"{entry} is a link inside the output, where qstream writes {local}; qstream"
                    " never writes through a link in an output: remove it"
                )
            left.append(os.path.relpath(entry, local))
    what = f"{left[0]}, which qstream did not write" if left else "something qstream did not write"
    return StoreError(f"{local} holds {what}; remove it, or choose another destination")


def write_group(path: str, attrs: dict[str, Any], members: dict[str, Member]) -> None:
    """A new quantized group at the local ``path`` (absent), complete at once: ``members``
    maps a name to ``(create_array keywords, values or None, attributes or None)``. The group
    is built in a hidden folder beside ``path`` and renamed into place, so it is whole or
    absent (a killed writer's folder, ``.qstream-tmp-*``, is removed by
    :func:`~qstream.io.outputs.cleanup.clean_partials` of the root)."""

    def build(fd: int, where: str) -> None:
        for name, (kw, values, member_attrs) in members.items():
            with made_folder(fd, name, os.path.join(where, name)) as member:
                _fill_array(member, os.path.join(where, name), kw, values, member_attrs)
        write_new_in(fd, "zarr.json", group_doc(attrs), os.path.join(where, "zarr.json"))

    _publish(path, build)


def _zarr_write(root: str, name: str, meta: Any, values: np.ndarray, empty: bool) -> None:
    """Write ``values`` to the array ``name`` of the local folder ``root`` through zarr
    (``empty``: its all-zero chunks too)."""
    import zarr
    from zarr.core.array import AsyncArray

    store = zarr.storage.LocalStore(root)
    where = zarr.storage.StorePath(store, name)
    config = WRITE_ALL_CHUNKS if empty else None
    zarr.Array(AsyncArray(meta, where, config=config))[...] = values
