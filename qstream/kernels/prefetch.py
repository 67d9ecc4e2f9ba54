"""A cache prefetch hint for kernels (Numba has none): ``llvm.prefetch`` on an element's
address."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def prefetch(typingctx, arr, i):
    """Hint the CPU to bring element ``i`` of the contiguous array ``arr`` (counted from its
    first element, possibly past its end: a prefetch never faults) into its caches.

    For kernels that make two passes over a row, one bound by memory and one by arithmetic:
    prefetching the next row during the arithmetic lets the two overlap."""
    sig = types.void(arr, i)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        p = builder.bitcast(builder.gep(a.data, [args[1]]), i8p)
        # a read, kept in every cache level, of data
        builder.call(fn, [p, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen
