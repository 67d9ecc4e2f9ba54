"""The ``qstream`` process's own housekeeping: its cycle collector run rarely, its freed
memory kept for reuse, Numba's probes for SciPy's BLAS and for CFFI skipped, its cached
kernels loaded without Numba's compiler set-up, and its end
quick once a command is done. Only the console script (:func:`cli.main.console`)
does these, for the process it owns.

Python's cycle collector runs every 700 new container objects and, now and then, walks every
object of the process; after Numba is loaded that is hundreds of thousands of them. A
conversion of 16,384 tensors spent 0.5-0.75 s in it (1024 tensors: 0.2 s), almost all of it
in full collections, without freeing memory worth having (its peak RSS is the same with the
collector off). :func:`collect_rarely` sets the objects already there aside
(``gc.freeze``) and collects the young ones every 50,000 new objects instead: 0.06-0.1 s.
Memory is still freed by reference counts as before; only cycles wait longer, and there are
few: a whole 16,384-tensor conversion leaves 1,258 objects in cycles (0.4 MB), mostly classes
made once.

glibc's ``malloc`` gives blocks of more than 128 KiB their own pages and returns them to the
system when freed, so the next such block is fresh pages again, each zeroed by the kernel on
first touch (up to 2.6 s a GiB on the 2-core test machine). A pack of a 16,384-tensor
checkpoint has 32,768 channels, and its per-channel sums and partials are such blocks: 185,000
page faults against 39,000 for the same bytes as 1024 tensors. :func:`keep_freed_memory` has
``malloc`` keep blocks up to 32 MiB in its heap, and up to 32 MiB free at the heap's top
before giving memory back: 56,000 faults, about 1 s less, and the same peak RSS (a freed
block is reused, not added to). A streaming job holds a little more (a percentile job of
1 GiB at ``--max-memory 256MB``: 292-296 MB against 251-260 MB) and runs faster (2.7-3.1 s
against 3.5-3.7 s). The time it saves is what those faults cost, which varies with the
machine's state; it never changes an output.

When Numba first runs a kernel, it sets up its CPU target, and ``numba.np.arraymath`` then
probes for BLAS (its ``np.dot`` and ``@``) by importing ``scipy.linalg.cython_blas``. Where
SciPy is installed that imports all of ``scipy.linalg``, whose array-API layer walks every
attribute of NumPy (importing ``numpy.f2py`` on the way): 0.1-0.15 s of a 1.8 s conversion,
in every process. Likewise ``numba.core.typing.cffi_utils`` imports ``cffi`` and makes an
``FFI()`` (loading ``pycparser``: 20-25 ms) so that kernels may call CFFI functions. No
qstream kernel uses BLAS or CFFI, and qstream imports neither SciPy nor CFFI.
:func:`skip_numba_probes` makes those imports, from those probes only, fail as if the
packages were absent: Numba then leaves ``np.dot``, ``@`` and CFFI calls unsupported in this
process (as it does without them), and ``import scipy.linalg`` or ``import cffi`` still works
for anyone else, later too.

Before Numba loads a kernel from its cache it "refreshes" its CPU target: it imports some
forty of its own modules (its implementations of Python and NumPy: ``numba.np.arraymath``,
``numba.cpython.unicode``, ...) and installs their typing and lowering registries, 0.35-0.45 s
of the first kernel call of every process (0.56 s of it, against 0.12 s without, on the
2-core test machine), which is most of what a small job waits for. All of that serves
*compiling* (typing and lowering new code, which does its own refresh first); a cached
kernel is machine code that needs only Numba's runtime (``rtsys``, set up here as Numba
does) and the symbols its object code links to. :func:`load_kernels_lean` has
``Cache.load_overload`` read the cached kernel, list the symbols its object code leaves
undefined (an ELF reader, :func:`undefined_symbols`), run the kernel's own load-time set-up
(a parallel kernel's threading layer) and, when LLVM finds every one of those symbols
already, load it without the refresh; anything else (another object format, a symbol not
there yet) takes Numba's whole path. The kernel loaded is the same machine code either way:
a conversion's every output file is the same (tests/cli/test_lean_kernel_loads.py).

After a command, the interpreter's own shutdown (freeing every module, Numba's and LLVM's
objects) takes 0.2-0.4 s, as long as a small conversion's work. Nothing of it is needed: the
command has closed its files. :func:`leave` does what a normal exit does that matters (runs
the ``atexit`` handlers, flushes stdout and stderr) and then ends the process with
``os._exit``. It takes the normal exit where it cannot be sure: while another thread still
runs (Python waits for it), or where ``atexit`` cannot be run early.

Only the console script (:func:`cli.main.console`) leaves so; ``main()`` raises
``SystemExit`` as before, for callers that go on after it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib.util
import os
import struct
import sys
import threading
from typing import Any, NoReturn

#: gc thresholds of the console script: young objects every 50,000 new ones; the oldest
#: generation only after 50 x 1000 of those
THRESHOLDS = (50_000, 50, 1000)


def collect_rarely() -> None:
    """Set the objects of the start-up aside from the cycle collector and run it rarely
    (:data:`THRESHOLDS`): for the console script, whose process ends with its command."""
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (glibc's malloc.h)
#: blocks up to this size come from malloc's heap (glibc's largest allowed)
MMAP_THRESHOLD = 32 << 20
#: free memory at the heap's top is given back only above this (bounded: a long streaming
#: job's heap does not keep what its largest moment needed)
TRIM_THRESHOLD = 32 << 20


def keep_freed_memory() -> bool:
    """Have glibc's ``malloc`` reuse freed blocks of up to 32 MiB instead of returning them
    to the system at once; whether it was set (False off glibc, or when ``GLIBC_TUNABLES`` already
    sets malloc's own tunables, which are left as they are)."""
    if not sys.platform.startswith("linux") or "glibc.malloc" in os.environ.get(
        "GLIBC_TUNABLES", ""
    ):
        return False
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version"):  # (only glibc's mallopt takes these)
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


#: the imports Numba makes only to probe for support no qstream kernel uses: the module
#: imported -> the (module, function) of Numba that imports it ("<module>": at its top level)
NUMBA_PROBES = {
    "scipy.linalg": ("numba.np.arraymath", "_check_blas"),  # np.dot and @ (BLAS)
    "cffi": ("numba.core.typing.cffi_utils", "<module>"),  # CFFI functions in kernels
}


class _NoNumbaProbes:
    """An import finder that fails each import of :data:`NUMBA_PROBES` made by its probe,
    once; it is gone once both have been; no other import is touched."""

    def __init__(self) -> None:
        self.waiting = dict(NUMBA_PROBES)

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        prober = self.waiting.get(name)
        if prober is None:
            return None
        frame = sys._getframe(1)
        while frame is not None:
            if (frame.f_globals.get("__name__"), frame.f_code.co_name) == prober:
                del self.waiting[name]
                if not self.waiting:
                    with contextlib.suppress(ValueError):
                        sys.meta_path.remove(self)  # type: ignore[arg-type]
                raise ImportError(f"Numba's probe for {name} is skipped in the qstream command")
            frame = frame.f_back  # type: ignore[assignment]
        return None


def skip_numba_probes() -> bool:
    """Have Numba's probes for BLAS and CFFI find none, without importing SciPy or CFFI
    (see the module's docstring); whether the probes are still to come (False: Numba's CPU
    target is set up already, or those packages are imported already)."""
    probers = {module for module, _ in NUMBA_PROBES.values()}
    if any(m in sys.modules for m in (*NUMBA_PROBES, *probers)):
        return False
    if not any(isinstance(f, _NoNumbaProbes) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoNumbaProbes())  # type: ignore[arg-type]
    return True


#: the Numba module whose ``Cache.load_overload`` :func:`load_kernels_lean` replaces
NUMBA_CACHING = "numba.core.caching"


def load_kernels_lean() -> bool:
    """Have Numba load a cached kernel without first setting up what only compiling needs
    (see the module's docstring); whether it will (False: this Numba's cache has not the
    form this was written for, and it loads as it always did). Numba's cache module is
    changed when it is imported (at once if it is already)."""
    module = sys.modules.get(NUMBA_CACHING)
    if module is not None:
        return _lean_loads(module)
    if not any(isinstance(f, _AfterNumbaCaching) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterNumbaCaching())  # type: ignore[arg-type]
    return True


class _AfterNumbaCaching:
    """An import finder that lets :data:`NUMBA_CACHING` load as usual, then changes it
    (:func:`_lean_loads`); it is gone after that one import."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> Any:
        if name != NUMBA_CACHING:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)  # type: ignore[arg-type]
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenLean(spec.loader)  # type: ignore[assignment]
        return spec


class _ThenLean:
    """A module loader that runs ``loader``'s module, then :func:`_lean_loads` on it."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        _lean_loads(module)

    def __getattr__(self, name: str) -> Any:  # (get_source, get_code, ...: the loader's)
        return getattr(self.loader, name)


def _lean_loads(caching: Any) -> bool:
    """Replace ``caching.Cache.load_overload`` (see :func:`load_kernels_lean`), where this
    Numba's cache has the parts it uses."""
    cache = getattr(caching, "Cache", None)
    parts = ("load_overload", "_load_overload", "_index_key", "_guard_against_spurious_io_errors")
    if cache is None or not all(hasattr(cache, p) for p in parts):
        return False
    if getattr(cache.load_overload, "qstream_lean", False):
        return True
    whole = cache.load_overload

    def load_overload(self: Any, sig: Any, target_context: Any) -> Any:
        from numba.core.cpu import CPUContext
        from numba.core.runtime import rtsys

        if not isinstance(target_context, CPUContext) or not all(
            hasattr(self, a) for a in ("_enabled", "_cache_file", "_impl")
        ):
            return whole(self, sig, target_context)
        rtsys.initialize(target_context)  # (Numba's runtime: what every kernel links to)
        with self._guard_against_spurious_io_errors():
            if not self._enabled:
                return None
            data = self._cache_file.load(self._index_key(sig, target_context.codegen()))
            if data is None:
                return None
            if not links_as_it_is(data):
                target_context.refresh()  # (what Numba always does first)
            return self._impl.rebuild(target_context, data)

    load_overload.qstream_lean = True  # type: ignore[attr-defined]
    cache.load_overload = load_overload
    return True


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


def exit_code(code: object) -> int:
    """The process exit code of ``SystemExit(code)``: None is 0, an int is itself, anything
    else is printed to stderr (as Python does) and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def leave(code: object) -> NoReturn:
    """End the process with ``SystemExit(code)``'s exit code, skipping the interpreter's
    teardown; a normal exit when another non-daemon thread still runs (it is waited for, as
    Python would) or when this Python cannot run the ``atexit`` handlers early."""
    run_handlers = getattr(atexit, "_run_exitfuncs", None)  # (CPython)
    busy = any(
        t.is_alive() and not t.daemon and t is not threading.main_thread()
        for t in threading.enumerate()
    )
    if run_handlers is None or busy:
        raise SystemExit(code)
    status = exit_code(code)
    run_handlers()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or its reader is gone: as Python exits
            status = status or 120
    os._exit(status)
