"""Compressed chunks of the direct chunk I/O path (:mod:`qstream.io.storage.chunks`), decoded with a
bound.

A Zarr v3 compressor is read through its numcodecs equivalent (:func:`numcodecs_of`), and a
chunk is decoded into the caller's buffer only when it decodes to exactly that buffer's size:
codecs whose frames declare their size (zstd, blosc, lz4) are checked before decoding, stream
formats (zlib, gzip, bz2, lzma) are decoded with a bound. A few crafted bytes can declare
gigabytes; they are refused without ever being decoded (:func:`decode_bounded`).

qstream's own zstd chunks (zarr's default compressor, which every conversion writes) go
through :class:`ZstdFrames`, on the ``zstandard`` package: it loads in ~1 ms, where numcodecs'
package imports every codec it has and scans the installed packages' entry points first
(20-35 ms, a tenth of the bundled sample's conversion).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import zstandard

from ...errors import StoreError
from .compression import codec_config

_contexts = threading.local()  # each thread's compressors, by (level, checksum)


@dataclass(frozen=True)
class ZstdFrames:
    """zstd frames as ``numcodecs.Zstd(level, checksum)`` writes them (zarr's ``zstd`` codec:
    one frame declaring its content size; the same bytes for the same libzstd), encoded and
    decoded with ``zstandard``."""

    level: int = 0
    checksum: bool = False
    codec_id = "zstd"  # (numcodecs' name for the codec: errors say it)

    def encode(self, buf: Any) -> bytes:
        """One frame holding ``buf``'s bytes."""
        key = (self.level, self.checksum)
        made = getattr(_contexts, "made", None)
        if made is None:
            made = _contexts.made = {}
        cctx = made.get(key)
        if cctx is None:
            cctx = made[key] = zstandard.ZstdCompressor(
                level=self.level, write_checksum=self.checksum, write_content_size=True
            )
        return cctx.compress(memoryview(buf).cast("B"))

    def decode(self, buf: Any, out: np.ndarray | None = None) -> Any:
        """The bytes of the frame ``buf`` (into ``out`` when given: exactly its size)."""
        b = memoryview(buf).cast("B")
        size = _zstd_content_size(b)
        flat = None if out is None else out.reshape(-1).view(np.uint8)
        if size is None:
            raise StoreError("its zstd frame does not declare its size")
        if flat is not None and size != flat.size:
            raise StoreError(f"its zstd frame declares {size} bytes, not {flat.size}")
        data = zstandard.ZstdDecompressor().decompress(b, max_output_size=size)
        if flat is None:
            return data
        flat[...] = np.frombuffer(data, np.uint8)
        return out


def numcodecs_of(compressors: Any) -> Any:
    """The numcodecs equivalent of a Zarr v3 compressor chain: None (no compressor), a codec,
    or False (not reproducible here)."""
    if not compressors:
        return None
    if len(compressors) > 1:
        return False
    import numcodecs
    from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

    c = compressors[0]
    cfg = codec_config(c)
    if isinstance(c, ZstdCodec):
        return numcodecs.Zstd(level=cfg.get("level", 0), checksum=cfg.get("checksum", False))
    if isinstance(c, GzipCodec):
        return _gzip_codec(cfg.get("level", 5))
    if isinstance(c, BloscCodec):
        shuffle = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}[cfg["shuffle"]]
        return numcodecs.Blosc(  # typesize: chunks are encoded as bytes, shuffled as zarr does
            cname=cfg["cname"],
            clevel=cfg["clevel"],
            shuffle=shuffle,
            blocksize=cfg["blocksize"],
            typesize=cfg.get("typesize"),
        )
    return False


def _gzip_codec(level: int) -> Any:
    """numcodecs' GZip at ``level``, whose chunks carry no time: gzip's header has a field for
    the time it was written, which numcodecs fills with the clock, so two runs (or a resumed
    one) would write different bytes for the same codes; here it is 0, as gzip allows ("no
    time stamp is available"). Decoding is numcodecs'."""
    import gzip

    import numcodecs
    from numcodecs.compat import ensure_contiguous_ndarray

    class GZipNoTime(numcodecs.GZip):  # type: ignore[misc]
        def encode(self, buf: Any) -> bytes:
            return gzip.compress(
                ensure_contiguous_ndarray(buf).data.cast("B"),
                compresslevel=self.level,
                mtime=0,
            )

        def __reduce__(self) -> tuple[Any, tuple[int]]:  # (sent to a worker process: remade)
            return _gzip_codec, (self.level,)

    return GZipNoTime(level=level)


def is_bounded(codec: Any) -> bool:
    """Whether :func:`decode_bounded` decodes ``codec``'s chunks."""
    if isinstance(codec, ZstdFrames):
        return True
    import numcodecs

    known = (numcodecs.Zlib, numcodecs.GZip, numcodecs.BZ2, numcodecs.LZMA, numcodecs.Zstd)
    return isinstance(codec, (*known, numcodecs.Blosc, numcodecs.LZ4))


def decode_bounded(codec: Any, buf: np.ndarray, flat: np.ndarray) -> int:
    """Decode ``buf`` into ``flat`` (when it decodes to exactly ``flat``'s size) and return
    the size it decodes to, without ever decoding more than ``flat.size + 1`` bytes: codecs
    whose frames declare their size (zstd, blosc, lz4) are checked first, stream formats
    (zlib, gzip, bz2, lzma) are decoded with a bound. A frame that declares nothing (a zstd
    frame without a content size) is refused."""
    make = None if isinstance(codec, ZstdFrames) else _stream_of(codec)
    if make is not None:
        d = make()
        out = d.decompress(buf.data.cast("B"), flat.size + 1)
        if len(out) == flat.size:
            flat[...] = np.frombuffer(out, np.uint8)
        return len(out)
    declared = _declared_size(codec, buf)
    if declared is None:
        name = getattr(codec, "codec_id", type(codec).__name__)  # (numcodecs' ids: zstd, lz4)
        raise StoreError(f"its {name} frame does not declare its size")
    if declared == flat.size:
        codec.decode(buf, out=flat)
    return declared


def _stream_of(codec: Any) -> Callable[[], Any] | None:
    """A bounded decoder's maker for a numcodecs stream codec (zlib, gzip, bz2, lzma), else
    None."""
    import bz2
    import lzma
    import zlib

    import numcodecs

    streams: dict[type, Callable[[], Any]] = {
        numcodecs.Zlib: lambda: zlib.decompressobj(),
        numcodecs.GZip: lambda: zlib.decompressobj(16 + zlib.MAX_WBITS),
        numcodecs.BZ2: bz2.BZ2Decompressor,
        numcodecs.LZMA: lzma.LZMADecompressor,
    }
    return next((m for t, m in streams.items() if isinstance(codec, t)), None)


def _declared_size(codec: Any, buf: np.ndarray) -> int | None:
    """The decoded size a compressed chunk declares in its header (zstd frame content size,
    blosc header, lz4 prefix), or None when the format does not say."""
    b = buf.data.cast("B")
    if isinstance(codec, ZstdFrames):
        return _zstd_content_size(b)
    import numcodecs

    if isinstance(codec, numcodecs.Zstd):
        return _zstd_content_size(b)
    if isinstance(codec, numcodecs.Blosc) and len(b) >= 16:
        return int.from_bytes(b[4:8], "little")
    if isinstance(codec, numcodecs.LZ4) and len(b) >= 4:
        return int.from_bytes(b[:4], "little")
    return None


def _zstd_content_size(b: memoryview) -> int | None:
    """The frame content size of a single zstd frame (RFC 8878, 3.1.1.1), or None."""
    if len(b) < 6 or bytes(b[:4]) != b"\x28\xb5\x2f\xfd":
        return None
    fhd = b[4]
    fcs_flag, single, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    size = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if size == 0 or len(b) < pos + size:
        return None
    value = int.from_bytes(b[pos : pos + size], "little")
    return value + 256 if size == 2 else value
