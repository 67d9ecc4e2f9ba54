"""The ``zarr.json`` of a plain array, written without zarr-python.

A converted checkpoint's packs and small tensors are written whole
(:mod:`qstream.io.outputs.publish`)
with a few kinds of arrays: codes, scales and zero points of NumPy integer or float types,
raw or zstd-compressed, with explicit chunks. For those :func:`plain_array` gives the
document ``zarr.create_array`` would write (the same JSON, parsed) and the chunk files to
write through, so that a conversion need not import zarr-python (0.2 s of every run).
Anything else (sub-byte and bfloat16 types, other codecs, chunks left to zarr's choice) gets
None, and zarr makes the document as before.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .chunkcodecs import ZstdFrames
from .chunks import ChunkFiles

# zarr's default compressor of a Zarr v3 array of numbers ("auto"), and its chunks' codec
_ZSTD = ZstdFrames(level=0, checksum=False)
_DEFAULT_ZSTD = {
    "name": "zstd",
    "configuration": {"level": _ZSTD.level, "checksum": _ZSTD.checksum},
}
_PLAIN = {np.dtype(f"{kind}{bits}") for kind in ("int", "uint") for bits in (8, 16, 32, 64)}
_PLAIN |= {np.dtype(f"float{bits}") for bits in (16, 32, 64)}
_KEYS = {
    "shape",
    "chunks",
    "dtype",
    "fill_value",
    "compressors",
    "chunk_key_encoding",
    "dimension_names",
    "attributes",
    "serializer",
}


@dataclass(frozen=True)
class ChunkKey:
    """Zarr v3's ``default`` chunk key encoding: ``c``, then the coordinates, joined by
    ``separator``."""

    separator: str

    def __call__(self, coords: tuple[int, ...]) -> str:
        return self.separator.join(map(str, ("c", *coords)))


def is_plain_dtype(dtype: Any) -> bool:
    """Whether arrays of ``dtype`` are written without zarr-python (see :func:`plain_array`)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return False
    return dt in _PLAIN and dt.byteorder != ">"


def plain_array(kw: dict[str, Any]) -> tuple[bytes, ChunkFiles] | None:
    """``(zarr.json bytes, chunk files with no root yet)`` of the array ``zarr.create_array
    (**kw)`` makes, when ``kw`` describes a plain array (see the module docstring); else
    None."""
    if set(kw) - _KEYS or "chunks" not in kw or kw.get("serializer", "auto") != "auto":
        return None
    try:
        dtype = np.dtype(kw["dtype"])
    except TypeError:
        return None
    shape = tuple(int(n) for n in kw["shape"])
    chunks = tuple(int(c) for c in kw["chunks"])
    fill = kw.get("fill_value", 0)
    if dtype not in _PLAIN or dtype.byteorder == ">" or not shape or len(chunks) != len(shape):
        return None
    if isinstance(fill, bool) or not isinstance(fill, int | float) or fill != 0:
        return None
    if not all(c > 0 for c in chunks):
        return None
    compressors = kw.get("compressors", "auto")
    if compressors is None:
        codecs: list[dict[str, Any]] = []
    elif isinstance(compressors, str) and compressors == "auto":
        codecs = [_DEFAULT_ZSTD]
    else:
        return None
    separator = _separator(kw.get("chunk_key_encoding"))
    if separator is None:
        return None
    serializer: dict[str, Any] = {"name": "bytes"}
    if dtype.itemsize > 1:
        serializer["configuration"] = {"endian": "little"}
    doc: dict[str, Any] = {
        "shape": list(shape),
        "data_type": dtype.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunks)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": separator}},
        "fill_value": 0.0 if dtype.kind == "f" else 0,
        "codecs": [serializer, *codecs],
        "attributes": dict(kw.get("attributes") or {}),
    }
    names = kw.get("dimension_names")
    if names is not None:
        doc["dimension_names"] = list(names)
    doc.update({"zarr_format": 3, "node_type": "array", "storage_transformers": []})
    codec = _ZSTD if codecs else None
    files = ChunkFiles(
        root="",
        shape=shape,
        chunks=chunks,
        dtype=dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype,
        fill_value=0,
        codec=codec,
        encode_key=ChunkKey(separator),
    )
    return json.dumps(doc, indent=2).encode(), files


def auto_chunks(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The chunks ``zarr.create_array`` picks for ``shape`` when given none (and no shards),
    made without zarr-python: starting from the whole array (each axis at least 1), the axes
    are halved in turn (rounded up) until a chunk is below a target size or within half of
    it, and below 64 MiB. The target grows with the array: 256 KiB x 2^log10(its MiB), kept
    within 128 KiB-64 MiB. Kept tensors are written with these chunks, as zarr chose them."""
    if not itemsize:
        return tuple(int(n) for n in shape)
    low, high, step = 128 << 10, 64 << 20, 256 << 10
    chunks = [max(int(n), 1) for n in shape]
    # (in floats, as zarr computes it: the same target to the last bit)
    target = step * 2.0 ** math.log10(float(math.prod(chunks)) * itemsize / (1 << 20))
    target = min(max(target, low), high)
    i = 0
    while True:
        nbytes = float(math.prod(chunks)) * itemsize
        if (nbytes < target or abs(nbytes - target) / target < 0.5) and nbytes < high:
            break
        if math.prod(chunks) == 1:
            break
        chunks[i % len(chunks)] = -(-chunks[i % len(chunks)] // 2)
        i += 1
    return tuple(chunks)


def _separator(encoding: object) -> str | None:
    """The separator of a ``default`` chunk key encoding given as ``create_array`` takes it
    (absent: ``/``), or None for anything else."""
    if encoding is None:
        return "/"
    if not isinstance(encoding, dict) or encoding.get("name") != "default":
        return None
    separator = encoding.get("separator", encoding.get("configuration", {}).get("separator", "/"))
    return separator if separator in ("/", ".") else None
