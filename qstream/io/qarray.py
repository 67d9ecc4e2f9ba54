"""The on-disk format of qstream's outputs, and the rules for writing them.

A quantized array is a Zarr v3 group::

    dst/            attrs["qstream"] = {"version", "fingerprint", "ready", "complete", "spec",
      data                             "source", "calibration", "error", "report", ...}
      scale         float32, the parameter shape ([] per tensor, [C] per axis, blocked shape)
      zero_point    the type's integer container (float types: float32 zeros)
      _progress     the resume snapshot of the quantize pass (``qstream.io.progress``)

Sub-byte types (int4/uint4/int2/uint2/float4_e2m1fn) are packed, two or four per byte, in the
zarr-extensions data types and ``packbits`` codec (format 3; format 2 stored them one per
byte in int8/uint8, masked to their bits, and is still read); float8 as uint8 bit
patterns. Per-tensor integer arrays also carry CF ``scale_factor``/``add_offset`` on
``data``. Every array has dimension names.

Life of an output: the group's metadata is written first, in one write, with the job's
``fingerprint`` and ``ready: false``; then the member arrays and the parameters; then
``ready: true``; blocks land; ``complete: true`` is written last. A kill at any moment leaves a
state the same job resumes from (members not ready are made again; blocks past the progress
snapshot are written again).

Destination rules and the life of an output location: :mod:`qstream.io.destination`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import shutil
from collections.abc import Mapping

import numpy as np

from ..core.affine import affine_dequantize
from ..core.indexing import step1_slices
from ..core.layout import param_region, plan_layout
from ..errors import StoreError
from ..qtypes import qtype
from ..spec import QuantSpec
from . import compression, localmeta
from .destination import MEMBERS, TMP_PREFIX, inspect_destination, local_path
from .paths import check_tree, child
from .stores import open_group, open_store

FORMAT_VERSION = 3
# Every output chunk is written: skipping zarr's "is this chunk all fill value?" scan saves a
# full pass over the data, and quantized/dequantized chunks are almost never empty.
WRITE_ALL_CHUNKS = {"write_empty_chunks": True}
# Chunk files side by side ("c.0.0"), not one directory per chunk row ("c/0/0"): creating a
# directory costs as much as a file, and a block writes one chunk.
FLAT_KEYS = {"name": "default", "separator": "."}


# --------------------------------------------------------------------------- quantized groups


def create_group(dst, attrs: dict, storage_options: dict | None = None):
    """A new Zarr v3 group at ``dst`` whose metadata carries ``attrs`` from its first write."""
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


def create_arrays(group, arrays: dict[str, dict]) -> dict:
    """Create the member arrays ``{name: zarr.create_array keywords}`` of the new group
    ``group`` (none may exist yet) in one concurrent write of their metadata; returns
    ``{name: zarr.Array}``. A ``config`` keyword applies to the returned array objects.

    One ``create_array`` per member costs a round of existence checks and parent-group
    writes each (~3 ms on a local disk); a converted checkpoint makes four per tensor."""
    nodes, configs = {}, {}
    for name, kw in arrays.items():
        kw = dict(kw)
        configs[name] = kw.pop("config", None)
        nodes[name] = _array_metadata(kw)
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


_TEMPLATES: dict[str, object] = {}  # create_array keywords -> the metadata they make


def _array_metadata(kw: dict):
    """The Zarr metadata ``zarr.create_array(**kw)`` would write, made once per keywords in
    memory (the codecs' reprs name every setting)."""
    import zarr
    from zarr.storage import MemoryStore

    key = repr(sorted(kw.items()))
    meta = _TEMPLATES.get(key)
    if meta is None:
        from .zarr_ext import register_zarr_types

        register_zarr_types()  # sub-byte types: this may be the process's first Zarr write
        meta = zarr.create_array(store=MemoryStore(), **kw).metadata
        if len(_TEMPLATES) >= 256:
            _TEMPLATES.clear()
        _TEMPLATES[key] = meta
    # a copy with its own attributes: zarr updates an array's attributes in place
    return dataclasses.replace(meta, attributes=copy.deepcopy(meta.attributes))


_PREPARED: dict[str, tuple] = {}  # create_array keywords -> (metadata, document, chunk files)


def _prepared(kw: dict):
    """``(metadata, zarr.json bytes, ChunkFiles or None)`` of an array made with ``kw`` (no
    ``config``), made once per keywords: the many small tensors of a conversion share them.
    The chunk files' ``root`` is to be set (``dataclasses.replace``)."""
    import zarr
    from zarr.core.array import AsyncArray

    from .chunks import chunk_files
    from .localmeta import encode_doc

    key = repr(sorted(kw.items()))
    got = _PREPARED.get(key)
    if got is None:
        meta = _array_metadata(kw)
        store = zarr.storage.LocalStore(os.sep)  # (a location for chunk_files to accept)
        files = chunk_files(zarr.Array(AsyncArray(meta, zarr.storage.StorePath(store, "x"))))
        if len(_PREPARED) >= 256:
            _PREPARED.clear()
        got = _PREPARED[key] = (meta, encode_doc(meta), files)
    return got


def write_array(path: str, kw: dict, values, attrs: dict) -> None:
    """A new array at the local ``path`` (absent) holding ``values``, complete at once (built
    beside its place and renamed into it, as :func:`write_group` does)."""
    _publish(path, lambda tmp: _write_member(tmp, kw, values, attrs))


def _write_member(where: str, kw: dict, values, attrs) -> None:
    """The array made with ``kw`` and ``attrs``, holding ``values`` (or none), written into the
    new folder ``where``."""
    meta, doc, files = _prepared({k: v for k, v in kw.items() if k != "config"})
    if attrs:  # (the prepared document with these attributes, by the C encoder)
        parsed = json.loads(doc)
        parsed["attributes"] = attrs
        doc = json.dumps(parsed, allow_nan=True, separators=(",", ":")).encode()
    os.mkdir(where)
    with open(os.path.join(where, "zarr.json"), "wb") as f:
        f.write(doc)
    if values is None:
        return
    values = np.asarray(values)
    if files is None or not values.shape:
        _zarr_write(os.path.dirname(where), os.path.basename(where), meta, values)
    else:
        out = dataclasses.replace(files, root=where, atomic=False)
        out.write(tuple(slice(0, n) for n in values.shape), values, made={where})


def _publish(path: str, build) -> None:
    """``build(folder)`` a node in a hidden folder beside the local ``path``, then rename it
    into place (an existing node is never replaced); nothing is left if it fails."""
    import uuid

    local = local_path(path)
    tmp = os.path.join(os.path.dirname(local), f"{TMP_PREFIX}{uuid.uuid4().hex}")
    try:
        build(tmp)
        os.replace(tmp, local)  # published whole
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and not isinstance(e, StoreError):
            raise StoreError(f"cannot write {path}: {e}") from None
        raise


def write_group(path: str, attrs: dict, members: dict) -> None:
    """A new quantized group at the local ``path`` (absent), complete at once: ``members``
    maps a name to ``(create_array keywords, values or None, attributes or None)``. The group
    is built in a hidden folder beside ``path`` and renamed into place, so it is whole or
    absent (a killed writer's folder, ``.qstream-tmp-*``, is removed by
    :func:`~qstream.io.destination.clean_partials` of the root)."""
    from zarr.core.group import GroupMetadata

    from .localmeta import encode_doc

    def build(tmp: str) -> None:
        os.mkdir(tmp)
        for name, (kw, values, member_attrs) in members.items():
            _write_member(os.path.join(tmp, name), kw, values, member_attrs)
        with open(os.path.join(tmp, "zarr.json"), "wb") as f:
            f.write(encode_doc(GroupMetadata(attributes=attrs, zarr_format=3)))

    _publish(path, build)


def _zarr_write(root: str, name: str, meta, values) -> None:
    """Write ``values`` to the array ``name`` of the local folder ``root`` through zarr."""
    import zarr
    from zarr.core.array import AsyncArray

    store = zarr.storage.LocalStore(root)
    zarr.Array(AsyncArray(meta, zarr.storage.StorePath(store, name)))[...] = values


def data_encoding(qt) -> tuple[np.dtype, object]:
    """How ``data`` of type ``qt`` is stored: (Zarr dtype, serializer). Sub-byte types are
    packed with the ``packbits`` codec (zarr-extensions data types ``int4``, ``uint4``,
    ``int2``, ``uint2``, ``float4_e2m1fn``); float8 types as uint8 bit patterns; the rest
    natively."""
    if qt.bits < 8:  # (the types and codec are registered whenever a store is opened)
        from .zarr_ext import PackBits

        return qt.dtype, PackBits()
    return (np.dtype(np.uint8) if qt.is_float else qt.widened), "auto"


def storage_of(qt) -> str:
    """The ``storage`` entry of an output's metadata."""
    if qt.bits < 8:
        return f"packed, {8 // qt.bits} per byte (packbits)"
    return "uint8 bit patterns" if qt.is_float else "native"


def stored_nbytes(shape, qt) -> int:
    """Bytes of the values of an array of ``shape`` and type ``qt`` as stored (uncompressed)."""
    n = math.prod(shape)
    return -(-n * qt.bits // 8) if qt.bits < 8 else n * max(1, qt.dtype.itemsize)


def set_meta(group, meta: dict, key: str = "qstream") -> None:
    """Replace the group's ``key`` attributes (one atomic metadata write)."""
    try:
        if localmeta.local_root(group.store_path.store) is not None:
            localmeta.update_group(group, key, meta)
        else:
            group.attrs[key] = meta
    except OSError as e:
        raise StoreError(f"cannot write the metadata of {group.store_path}: {e}") from None


def check_writer(node, token: str, dst) -> None:
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


def missing_members(group) -> list[str]:
    """The member documents a quantized group lacks in its store (one listing)."""
    from .stores import stored_sizes

    sizes = stored_sizes(group.store_path.store, group.store_path.path)
    return [f"{m}/zarr.json" for m in MEMBERS if f"{m}/zarr.json" not in sizes]


def gaps(node) -> list[str]:
    """What the quantized group (or plain array) ``node`` lacks in its store, from one
    listing: member documents, and chunks of ``data`` and ``scale`` (of a plain array, its
    own) absent or of the wrong size (raw chunks must have their exact size, compressed ones
    must not be empty). ``zero_point`` chunks are not listed: zarr does not store all-zero
    ones."""
    import zarr

    from .stores import stored_sizes

    sizes = stored_sizes(node.store_path.store, node.store_path.path)
    if isinstance(node, zarr.Array):
        return ["zarr.json"] if "zarr.json" not in sizes else _chunk_gaps(node, "", sizes)
    members = ("data", "scale", "zero_point")
    missing = [f"{m}/zarr.json" for m in members if f"{m}/zarr.json" not in sizes]
    if "zarr.json" not in sizes:
        missing.insert(0, "zarr.json")
    for m in ("data", "scale"):
        if f"{m}/zarr.json" in sizes:
            missing += _chunk_gaps(node[m], f"{m}/", sizes)
    return missing


def _chunk_gaps(arr, prefix: str, sizes: dict[str, int]) -> list[str]:
    import itertools

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
    return out


def is_checkpoint(path, storage_options: dict | None = None) -> bool:
    """Whether ``path`` is the root of a converted checkpoint."""
    return inspect_destination(path, storage_options).kind == "checkpoint"


def read_all(arr) -> np.ndarray:
    """All of the Zarr array ``arr``: straight from its chunk files where it can (no event
    loop hop: a conversion's small parameter arrays are read by the thousand)."""
    from .chunks import chunk_files

    files = chunk_files(arr) if arr.shape else None
    if files is None:
        return np.asarray(arr[...])
    out = np.empty(arr.shape, files.dtype if not files.bits else arr.dtype)
    files.read(tuple(slice(0, n) for n in arr.shape), out)
    return out


_PARSED: dict[bytes, object] = {}  # array documents -> their parsed metadata
MAX_PARAMS = 1 << 27  # parameters of one output read at once (0.5 GiB of float32 scales)


class LocalGroup:
    """A Zarr v3 group on a local disk, opened from its documents without zarr's event loop
    (members are made from their own documents, whose parsed form is shared by identical
    documents): ``attrs``, ``store_path``, ``group[name]`` (an array, or a group)."""

    def __init__(self, path: str, doc: dict) -> None:
        import zarr

        self.path = path
        self.attrs = doc.get("attributes") or {}
        self.store_path = zarr.storage.StorePath(zarr.storage.LocalStore(path), "")

    def __getitem__(self, name: str):
        import zarr
        from zarr.core.array import AsyncArray
        from zarr.core.metadata.v3 import ArrayV3Metadata

        where = os.path.join(self.path, *name.split("/"))
        try:
            with open(os.path.join(where, "zarr.json"), "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise KeyError(name) from None
        meta = _PARSED.get(raw)
        if meta is None:
            doc = json.loads(raw)
            if doc.get("node_type") != "array" or doc.get("zarr_format") != 3:
                return zarr.open(self.store_path.store, mode="r", path=name)
            meta = ArrayV3Metadata.from_dict(doc)
            if len(_PARSED) >= 256:
                _PARSED.clear()
            _PARSED[raw] = meta
        return zarr.Array(AsyncArray(meta, zarr.storage.StorePath(self.store_path.store, name)))


def _open_local(path) -> LocalGroup | None:
    """``path`` opened as a :class:`LocalGroup` when it is a local Zarr v3 group."""
    from .destination import read_local_doc

    local = local_path(path)
    if local is None:
        return None
    from .stores import open_store

    open_store(path, mode="r", storage_options=None)  # (its checks, and the types registered)
    doc = read_local_doc(os.path.join(local, "zarr.json"))
    if doc is None or doc.get("node_type") != "group" or doc.get("zarr_format") != 3:
        return None
    return LocalGroup(local, doc)


def open_quantized(
    path, *, allow_incomplete: bool = False, storage_options: dict | None = None
) -> QuantizedArray | QuantizedCheckpoint:
    """Open a quantized group lazily; ``arr[0:128]`` reads and dequantizes only that slab.
    The root of a converted checkpoint opens as a :class:`QuantizedCheckpoint`, a mapping of
    tensor names to lazy arrays. A ``.safetensors`` file (or index) that qstream exported
    opens as a dict of name -> lazy array of its values (see :mod:`qstream.io.exported`)."""
    if isinstance(path, str | os.PathLike) and os.fspath(path).endswith(
        (".safetensors", ".safetensors.index.json")
    ):
        return _open_export(os.fspath(path))
    group = _open_local(path) or open_group(path, mode="r", storage_options=storage_options)
    if "qstream_checkpoint" in group.attrs:
        return QuantizedCheckpoint(path, group, allow_incomplete, storage_options)
    if isinstance(group, LocalGroup):  # read through nothing that leads elsewhere
        check_tree(group.path, "the quantized output")
    meta = group.attrs.get("qstream")
    if not isinstance(meta, dict) or not meta or "dequantized_from" in meta:
        raise StoreError(f"{path} is not a qstream quantized array (no 'qstream' attributes)")
    if not meta.get("complete") and not allow_incomplete:
        raise StoreError(
            f"{path} is incomplete (an interrupted or failed job); re-run the job to resume it,"
            " or pass allow_incomplete=True to read it anyway"
        )
    if not meta.get("ready", True):
        raise StoreError(f"{path} was interrupted while it was being created; re-run the job")
    return QuantizedArray(group, meta)


def _open_export(path: str) -> dict:
    from .checkpoints import open_checkpoint
    from .exported import DequantizedTensor

    tensors = open_checkpoint(path)
    if not any(isinstance(t, DequantizedTensor) for t in tensors.values()):
        raise StoreError(f"{path} is not a qstream export (no quantized tensors described)")
    return tensors


class QuantizedCheckpoint(Mapping):
    """A converted checkpoint on disk: tensor name -> :class:`QuantizedArray` (quantized
    tensors) or ``zarr.Array`` (kept tensors, their original values; bfloat16 widened to
    float32, the original dtype in ``attrs["qstream"]["dtype"]``), in conversion order."""

    def __init__(self, path, group, allow_incomplete: bool, storage_options: dict | None):
        self.path = path
        self.group = group
        meta = group.attrs["qstream_checkpoint"]
        if not isinstance(meta, dict):
            raise StoreError(f"{path}: its metadata is damaged or crafted (not an object)")
        self.meta = dict(meta)
        if not self.meta.get("complete") and not allow_incomplete:
            raise StoreError(
                f"{path} is an incomplete checkpoint conversion; re-run the conversion to"
                " resume it, or pass allow_incomplete=True to read the finished tensors"
            )
        from .rootindex import RootIndex

        store = group.store_path.store if local_path(path) is None else None
        #: each tensor's row (see :mod:`qstream.io.rootindex`), keys checked, in order
        self.tensors: dict = RootIndex.open(path, self.meta, store).rows()
        self._keys = {n: t.get("key", n) for n, t in self.tensors.items()}
        self._storage_options = storage_options
        self._packs: dict = {}

    def key_of(self, name: str) -> str:
        """The key (path component below the root) the tensor ``name`` is stored under."""
        return self._keys[name]

    def __getitem__(self, name: str):
        if name not in self.tensors:
            raise KeyError(name)
        key = self._keys[name]
        local = local_path(self.path)
        row = self.tensors[name]
        if row.get("pack") is not None:
            return self._pack(row["pack"]).tensor(row.get("slot"), name)
        if local is not None:  # never a link out of the checkpoint, nor a link or FIFO in it
            check_tree(child(local, key, self.path), "the converted tensor")
        if self.tensors[name].get("kept"):
            return self.group[key]
        return open_quantized(
            f"{os.fspath(self.path).rstrip('/')}/{key}", storage_options=self._storage_options
        )

    def _pack(self, name):
        """The pack ``name`` (see :mod:`qstream.io.packs`), the last few kept open (tensors
        are mostly read in order, a pack's one after another)."""
        from .packs import PACKS, PackReader, check_pack_name

        check_pack_name(name, self.path)
        reader = self._packs.pop(name, None)
        if reader is None:
            local = local_path(self.path)
            if local is None:
                raise StoreError(f"{self.path}: packed tensors are read from a local directory")
            folder = child(child(local, PACKS, self.path), name, self.path)
            check_tree(folder, "the pack")
            reader = PackReader(folder)
        self._packs[name] = reader
        while len(self._packs) > 2:
            self._packs.pop(next(iter(self._packs)))
        return reader

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def __repr__(self) -> str:
        return f"QuantizedCheckpoint({self.path!r}, {len(self)} tensors)"

    def summary(self) -> dict:
        """Per tensor: shape, dtype, target, bytes and error summary (JSON-ready)."""
        return {
            "checkpoint": self.meta.get("source"),
            "complete": bool(self.meta.get("complete")),
            "tensors": self.tensors,
        }

    # ---- views (qstream.viz): from the root's index rows, no tensor opened; bounded

    @property
    def view(self):
        """The :class:`~qstream.calibration.views.CheckpointView` of this checkpoint: the
        SQNR over its quantized tensors (a histogram, the worst ones), its bytes before and
        after (totals, per target, the largest tensors, a histogram of sizes); bounded
        whatever the number of tensors."""
        from ..calibration.views import CheckpointView

        return CheckpointView.from_rows(self.tensors.values(), title=str(self.path))

    def _repr_html_(self) -> str:
        from ..viz.html import checkpoint_html

        return checkpoint_html(self.view)

    def plot(self, ax=None):
        """Draw the SQNR over the quantized tensors (one count per tensor, the median and the
        worst marked) on ``ax`` (a new figure when None) with matplotlib (``pip install
        'qstream-zarr[plot]'``); returns the axes. The whole page (the worst tensors and
        the sizes too): ``qstream.viz.mpl.checkpoint_figure(ck.view)``."""
        from ..viz.mpl import plot_checkpoint

        return plot_checkpoint(self.view, ax=ax)


class QuantizedArray:
    """A quantized array on disk, dequantized on indexing (float32)."""

    def __init__(self, group, meta: dict):
        self.group = group
        self.meta = meta
        where = str(group.store_path).removeprefix("file://")
        try:
            if meta.get("layout") == "codec":  # its codes, through data's plain form
                from .codec import open_plain

                self.data = open_plain(group)
            else:
                self.data = group["data"]
            self.spec = QuantSpec.from_dict(meta["spec"])
            self.qtype = qtype(self.spec.dtype)
            scale, zero_point = group["scale"], group["zero_point"]
            self.scale_dtype = np.dtype(scale.dtype)
            self.axis = meta.get("axis")
            # (the declared shapes first: a crafted output could declare billions)
            self._check(where, tuple(scale.shape), tuple(zero_point.shape))
            self.scale = np.asarray(read_all(scale), np.float32)
            self.zero_point = np.asarray(read_all(zero_point))
            self.offset = None  # float offsets (spec.offset), float64
            if self.spec.float_offset:
                offset = group["offset"]
                self._check(where, tuple(scale.shape), tuple(offset.shape))
                self.offset = np.asarray(read_all(offset), np.float64)
            self.codec = None  # the codec layout's decode constants (qstream.io.codec)
            if meta.get("layout") == "codec":
                from .codec import constants

                self.codec = constants(meta["codec"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            if isinstance(e, StoreError):
                raise
            raise StoreError(
                f"{where}: its metadata is damaged or crafted ({type(e).__name__}: {e})"
            ) from None

    def _check(self, where: str, scale_shape, zero_point_shape) -> None:
        """Refuse metadata that does not describe the stored arrays (the kernels index the
        parameters by the data's shape)."""
        from ..core.layout import blocked_param_shape

        shape, axis, bs = self.shape, self.axis, self.spec.block_size
        if axis is None:
            want: tuple[int, ...] | None = ()
        elif isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis < len(shape):
            want = None
        elif bs:
            want = tuple(blocked_param_shape(shape, axis, bs))
        else:
            want = (shape[axis],)
        if want is not None and math.prod(want) > MAX_PARAMS:
            raise StoreError(
                f"{where}: declares {math.prod(want):,} parameters, more than qstream reads at"
                f" once ({MAX_PARAMS:,}); the output is damaged or crafted"
            )
        # (format 2 stored sub-byte types one per byte, in their widened container)
        stored = {np.dtype(data_encoding(self.qtype)[0]), np.dtype(self.qtype.widened)}
        if (
            want is None
            or scale_shape != want
            or zero_point_shape != want
            or np.dtype(self.data.dtype) not in stored
        ):
            raise StoreError(
                f"{where}: its metadata ({self.spec.dtype}, axis {axis!r}, block size {bs}) does"
                f" not describe its arrays (data {list(shape)} {self.data.dtype}, scale"
                f" {list(scale_shape)}, zero_point {list(zero_point_shape)}); the output is"
                " damaged or crafted"
            )

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def report(self) -> dict:
        return {k: self.meta.get(k) for k in ("source", "calibration", "error", "report")}

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return (
            f"QuantizedArray(shape={self.shape}, dtype={self.spec.dtype},"
            f" granularity={self.spec.granularity})"
        )

    def summary(self) -> dict:
        """Spec, parameter summary, calibration and error report (JSON-ready)."""

        def stats(a):
            a = np.asarray(a, np.float64).reshape(-1)
            return {
                "shape": list(np.shape(a)),
                "min": float(a.min()) if a.size else 0.0,
                "max": float(a.max()) if a.size else 0.0,
            }

        return {
            "shape": list(self.shape),
            "dtype": self.spec.dtype,
            "granularity": self.spec.granularity,
            "axis": self.axis,
            "block_size": self.spec.block_size,
            "method": self.spec.method if self.spec.scale is None else "explicit",
            "symmetric": self.spec.symmetric,
            "round_mode": self.spec.round_mode,
            "complete": bool(self.meta.get("complete")),
            "compression": compression.describe(self.data.compressors),
            "scale": {**stats(self.scale), "shape": list(self.scale.shape)},
            "zero_point": {**stats(self.zero_point), "shape": list(self.zero_point.shape)},
            "calibration": self.meta.get("calibration"),
            "error": self.meta.get("error"),
            "source": self.meta.get("source"),
        }

    # ---- views (qstream.viz): what was kept in the metadata, drawn without the source

    @property
    def view(self):
        """The :class:`~qstream.calibration.views.ReportView` of this output's metadata: the
        calibration histogram and thresholds (per tensor), the per-channel SQNR summary, for
        group-wise outputs the per-group SQNR distribution and worst groups, the error
        report."""
        from ..calibration.views import ReportView

        where = str(self.group.store_path).removeprefix("file://")
        title = f"{self.spec.dtype} {list(self.shape)} ({where})"
        return ReportView.from_meta(self.meta, title=title)

    def _repr_html_(self) -> str:
        from ..viz.html import view_html

        return view_html(self.view)

    def plot(self, ax=None):
        """Draw the stored calibration histogram with its thresholds (per tensor), the
        per-channel SQNR (per channel) or the per-group SQNR (group-wise) on ``ax`` with
        matplotlib (``pip install 'qstream-zarr[plot]'``); returns the axes."""
        from ..viz.mpl import plot_view

        return plot_view(self.view, ax=ax)

    def quantized(self, key=...) -> np.ndarray:
        """The stored values of ``key`` as the quantized dtype (ml_dtypes for sub-byte/float)."""
        from .chunks import chunk_files

        region, squeeze = step1_slices(key, self.shape) if self.shape else (None, ())
        files = chunk_files(self.data) if region else None
        if files is not None:  # straight from the chunk files (no event loop hop)
            raw = np.empty(tuple(k.stop - k.start for k in region), files.dtype)
            if files.bits:
                raw = raw.view(self.qtype.dtype)
            files.read(region, raw)
            raw = raw.reshape([d for d, sq in zip(raw.shape, squeeze, strict=True) if not sq])
        else:
            raw = np.asarray(self.data[key])
        return raw.view(self.qtype.dtype) if raw.dtype != self.qtype.dtype else raw

    def __array__(self, dtype=None, copy=None):
        y = self[...]
        return y if dtype is None else y.astype(dtype)

    def __getitem__(self, key) -> np.ndarray:
        key, squeeze = step1_slices(key, self.shape)
        y = self.dequantize_region(key, self.quantized(key))
        return y.reshape([d for d, sq in zip(y.shape, squeeze, strict=True) if not sq])

    def dequantize_region(self, key, q, dtype=np.float32, out=None) -> np.ndarray:
        """Dequantize ``q``, the stored values of the region ``key`` (a tuple of step-1
        slices), with the parameters that region uses; ``out`` optionally receives it."""
        q = q.view(self.qtype.dtype) if q.dtype != self.qtype.dtype else q
        if self.codec is not None or self.offset is not None:
            from .scientific_read import dequantize_scientific

            return self._missing(q, dequantize_scientific(self, key, q, dtype, out))
        if self.axis is None:
            s, z = self.scale.reshape(()), self.zero_point.reshape(()).astype(np.float64)
            layout = plan_layout(q.shape, (), None, None)
        else:
            bs = self.spec.block_size
            k = self.axis
            if bs and key[k].start % bs == 0:  # the region starts on a parameter block
                pk = param_region(key, k, bs)
                s, z = self.scale[pk], self.zero_point[pk].astype(np.float64)
                layout = plan_layout(q.shape, s.shape, k, bs)
            elif bs:  # an arbitrary slice: the parameters element by element (slow path)
                idx = np.arange(key[k].start, key[k].stop)
                pk = tuple(slice(None) if d == k else key[d] for d in range(self.ndim))
                s = np.take(self.scale[pk], idx // bs, axis=k)
                z = np.take(self.zero_point[pk], idx // bs, axis=k)
                y = (q.astype(np.float32) - z.astype(np.float32)) * s
                if out is None:
                    return self._missing(q, y.astype(dtype, copy=False))
                out[...] = y
                return self._missing(q, out)
            else:
                idx = slice(key[k].start, key[k].stop)
                s, z = self.scale[idx], self.zero_point[idx].astype(np.float64)
                layout = plan_layout(q.shape, s.shape, k, None)
        y = affine_dequantize(q, s, z, layout, self.qtype, np.dtype(dtype), out=out)
        return self._missing(q, y)

    def _missing(self, q, y):
        """``y`` with NaN where ``q`` holds the code the ``fill`` NaN policy reserves."""
        if self.spec.nan_policy == "fill":
            y[q == self.qtype.dtype.type(self.qtype.qmin)] = np.nan
        return y
