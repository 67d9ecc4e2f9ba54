"""The header of a safetensors file, parsed and checked before any tensor is read.

The header is JSON (at most :data:`MAX_HEADER` bytes, the format's own limit): each entry's
dtype, shape and data offsets are checked against the file's data region, and a corrupt or
hostile header is refused naming the first rule it breaks. Local files
(:mod:`qstream.io.checkpoints.safetensors_files`) and objects in a store
(:mod:`qstream.io.checkpoints.remote_safetensors`) share these checks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import StoreError
from .dtypes import SAFETENSORS_DTYPES
from .tensor import CheckpointTensor

MAX_HEADER = 100_000_000  # bytes of a safetensors header (the format's own limit)
MAX_TENSORS = 1 << 18  # tensors of one safetensors file (a whole 90k-tensor model fits)

#: make(name, dtype, shape, offset in the file) -> the tensor
MakeTensor = Callable[[str, np.dtype[Any], list[int], int], CheckpointTensor]


def header_tensors(
    where: str, raw: bytes, n: int, size: int, only: set[str] | None, make: MakeTensor
) -> dict[str, CheckpointTensor]:
    """The tensors of the safetensors header ``raw`` (``n`` bytes of a file of ``size``):
    each validated entry made by ``make(name, dtype, shape, offset in the file)``."""
    entries = raw.count(b'"data_offsets"')  # (counted before a parse makes objects of them)
    if entries > MAX_TENSORS:
        raise StoreError(
            f"{where}: its header lists {entries:,} tensors, more than qstream opens from one"
            f" file ({MAX_TENSORS:,}); split the checkpoint into shards with an index"
        )
    header = json_object(raw, f"{where}: invalid JSON header")
    data_start, data_size = 8 + n, size - 8 - n
    out: dict[str, CheckpointTensor] = {}
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            _check_metadata(where, info)
        elif only is None or name in only:
            dtype, shape, start = _check_entry(where, name, info, data_size)
            spans.append((start, start + math.prod(shape) * dtype.itemsize, name))
            out[name] = make(name, dtype, shape, data_start + start)
        else:  # (a tensor not taken: its bytes' place only, whatever its type)
            spans.append((*_offsets(where, name, info), name))
    _check_layout(where, spans, data_size)
    return out


def _offsets(where: str, name: str, info: Any) -> tuple[int, int]:
    """The checked ``data_offsets`` of a header entry (two integers, start <= end)."""
    offsets = info.get("data_offsets") if isinstance(info, dict) else None
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_uint, offsets))):
        raise StoreError(f"{where}: tensor {name!r}: invalid data_offsets {offsets!r}")
    start, end = offsets
    if start > end:
        raise StoreError(
            f"{where}: tensor {name!r}: data_offsets {offsets} are out of range (start > end)"
        )
    return start, end


def _check_metadata(where: str, info: Any) -> None:
    """``__metadata__``: names to strings (or null), as the format's own library takes it."""
    if info is None:
        return
    if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
        raise StoreError(f"{where}: its header's __metadata__ does not map names to strings")


def _check_layout(where: str, spans: list[tuple[int, int, str]], data_size: int) -> None:
    """The tensors' bytes, in order of their offsets, fill the data region one after another
    from its start to its end: no two tensors share a byte, no byte is left between or
    after them (the rule of the format, which its own library enforces: a header that breaks
    it is crafted or corrupt, and aliasing tensors would read each other's values)."""
    at = 0
    for start, end, name in sorted(spans):
        if start != at:
            what = "lies inside the bytes before it" if start < at else f"leaves {start - at} bytes"
            raise StoreError(
                f"{where}: tensor {name!r} at data_offsets [{start}, {end}] {what} (its bytes"
                f" must start at {at}, where the tensor before it ends); the header is corrupt"
                " or crafted"
            )
        at = end
    if at != data_size:
        raise StoreError(
            f"{where}: its tensors end at byte {at} of a data region of {data_size} bytes; the"
            " header is corrupt or crafted, or the file holds more than its header lists"
        )


def _check_entry(
    where: str, name: str, info: Any, data_size: int
) -> tuple[np.dtype[Any], list[int], int]:
    """Validate one header entry; return (dtype, shape, start offset within the data region)."""
    try:  # the common case, checked in a few steps (a header may list 100,000 tensors)
        dtype = SAFETENSORS_DTYPES[info["dtype"]]
        shape, (start, end) = info["shape"], info["data_offsets"]
        if (
            type(shape) is list
            and type(start) is int
            and type(end) is int
            and set(map(type, shape)) <= _INT
            and min(shape, default=0) >= 0
            and 0 <= start <= end <= data_size
            and end - start == math.prod(shape) * dtype.itemsize
        ):
            return dtype, shape, start
    except (TypeError, KeyError, ValueError):
        pass
    return _check_entry_slowly(where, name, info, data_size)


_INT = {int}


def _check_entry_slowly(
    where: str, name: str, info: Any, data_size: int
) -> tuple[np.dtype[Any], list[int], int]:
    """:func:`_check_entry`, each rule in turn, the first one broken named."""
    at = f"{where}: tensor {name!r}"
    if not isinstance(info, dict):
        raise StoreError(f"{at}: header entry is not an object")
    code, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if code not in SAFETENSORS_DTYPES:
        raise StoreError(f"{at}: unknown dtype {code!r}")
    if not isinstance(shape, list) or not all(_is_uint(s) for s in shape):
        raise StoreError(f"{at}: invalid shape {shape!r}")
    start, end = _offsets(where, name, info)
    dtype = SAFETENSORS_DTYPES[code]
    expected = math.prod(shape) * dtype.itemsize
    if end - start != expected:
        raise StoreError(
            f"{at}: data_offsets {offsets} span {end - start} bytes, "
            f"but shape {shape} of {code} needs {expected}"
        )
    if end > data_size:
        raise StoreError(
            f"{at}: data_offsets {offsets} are out of range: the file is truncated "
            f"(data region holds {data_size} bytes)"
        )
    return dtype, shape, start


def _is_uint(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def json_object(raw: bytes, where: str) -> dict[str, Any]:
    """``raw`` parsed as a JSON object, or a :class:`StoreError` starting with ``where``."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StoreError(f"{where} ({e})") from None
    except RecursionError:
        raise StoreError(f"{where} (nested too deeply)") from None
    if not isinstance(doc, dict):
        raise StoreError(f"{where} (a JSON object is expected)")
    return doc
