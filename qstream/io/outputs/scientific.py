"""Outputs that xarray and plain Zarr readers see as the source's variable.

- the source's dimension names (Zarr v3 ``dimension_names``, or xarray's v2
  ``_ARRAY_DIMENSIONS``) and its descriptive attributes (units, long_name, ...) are carried to
  ``data`` (:func:`source_dims`, :func:`source_attrs`);
- the parameters are coordinates of ``data`` (a CF ``coordinates`` attribute), so
  ``xr.open_zarr`` shows one data variable; when that variable is codes that xarray's CF
  decoding does not turn into values (per channel, blockwise, float types), ``data``'s
  attributes say so and how to decode them (:func:`codes_attrs`); ``_progress`` (the resume
  snapshot) is removed once the output is complete (:func:`drop_progress`);
- the source's coordinates (the 1-D arrays beside a Zarr source named by its dimensions, as
  long as the axis: ``lat``, ``lon``, ``time``), values and attributes, are copied into the
  output's group, where xarray finds them as the dimensions' coordinates
  (:func:`copy_coords`);
- the lock file exists only while a job writes (see :func:`qstream.io.outputs.destination.locked`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any

import numpy as np

from ...errors import StoreError
from ...paths import local_path, walk_below
from ..storage import (
    ARRAY_KEY,
    delete_keys,
    group_doc,
    is_array_doc,
    is_array_doc_at,
    remove_array_files,
    remove_if_empty,
    write_doc,
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
    """The descriptive ones of ``attrs`` (see :func:`source_attrs`; never the
    :func:`codes_attrs` of a quantized ``data``: what is carried are values)."""
    out = {
        k: v
        for k, v in attrs.items()
        if isinstance(k, str) and k not in _ENCODING_ATTRS and not k.startswith(("_", CODES_PREFIX))
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


CODES_PREFIX = "qstream_"  # (the attributes :func:`codes_attrs` writes)


def codes_attrs(
    qtype: str, axis: int | None, block_size: int | None, offset: bool
) -> dict[str, Any]:
    """The attributes of a quantized ``data`` that tell a plain ``xr.open_zarr`` (or zarr)
    reader it holds codes, not values, and how to decode them: ``qstream_codes: true``, the
    names of the parameter arrays (``qstream_scale``, ``qstream_zero_point`` or
    ``qstream_offset``), the axis and block size, and ``qstream_decode`` (the formula, and
    ``qs.open_xarray``, which decodes lazily to float32). None for a per-tensor integer
    output: its CF ``scale_factor``/``add_offset`` make xarray decode it."""
    floats = qtype.startswith("float")
    if axis is None and not floats:
        return {}
    where = (
        "one value per tensor"
        if axis is None
        else f"one per index of axis {axis}"
        if not block_size
        else f"one per block of {block_size} along axis {axis}"
    )
    how = "data * scale + offset" if offset else "(data - zero_point) * scale"
    if floats:
        how = f"data (uint8 bit patterns of {qtype}) * scale" if "8" in qtype else "data * scale"
    out: dict[str, Any] = {
        "qstream_codes": True,
        "qstream_dtype": qtype,
        "qstream_scale": "scale",
        **({"qstream_offset": "offset"} if offset else {"qstream_zero_point": "zero_point"}),
        "qstream_axis": axis,
        "qstream_decode": (
            f"these are quantized {qtype} codes, not values: values = {how}, parameters"
            f" {where}; qstream.open_xarray(path) gives the values (lazy, float32)"
        ),
    }
    if block_size:
        out["qstream_block_size"] = block_size
    return out


def coordinates(offset: bool) -> str:
    """The CF ``coordinates`` attribute of ``data``: its parameters."""
    return "scale zero_point offset" if offset else "scale zero_point"


MEMBERS = {"data", "scale", "zero_point", "offset", "_progress"}  # (an output's own arrays)
MAX_COORD_BYTES = 64 << 20  # a coordinate array larger than this is not copied


def source_coords(source: Any, dims: list[str] | None, shape: Any) -> dict[str, Any]:
    """The coordinates of a Zarr ``source`` (of dimensions ``dims`` and ``shape``): each 1-D
    array of its group named by one of its dimensions and as long as that axis, as
    ``(values, attributes)`` (the attributes as :func:`carried_attrs` keeps them: ``units``,
    ``calendar``, ``long_name``, ...). None where there is nothing to copy."""
    arr: Any = getattr(source, "array", None)
    if getattr(source, "description", {}).get("kind") != "zarr" or arr is None or not dims:
        return {}
    import zarr

    try:
        path = str(arr.store_path.path).strip("/")
        if path:  # (the source's group is in its store)
            parent = path.rsplit("/", 1)[0] if "/" in path else ""
            group = zarr.open_group(store=arr.store_path.store, path=parent, mode="r")
        else:  # (a store rooted at the array: its folder's, when local)
            local = local_path(source.description.get("path"))
            if local is None:
                return {}
            group = zarr.open_group(os.path.dirname(os.path.abspath(local)), mode="r")
    except Exception:  # (no group above the source: nothing to copy)
        return {}
    return group_coords(group, dims, shape)


def group_coords(group: Any, dims: list[str] | None, shape: Any) -> dict[str, Any]:
    """The members of the ``zarr.Group`` ``group`` that are coordinates of an array of
    dimensions ``dims`` and ``shape`` (see :func:`source_coords`), as ``(values,
    attributes)``."""
    import zarr

    out = {}
    for dim, n in zip(dims or [], shape, strict=True):
        if dim in MEMBERS or not _NAME.fullmatch(dim) or dim.startswith("_"):
            continue
        try:
            member = group[dim]
        except Exception:
            continue
        if not isinstance(member, zarr.Array) or tuple(member.shape) != (int(n),):
            continue
        if int(n) * member.dtype.itemsize > MAX_COORD_BYTES:
            continue
        try:
            values = member[...]
        except Exception:  # (a type this zarr cannot read: left behind)
            continue
        out[dim] = (values, carried_attrs(dict(member.attrs)))
    return out


def copy_coords(source: Any, group: Any, dims: list[str] | None, shape: Any) -> None:
    """Copy :func:`source_coords` into the output ``group`` (a ``zarr.Group``), each a 1-D
    array named by its dimension (replacing one there: a resumed run writes the same; a link
    in its place, in a local output, is refused naming it, never written through)."""
    for dim, (values, attrs) in source_coords(source, dims, shape).items():
        _write_coord(group, dim, values, attrs, overwrite=True)


def _write_coord(group: Any, dim: str, values: Any, attrs: dict[str, Any], overwrite: bool) -> None:
    """Write the coordinate ``dim`` into ``group`` (a link in its place, in a local store,
    refused naming it, never written through)."""
    root = getattr(group.store_path.store, "root", None)  # (a local store's folder)
    if root is not None:
        parts = [p for p in str(group.store_path.path).split("/") if p]
        walk_below(os.fspath(root), [*parts, dim, "zarr.json"])
    try:
        a = group.create_array(
            dim,
            shape=values.shape,
            dtype=values.dtype,
            dimension_names=[dim],
            attributes=attrs,
            overwrite=overwrite,
        )
        a[...] = values
    except OSError as e:
        raise StoreError(f"cannot write the coordinate {dim} of {group.store_path}: {e}") from None


def copy_coords_beside(
    qgroup: Any,
    dims: list[str] | None,
    shape: Any,
    dst: Any,
    storage_options: dict[str, Any] | None = None,
) -> list[str]:
    """Copy the coordinates of the quantized output ``qgroup`` (:func:`group_coords`) beside
    its dequantized copy ``dst`` when ``dst`` is a member of a Zarr group (``copy.zarr/t2m``),
    where ``xr.open_zarr`` of that group finds them. A member of that name already there is
    never replaced (qstream did not write it): it counts when it holds the same values, else
    the coordinate is left out. Returns the coordinates the copy has beside it."""
    coords = group_coords(qgroup, dims, shape)
    if not coords or not isinstance(dst, str | os.PathLike):
        return []
    path = os.fspath(dst).rstrip("/")
    if "/" not in path.split("://", 1)[-1]:
        return []
    parent = path.rsplit("/", 1)[0]
    import zarr

    from ..storage import open_store

    _group_for_copy(parent, path)
    try:
        store = open_store(parent, mode="w", storage_options=storage_options)
        group = zarr.open_group(store=store, mode="r+")  # (an existing group only)
    except Exception:  # (not inside a Zarr group: no place for them)
        return []
    beside = []
    for dim, (values, attrs) in coords.items():
        try:
            there = group[dim]
        except KeyError:
            there = None
        if there is not None:
            if isinstance(there, zarr.Array) and tuple(there.shape) == values.shape:
                theirs = np.asarray(there[...])
                if np.array_equal(theirs, values, equal_nan=values.dtype.kind in "fc"):
                    beside.append(dim)
            continue
        _write_coord(group, dim, values, attrs, overwrite=False)
        beside.append(dim)
    return beside


def _group_for_copy(parent: str, path: str) -> None:
    """Make the local folder ``parent`` a Zarr group where a copy ``path`` asked to be a
    member of one that does not exist yet (``copy.zarr/t2m``: the folder, named ``.zarr``,
    made for the copy and holding nothing else), so that its coordinates go beside it and
    ``xr.open_zarr(parent)`` opens both. A folder holding anything else is left as it is."""
    local = local_path(parent)
    if local is None or not local.endswith(".zarr") or os.path.islink(local):
        return
    try:
        held = os.listdir(local)
    except OSError:
        return
    if held != [os.path.basename(path)] or not os.path.isdir(os.path.join(local, held[0])):
        return
    with contextlib.suppress(FileExistsError):  # (made meanwhile: a group already)
        write_doc(local, group_doc({}), new=True)


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
