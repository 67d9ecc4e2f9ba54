"""Float bit patterns in kernels: integer tests and integer min/max that LLVM vectorises.

Numba lowers a float ``min``/``max`` to a compare-and-select that the loop vectoriser leaves
scalar, and fast-math flags may fold a float ``isfinite`` away; integer operations on the bit
patterns have neither problem.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .runtime import njit

EXP = np.int64(0x7FF0000000000000)  # float64 exponent bits
MAG = np.int64(0x7FFFFFFFFFFFFFFF)  # every bit but the sign
KEY_MAX = np.int64(0x7FFFFFFFFFFFFFFF)
KEY_MIN = np.int64(-0x7FFFFFFFFFFFFFFF - 1)
# the order keys of -/+ the largest finite float64: NaN and infinities have keys beyond these
FINITE_KEY_MIN = np.int64(-0x7FF0000000000000)
FINITE_KEY_MAX = np.int64(0x7FEFFFFFFFFFFFFF)


@intrinsic
def bits(typingctx, v):
    """The bit pattern of a float64 as an int64."""
    sig = types.int64(types.float64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return sig, codegen


@intrinsic
def from_bits(typingctx, v):
    """The float64 whose bit pattern is the int64 ``v``."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return sig, codegen


@njit(inline="always", cache=True)
def nonfinite(x):
    """1 if the float64 ``x`` is NaN or +-inf, else 0 (its exponent bits are all ones)."""
    return np.int32((bits(x) & EXP) == EXP)


@njit(inline="always", cache=True)
def order_key(x):
    """An int64 that orders like the float64 ``x`` (for finite values and infinities)."""
    b = bits(x)
    return b ^ ((b >> 63) & MAG)


@njit(inline="always", cache=True)
def from_order_key(k):
    """The float64 whose :func:`order_key` is ``k``."""
    return from_bits(k ^ ((k >> 63) & MAG))


# The same for float32 on int32 keys: twice the lanes per vector where the input is float32.
MAG32 = np.int32(0x7FFFFFFF)
KEY32_MAX = np.int32(0x7FFFFFFF)
KEY32_MIN = np.int32(-0x80000000)
FINITE_KEY32_MIN = np.int32(-0x7F800000)  # the order key of -3.4028235e38
FINITE_KEY32_MAX = np.int32(0x7F7FFFFF)


@intrinsic
def bits32(typingctx, v):
    """The bit pattern of a float32 as an int32."""
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def from_bits32(typingctx, v):
    """The float32 whose bit pattern is the int32 ``v``."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@njit(inline="always", cache=True)
def order_key32(x):
    """An int32 that orders like the float32 ``x`` (for finite values and infinities)."""
    b = bits32(x)
    return b ^ ((b >> np.int32(31)) & MAG32)


@njit(inline="always", cache=True)
def from_order_key32(k):
    """The float32 whose :func:`order_key32` is ``k``."""
    return from_bits32(k ^ ((k >> np.int32(31)) & MAG32))
