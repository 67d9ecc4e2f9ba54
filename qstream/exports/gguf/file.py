"""The GGUF file format as qstream writes it (version 3): a header of key-value pairs and
tensor descriptions, then each tensor's bytes aligned to :data:`ALIGN`, streamed in slabs.

Every file qstream writes carries :data:`MARK` as its first key, holding the export's
identity (JSON): :func:`identity` reads it back with the file's own header (no gguf-py), so
that an export knows a file it wrote, and a finished one.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...compat import gguf as q
from ...errors import StoreError
from ...input_files import open_regular
from ..files import ReadRows, Tick, remove_stale_partials

ALIGN = 32
VERSION = 3
MARK = "qstream.export"  # a key every GGUF qstream writes carries
SQNR = "qstream.sqnr_db"  # the SQNR of each tensor qstream quantized (JSON: GGUF name -> dB)
# GGUF's value types
U32, I32, F32, BOOL, STR, ARR, U64 = 4, 5, 6, 7, 8, 9, 10

#: a key's (value type, value), or (ARR, items, the items' value type) for an array
Value = tuple[int, Any] | tuple[int, Any, int]
_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", U32: "I", I32: "i", F32: "f", BOOL: "?", U64: "Q",
            11: "q", 12: "d"}  # fmt: skip


@dataclass(frozen=True)
class Later:
    """A string value known once the tensors are written (error figures, measured as they
    stream): ``size`` bytes reserved in the header, then ``fill()``'s text, padded with
    spaces to that size (a JSON text reads the same)."""

    size: int
    fill: Callable[[], str]


class GGUFTensor:
    """One tensor of the file: its GGUF name, shape, type and a reader of byte rows.

    ``rows``: how many rows (the leading axes flattened); ``read(r0, r1)``: the uint8 bytes
    of rows ``r0:r1`` (any shape), called for ``step`` rows at a time."""

    def __init__(
        self, name: str, shape: Iterable[int], gtype: str, rows: int, read: ReadRows, step: int
    ) -> None:
        self.name, self.shape, self.type = name, tuple(int(d) for d in shape), gtype
        self.rows = rows
        self.read = read
        self.step = step
        inner = q.byte_shape(self.shape, gtype) if self.shape else ()
        itemsize = 4 if gtype == "F32" else 2 if gtype == "F16" else 1
        self.nbytes = math.prod(inner) * itemsize if self.shape else 4


def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def _value(kind: int, v: Any, element: int | None = None) -> bytes:
    if kind == STR:
        return _string(v)
    if kind == ARR:
        if element is None or element == ARR:
            raise StoreError(f"an array of value type {element} is not written")
        head = struct.pack("<IQ", element, len(v))
        if element == STR:
            return head + b"".join(_string(s) for s in v)
        return head + struct.pack(f"<{len(v)}{_FORMATS[element]}", *v)
    return struct.pack("<" + _FORMATS[kind], v)


def write_gguf(
    path: str, kv: dict[str, Value], tensors: list[GGUFTensor], tick: Tick | None = None
) -> None:
    """Write the GGUF file ``path``: the keys ``kv`` (in order; arrays of strings and
    numbers too; a :class:`Later` string filled in once the tensors are written), then
    ``tensors`` (``tick``: told the bytes of each slab written)."""
    parts = [struct.pack("<4sIQQ", b"GGUF", VERSION, len(tensors), len(kv))]
    later: list[tuple[int, Later]] = []  # (where each Later's text goes)
    for k, value in kv.items():
        kind, v = value[0], value[1]
        element = value[2] if len(value) > 2 else None
        if isinstance(v, Later):
            at = sum(len(p) for p in parts) + len(_string(k)) + 4 + 8
            later.append((at, v))
            v = " " * v.size  # (a placeholder, of the text's size)
        parts.append(_string(k) + struct.pack("<I", kind) + _value(kind, v, element))
    offset = 0
    for t in tensors:
        dims = t.shape[::-1] or (1,)
        parts.append(_string(t.name) + struct.pack(f"<I{len(dims)}Q", len(dims), *dims))
        parts.append(struct.pack("<IQ", q.TYPE_ID[t.type], offset))
        offset += t.nbytes + (-t.nbytes % ALIGN)
    head = b"".join(parts)
    head += b"\0" * (-len(head) % ALIGN)
    remove_stale_partials(path)  # what a killed export of this file left
    tmp = f"{path}.{os.getpid()}.partial"
    try:
        with open(tmp, "wb") as f:
            f.write(head)
            for t in tensors:
                written = 0
                for r0 in range(0, t.rows, t.step):
                    chunk = t.read(r0, min(t.rows, r0 + t.step))
                    f.write(np.ascontiguousarray(chunk).reshape(-1).view(np.uint8).data)
                    written += chunk.nbytes
                    if tick is not None:
                        tick(chunk.nbytes)
                if written != t.nbytes:
                    raise StoreError(f"{t.name}: wrote {written} bytes, expected {t.nbytes}")
                f.write(b"\0" * (-t.nbytes % ALIGN))
            for at, deferred in later:
                text = deferred.fill().encode()
                if len(text) > deferred.size:
                    raise StoreError(f"{path}: {len(text)} bytes for {deferred.size} reserved")
                f.seek(at)
                f.write(text.ljust(deferred.size))
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise StoreError(f"cannot write {path}: {e}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def written_by_qstream(path: str) -> bool:
    """Whether the GGUF file ``path`` carries qstream's export key."""
    return identity(path) is not None


def identity(path: str) -> str | None:
    """The job identity recorded under qstream's key (written first) in the GGUF file
    ``path``, or None when it is not a GGUF qstream wrote."""
    try:
        with open_regular(path) as f:
            magic, _, _, n_kv = struct.unpack("<4sIQQ", f.read(24))
            if magic != b"GGUF" or n_kv < 1:
                return None
            (n,) = struct.unpack("<Q", f.read(8))
            if f.read(min(n, 256)) != MARK.encode():
                return None
            kind, size = struct.unpack("<IQ", f.read(12))
            if kind != STR or size > 1 << 20:
                return None
            found: str = f.read(size).decode()
            return found
    except (OSError, struct.error, UnicodeDecodeError):
        return None


def describe(path: str) -> dict[str, Any]:
    """What a GGUF file qstream wrote holds: its checked header's summary and tensor list
    (:func:`qstream.io.checkpoints.gguf_metadata.describe_gguf`) with the job recorded under
    :data:`MARK`
    (the source, and the ``--gguf-type`` asked for: None when the recipe chose the types)."""
    job = identity(path)
    if job is None:
        raise StoreError(f"{path} is not a qstream export (no {MARK} key)")
    from ...io.checkpoints.gguf_metadata import describe_gguf  # (loaded when described)

    ident = json.loads(job)
    found = describe_gguf(path)
    return {
        "file": path,
        "format": "gguf",
        "loader": "llama.cpp / gguf-py",
        "source": ident.get("source"),
        "type": ident.get("type"),
        **{k: v for k, v in found.items() if k not in ("file", "format")},
    }
