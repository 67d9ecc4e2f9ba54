"""Bit packing of sub-byte values, the layout of zarr-extensions' ``packbits`` codec: element
``i`` at bits ``[i*k, (i+1)*k)`` of the byte sequence, least-significant bit first. Used by the
direct chunk I/O path and by the zarr codec (:mod:`qstream.io.zarr_types.zarr_ext`); one chunk per
call,
``nogil`` (worker threads pack and unpack their chunks at once). The loops are written out
per width (4 and 2 bits) so that LLVM vectorises them."""

from __future__ import annotations

import numpy as np

from .runtime import njit


@njit(cache=True, nogil=True)
def _pack4(src, out):
    n = src.size
    for i in range(n // 2):
        out[i] = (src[2 * i] & 15) | ((src[2 * i + 1] & 15) << 4)
    if n % 2:
        out[n // 2] = src[n - 1] & 15


@njit(cache=True, nogil=True)
def _pack2(src, out):
    n = src.size
    for i in range(n // 4):
        k = 4 * i
        out[i] = (
            (src[k] & 3)
            | ((src[k + 1] & 3) << 2)
            | ((src[k + 2] & 3) << 4)
            | ((src[k + 3] & 3) << 6)
        )
    if n % 4:
        acc = 0
        for j in range(n % 4):
            acc |= (src[n - n % 4 + j] & 3) << (2 * j)
        out[n // 4] = acc


@njit(cache=True, nogil=True)
def _unpack4(src, n, signed, out):
    # sign extension of a 4-bit code c: ((c ^ 8) - 8), as a byte
    x = np.uint8(8) if signed else np.uint8(0)
    for i in range(n // 2):
        b = src[i]
        out[2 * i] = ((b & 15) ^ x) - x
        out[2 * i + 1] = ((b >> 4) ^ x) - x
    if n % 2:
        out[n - 1] = ((src[n // 2] & 15) ^ x) - x


@njit(cache=True, nogil=True)
def _unpack2(src, n, signed, out):
    x = np.uint8(2) if signed else np.uint8(0)
    for i in range(n // 4):
        b = src[i]
        out[4 * i] = ((b & 3) ^ x) - x
        out[4 * i + 1] = (((b >> 2) & 3) ^ x) - x
        out[4 * i + 2] = (((b >> 4) & 3) ^ x) - x
        out[4 * i + 3] = ((b >> 6) ^ x) - x
    for j in range(n % 4):
        out[n - n % 4 + j] = (((src[n // 4] >> (2 * j)) & 3) ^ x) - x


def pack_codes(src: np.ndarray, bits: int, out: np.ndarray) -> None:
    """Pack the low ``bits`` (4 or 2) bits of each byte of ``src`` (uint8, 1-d) into ``out``
    (uint8, ``ceil(src.size * bits / 8)`` bytes), least-significant bits first."""
    (_pack4 if bits == 4 else _pack2)(src, out)


def unpack_codes(src: np.ndarray, n: int, bits: int, signed: bool, out: np.ndarray) -> None:
    """The first ``n`` ``bits``-bit codes of ``src`` (uint8) into ``out`` (uint8, one per
    byte), sign-extended (as int8 bytes) when ``signed``."""
    (_unpack4 if bits == 4 else _unpack2)(src, n, signed, out)
