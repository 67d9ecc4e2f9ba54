"""Export quantized outputs as safetensors, streaming, for loaders outside qstream.

Two layouts (``format``):

- ``compressed-tensors`` (the default): what transformers (through ``compressed-tensors``) and
  vLLM load, with a ``config.json`` beside the files that carries the ``quantization_config``
  they need (merged into the source checkpoint's own ``config.json`` when there is one); see
  :mod:`qstream.io.compressed_tensors`. A tensor that layout cannot express is refused,
  naming it, before anything is written: an export never loads silently wrong.
- ``qstream``: every quantized type qstream has, read by qstream (and by hand): a quantized
  tensor ``N`` is written as

  - ``N``: the stored values (``I8``/``U8``/``I16``/``U16``/``I32``; int4/uint4/int2/uint2 one
    value per byte in ``I8``/``U8``; float8_e4m3fn/e5m2 as ``F8_E4M3``/``F8_E5M2``; the other
    float types as ``U8`` bit patterns),
  - ``N_scale``: float32 (float16 when stored so, ``scale_dtype="float16"``), shaped to
    broadcast against ``N``: ``[1]`` per tensor, the channel axis kept and every other axis 1
    per axis (``[out, 1]`` for axis 0 of a matrix), the group layout ``[out, in / group]``
    blocked,
  - ``N_zero_point``: the zero point in the values' integer type, same shape as ``N_scale``
    (omitted when every zero point is 0, i.e. symmetric),

  so ``(N - N_zero_point) * N_scale`` in float32 is ``qstream.dequantize`` bit for bit. No
  ``config.json`` is written: transformers would read the codes as weights.

Kept tensors are written in their original dtype (bfloat16 included). ``__metadata__``
records the layout (``qstream_format``) and each quantized tensor's type, axis and block size
(``qstream``, JSON). Above ``max_shard_size`` the tensors are split over
``stem-0000K-of-0000N.safetensors`` with a ``stem.safetensors.index.json`` (``weight_map``),
as Hugging Face sharded checkpoints are. Memory stays bounded: tensors are read and written in
slabs of ~16 MiB.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct

import numpy as np

from ..errors import InvalidParameterError, StoreError
from . import compressed_tensors as ct
from .qarray import QuantizedArray, QuantizedCheckpoint, open_quantized

SLAB = 16 << 20
FORMATS = ("compressed-tensors", "qstream", "dequantized")
CONFIG = "config.json"
LOADERS = {
    "compressed-tensors": "transformers / vLLM (compressed-tensors)",
    "qstream": "qstream (open_quantized-style layout; not for transformers)",
    "dequantized": "any safetensors reader (float values)",
}
FLOAT_TYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_INT_TAGS = {
    "int8": "I8",
    "uint8": "U8",
    "int16": "I16",
    "uint16": "U16",
    "int32": "I32",
    "int4": "I8",
    "int2": "I8",
    "uint4": "U8",
    "uint2": "U8",
}
_FLOAT_TAGS = {"float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}
_PLAIN_TAGS = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}


class _Entry:
    """One tensor of the export: its safetensors dtype tag, shape and a slab reader."""

    def __init__(self, name: str, tag: str, shape, itemsize: int, read):
        self.name, self.tag, self.shape = name, tag, tuple(int(d) for d in shape)
        self.nbytes = math.prod(self.shape) * itemsize
        self.read = read  # read(row0, row1) -> C-contiguous array of the rows (or all for 0-d)


class _Tensors:
    """The tensors of an export, opened when their entries are read and one at a time (the
    last one is kept: its entries are written one after another), so that an export of many
    tensors holds one tensor's parameters, not all of them."""

    def __init__(self, opened, name: str) -> None:
        self.opened, self.single = opened, name
        self.last: tuple[str, object] | None = None

    def names(self) -> list[str]:
        if isinstance(self.opened, QuantizedCheckpoint):
            return list(self.opened)
        return [self.single]

    def __call__(self, name: str):
        if self.last is None or self.last[0] != name:
            t = self.opened[name] if isinstance(self.opened, QuantizedCheckpoint) else self.opened
            self.last = (name, t)
        return self.last[1]


def _entries(name: str, t, get) -> list[_Entry]:
    """The entries of the tensor ``name`` (``t``, open now); their readers open it again
    through ``get``."""
    if isinstance(t, QuantizedArray):
        return _quantized_entries(name, t, get)
    import ml_dtypes

    dtype = dict(t.attrs.get("qstream", {})).get("dtype", np.dtype(t.dtype).name)
    if dtype not in _PLAIN_TAGS:
        raise InvalidParameterError(f"{name}: no safetensors type for {dtype}")
    out = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)

    def read(r0, r1):
        t = get(name)
        v = np.asarray(t[r0:r1] if t.ndim else t[...])
        return np.ascontiguousarray(v.astype(out, copy=False))

    return [_Entry(name, _PLAIN_TAGS[dtype], t.shape, out.itemsize, read)]


def _quantized_entries(name: str, arr: QuantizedArray, get) -> list[_Entry]:
    qt = arr.qtype
    if qt.name in _INT_TAGS:
        tag = _INT_TAGS[qt.name]
        values = np.dtype(qt.widened)
    else:
        tag = _FLOAT_TAGS.get(qt.name, "U8")
        values = np.dtype(np.uint8)

    def read(r0, r1):
        a = get(name)
        q = a.quantized((slice(r0, r1),) if a.ndim else ...)
        v = q.astype(values, copy=False) if qt.name in _INT_TAGS else q.view(np.uint8)
        return np.ascontiguousarray(v)

    entries = [_Entry(name, tag, arr.shape, values.itemsize, read)]
    s, z = _param_shape(arr)
    half = arr.scale_dtype == np.float16  # stored as float16: exported as such
    scale_dtype = np.dtype(np.float16 if half else np.float32)

    def read_scale(r0, r1):
        return get(name).scale.reshape(s).astype(scale_dtype)[r0:r1]

    def read_zero_point(r0, r1):
        return get(name).zero_point.reshape(z).astype(values)[r0:r1]

    entries.append(
        _Entry(f"{name}_scale", "F16" if half else "F32", s, scale_dtype.itemsize, read_scale)
    )
    if not qt.is_float and np.any(arr.zero_point != 0):
        entries.append(_Entry(f"{name}_zero_point", tag, z, values.itemsize, read_zero_point))
    return entries


def _float_entry(name: str, arr: QuantizedArray, get, dtype: str) -> _Entry:
    """The dequantized values of ``name`` in ``dtype``, read in slabs."""
    import ml_dtypes

    out = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)

    def read(r0, r1):
        a = get(name)
        v = a[r0:r1] if a.ndim else a[...]
        return np.ascontiguousarray(np.asarray(v).astype(out, copy=False))

    return _Entry(name, FLOAT_TYPES[dtype], arr.shape, out.itemsize, read)


def _ct_entries(name: str, arr: QuantizedArray, lay: ct.Layout, get) -> list[_Entry]:
    """The compressed-tensors entries of the quantized weight ``name`` (see
    :mod:`qstream.io.compressed_tensors`)."""
    out, cols = arr.shape
    m = lay.module

    def codes(r0, r1):
        return ct.signed_codes(get(name).quantized((slice(r0, r1),)), lay)

    if lay.bits == 8:
        entries = [_Entry(f"{m}weight", "I8", arr.shape, 1, codes)]
    else:
        words = -(-cols * lay.bits // 32)
        entries = [
            _Entry(
                f"{m}weight_packed",
                "I32",
                (out, words),
                4,
                lambda r0, r1: ct.pack_rows(codes(r0, r1)),
            ),
            _Entry(
                f"{m}weight_shape", "I64", (2,), 8, lambda r0, r1: np.array([out, cols], np.int64)
            ),
        ]
    pshape = {"tensor": (1,), "channel": (out, 1)}.get(lay.strategy, arr.scale.shape)
    half = arr.scale_dtype == np.float16
    sdtype = np.dtype(np.float16 if half else np.float32)
    entries.append(
        _Entry(
            f"{m}weight_scale",
            "F16" if half else "F32",
            pshape,
            sdtype.itemsize,
            lambda r0, r1: get(name).scale.reshape(pshape).astype(sdtype)[r0:r1],
        )
    )
    if not lay.symmetric:

        def zero_points():
            zp = np.rint(get(name).zero_point.reshape(pshape)).astype(np.int16)
            return (zp - lay.offset).astype(np.int8)

        if lay.bits == 8:
            zshape, read_zp = pshape, lambda r0, r1: zero_points()[r0:r1]
        else:
            zshape = (-(-pshape[0] * lay.bits // 32), pshape[1])
            read_zp = lambda r0, r1: ct.pack_columns(zero_points(), lay.bits)[r0:r1]  # noqa: E731
        tag, size = ("I8", 1) if lay.bits == 8 else ("I32", 4)
        entries.append(_Entry(f"{m}weight_zero_point", tag, zshape, size, read_zp))
    return entries


def _param_shape(arr: QuantizedArray) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shape of the exported scale / zero point (see the module docstring)."""
    if arr.axis is None:
        return (1,), (1,)
    if arr.spec.block_size:
        return arr.scale.shape, arr.scale.shape
    shape = [1] * arr.ndim
    shape[arr.axis] = arr.shape[arr.axis]
    return tuple(shape), tuple(shape)


def _shards(entries: list[_Entry], limit: int) -> list[list[_Entry]]:
    shards: list[list[_Entry]] = [[]]
    size = 0
    for e in entries:
        if shards[-1] and size + e.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    return shards


def _write_file(path: str, entries: list[_Entry], metadata: dict[str, str]) -> None:
    header: dict = {"__metadata__": metadata}
    offset = 0
    for e in entries:
        header[e.name] = {"dtype": e.tag, "shape": list(e.shape), "data_offsets": [offset, 0]}
        offset += e.nbytes
        header[e.name]["data_offsets"][1] = offset
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = f"{path}.{os.getpid()}.partial"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            for e in entries:
                rows = e.shape[0] if e.shape else 1
                per_row = max(1, e.nbytes // max(1, rows))
                step = max(1, SLAB // per_row)
                written = 0
                for r0 in range(0, rows, step):
                    chunk = e.read(r0, min(rows, r0 + step))
                    f.write(np.ascontiguousarray(chunk).reshape(-1).view(np.uint8))
                    written += chunk.nbytes
                if written != e.nbytes:
                    raise StoreError(f"{e.name}: wrote {written} bytes, expected {e.nbytes}")
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise StoreError(f"cannot write {path}: {e}") from None
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def shard_pattern(out: str):
    """The names of the shard files an export to ``out`` may write (a compiled regex)."""
    import re

    stem = os.path.basename(out)[: -len(".safetensors")]
    return re.compile(re.escape(stem) + r"-\d{5}-of-\d{5}\.safetensors")


def _written_by_qstream(path: str) -> bool:
    """Whether ``path`` (a safetensors file or an index) carries qstream's export metadata."""
    return export_metadata(path) is not None


def finished_export(out, job: str) -> list[str] | None:
    """The files of a finished export to ``out`` that recorded the identity ``job`` (its
    last file, the index or the only file, exists and says so), else None."""
    out = os.fspath(out)
    index = out[: -len(".safetensors")] + ".safetensors.index.json"
    if os.path.lexists(index):
        doc = read_json(index)
        meta = _qstream_meta(doc.get("metadata") if doc else None)
        if meta is None or meta.get("qstream_job") != job:
            return None
        wmap = doc.get("weight_map")
        names = sorted(set(wmap.values())) if isinstance(wmap, dict) else []
        if not all(isinstance(n, str) and shard_pattern(out).fullmatch(n) for n in names):
            return None  # not an index this export writes
        if meta.get("qstream_format") == "compressed-tensors":
            names.append(CONFIG)
        return [os.path.join(os.path.dirname(out), n) for n in names] + [index]
    meta = export_metadata(out) if os.path.lexists(out) else None
    if meta is None or meta.get("qstream_job") != job:
        return None
    config = os.path.join(os.path.dirname(out), CONFIG)
    return [out, config] if meta.get("qstream_format") == "compressed-tensors" else [out]


def export_metadata(path: str) -> dict | None:
    """qstream's metadata in a safetensors file or index, or None."""
    if path.endswith(".json"):
        doc = read_json(path)
        if doc is not None and os.path.basename(path) == CONFIG:
            return _qstream_meta(doc)
        return _qstream_meta(doc.get("metadata") if doc else None)
    from .paths import open_regular

    try:
        with open_regular(path) as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(min(n, 100 << 20)))
    except (OSError, ValueError, RecursionError, struct.error):
        return None
    return _qstream_meta(header.get("__metadata__") if isinstance(header, dict) else None)


def _qstream_meta(meta) -> dict | None:
    if isinstance(meta, dict) and "qstream_export" in meta:  # a config.json qstream wrote
        return {"qstream": "config", **meta["qstream_export"]}
    return meta if isinstance(meta, dict) and "qstream" in meta else None


def read_json(path: str) -> dict | None:
    """The JSON object in the file ``path`` (at most 100 MB), or None."""
    from .paths import open_regular

    try:
        with open_regular(path) as f:
            doc = json.loads(f.read(100 << 20))
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def remove_stale_partials(target: str) -> None:
    """Remove ``target.<pid>.partial`` files that a killed export (a dead process) left."""
    import glob
    import re

    for tmp in glob.glob(glob.escape(target) + ".*.partial"):
        m = re.fullmatch(re.escape(target) + r"\.(\d+)\.partial", tmp)
        if m is None or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        except OSError:  # alive (another user's process): not ours to touch
            continue


def export_safetensors(
    src,
    out,
    *,
    format: str = "compressed-tensors",
    config=None,
    max_shard_size: int = 5 * 10**9,
    overwrite: bool = False,
    name: str = "weight",
    storage_options: dict | None = None,
    replace_own: bool = False,
    job: str | None = None,
    dtype: str = "float32",
) -> dict:
    """Write the quantized output ``src`` (a converted checkpoint's root, or one quantized
    group, exported as the tensor ``name``) to the safetensors file ``out`` (or shards beside
    it, with an index, above ``max_shard_size`` bytes); see the module docstring for the two
    layouts (``format``). Returns the files written, the tensors' names, the format and the
    loader it targets.

    ``config`` (compressed-tensors only): the model's ``config.json`` (a path or a dict) into
    which the ``quantization_config`` is merged; None: the one beside the converted
    checkpoint's source, if there is one. The result is written as ``config.json`` beside
    ``out`` (a ``config.json`` qstream did not write is never replaced); without a source
    config it holds the ``quantization_config`` alone, to merge into the model's.

    Existing files are refused unless ``overwrite``, except shards of an interrupted export
    (they carry qstream's metadata and no index was written); ``replace_own`` also replaces a
    finished export's files qstream wrote (a resumed ``convert ... out.safetensors``).
    ``job``: an identity recorded in the files (see :func:`finished_export`).

    ``format="dequantized"``: every quantized tensor written as its dequantized values in
    ``dtype`` (float32, float16 or bfloat16; what ``qstream dequantize ... OUT.safetensors``
    writes), kept tensors as stored."""
    if dtype not in FLOAT_TYPES:
        raise InvalidParameterError(f"dtype must be one of {', '.join(FLOAT_TYPES)}, got {dtype!r}")
    if format not in FORMATS:
        raise InvalidParameterError(
            f"unknown export format {format!r}; expected one of: {', '.join(FORMATS)} (GGUF:"
            " an output path ending in .gguf, see qstream.export_gguf)"
        )
    out = os.fspath(out)
    if not out.endswith(".safetensors"):
        raise InvalidParameterError(f"{out}: the export target must end in .safetensors")
    if job is None:  # a plain export: the same call on the same output is the same job
        job = _export_job(src, format, name, dtype, config, max_shard_size)
        done = None if overwrite or replace_own else finished_export(out, job)
        if done is not None:
            return {"files": done, "already_complete": True, "format": format,
                    "loader": LOADERS[format], "tensors": [], "bytes": 0}  # fmt: skip
    opened = open_quantized(src, storage_options=storage_options)
    folder = os.path.dirname(out) or "."
    if not os.path.isdir(folder):  # (after the source: its faults are named first)
        raise StoreError(f"cannot export to {out}: the folder {folder} does not exist")
    tensors = _Tensors(opened, name)
    entries, described, layouts, kept = [], {}, [], []
    for n in tensors.names():
        t = tensors(n)
        if isinstance(t, QuantizedArray) and t.spec.float_offset and format != "dequantized":
            raise InvalidParameterError(
                f"{n}: a float offset (x = q * scale + offset) has no place in the {format}"
                " layout, whose loaders compute (q - zero_point) * scale; export it with"
                " format='dequantized' or keep its integer zero point"
            )
        if isinstance(t, QuantizedArray):
            if format == "compressed-tensors":
                lay = ct.layout(n, t.shape, t.spec)
                layouts.append(lay)
                entries += _ct_entries(n, t, lay, tensors)
            elif format == "dequantized":
                entries.append(_float_entry(n, t, tensors, dtype))
                continue
            else:
                entries += _quantized_entries(n, t, tensors)
            described[n] = {"dtype": t.spec.dtype, "axis": t.axis, "block_size": t.spec.block_size}
        else:
            entries += _entries(n, t, tensors)
            if len(t.shape) == 2 and n.endswith("weight"):
                kept.append(n[: -len("weight")])
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})[:3]
        raise InvalidParameterError(
            f"tensor names collide with the export's parameter names: {', '.join(dup)}"
        )
    shards = _shards(entries, int(max_shard_size))
    stem = out[: -len(".safetensors")]
    files = (
        [out]
        if len(shards) == 1
        else [f"{stem}-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    index = f"{stem}.safetensors.index.json"
    config_path = os.path.join(os.path.dirname(out), CONFIG)
    model_config = None
    if format == "compressed-tensors":
        model_config = _model_config(config, opened)
        model_config["quantization_config"] = ct.quantization_config(layouts, kept)
    write_config = model_config is not None and not _same_config(config_path, model_config)
    targets = files + ([config_path] if write_config else [])
    targets += [index] if len(shards) > 1 else []
    check_targets(targets, overwrite or replace_own)
    stale = _other_forms(out, index, targets, overwrite or replace_own)
    for f in targets:
        remove_stale_partials(f)
    for f in stale:  # an earlier export's other form (one file vs shards): never left beside
        os.unlink(f)
    meta = {
        "format": "pt",
        "qstream": json.dumps(described, sort_keys=True),
        "qstream_format": format,
    }
    if job is not None:
        meta["qstream_job"] = job
    last = None if len(shards) > 1 else files[0]  # the file that marks a finished export
    for path, shard in zip(files, shards, strict=True):
        if path != last:
            _write_file(path, shard, meta)
    if write_config:
        model_config["qstream_export"] = {"format": format, **({"job": job} if job else {})}
        _write_json(config_path, model_config)
    if last is not None:
        _write_file(last, shards[0], meta)
    else:
        weight_map = {
            e.name: os.path.basename(f) for f, s in zip(files, shards, strict=True) for e in s
        }
        total = sum(e.nbytes for e in entries)
        doc = {
            "metadata": {"total_size": total, "qstream": "export", "qstream_format": format},
            "weight_map": weight_map,
        }
        if job is not None:
            doc["metadata"]["qstream_job"] = job
        _write_json(index, doc)
    return {
        "already_complete": False,
        "files": targets,
        "tensors": names,
        "bytes": sum(e.nbytes for e in entries),
        "format": format,
        "loader": LOADERS[format],
        "config": config_path if model_config is not None else None,
    }


def _other_forms(out: str, index: str, targets: list[str], replace: bool) -> list[str]:
    """Files of an earlier export to ``out`` in the form this one does not write (its single
    file, its index, its shards): they must go, or a loader would read them (transformers
    prefers ``model.safetensors`` to an index). Only qstream's, only with ``replace`` (or
    shards no finished export lists); anything else is refused."""
    import re

    from .paths import kind_of

    folder = os.path.dirname(out) or "."
    found = [f for f in (out, index) if f not in targets and kind_of(f) is not None]
    pattern = shard_pattern(out)
    try:
        names = [n for n in os.listdir(folder) if pattern.fullmatch(n)]
    except OSError:
        names = []
    found += [os.path.join(folder, n) for n in names if os.path.join(folder, n) not in targets]
    for f in found:
        if kind_of(f) != "file" or not _written_by_qstream(f):
            raise StoreError(
                f"{f} exists and is not a qstream export; qstream never replaces what it did"
                " not write (even with overwrite=True): remove it yourself or export elsewhere"
            )
        finished = not re.search(r"-\d{5}-of-\d{5}\.safetensors$", f)  # a file or an index
        if finished and not replace:
            raise StoreError(f"{f} exists; pass overwrite=True to replace it")
    return found


def _export_job(src, format: str, name: str, dtype: str, config, shard: int) -> str:
    """The identity of a plain export: what it reads (the output's root document, whose
    time changes when the output is written again), how and into what layout."""
    from .stores import location

    where = location(src) or str(src)
    try:
        stamp = os.stat(os.path.join(os.fspath(src), "zarr.json")).st_mtime_ns
    except (OSError, TypeError):
        stamp = None
    conf = config if isinstance(config, dict | None) else os.path.abspath(os.fspath(config))
    ident = {"export": where, "stamp": stamp, "format": format, "name": name, "dtype": dtype}
    ident["max_shard_size"] = int(shard)
    return json.dumps({**ident, "config": conf}, sort_keys=True, default=str)


def check_targets(targets: list[str], replace: bool) -> None:
    """Refuse an export over files qstream did not write (whatever ``overwrite`` says) and,
    unless ``replace``, over a finished export (its last file, the marker, exists)."""
    from .paths import kind_of

    for f in targets:
        kind = kind_of(f)
        if kind is None:
            continue
        ours = kind == "file" and _written_by_qstream(f)
        if not ours:  # never replaced, whatever ``overwrite`` says
            raise StoreError(
                f"{f} exists and is not a qstream export; qstream never replaces what it did"
                " not write (even with overwrite=True): remove it yourself or export elsewhere"
            )
        # the last file written (the index, or the only file) marks a finished export; shards
        # of an interrupted one (ours: they carry qstream's metadata) are written again
        if not (replace or f != targets[-1]):
            raise StoreError(f"{f} exists; pass overwrite=True to replace it")


def _same_config(path: str, doc: dict) -> bool:
    """Whether ``path`` is a config.json qstream wrote with the same content as ``doc`` (two
    exports of one model into one folder share it)."""
    from .paths import kind_of

    if kind_of(path) != "file":
        return False
    old = read_json(path)
    if old is None or "qstream_export" not in old:
        return False
    old.pop("qstream_export")
    return old == doc


def _model_config(config, opened) -> dict:
    """The model configuration the quantization config is merged into: ``config`` (a dict or
    the path of a JSON file), or the ``config.json`` beside the converted checkpoint's local
    source, or an empty one."""
    if isinstance(config, dict):
        return json.loads(json.dumps(config))  # a copy; JSON only
    path = os.fspath(config) if config is not None else _source_config(opened)
    if path is None:
        return {}
    doc = read_json(path)
    if doc is None:
        raise InvalidParameterError(f"{path}: not a readable JSON object (a model config.json)")
    if "qstream_export" in doc:  # one qstream wrote: the model's config, and its own part
        doc.pop("qstream_export")
        doc.pop("quantization_config", None)
    elif "quantization_config" in doc:
        raise InvalidParameterError(
            f"{path} already has a quantization_config: its checkpoint is quantized already;"
            " pass config= a plain model config"
        )
    return doc


def _source_config(opened) -> str | None:
    """``config.json`` beside (or in) a converted checkpoint's local source, if there is one."""
    if not isinstance(opened, QuantizedCheckpoint):
        return None
    source = opened.meta.get("source")
    if not isinstance(source, str) or "://" in source:
        return None
    folder = source if os.path.isdir(source) else os.path.dirname(source)
    path = os.path.join(folder, CONFIG)
    return path if os.path.isfile(path) else None


def _write_json(path: str, doc: dict) -> None:
    tmp = f"{path}.{os.getpid()}.partial"
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=2)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise StoreError(f"cannot write {path}: {e}") from None


def describe_export(path) -> dict:
    """What a file qstream exported holds and which loader it targets: a ``.safetensors``
    (or its index) or a ``.gguf``. Raises :class:`StoreError` for a file qstream did not
    export."""
    path = os.fspath(path)
    if path.endswith(".gguf"):
        from .gguf import describe

        return describe(path)
    meta = export_metadata(path)
    if meta is None:
        raise StoreError(f"{path} is not a qstream export (no qstream metadata)")
    if path.endswith(".json"):
        doc = read_json(path) or {}
        names = list((doc.get("weight_map") or {}).keys())
        total = (doc.get("metadata") or {}).get("total_size")
    else:
        from .paths import open_regular

        with open_regular(path) as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(min(n, 100 << 20)))
        names = [k for k in header if k != "__metadata__"]
        total = max((v["data_offsets"][1] for k, v in header.items() if k in names), default=0)
    fmt = meta.get("qstream_format", "qstream")
    quantized = json.loads(meta["qstream"]) if isinstance(meta.get("qstream"), str) else {}
    config = os.path.join(os.path.dirname(path), CONFIG)
    return {
        "file": path,
        "format": fmt,
        "loader": LOADERS.get(fmt, LOADERS["qstream"]),
        "tensors": len(names),
        "quantized": quantized,
        "bytes": total,
        "config": config if fmt == "compressed-tensors" and os.path.isfile(config) else None,
    }
