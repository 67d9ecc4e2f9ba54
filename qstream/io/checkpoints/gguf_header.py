"""The header of a GGUF file (versions 2 and 3, little-endian), parsed and checked before
anything is allocated: :func:`read_header`.

Layout (gguf-py's ``GGUFReader``, llama.cpp's ``gguf.cpp``): ``GGUF``, the version (u32), the
tensor and key counts (u64), the keys (a string, a value type u32, a value), the tensor
descriptions (a name, the dimension count u32, the dimensions u64 fastest first, the type
u32, the offset u64 from the start of the data), padding to ``general.alignment`` (default
32), then the data. Every count, length, dimension, type and offset is checked against the
file's size and sane limits first; a file that fails is refused with one
:class:`~qstream.errors.StoreError` line naming the field. The header is read through a
read-only map of the file (only its pages are touched); large arrays (a tokenizer's
vocabulary) are kept as :class:`GGUFArray` references, not decoded. A GGUF file at a URL
(:func:`read_remote_header`) is parsed by the same code from its first bytes, fetched by
ranged requests that grow until the header parses; its checks are the local file's.
"""

from __future__ import annotations

import itertools
import math
import mmap
import os
import struct
import threading
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ...errors import StoreError
from ...input_files import open_regular
from .remote import RangedTensor, RemoteFolder, is_url, split_url

MAGIC = b"GGUF"
VERSIONS = (2, 3)
ALIGNMENT = 32  # the default of general.alignment
MAX_TENSORS = 1 << 22
MAX_KEYS = 1 << 20
MAX_KEY = 65535  # bytes of a key (the format's limit)
MAX_NAME = 4096  # bytes of a tensor name
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ELEMENTS = 1 << 62
MAX_DEPTH = 4  # arrays of arrays
SMALL_ARRAY = 4096  # arrays up to this many elements are decoded; longer ones referenced
REMOTE_PREFIX = 1 << 20  # bytes of a GGUF object read first; then as many again, until it parses
REMOTE_HEADER = 256 << 20  # the longest header read from a URL (a 256k-token vocabulary: ~10 MB)

# value types: (struct format, byte size) of the scalars; 8: string, 9: array
SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}  # fmt: skip
STRING, ARRAY = 8, 9
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?",
          10: "<u8", 11: "<i8", 12: "<f8"}  # fmt: skip

#: every GGML type: id -> (name, values per block, bytes per block) (gguf-py 0.19's table)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}  # fmt: skip
#: the types qstream decodes
READ_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
              "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MXFP4")  # fmt: skip


@dataclass(frozen=True)
class GGUFArray:
    """A long array value, not decoded: its element type, count and bytes in the file."""

    kind: int
    count: int
    start: int
    end: int

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's description: ``shape`` in NumPy order (slowest first), its GGML type
    name, the absolute byte ``offset`` of its data, ``nbytes`` and the bytes of one row
    (the last axis)."""

    name: str
    shape: tuple[int, ...]
    type: str
    offset: int
    nbytes: int
    row_bytes: int

    @property
    def rows(self) -> int:
        """Rows of the last axis (the leading axes flattened)."""
        return math.prod(self.shape[:-1])


@dataclass(frozen=True)
class GGUFHeader:
    """A checked GGUF header: its keys (``kv``: name -> value, ``kinds``: name -> value
    type), its tensors in file order, the alignment and where the data starts."""

    path: str
    version: int
    size: int
    alignment: int
    data_offset: int
    kv: dict[str, Any]
    kinds: dict[str, int]
    tensors: list[TensorInfo]
    #: the file's bytes in an object store (its URL's), read by ranges; None: a local file
    remote: RangedTensor | None = field(default=None, compare=False, repr=False)


class _Short(Exception):
    """The header goes on past the bytes of a remote file read so far (``end``: the bytes
    needed from its start)."""

    def __init__(self, end: int) -> None:
        self.end = end


class _Cursor:
    """Checked little-endian reads of the mapped header; every refusal names ``path`` and
    the field being read. ``have``: the bytes of ``buf`` (the start of a remote file of
    ``size`` bytes: a read past them raises :class:`_Short`, and more is fetched)."""

    def __init__(
        self, buf: mmap.mmap | bytes, size: int, path: str, have: int | None = None
    ) -> None:
        self.buf, self.size, self.path, self.pos = buf, size, path, 0
        self.have = size if have is None else have

    def fail(self, what: str) -> StoreError:
        return StoreError(f"GGUF file {self.path}: {what}")

    def need(self, n: int, field: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(
                f"{field} needs {n} bytes at offset {self.pos}, past the end of the file"
                f" ({self.size} bytes); the file is truncated or corrupt"
            )
        if n > self.have - self.pos:
            raise _Short(self.pos + n)

    def scalar(self, kind: int, field: str) -> Any:
        fmt, n = SCALARS[kind]
        self.need(n, field)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def u32(self, field: str) -> int:
        return int(self.scalar(4, field))

    def u64(self, field: str) -> int:
        return int(self.scalar(10, field))

    def string(self, field: str, limit: int | None = None) -> str:
        n = self.u64(f"{field} (length)")
        if limit is not None and n > limit:
            raise self.fail(f"{field} is {n} bytes long, above the limit of {limit}")
        self.need(n, field)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            if limit is not None:  # (names and keys must be text; values are kept)
                raise self.fail(f"{field} is not UTF-8 text") from None
            return raw.decode("utf-8", errors="replace")

    def skip_string(self, field: str) -> None:
        n = self.u64(f"{field} (length)")
        self.need(n, field)
        self.pos += n

    def value(self, kind: int, field: str, depth: int = 0) -> Any:
        if kind in SCALARS:
            return self.scalar(kind, field)
        if kind == STRING:
            return self.string(field)
        if kind != ARRAY:
            raise self.fail(f"{field} has the unknown value type {kind}")
        if depth >= MAX_DEPTH:
            raise self.fail(f"{field}: arrays nested more than {MAX_DEPTH} deep")
        elem = self.u32(f"{field} (array element type)")
        count = self.u64(f"{field} (array length)")
        least = SCALARS[elem][1] if elem in SCALARS else 8 if elem == STRING else 12
        if elem not in SCALARS and elem not in (STRING, ARRAY):
            raise self.fail(f"{field} is an array of the unknown value type {elem}")
        if count > (self.size - self.pos) // least:
            raise self.fail(
                f"{field} declares {count} array elements, more than the"
                f" {self.size - self.pos} bytes left in the file can hold"
            )
        start = self.pos
        if elem in SCALARS:
            n = count * SCALARS[elem][1]
            self.pos += n
            if count > SMALL_ARRAY:
                return GGUFArray(elem, count, start, self.pos)
            if self.pos > self.have:
                raise _Short(self.pos)
            return np.frombuffer(self.buf, _NUMPY[elem], count, start).tolist()
        if count > SMALL_ARRAY and elem == STRING:
            for _ in range(count):
                self.skip_string(f"{field} (an element)")
            return GGUFArray(elem, count, start, self.pos)
        return [self.value(elem, f"{field}[{i}]", depth + 1) for i in range(count)]


def read_header(
    path: str, *, storage_options: dict[str, Any] | None = None, store: str | None = None
) -> GGUFHeader:
    """Parse and check the header of the GGUF file ``path`` (see the module's text), or of
    the GGUF object at the URL ``path`` (:func:`read_remote_header`, through ``store`` with
    ``storage_options``)."""
    if is_url(path):
        return read_remote_header(path, storage_options=storage_options, store=store)
    try:
        f = open_regular(path, "GGUF file")
    except FileNotFoundError:
        raise StoreError(f"no such file: {path}") from None
    with f:
        st = os.fstat(f.fileno())
        size = st.st_size
        key = (path, st.st_dev, st.st_ino, size, st.st_mtime_ns, st.st_ctime_ns)
        with _last_lock:
            if _last and _last[0] == key:  # (opened, then described: one parse, ~0.2 s
                return _last[1]  # for a 50k-token vocabulary)
        _check_start(path, size)
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # a file system that cannot map files
            buf = None
        try:
            header = _parse(buf if buf is not None else f.read(), size, path)
        finally:
            if buf is not None:
                buf.close()
    with _last_lock:
        _last[:] = [key, header]
    return header


# the last local header parsed, with the file's identity (device, inode, size, times):
# read again while the file is unchanged, it is not parsed again
_last: list[Any] = []
_last_lock = threading.Lock()


def _check_start(path: str, size: int) -> None:
    if size < 24:
        raise StoreError(
            f"GGUF file {path} is truncated: {size} bytes, shorter than the 24-byte start"
            " (magic, version, counts)"
        )


def read_remote_header(
    url: str, *, storage_options: dict[str, Any] | None = None, store: str | None = None
) -> GGUFHeader:
    """The checked header of the GGUF object at ``url``, read by ranged requests: a HEAD for
    its size, then its first :data:`REMOTE_PREFIX` bytes, and as many again (at least what
    the field being parsed needs) until the header parses, up to :data:`REMOTE_HEADER`
    bytes (a longer header is refused); the file is never fetched whole.
    The checks and refusals are the local file's (:func:`read_header`); the header's
    ``remote`` reads its tensors' bytes by ranges."""
    base, name = split_url(url)
    folder = RemoteFolder(base, store, storage_options)
    size = folder.size(name)
    if size is None:
        raise StoreError(f"no such object: {url}")
    _check_start(url, size)
    remote = RangedTensor(folder, name, 0, np.uint8, (size,))
    buf = bytearray()
    want = min(size, REMOTE_PREFIX)
    while True:
        part = np.empty(want - len(buf), np.uint8)
        remote.read_run(len(buf), part)  # (a short object: "ended early")
        buf += part.tobytes()
        try:
            header = _parse(bytes(buf), size, url, have=len(buf))
        except _Short as more:
            if more.end > REMOTE_HEADER:
                raise StoreError(
                    f"GGUF file {url}: its header goes on past {REMOTE_HEADER >> 20} MiB (to"
                    f" byte {more.end}), more than qstream reads from a URL; download the file"
                    " first"
                ) from None
            want = min(size, REMOTE_HEADER, max(2 * len(buf), more.end))
            continue
        return replace(header, remote=remote)


def _parse(buf: mmap.mmap | bytes, size: int, path: str, have: int | None = None) -> GGUFHeader:
    c = _Cursor(buf, size, path, have)
    magic = bytes(buf[:4])
    if magic != MAGIC:
        raise c.fail(f"not a GGUF file: it starts with {magic!r}, not {MAGIC!r}")
    c.pos = 4
    version = c.u32("version")
    if version not in VERSIONS:
        swapped = struct.unpack("<I", struct.pack(">I", version))[0]
        if swapped in VERSIONS:
            raise c.fail(f"a big-endian GGUF (version {swapped}); only little-endian is read")
        raise c.fail(f"version {version} is not read; versions {VERSIONS} are")
    n_tensors = c.u64("tensor count")
    n_kv = c.u64("key count")
    left = size - c.pos
    if n_kv > min(MAX_KEYS, left // 13):
        raise c.fail(f"key count {n_kv} is above {min(MAX_KEYS, left // 13)} (the limit, or"
                     f" what the {size}-byte file can hold)")  # fmt: skip
    if n_tensors > min(MAX_TENSORS, left // 24):
        raise c.fail(f"tensor count {n_tensors} is above {min(MAX_TENSORS, left // 24)} (the"
                     f" limit, or what the {size}-byte file can hold)")  # fmt: skip
    kv: dict[str, Any] = {}
    kinds: dict[str, int] = {}
    for i in range(n_kv):
        key = c.string(f"key {i}", MAX_KEY)
        if key in kv:
            raise c.fail(f"key {key!r} appears twice")
        kind = c.u32(f"value type of key {key!r}")
        kv[key] = c.value(kind, f"value of key {key!r}")
        kinds[key] = kind
    alignment = ALIGNMENT
    if "general.alignment" in kv:
        alignment = kv["general.alignment"]
        if kinds["general.alignment"] != 4 or alignment <= 0 or alignment & (alignment - 1):
            raise c.fail(f"general.alignment must be a u32 power of two, got {alignment!r}")
    infos = [_tensor_info(c, i) for i in range(n_tensors)]
    data_offset = c.pos + (-c.pos % alignment)
    if data_offset > size and infos:
        raise c.fail(f"the data would start at {data_offset}, past the end ({size} bytes)")
    return GGUFHeader(path, version, size, alignment, data_offset, kv, kinds,
                      _place(c, infos, alignment, data_offset))  # fmt: skip


def _tensor_info(c: _Cursor, i: int) -> tuple[str, tuple[int, ...], int, int]:
    """(name, shape in NumPy order, type id, offset in the data) of tensor ``i``."""
    name = c.string(f"name of tensor {i}", MAX_NAME)
    n_dims = c.u32(f"dimension count of tensor {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise c.fail(f"tensor {name!r} has {n_dims} dimensions; 1..{MAX_DIMS} are allowed")
    dims = [c.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims)]
    count = 1
    for d, n in enumerate(dims):
        if n < 1:
            raise c.fail(f"dimension {d} of tensor {name!r} is {n}; dimensions are >= 1")
        count *= n
        if count > MAX_ELEMENTS:
            raise c.fail(f"the dimensions of tensor {name!r} {dims} overflow ({count}+ values)")
    kind = c.u32(f"type of tensor {name!r}")
    offset = c.u64(f"offset of tensor {name!r}")
    return name, tuple(reversed(dims)), kind, offset


def _place(
    c: _Cursor, infos: list[tuple[str, tuple[int, ...], int, int]], alignment: int, data: int
) -> list[TensorInfo]:
    """The tensors with their types, sizes and absolute offsets, each checked: a type that
    is read, whole blocks, inside the file, aligned, no two overlapping."""
    out: list[TensorInfo] = []
    seen: set[str] = set()
    for name, shape, kind, offset in infos:
        if name in seen:
            raise c.fail(f"tensor {name!r} appears twice")
        seen.add(name)
        if kind not in GGML_TYPES:
            raise c.fail(f"tensor {name!r} has the unknown GGML type id {kind}")
        tname, block, tsize = GGML_TYPES[kind]
        if tname not in READ_TYPES:
            raise c.fail(f"tensor {name!r} is of type {tname}, which qstream does not decode"
                         f" (it reads {', '.join(READ_TYPES)})")  # fmt: skip
        if shape[-1] % block:
            raise c.fail(f"tensor {name!r} ({tname}) has rows of {shape[-1]} values, not whole"
                         f" blocks of {block}")  # fmt: skip
        row_bytes = shape[-1] // block * tsize
        nbytes = math.prod(shape[:-1]) * row_bytes
        if offset % alignment:
            raise c.fail(f"offset {offset} of tensor {name!r} is not a multiple of the"
                         f" alignment {alignment}")  # fmt: skip
        if offset > c.size or nbytes > c.size - data - offset:
            raise c.fail(f"tensor {name!r} ({nbytes} bytes at data offset {offset}) ends past"
                         f" the end of the file ({c.size} bytes, data from {data})")  # fmt: skip
        out.append(TensorInfo(name, shape, tname, data + offset, nbytes, row_bytes))
    ordered = sorted(out, key=lambda t: t.offset)
    for a, b in itertools.pairwise(ordered):
        if a.offset + a.nbytes > b.offset:
            raise c.fail(f"tensors {a.name!r} and {b.name!r} overlap in the file")
    return out


def read_array(header: GGUFHeader, a: GGUFArray) -> list[Any]:
    """The values of the long array ``a`` of the GGUF file of ``header`` (decoded on
    demand; a remote file's: one ranged request)."""
    raw: bytes
    if header.remote is not None:
        part = np.empty(a.end - a.start, np.uint8)
        header.remote.read_run(a.start, part)
        raw = part.tobytes()
    else:
        with open_regular(header.path, "GGUF file") as f:
            f.seek(a.start)
            raw = f.read(a.end - a.start)
    if len(raw) != a.end - a.start:
        raise StoreError(f"GGUF file {header.path}: the file changed while it was read")
    if a.kind in _NUMPY:
        return list(np.frombuffer(raw, _NUMPY[a.kind], a.count).tolist())
    c = _Cursor(raw, len(raw), header.path)
    return [c.value(a.kind, "array element") for _ in range(a.count)]
