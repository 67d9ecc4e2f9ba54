"""Direct chunk I/O: whole chunks of a Zarr array on a local file system, read and written
without zarr's asynchronous codec pipeline.

zarr-python reads a chunk through an event loop, a fresh ``bytes`` object and a copy into the
result; here an uncompressed chunk is mapped (:meth:`ChunkFiles.view`: the kernels read the
page cache itself, no copy) or read straight into the caller's buffer (``readinto``), and a
compressed one is decoded into it (``codec.decode(..., out=)``, which releases the GIL, so
decoding scales with the threads that call it).

Writes go to a temporary file renamed into place (readers never see a torn chunk). Chunks of
``DIRECT_MIN`` bytes or more are written with ``O_DIRECT`` where the file system allows it:
the data goes from the caller's (reused) buffer to the disk without filling the page cache.
On VMs that return free memory to the host every fresh page-cache page costs a host fault
(measured here: a 4 MiB chunk file took 0.3 ms of CPU with ``O_DIRECT``, 0.7 to 11 ms
through the page cache), and an out-of-core job should not evict its source from the cache
anyway. ``QSTREAM_DIRECT_IO=0`` turns it off.

:func:`chunk_files` returns a :class:`ChunkFiles` only for the layouts it reproduces exactly:
a local store, a regular chunk grid without sharding, no filters, little-endian (or one-byte)
values in C order, and no compressor or one of zstd, gzip, blosc (Zarr v3) or any numcodecs
compressor (Zarr v2). Anything else returns None and the caller keeps using zarr.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import math
import mmap
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...core import ALIGN, scratch
from ...errors import StoreError
from ...input_files import open_regular
from ...paths import opened, opened_in, write_all
from ..zarr_types.packing import packed_nbytes
from .chunkcodecs import decode_bounded, is_bounded, numcodecs_of
from .compression import codec_config
from .inplace import map_bytes

# POSIX only (mapping and O_DIRECT); elsewhere chunks are read and written with plain calls
_POSIX = os.name == "posix" and hasattr(mmap, "MAP_PRIVATE")
DIRECT_IO = os.environ.get("QSTREAM_DIRECT_IO", "1") != "0" and hasattr(os, "O_DIRECT")
DIRECT_MIN = 256 << 10
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
PARTIAL = ".partial"  # suffix of a chunk file being written (zarr's LocalStore uses it too)


@dataclass
class ChunkFiles:
    """The chunk files of one array (see module docstring)."""

    root: str  # the array's directory
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype  # as stored (little-endian or one byte)
    fill_value: Any
    codec: Any  # a numcodecs codec, a ZstdFrames (qstream's own zstd chunks) or None (raw)
    encode_key: Any  # chunk coordinates -> relative path
    direct: bool = field(default=DIRECT_IO)  # O_DIRECT writes (turned off if refused)
    bits: int = 0  # packed sub-byte values (``packbits``, no padding byte): bits each; 0: not
    signed: bool = False  # packed values are sign-extended when unpacked
    # each chunk written under a temporary name and renamed (False: straight to its name, for
    # an array in a folder no reader sees yet)
    atomic: bool = True
    # every chunk was written (a finished quantized output's codes and scales): an absent one
    # is damage, refused, never read as the fill value
    required: bool = False
    # a descriptor of ``root`` held by the caller while it writes (a node being built in a
    # folder no reader sees yet, :mod:`qstream.io.outputs.publish`): chunk files are made
    # relative to it, no path walked again
    root_fd: int | None = None

    def path(self, coords: tuple[int, ...]) -> str:
        """The file of chunk ``coords``."""
        return os.path.join(self.root, self.encode_key(coords))

    @property
    def chunk_nbytes(self) -> int:
        """Bytes of one uncompressed chunk (edge chunks are stored whole too)."""
        n = int(np.prod(self.chunks))
        return packed_nbytes(n, self.bits) if self.bits else n * self.dtype.itemsize

    def _whole(self, inner: tuple[slice, ...]) -> bool:
        return all(s.start == 0 and s.stop == c for s, c in zip(inner, self.chunks, strict=True))

    # ---- reading

    def read(self, region: tuple[slice, ...], out: np.ndarray) -> None:
        """Fill ``out`` (C-contiguous, ``region``'s shape) with the values of ``region``."""
        for coords, inner, outer in self.chunks_of(region):
            dest = out[outer]
            full = self._whole(inner)
            if full and dest.flags.c_contiguous:
                self._read_chunk(coords, dest)
                continue
            if not os.path.lexists(self.path(coords)):
                # never written: the fill value, without the declared chunk's buffer (memory
                # as the region, whatever chunk a crafted document declares)
                if self.required:
                    raise missing_chunk(self.path(coords))
                dest[...] = self.fill_value
                continue
            chunk = scratch("chunk-read", self.chunks, self.dtype)
            self._read_chunk(coords, chunk)
            dest[...] = chunk[inner]

    def view(self, region: tuple[slice, ...]) -> np.ndarray | None:
        """``region`` as a view of the mapped chunk file, without a copy, when it lies inside
        one stored uncompressed chunk; else None (use :meth:`read`). Writing to the view
        changes only this process's copy."""
        if self.codec is not None or self.bits or not _POSIX or self.count(region) != 1:
            return None
        pieces = list(self.chunks_of(region))
        coords, inner, _ = pieces[0]
        path = self.path(coords)
        try:
            with open_regular(path, "chunk") as f:
                raw = map_bytes(f.fileno(), 0, _check_size(f, self.chunk_nbytes, path))
        except FileNotFoundError:
            return None
        return raw.view(self.dtype).reshape(self.chunks)[inner]

    def _read_chunk(self, coords: tuple[int, ...], dest: np.ndarray) -> None:
        """Decode chunk ``coords`` into ``dest`` (a C-contiguous chunk-shaped array)."""
        path = self.path(coords)
        if self.bits:  # the packed bytes first, then unpacked into ``dest``
            flat = scratch("chunk-packed", (self.chunk_nbytes,), np.uint8)
            if not self._decode_into(path, flat, dest):
                return
            from ...kernels.packing import unpack_codes

            unpack_codes(flat, dest.size, self.bits, self.signed, dest.reshape(-1).view(np.uint8))
            return
        self._decode_into(path, dest.reshape(-1).view(np.uint8), dest)

    def _decode_into(self, path: str, flat: np.ndarray, dest: np.ndarray) -> bool:
        """The stored bytes of the chunk file ``path`` (decoded) into ``flat``; False (and
        ``dest`` filled with the fill value) when the chunk was never written."""
        try:
            with open_regular(path, "chunk") as f:
                if self.codec is None:  # straight into the caller's buffer
                    _check_size(f, flat.nbytes, path)
                    _read_exact(f, flat.data, path)
                    return True
                size = os.fstat(f.fileno()).st_size
                if size > 2 * flat.size + (64 << 10):  # no codec expands data that much
                    raise StoreError(
                        f"corrupt chunk {path}: {size} bytes stored for {flat.size} bytes of values"
                    )
                buf = scratch("chunk-bytes", (size,), np.uint8)
                _read_exact(f, buf.data, path)
        except FileNotFoundError:
            if self.required:
                raise missing_chunk(path) from None
            dest[...] = self.fill_value  # never written: the fill value, as zarr reads it
            return False
        # every decoder here accepts a frame that decodes to fewer bytes than ``out`` holds and
        # leaves the rest as it was: check the size the frame declares, and never decode more
        # than the chunk holds (a few bytes may declare gigabytes)
        try:
            declared = decode_bounded(self.codec, buf, flat)
        except StoreError as e:
            raise StoreError(f"corrupt chunk {path}: {e}") from None
        except Exception as e:
            raise StoreError(f"corrupt chunk {path}: {type(e).__name__}: {e}") from None
        if declared != flat.size:
            got = f"{declared}" if declared < flat.size else f"more than {flat.size}"
            raise StoreError(f"corrupt chunk {path}: decodes to {got} bytes, expected {flat.size}")
        return True

    # ---- writing

    def write(
        self,
        region: tuple[slice, ...],
        data: np.ndarray,
        made: set[str] | None = None,
        *,
        empty: bool = True,
    ) -> None:
        """Write ``data`` to ``region``, which must cover whole chunks (edge chunks may be
        short at the array's end: they are padded with the fill value, as zarr stores them).
        ``empty=False``: a chunk whose bytes are all zero, as is a fill value of 0, is not
        written (zarr's own writes leave such chunks out; they read as the fill value)."""
        for d, (s, c, n) in enumerate(zip(region, self.chunks, self.shape, strict=True)):
            if s.start % c or (s.stop % c and s.stop != n):
                raise ValueError(
                    f"region {region} is not aligned to chunks {self.chunks} (dim {d})"
                )
        data = np.asarray(data).view(self.dtype) if data.dtype != self.dtype else data
        made = set() if made is None else made  # folders known to exist
        skip_zero = not empty and self._zero_fill()
        for coords, inner, outer in self.chunks_of(region):
            src = data[outer]
            full = self._whole(inner)
            if not (full and src.flags.c_contiguous):
                chunk = scratch("chunk-write", self.chunks, self.dtype)
                if not full:
                    chunk[...] = self.fill_value
                chunk[inner] = src
                src = chunk
            payload = src.reshape(-1).view(np.uint8)
            if skip_zero and not payload.any():
                continue
            if self.bits:
                from ...kernels.packing import pack_codes

                packed = scratch("chunk-pack", (packed_nbytes(payload.size, self.bits),), np.uint8)
                pack_codes(payload, self.bits, packed)
                payload = packed
            if self.codec is not None:
                payload = self.codec.encode(payload)
            self._put(self.path(coords), payload, made)

    def _zero_fill(self) -> bool:
        """Whether the fill value's bytes are all zero (so an all-zero chunk is all fill)."""
        return not any(np.asarray(self.fill_value, self.dtype).tobytes())

    def _put(self, path: str, payload: Any, made: set[str]) -> None:
        """Write the chunk file ``path`` whole: a new file under a temporary name, then
        renamed, both relative to its folder's descriptor, opened from the root this process
        holds without following a link (:func:`~qstream.paths.opened`): a folder on the
        way swapped for a link, even while the write runs, is refused, never written
        through. (``made``: folders known to exist, made without a look at them first.)"""
        parent, name = os.path.split(path)
        view = memoryview(payload).cast("B")
        folder: Any
        if self.root_fd is not None and parent == self.root:
            folder = contextlib.nullcontext(self.root_fd)
        elif self.root_fd is not None:
            below = os.path.relpath(parent, self.root).split(os.sep)
            folder = opened_in(self.root_fd, self.root, below, create=True)
        else:
            folder = opened(parent, create=parent not in made)
        with folder as dfd:
            made.add(parent)
            # readers never see a torn chunk
            tmp = f"{name}.{os.getpid()}-{threading.get_ident()}{PARTIAL}" if self.atomic else name
            try:
                if not (
                    self.direct and len(view) >= DIRECT_MIN and self._write_direct(dfd, tmp, view)
                ):
                    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW | _CLOEXEC
                    fd = os.open(tmp, flags, 0o644, dir_fd=dfd)
                    try:
                        write_all(fd, view)
                    finally:
                        os.close(fd)
                if self.atomic:
                    os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except OSError as e:
                if self.atomic:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=dfd)
                what = "a link" if e.errno == errno.ELOOP else e
                raise StoreError(f"cannot write {path}: {what}") from None

    def _write_direct(self, dfd: int, name: str, view: memoryview) -> bool:
        """Write ``view`` to the new file ``name`` of the folder ``dfd`` with O_DIRECT (an
        aligned copy first if it is not aligned); False, and direct writes off, where the
        file system refuses them."""
        import fcntl

        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT | _NOFOLLOW | _CLOEXEC
        try:
            fd = os.open(name, flags, 0o644, dir_fd=dfd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise
            self.direct = False
            return False
        try:
            if np.frombuffer(view, np.uint8).ctypes.data % ALIGN:
                buf = scratch("direct-write", (len(view),), np.uint8)
                buf[...] = np.frombuffer(view, np.uint8)
                view = buf.data
            head = len(view) // ALIGN * ALIGN
            try:
                write_all(fd, view[:head])
            except OSError:  # e.g. EINVAL: alignment rules stricter than ALIGN
                self.direct = False
                os.lseek(fd, 0, os.SEEK_SET)
                head = 0
            # the unaligned tail (and any refused part) through the page cache
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            write_all(fd, view[head:])
        finally:
            os.close(fd)
        return True

    # ---- geometry

    def count(self, region: tuple[slice, ...]) -> int:
        """How many chunks ``region`` touches."""
        return math.prod(
            max(0, -(-s.stop // c) - s.start // c) if s.stop > s.start else 0
            for s, c in zip(region, self.chunks, strict=True)
        )

    def chunks_of(
        self, region: tuple[slice, ...]
    ) -> Iterator[tuple[tuple[int, ...], tuple[slice, ...], tuple[slice, ...]]]:
        """(chunk coords, slice inside the chunk, slice inside the region) for each chunk
        that ``region`` touches."""
        ranges = [
            range(s.start // c, -(-s.stop // c)) if s.stop > s.start else range(0)
            for s, c in zip(region, self.chunks, strict=True)
        ]
        for coords in itertools.product(*ranges):
            inner, outer = [], []
            for k, s, c in zip(coords, region, self.chunks, strict=True):
                lo = max(s.start, k * c)
                hi = min(s.stop, (k + 1) * c)
                inner.append(slice(lo - k * c, hi - k * c))
                outer.append(slice(lo - s.start, hi - s.start))
            yield coords, tuple(inner), tuple(outer)


def missing_chunk(path: str) -> StoreError:
    """The refusal of the absent chunk ``path`` of an array whose every chunk was written."""
    return StoreError(
        f"missing chunk {path}: qstream writes every chunk of a finished output's codes and"
        " scales; the output is damaged: make it again (the quantize or convert that wrote"
        " it, overwriting it)"
    )


def chunk_files(arr: Any, *, required: bool = False) -> ChunkFiles | None:
    """Direct access to ``arr``'s chunk files, or None where zarr must do the work.
    ``required``: every chunk was written, so an absent one is refused (see
    :attr:`ChunkFiles.required`)."""
    try:
        import zarr
    except ImportError:  # pragma: no cover - zarr is a dependency
        return None
    if getattr(arr, "store_path", None) is None:  # (a packed tensor's slot: see io.packs)
        return None
    store = arr.store_path.store
    if not isinstance(store, zarr.storage.LocalStore) or getattr(arr, "shards", None):
        return None
    if arr.filters or not arr.shape:
        return None
    dtype = np.dtype(arr.dtype)
    meta = arr.metadata
    bits, signed = 0, False
    if meta.zarr_format == 3:
        from zarr.codecs import BytesCodec

        from ..zarr_types.zarr_ext import PackBits

        ser = arr.serializer
        if isinstance(ser, PackBits):
            if ser.padding_encoding != "none":
                return None
            zdt = meta.data_type
            bits, signed = zdt.bits, zdt.signed
        elif not isinstance(ser, BytesCodec):
            return None
        else:
            # configurations through to_dict(): zarr 3.1 holds enums, zarr 3.4 strings
            endian = codec_config(ser).get("endian")
            if endian not in ("little", None) and not (endian == "big" and dtype.itemsize == 1):
                return None
        codec = numcodecs_of(arr.compressors)
    else:
        if meta.order != "C":
            return None
        comps = arr.compressors
        codec = comps[0] if len(comps) == 1 else None
        if len(comps) > 1 or (codec is not None and not is_bounded(codec)):
            return None  # (zarr decodes what qstream cannot decode with a bound)
    if codec is False:
        return None
    if not bits and ((dtype.itemsize > 1 and dtype.byteorder == ">") or dtype.kind not in "biuf"):
        return None
    fill = arr.fill_value
    root = os.path.join(str(store.root), arr.store_path.path)
    return ChunkFiles(
        root=root,
        shape=tuple(int(d) for d in arr.shape),
        chunks=tuple(int(c) for c in arr.chunks),
        dtype=dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype,
        fill_value=0 if fill is None else fill,
        codec=codec,
        encode_key=meta.encode_chunk_key,
        bits=bits,
        signed=signed,
        required=required,
    )


def _check_size(f: Any, nbytes: int, path: str) -> int:
    """The size of the open chunk file ``f``, which must be ``nbytes`` (uncompressed)."""
    size = os.fstat(f.fileno()).st_size
    if size != nbytes:
        raise StoreError(f"corrupt chunk {path}: {size} bytes, expected {nbytes}")
    return size


def _read_exact(f: Any, view: memoryview, path: str) -> None:
    while view:
        n = f.readinto(view)
        if not n:
            raise StoreError(f"corrupt chunk {path}: the file ended early")
        view = view[n:]
