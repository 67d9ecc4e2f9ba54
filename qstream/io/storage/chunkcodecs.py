"""Compressed chunks of the direct chunk I/O path (:mod:`qstream.io.storage.chunks`), decoded with a
bound.

A Zarr v3 compressor is read through its numcodecs equivalent (:func:`numcodecs_of`), and a
chunk is decoded into the caller's buffer only when it decodes to exactly that buffer's size:
codecs whose frames declare their size (zstd, blosc, lz4) are checked before decoding, stream
formats (zlib, gzip, bz2, lzma) are decoded with a bound. A few crafted bytes can declare
gigabytes; they are refused without ever being decoded (:func:`decode_bounded`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import StoreError
from .compression import codec_config


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
        return numcodecs.GZip(level=cfg.get("level", 5))
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


def is_bounded(codec: Any) -> bool:
    """Whether :func:`decode_bounded` decodes ``codec``'s chunks."""
    import numcodecs

    known = (numcodecs.Zlib, numcodecs.GZip, numcodecs.BZ2, numcodecs.LZMA, numcodecs.Zstd)
    return isinstance(codec, (*known, numcodecs.Blosc, numcodecs.LZ4))


def decode_bounded(codec: Any, buf: np.ndarray, flat: np.ndarray) -> int:
    """Decode ``buf`` into ``flat`` (when it decodes to exactly ``flat``'s size) and return
    the size it decodes to, without ever decoding more than ``flat.size + 1`` bytes: codecs
    whose frames declare their size (zstd, blosc, lz4) are checked first, stream formats
    (zlib, gzip, bz2, lzma) are decoded with a bound. A frame that declares nothing (a zstd
    frame without a content size) is refused."""
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
    make = next((m for t, m in streams.items() if isinstance(codec, t)), None)
    if make is not None:
        d = make()
        out = d.decompress(buf.data.cast("B"), flat.size + 1)
        if len(out) == flat.size:
            flat[...] = np.frombuffer(out, np.uint8)
        return len(out)
    declared = _declared_size(codec, buf)
    if declared is None:
        raise StoreError(f"its {type(codec).__name__} frame does not declare its size")
    if declared == flat.size:
        codec.decode(buf, out=flat)
    return declared


def _declared_size(codec: Any, buf: np.ndarray) -> int | None:
    """The decoded size a compressed chunk declares in its header (zstd frame content size,
    blosc header, lz4 prefix), or None when the format does not say."""
    import numcodecs

    b = buf.data.cast("B")
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
