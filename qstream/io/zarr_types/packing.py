"""Sizes of bit-packed sub-byte values (the byte layout of zarr-extensions' ``packbits`` codec,
``padding_encoding: "none"``; the packing itself is :mod:`qstream.kernels.packing`)."""

from __future__ import annotations


def packed_nbytes(n: int, bits: int) -> int:
    """Bytes of ``n`` packed ``bits``-bit elements (without a padding byte)."""
    return (n * bits + 7) // 8
