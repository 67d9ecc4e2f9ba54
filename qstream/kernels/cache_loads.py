"""Loading a kernel from Numba's on-disk cache without Numba's compiler set-up.

Before Numba loads a kernel from its cache it "refreshes" its CPU target: it imports some
forty of its own modules (its implementations of Python and NumPy: ``numba.np.arraymath``,
``numba.cpython.unicode``, ...) and installs their typing and lowering registries, 0.1-0.45 s
of the first kernel call of every process, which is most of what a small job waits for. All
of that serves *compiling* (typing and lowering new code, which does its own refresh first);
a cached kernel is machine code that needs only Numba's runtime (``rtsys``, set up here as
Numba does) and the symbols its object code links to.

:func:`lean_load` reads the cached kernel, lists the symbols its object code leaves undefined
(an ELF reader, :func:`undefined_symbols`), runs the kernel's own load-time set-up (a parallel
kernel's threading layer) and, when LLVM finds every one of those symbols already, loads it
without the refresh; anything else (another object format, a symbol not there yet) takes
Numba's whole path. The kernel loaded is the same machine code either way: a conversion's
every output file is the same (tests/cli/test_lean_kernel_loads.py). Every qstream kernel's
cache loads so (:func:`qstream.kernels.runtime.njit`); other Numba functions of the process
are left as they are. ``LEAN = False`` turns it off (Numba's own path for every load).
"""

from __future__ import annotations

import struct
from typing import Any

from numba.core.caching import FunctionCache

#: whether qstream's kernels load lean (False: as Numba loads them)
LEAN = True


class LeanCache(FunctionCache):
    """Numba's on-disk cache of one qstream kernel, loading a build with :func:`lean_load`."""

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        """The build of ``sig`` in the cache, or None (then Numba compiles, refreshing)."""
        if not LEAN:
            return super().load_overload(sig, target_context)
        return lean_load(self, sig, target_context)


def lean(dispatcher: Any) -> Any:
    """``dispatcher`` with its cache a :class:`LeanCache` (unchanged when it has no on-disk
    cache, or a cache of another kind, or this Numba's cache lacks a part used here)."""
    cache = getattr(dispatcher, "_cache", None)
    if type(cache) is FunctionCache and all(hasattr(cache, a) for a in _PARTS):
        cache.__class__ = LeanCache
    return dispatcher


# the parts of Numba's cache lean_load uses
_PARTS = (
    "_load_overload",
    "_index_key",
    "_guard_against_spurious_io_errors",
    "_enabled",
    "_cache_file",
    "_impl",
)


def lean_load(cache: Any, sig: Any, target_context: Any) -> Any:
    """What Numba's ``Cache.load_overload`` returns, without its refresh of
    ``target_context`` where the cached kernel links as it is (:func:`links_as_it_is`)."""
    from numba.core.cpu import CPUContext
    from numba.core.runtime import rtsys

    if not isinstance(target_context, CPUContext):
        return FunctionCache.load_overload(cache, sig, target_context)
    rtsys.initialize(target_context)  # (Numba's runtime: what every kernel links to)
    with cache._guard_against_spurious_io_errors():
        if not cache._enabled:
            return None
        data = cache._cache_file.load(cache._index_key(sig, target_context.codegen()))
        if data is None:
            return None
        if not links_as_it_is(data):
            target_context.refresh()  # (what Numba always does first)
        return cache._impl.rebuild(target_context, data)


def links_as_it_is(payload: Any) -> bool:
    """Whether a cached kernel (Numba's ``CompileResult`` payload: its library first, the
    functions to run when it is loaded eighth) needs no symbol but those the process already
    has: every symbol its object code leaves undefined is found by LLVM's own look-up once
    the load's own set-up (``reload_init``: the threading layer of a parallel kernel) has run.
    False for anything else (another payload or object format): the caller then sets
    Numba's target up in full, as Numba does."""
    try:
        (_name, kind, (obj, _bitcode)), *rest = payload
        reload_init = rest[6]
    except (TypeError, ValueError, IndexError):
        return False
    if kind != "object" or not isinstance(obj, bytes):
        return False
    names = undefined_symbols(obj)
    if names is None:
        return False
    for fn in reload_init or ():
        fn()
    import llvmlite.binding as ll

    return all(ll.address_of_symbol(n) for n in names)


def undefined_symbols(obj: bytes) -> list[str] | None:
    """The names of the symbols an ELF64 little-endian object file leaves undefined (weak
    ones aside: the linker may leave those null), or None if ``obj`` is not one."""
    if obj[:6] != b"\x7fELF\x02\x01" or len(obj) < 64:
        return None
    try:
        (shoff,) = struct.unpack_from("<Q", obj, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
        sections = [
            struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)
        ]
        names: list[str] = []
        for sh in sections:
            if sh[1] != 2:  # SHT_SYMTAB
                continue
            strtab = sections[sh[6]]
            s0, offset, size, entsize = strtab[4], sh[4], sh[5], sh[9] or 24
            for k in range(1, size // entsize):  # (symbol 0 is the null symbol)
                st_name, st_info, _, st_shndx, _, _ = struct.unpack_from(
                    "<IBBHQQ", obj, offset + k * entsize
                )
                if st_shndx == 0 and st_name and st_info >> 4 != 2:  # undefined, not weak
                    end = obj.index(b"\0", s0 + st_name)
                    names.append(obj[s0 + st_name : end].decode())
        return names
    except (struct.error, IndexError, ValueError, UnicodeDecodeError):
        return None
