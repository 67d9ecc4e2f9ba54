"""The on-disk format of a quantized array: what a quantized group's members and attributes are.

A quantized array is a Zarr v3 group::

    dst/            attrs["qstream"] = {"version", "fingerprint", "ready", "complete", "spec",
      data                             "source", "calibration", "error", "report", ...}
      scale         float32 (float16 or bfloat16 as the spec's scale_dtype says), the parameter
                    shape ([] per tensor, [C] per axis, blocked shape)
      zero_point    the type's integer container (float types: float32 zeros)
      _progress     the resume snapshot of the quantize pass (``qstream.io.outputs.progress_log``)

Sub-byte types (int4/uint4/int2/uint2/float4_e2m1fn) are packed, two or four per byte, in the
zarr-extensions data types and ``packbits`` codec (format 3; format 2 stored them one per
byte in int8/uint8, masked to their bits, and is still read); float8 as uint8 bit
patterns. Per-tensor integer arrays also carry CF ``scale_factor``/``add_offset`` on
``data``. Every array has dimension names.

Life of an output: the group's metadata is written first, in one write, with the job's
``fingerprint`` and ``ready: false``; then the member arrays and the parameters; then
``ready: true``; blocks land; ``complete: true`` is written last. A kill at any moment leaves a
state the same job resumes from (members not ready are made again; blocks past the progress
snapshot are written again). Small outputs are written whole instead
(:mod:`qstream.io.outputs.publish`).

Destination rules and the life of an output location: :mod:`qstream.io.outputs.destination`; reading
an output: :mod:`qstream.io.outputs.qarray`.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import StoreError
from ...qtypes import QType
from ..storage import chunk_files, localmeta, open_store, stored_sizes

if TYPE_CHECKING:
    from zarr.core.array_spec import ArrayConfigParams

FORMAT_VERSION = 3
MEMBERS = ("data", "scale", "zero_point", "_progress")  # of a quantized group
OPTIONAL_MEMBERS = ("offset",)  # of some quantized groups (float offsets)
# a node being built beside its place, renamed into it when whole (qstream.io.outputs.publish)
TMP_PREFIX = ".qstream-tmp-"
LOCK = ".qstream-lock"  # a local destination's lock file (qstream.io.outputs.destination.locked)
# Every output chunk is written: skipping zarr's "is this chunk all fill value?" scan saves a
# full pass over the data, and quantized/dequantized chunks are almost never empty.
WRITE_ALL_CHUNKS: ArrayConfigParams = {"write_empty_chunks": True}
# Chunk files side by side ("c.0.0"), not one directory per chunk row ("c/0/0"): creating a
# directory costs as much as a file, and a block writes one chunk.
FLAT_KEYS = {"name": "default", "separator": "."}


# --------------------------------------------------------------------------- quantized groups


def create_group(
    dst: object, attrs: dict[str, Any], storage_options: dict[str, Any] | None = None
) -> Any:
    """A new Zarr v3 group (``zarr.Group``) at ``dst`` whose metadata carries ``attrs`` from
    its first write."""
    import zarr

    store = open_store(dst, mode="w", storage_options=storage_options)
    try:
        if localmeta.local_root(store) is not None:
            return localmeta.new_group(store, attrs)
        return zarr.create_group(store=store, attributes=attrs, zarr_format=3, overwrite=False)
    except (zarr.errors.ContainsGroupError, FileExistsError):
        raise StoreError(f"{dst} was created by another process meanwhile; run again") from None
    except (PermissionError, OSError) as e:
        raise StoreError(f"cannot write {dst}: {e}") from None


def create_arrays(group: Any, arrays: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Create the member arrays ``{name: zarr.create_array keywords}`` of the new group
    ``group`` (none may exist yet) in one concurrent write of their metadata; returns
    ``{name: zarr.Array}``. A ``config`` keyword applies to the returned array objects.

    One ``create_array`` per member costs a round of existence checks and parent-group
    writes each (~3 ms on a local disk); a converted checkpoint makes four per tensor."""
    nodes, configs = {}, {}
    for name, kw in arrays.items():
        kw = dict(kw)
        configs[name] = kw.pop("config", None)
        nodes[name] = array_metadata(kw)
    if localmeta.local_root(group.store_path.store) is not None:
        try:
            return {n: localmeta.new_array(group, n, m, configs[n]) for n, m in nodes.items()}
        except FileExistsError as e:
            raise StoreError(f"{e.filename} was created by another process meanwhile") from None
    made = dict(group.create_hierarchy(nodes, overwrite=False))
    out = {}
    for name, config in configs.items():
        arr = made[name]
        out[name] = arr.with_config(config) if config else arr
    return out


_TEMPLATES: dict[str, Any] = {}  # create_array keywords -> the metadata they make


def array_metadata(kw: dict[str, Any]) -> Any:
    """The Zarr metadata (``ArrayV3Metadata``) ``zarr.create_array(**kw)`` would write, made
    once per keywords in memory (the codecs' reprs name every setting)."""
    import zarr
    from zarr.storage import MemoryStore

    key = repr(sorted(kw.items()))
    meta = _TEMPLATES.get(key)
    if meta is None:
        from ..zarr_types.zarr_ext import register_zarr_types

        register_zarr_types()  # sub-byte types: this may be the process's first Zarr write
        meta = zarr.create_array(store=MemoryStore(), **kw).metadata
        if len(_TEMPLATES) >= 256:
            _TEMPLATES.clear()
        _TEMPLATES[key] = meta
    # a copy with its own attributes: zarr updates an array's attributes in place
    return dataclasses.replace(meta, attributes=copy.deepcopy(meta.attributes))


def data_encoding(qt: QType) -> tuple[np.dtype[Any], Any]:
    """How ``data`` of type ``qt`` is stored: (Zarr dtype, serializer). Sub-byte types are
    packed with the ``packbits`` codec (zarr-extensions data types ``int4``, ``uint4``,
    ``int2``, ``uint2``, ``float4_e2m1fn``); float8 types as uint8 bit patterns; the rest
    natively."""
    if qt.bits < 8:  # (the types and codec are registered whenever a store is opened)
        from ..zarr_types.zarr_ext import PackBits

        return qt.dtype, PackBits()
    return (np.dtype(np.uint8) if qt.is_float else qt.widened), "auto"


def storage_of(qt: QType) -> str:
    """The ``storage`` entry of an output's metadata."""
    if qt.bits < 8:
        return f"packed, {8 // qt.bits} per byte (packbits)"
    return "uint8 bit patterns" if qt.is_float else "native"


def stored_nbytes(shape: Sequence[int], qt: QType) -> int:
    """Bytes of the values of an array of ``shape`` and type ``qt`` as stored (uncompressed)."""
    n = math.prod(shape)
    return -(-n * qt.bits // 8) if qt.bits < 8 else n * max(1, qt.dtype.itemsize)


def quantized_nbytes(shape: Sequence[int], spec: Any) -> int:
    """The size of a tensor of ``shape`` quantized under ``spec`` (a ``QuantSpec``): every
    byte its output holds for it, uncompressed. That is its codes as stored
    (:func:`stored_nbytes`) and its parameters, one set per tensor, channel or block: a
    scale (float32; float16 or bfloat16 with ``scale_dtype`` so), a zero point (in the codes'
    widened type) unless every one is 0 by construction (signed integer types symmetric,
    float types: zarr stores no chunk of zeros), an offset (float64) for a float offset.
    The one definition of "after" of ``convert --dry-run``, ``convert``, ``inspect`` and
    the conversion's reports."""
    qt = spec.qtype
    shape = [int(d) for d in shape]
    params = 1
    if spec.axis is not None and shape:
        axis = spec.axis % len(shape)
        params = shape[axis]
        if spec.block_size:
            params = math.prod(shape) // max(1, shape[axis]) * -(-shape[axis] // spec.block_size)
    each = 2 if spec.scale_dtype in ("float16", "bfloat16") else 4
    if spec.float_offset:
        each += 8
    elif not qt.is_float and (not spec.symmetric or not qt.signed):
        each += qt.widened.itemsize
    return stored_nbytes(shape, qt) + params * each


def set_meta(group: Any, meta: dict[str, Any], key: str = "qstream") -> None:
    """Replace the group's ``key`` attributes (one atomic metadata write)."""
    try:
        if localmeta.local_root(group.store_path.store) is not None:
            localmeta.update_group(group, key, meta)
        else:
            group.attrs[key] = meta
    except OSError as e:
        raise StoreError(f"cannot write the metadata of {group.store_path}: {e}") from None


def check_writer(node: Any, token: str, dst: object) -> None:
    """Refuse to finish an output that another job took over while this one ran: the node's
    metadata, read again from the store, must still name this job's ``token`` as its writer
    (two jobs writing one object-store output are not stopped by a lock)."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    sp = node.store_path
    key = f"{sp.path}/zarr.json".lstrip("/")
    raw = sync(sp.store.get(key, default_buffer_prototype()))
    try:
        doc = json.loads(raw.to_bytes()) if raw is not None else {}
        writer = doc["attributes"]["qstream"].get("writer")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        writer = None
    if writer != token:
        raise StoreError(
            f"{dst} was taken over by another job while this one ran (its metadata now names"
            " another writer, or is gone); this run stops without marking it complete: let the"
            " other job finish, or re-run this one to resume"
        )


# --------------------------------------------------------------------------- what is missing


def missing_members(group: Any) -> list[str]:
    """The member documents a quantized group lacks in its store (one listing)."""
    sizes = stored_sizes(group.store_path.store, group.store_path.path)
    return [f"{m}/zarr.json" for m in MEMBERS if f"{m}/zarr.json" not in sizes]


def gaps(node: Any, sizes: Mapping[str, int] | None = None, *, strict: bool = True) -> list[str]:
    """What the quantized group (or plain array) ``node`` lacks in its store, from one
    listing (``sizes``: its files' sizes by key below it, listed already): member
    documents, and chunks of ``data`` and ``scale`` (of a plain array, its own) absent or of
    the wrong size (raw chunks must have their exact size, compressed ones must not be
    empty). ``zero_point`` chunks are not listed: zarr does not store all-zero ones.
    ``strict=False``: nor the chunks of local arrays written through zarr rather than their
    chunk files (0-d ones, and layouts :func:`~qstream.io.storage.chunk_files` does not
    write), whose all-zero chunks earlier versions left out (what an output of any version
    lacks; in object stores every chunk is written, and read so)."""
    import zarr

    if sizes is None:
        sizes = stored_sizes(node.store_path.store, node.store_path.path)
    if isinstance(node, zarr.Array):
        if "zarr.json" not in sizes:
            return ["zarr.json"]
        return _chunk_gaps(node, "", sizes, strict)
    members = ("data", "scale", "zero_point")
    missing = [f"{m}/zarr.json" for m in members if f"{m}/zarr.json" not in sizes]
    if "zarr.json" not in sizes:
        missing.insert(0, "zarr.json")
    for m in ("data", "scale"):
        if f"{m}/zarr.json" in sizes:
            missing += _chunk_gaps(node[m], f"{m}/", sizes, strict)
    return missing


def _local(arr: Any) -> bool:
    import zarr

    return isinstance(arr.store_path.store, zarr.storage.LocalStore)


def _chunk_gaps(arr: Any, prefix: str, sizes: Mapping[str, int], strict: bool) -> list[str]:
    from zarr.codecs import BytesCodec

    meta = arr.metadata
    plain = isinstance(getattr(arr, "serializer", None), BytesCodec)
    raw = plain and not arr.compressors and not getattr(arr, "filters", ())
    exact = (math.prod(arr.chunks) if arr.shape else 1) * arr.dtype.itemsize if raw else None
    grid = [range(-(-s // c)) for s, c in zip(arr.shape, arr.chunks, strict=True)]
    out = []
    for coords in itertools.product(*grid):
        key = prefix + meta.encode_chunk_key(coords)
        size = sizes.get(key)
        if size is None or size == 0 or (exact is not None and size != exact):
            out.append(key)
    if out and not strict and (not arr.shape or (_local(arr) and chunk_files(arr) is None)):
        return []  # (written through zarr locally: earlier versions left all-zero chunks out)
    return out
