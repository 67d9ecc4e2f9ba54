"""Zarr metadata documents of local outputs, written by qstream itself.

zarr-python writes a node's ``zarr.json`` through its event-loop thread and a file thread,
after existence checks and parent-group writes: ~2-5 ms a node, and much more while the
cores run kernels (each hand-off waits for a time slice). A converted checkpoint makes six
metadata writes per tensor, so on a local disk qstream writes these documents itself, in the
calling thread: a group's by :func:`group_doc`, a plain array's by
:mod:`qstream.io.storage.arraydoc` (both the JSON zarr writes), anything else as zarr serializes it
(``to_buffer_dict``); written under a temporary name and renamed (readers never see a torn
document; :func:`qstream.io.outputs.cleanup.clean_partials` removes a killed writer's leftovers).
New nodes are linked into place, so a node that exists is never replaced. Elsewhere (object
stores, memory) zarr writes them as usual. :func:`read_local_doc` reads one back, refusing
anything that is not a regular file holding a JSON object. No link inside an output is
followed: the folders of a document are walked from the root this process holds
(:func:`qstream.paths.confined`), a document that is a link is refused, and the temporary
file is opened without following one.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import Any

from ...errors import StoreError
from ...input_files import open_regular
from ...paths import confined, opened
from .chunks import PARTIAL

DOC = "zarr.json"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
MAX_DOC = 256 << 20  # bytes of a metadata document qstream reads (a root of 100k tensors)


def _move_new(src: str, dst: str, dfd: int) -> None:
    """Move ``src`` to the new name ``dst`` (both entries of the folder ``dfd``), refusing an
    existing ``dst``."""
    if os.name == "nt":  # pragma: no cover - a rename refuses an existing target there
        os.rename(src, dst, src_dir_fd=dfd, dst_dir_fd=dfd)
        return
    # a rename replaces it: link (atomic, refuses an existing target), then unlink, as zarr's
    # LocalStore does for its exclusive writes
    os.link(src, dst, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
    os.unlink(src, dir_fd=dfd)


def read_local_doc(path: str) -> dict[str, Any] | None:
    """The JSON object in the local file ``path`` (a ``zarr.json``), or None: absent,
    unreadable, not JSON, not an object, or nested too deeply to be a Zarr document. A link
    (at ``path``, or on its way from a held root) is refused, not followed."""
    confined(path)
    try:
        with open_regular(path, "Zarr metadata", follow=False) as f:
            raw = f.read(MAX_DOC + 1)
        if len(raw) > MAX_DOC:
            return None
        doc = json.loads(raw)
    except StoreError:
        raise  # (a link, a FIFO, device or socket: refused, naming it)
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def local_root(store: Any) -> str | None:
    """The directory of a local Zarr store, or None."""
    import zarr

    return str(store.root) if isinstance(store, zarr.storage.LocalStore) else None


def group_doc(attrs: dict[str, Any]) -> bytes:
    """The ``zarr.json`` of a Zarr v3 group with ``attrs``, written compactly by the C JSON
    encoder (zarr's own indents it, which takes the pure-Python encoder: 5-10 ms for a group
    carrying a report)."""
    doc = {"attributes": attrs, "zarr_format": 3, "node_type": "group"}
    return json.dumps(doc, allow_nan=True, separators=(",", ":")).encode()


def encode_doc(metadata: Any) -> bytes:
    """``metadata``'s ``zarr.json``: a plain Zarr v3 group's by :func:`group_doc`, anything
    else as zarr serializes it."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.group import GroupMetadata

    plain = isinstance(metadata, GroupMetadata) and not metadata.consolidated_metadata
    if plain and metadata.zarr_format == 3:
        return group_doc(metadata.attributes)
    raw: bytes = metadata.to_buffer_dict(default_buffer_prototype())[DOC].to_bytes()
    return raw


def write_doc(directory: str, metadata: Any, *, new: bool) -> None:
    """Write ``metadata``'s ``zarr.json`` (or the document's ``bytes``) into ``directory``
    (made if absent); ``new``: fail with :class:`FileExistsError` if the node already has
    one, else replace it. No link on the way is followed, even one swapped in meanwhile:
    the document is written and renamed relative to its folder's descriptor, opened from the
    root this process holds (:func:`~qstream.paths.opened`; a link at the document's own
    place is replaced, never written through)."""
    tmp = f"{DOC}.{os.getpid()}-{threading.get_ident()}{PARTIAL}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW | _CLOEXEC
    with opened(directory, create=True) as dfd:  # (no link on the way followed, ever)
        try:
            with open(os.open(tmp, flags, 0o666, dir_fd=dfd), "wb") as f:
                f.write(metadata if isinstance(metadata, bytes) else encode_doc(metadata))
            if new:
                _move_new(tmp, DOC, dfd)
            else:
                os.replace(tmp, DOC, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise


def _root(store: Any) -> str:
    root = local_root(store)
    if root is None:
        raise TypeError(f"{store!r} is not a local Zarr store")
    return root


def new_group(store: Any, attrs: dict[str, Any]) -> Any:
    """A new Zarr v3 group (``zarr.Group``) at the root of the local ``store`` with
    ``attrs``."""
    import zarr
    from zarr.core.group import AsyncGroup, GroupMetadata

    metadata = GroupMetadata(attributes=attrs, zarr_format=3)
    write_doc(_root(store), metadata, new=True)
    return zarr.Group(AsyncGroup(metadata=metadata, store_path=zarr.storage.StorePath(store, "")))


def new_array(group: Any, name: str, metadata: Any, config: Any = None) -> Any:
    """A new array (``zarr.Array``) ``name`` of the local ``group`` with ``metadata`` (none
    may exist)."""
    import zarr
    from zarr.core.array import AsyncArray

    path = f"{group.store_path.path}/{name}".lstrip("/")
    store = group.store_path.store
    write_doc(os.path.join(_root(store), path), metadata, new=True)
    return zarr.Array(AsyncArray(metadata, zarr.storage.StorePath(store, path), config))


def update_group(group: Any, key: str, value: Any) -> None:
    """Set ``group.attrs[key] = value`` in one replacing write of its document."""
    root = _root(group.store_path.store)
    group.metadata.attributes[key] = value  # as zarr's own update_attributes does
    write_doc(os.path.join(root, group.store_path.path), group.metadata, new=False)
