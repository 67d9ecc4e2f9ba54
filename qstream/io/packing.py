"""Bit packing of sub-byte values (pure NumPy): the byte layout of zarr-extensions'
``packbits`` codec with ``padding_encoding: "none"``."""

from __future__ import annotations

import numpy as np


def packed_nbytes(n: int, bits: int) -> int:
    """Bytes of ``n`` packed ``bits``-bit elements (without a padding byte)."""
    return (n * bits + 7) // 8


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """The ``bits``-bit codes (low bits of each byte of ``codes``, any shape, C order) packed
    into bytes, least-significant bits first."""
    flat = np.ascontiguousarray(codes).reshape(-1).view(np.uint8)
    per = 8 // bits
    n = flat.size
    whole = n - n % per
    out = np.zeros(packed_nbytes(n, bits), np.uint8)
    mask = np.uint8((1 << bits) - 1)
    body = flat[:whole].reshape(-1, per)
    acc = out[: whole // per]
    for j in range(per):
        acc |= (body[:, j] & mask) << np.uint8(j * bits)
    for j in range(n - whole):  # the last, partial byte
        out[-1] |= (flat[whole + j] & mask) << np.uint8(j * bits)
    return out


def unpack(raw: np.ndarray, n: int, bits: int, signed: bool, out: np.ndarray) -> np.ndarray:
    """The first ``n`` ``bits``-bit codes of ``raw`` into ``out`` (one byte each, an
    ``int8``/``uint8``-sized array), sign-extended when ``signed``."""
    per = 8 // bits
    dst = out.reshape(-1).view(np.uint8)
    mask = np.uint8((1 << bits) - 1)
    whole = n - n % per
    body = dst[:whole].reshape(-1, per)
    src = raw[: whole // per]
    for j in range(per):
        body[:, j] = (src >> np.uint8(j * bits)) & mask
    for j in range(n - whole):
        dst[whole + j] = (raw[whole // per] >> np.uint8(j * bits)) & mask
    if signed:
        s = dst[:n].view(np.int8)
        half = np.int8(1 << (bits - 1))
        np.subtract(s ^ half, half, out=s)  # sign-extend: (c ^ half) - half
    return out
