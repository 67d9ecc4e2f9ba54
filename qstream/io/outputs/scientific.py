"""Outputs that xarray and plain Zarr readers see as the source's variable.

- the source's dimension names (Zarr v3 ``dimension_names``, or xarray's v2
  ``_ARRAY_DIMENSIONS``) and its descriptive attributes (units, long_name, ...) are carried to
  ``data`` (:func:`source_dims`, :func:`source_attrs`);
- the parameters are coordinates of ``data`` (a CF ``coordinates`` attribute), so
  ``xr.open_zarr`` shows one data variable; ``_progress`` (the resume snapshot) is removed once
  the output is complete (:func:`drop_progress`);
- the lock file exists only while a job writes (see :func:`qstream.io.outputs.destination.locked`).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from ...paths import local_path
from ..storage import (
    ARRAY_KEY,
    delete_keys,
    is_array_doc,
    is_array_doc_at,
    remove_array_files,
    remove_if_empty,
)

# Attributes that describe how the source's values were stored, not what they mean: never
# carried (the output's ``data`` has its own encoding).
_ENCODING_ATTRS = {
    "_FillValue",
    "missing_value",
    "scale_factor",
    "add_offset",
    "valid_min",
    "valid_max",
    "valid_range",
    "_Unsigned",
    "coordinates",
    "_ARRAY_DIMENSIONS",
    "dtype",
    "units_metadata",
    "compressor",
    "filters",
    "qstream",
}
MAX_ATTRS_BYTES = 64 << 10  # source attributes carried, as JSON (larger ones are not carried)
_NAME = re.compile(r"[^/\x00]{1,255}")


def source_dims(source: Any, ndim: int) -> list[str] | None:
    """The source's dimension names (Zarr v3 metadata, else xarray's v2 attribute), when it
    has a valid set (strings, distinct, one per axis, no ``/``), else None."""
    arr: Any = getattr(source, "array", None)
    meta = getattr(arr, "metadata", None)
    names = getattr(meta, "dimension_names", None)
    if not names:
        try:
            names = dict(arr.attrs).get("_ARRAY_DIMENSIONS")
        except Exception:  # (not a zarr array)
            names = None
    if not isinstance(names, list | tuple) or len(names) != ndim:
        return None
    if not all(isinstance(n, str) and _NAME.fullmatch(n) for n in names):
        return None
    if len(set(names)) != ndim:
        return None
    return list(names)


def source_attrs(source: Any) -> dict[str, Any]:
    """The source's descriptive attributes (a Zarr source's, without its encoding ones and
    without keys starting with ``_``); none when they are larger than
    :data:`MAX_ATTRS_BYTES` as JSON."""
    arr: Any = getattr(source, "array", None)
    if getattr(source, "description", {}).get("kind") != "zarr":
        return {}
    try:
        attrs = dict(arr.attrs)
    except Exception:
        return {}
    return carried_attrs(attrs)


def carried_attrs(attrs: dict[Any, Any]) -> dict[str, Any]:
    """The descriptive ones of ``attrs`` (see :func:`source_attrs`)."""
    out = {
        k: v
        for k, v in attrs.items()
        if isinstance(k, str) and k not in _ENCODING_ATTRS and not k.startswith("_")
    }
    try:
        if len(json.dumps(out, allow_nan=False)) > MAX_ATTRS_BYTES:
            return {}
    except (TypeError, ValueError):
        return {}
    return out


def param_names(dims: list[str], axis: int | None, block_size: int | None) -> list[str]:
    """Dimension names of the scale / zero point / offset: none per tensor; the channel
    axis's name per axis; a blocked array's axes, the blocked one renamed."""
    if axis is None:
        return []
    if not block_size:
        return [dims[axis]]
    names = list(dims)
    names[axis] += "_blocks"
    return names


def coordinates(offset: bool) -> str:
    """The CF ``coordinates`` attribute of ``data``: its parameters."""
    return "scale zero_point offset" if offset else "scale zero_point"


def drop_progress(dst: object, group: Any, storage_options: dict[str, Any] | None = None) -> None:
    """Remove the ``_progress`` member of a complete output (only an array qstream wrote:
    its own metadata says so); nothing fails if it is gone already."""
    local = local_path(dst)
    if local is not None:
        path = os.path.join(local, "_progress")
        if os.path.isdir(path) and not os.path.islink(path) and is_array_doc_at(path):
            remove_array_files(path)
            remove_if_empty(path)
        return
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    store = group.store_path.store
    prefix = group.store_path.path
    prefix = f"{prefix}/_progress/" if prefix else "_progress/"
    raw = sync(store.get(f"{prefix}zarr.json", default_buffer_prototype()))
    if raw is not None and is_array_doc(raw.to_bytes()):
        delete_keys(store, prefix, ARRAY_KEY, sync)
