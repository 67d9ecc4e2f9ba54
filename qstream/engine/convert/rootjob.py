"""The root group of a converted or restored checkpoint: its job's identity, its keys."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...errors import StoreError
from ...io.storage import compression as compressions
from ...io.storage import tensor_key


def same_job(meta: dict[str, Any], ident: dict[str, Any]) -> bool:
    """Whether the root metadata ``meta`` is of the job ``ident`` (outputs made before the
    ``compression`` option were made with ``"auto"``)."""
    stored = {k: meta.get(k) for k in ident}
    if meta.get("layout") != ident.get("layout"):  # (packs, or one group per tensor)
        return False
    return {**stored, "compression": meta.get("compression", compressions.AUTO)} == ident


def tensor_keys(names: Iterable[str]) -> dict[str, str]:
    """The key (:func:`~qstream.io.storage.names.tensor_key`) of every tensor name."""
    keys = {name: tensor_key(name) for name in names}
    if len(set(keys.values())) != len(keys):  # only cut keys of very long names can collide
        raise StoreError("two tensor names of the checkpoint map to one key; rename them")
    return keys
