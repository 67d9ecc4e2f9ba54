"""Export quantized outputs as safetensors, streaming, for loaders outside qstream.

Naming follows the compressed-tensors convention of int8/int4 checkpoints (what vLLM and
Hugging Face ``compressed-tensors`` read for "int-quantized" weights): a quantized tensor
``N`` is written as

- ``N``: the stored values (``I8``/``U8``/``I16``/``U16``/``I32``; int4/uint4/int2/uint2 one
  value per byte in ``I8``/``U8``; float8_e4m3fn/e5m2 as ``F8_E4M3``/``F8_E5M2``; the other
  float types as ``U8`` bit patterns),
- ``N_scale``: float32 (float16 when stored so, ``scale_dtype="float16"``), shaped to
  broadcast against ``N``: ``[1]`` per tensor, the channel axis kept and every other axis 1
  per axis (``[out, 1]`` for axis 0 of a matrix), the group
  layout ``[out, in / group]`` blocked,
- ``N_zero_point``: the zero point in the values' integer type, same shape as ``N_scale``
  (omitted when every zero point is 0, i.e. symmetric),

so ``(N - N_zero_point) * N_scale`` in float32 is ``qstream.dequantize`` bit for bit. Kept
tensors are written in their original dtype (bfloat16 included). ``__metadata__["qstream"]``
(JSON) records each quantized tensor's type, axis and block size. Above ``max_shard_size`` the
tensors are split over ``stem-0000K-of-0000N.safetensors`` with a ``stem.safetensors.index.json``
(``weight_map``), as Hugging Face sharded checkpoints are. Memory stays bounded: tensors are
read and written in slabs of ~16 MiB.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct

import numpy as np

from ..errors import InvalidParameterError, StoreError
from .qarray import QuantizedArray, QuantizedCheckpoint, open_quantized

SLAB = 16 << 20
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
    return _export_metadata(path) is not None


def finished_export(out, job: str) -> list[str] | None:
    """The files of a finished export to ``out`` that recorded the identity ``job`` (its
    last file, the index or the only file, exists and says so), else None."""
    out = os.fspath(out)
    index = out[: -len(".safetensors")] + ".safetensors.index.json"
    if os.path.lexists(index):
        doc = _read_json(index)
        meta = _qstream_meta(doc.get("metadata") if doc else None)
        if meta is None or meta.get("qstream_job") != job:
            return None
        wmap = doc.get("weight_map")
        names = sorted(set(wmap.values())) if isinstance(wmap, dict) else []
        if not all(isinstance(n, str) and shard_pattern(out).fullmatch(n) for n in names):
            return None  # not an index this export writes
        return [os.path.join(os.path.dirname(out), n) for n in names] + [index]
    meta = _export_metadata(out) if os.path.lexists(out) else None
    return [out] if meta is not None and meta.get("qstream_job") == job else None


def _export_metadata(path: str) -> dict | None:
    """qstream's metadata in a safetensors file or index, or None."""
    if path.endswith(".json"):
        doc = _read_json(path)
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
    return meta if isinstance(meta, dict) and "qstream" in meta else None


def _read_json(path: str) -> dict | None:
    """The JSON object in the file ``path`` (at most 100 MB), or None."""
    from .paths import open_regular

    try:
        with open_regular(path) as f:
            doc = json.loads(f.read(100 << 20))
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _remove_stale_partials(target: str) -> None:
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
    max_shard_size: int = 5 * 10**9,
    overwrite: bool = False,
    name: str = "weight",
    storage_options: dict | None = None,
    replace_own: bool = False,
    job: str | None = None,
) -> dict:
    """Write the quantized output ``src`` (a converted checkpoint's root, or one quantized
    group, exported as the tensor ``name``) to the safetensors file ``out`` (or shards beside
    it, with an index, above ``max_shard_size`` bytes); see the module docstring for the
    naming. Returns the files written and the tensors' names.

    Existing files are refused unless ``overwrite``, except shards of an interrupted export
    (they carry qstream's metadata and no index was written); ``replace_own`` also replaces a
    finished export's files qstream wrote (a resumed ``convert ... out.safetensors``).
    ``job``: an identity recorded in the files (see :func:`finished_export`)."""
    opened = open_quantized(src, storage_options=storage_options)
    tensors = _Tensors(opened, name)
    entries, described = [], {}
    for n in tensors.names():
        t = tensors(n)
        entries += _entries(n, t, tensors)
        if isinstance(t, QuantizedArray):
            described[n] = {"dtype": t.spec.dtype, "axis": t.axis, "block_size": t.spec.block_size}
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise InvalidParameterError("tensor names collide with the _scale/_zero_point suffixes")
    out = os.fspath(out)
    if not out.endswith(".safetensors"):
        raise InvalidParameterError(f"{out}: the export target must end in .safetensors")
    shards = _shards(entries, int(max_shard_size))
    stem = out[: -len(".safetensors")]
    files = (
        [out]
        if len(shards) == 1
        else [f"{stem}-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    index = f"{stem}.safetensors.index.json"
    targets = files + ([index] if len(shards) > 1 else [])
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
        if not (overwrite or replace_own or f != targets[-1]):
            raise StoreError(f"{f} exists; pass overwrite=True to replace it")
    for f in targets:
        _remove_stale_partials(f)
    meta = {
        "format": "pt",
        "qstream": json.dumps(described, sort_keys=True),
        "naming": "compressed-tensors: N, N_scale, N_zero_point",
    }
    if job is not None:
        meta["qstream_job"] = job
    for path, shard in zip(files, shards, strict=True):
        _write_file(path, shard, meta)
    if len(shards) > 1:
        weight_map = {
            e.name: os.path.basename(f) for f, s in zip(files, shards, strict=True) for e in s
        }
        total = sum(e.nbytes for e in entries)
        doc = {"metadata": {"total_size": total, "qstream": "export"}, "weight_map": weight_map}
        if job is not None:
            doc["metadata"]["qstream_job"] = job
        tmp = f"{index}.{os.getpid()}.partial"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=2)
        os.replace(tmp, index)
    return {"files": targets, "tensors": names, "bytes": sum(e.nbytes for e in entries)}
