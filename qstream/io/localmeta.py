"""Zarr metadata documents of local outputs, written by qstream itself.

zarr-python writes a node's ``zarr.json`` through its event-loop thread and a file thread,
after existence checks and parent-group writes: ~2-5 ms a node, and much more while the
cores run kernels (each hand-off waits for a time slice). A converted checkpoint makes six
metadata writes per tensor, so on a local disk qstream writes these documents itself, in the
calling thread: the bytes are zarr's own serialization of the node's metadata
(``to_buffer_dict``), written under a temporary name and renamed (readers never see a torn
document; :func:`qstream.io.destination.clean_partials` removes a killed writer's leftovers).
New nodes are linked into place, so a node that exists is never replaced. Elsewhere (object
stores, memory) zarr writes them as usual.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading

from .chunks import PARTIAL

DOC = "zarr.json"


if os.name == "nt":  # a rename refuses an existing target there
    _move_new = os.rename
else:  # a rename replaces it: link (atomic, refuses an existing target), then unlink, as
    # zarr's LocalStore does for its exclusive writes

    def _move_new(src: str, dst: str) -> None:
        os.link(src, dst)
        os.unlink(src)


def local_root(store) -> str | None:
    """The directory of a local Zarr store, or None."""
    import zarr

    return str(store.root) if isinstance(store, zarr.storage.LocalStore) else None


def encode_doc(metadata) -> bytes:
    """``metadata``'s ``zarr.json``: a Zarr v3 group's written here, compactly, by the C
    JSON encoder (zarr's own indents it, which takes the pure-Python encoder: 5-10 ms for a
    group carrying a report); anything else as zarr serializes it."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.group import GroupMetadata

    plain = isinstance(metadata, GroupMetadata) and not metadata.consolidated_metadata
    if plain and metadata.zarr_format == 3:
        doc = {"attributes": metadata.attributes, "zarr_format": 3, "node_type": "group"}
        return json.dumps(doc, allow_nan=True, separators=(",", ":")).encode()
    return metadata.to_buffer_dict(default_buffer_prototype())[DOC].to_bytes()


def write_doc(directory: str, metadata, *, new: bool) -> None:
    """Write ``metadata``'s ``zarr.json`` into ``directory`` (made if absent); ``new``: fail
    with :class:`FileExistsError` if the node already has one, else replace it."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, DOC)
    tmp = f"{path}.{os.getpid()}-{threading.get_ident()}{PARTIAL}"
    try:
        with open(tmp, "wb") as f:
            f.write(encode_doc(metadata))
        if new:
            _move_new(tmp, path)
        else:
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def new_group(store, attrs: dict):
    """A new Zarr v3 group at the root of the local ``store`` with ``attrs``."""
    import zarr
    from zarr.core.group import AsyncGroup, GroupMetadata

    metadata = GroupMetadata(attributes=attrs, zarr_format=3)
    write_doc(local_root(store), metadata, new=True)
    return zarr.Group(AsyncGroup(metadata=metadata, store_path=zarr.storage.StorePath(store, "")))


def new_array(group, name: str, metadata, config=None):
    """A new array ``name`` of the local ``group`` with ``metadata`` (none may exist)."""
    import zarr
    from zarr.core.array import AsyncArray

    path = f"{group.store_path.path}/{name}".lstrip("/")
    store = group.store_path.store
    write_doc(os.path.join(local_root(store), path), metadata, new=True)
    return zarr.Array(AsyncArray(metadata, zarr.storage.StorePath(store, path), config))


def update_group(group, key: str, value) -> None:
    """Set ``group.attrs[key] = value`` in one replacing write of its document."""
    root = local_root(group.store_path.store)
    group.metadata.attributes[key] = value  # as zarr's own update_attributes does
    write_doc(os.path.join(root, group.store_path.path), group.metadata, new=False)
