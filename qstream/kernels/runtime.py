"""Defining and calling kernels: serial twins for small work, Numba's threading layer, and
word of first-run compilation.

- :func:`parallel_kernel` compiles a kernel with ``parallel=True`` and, from the same source, a
  serial twin (``prange`` runs as ``range``). :func:`run` calls the twin when the largest array
  holds fewer than ``SERIAL_BELOW`` elements: a small block gains nothing from the thread pool
  (its fork/join costs more than the work), and the twin compiles about 3x faster, which is
  most of a first run on small inputs. Both visit tiles in the same order and fold them the
  same way, so their results are identical.
- :func:`specialize` builds a kernel again with some module-level constants changed: Numba
  drops the branches they rule out, so code that few jobs need compiles only where needed.
- Numba's ``workqueue`` layer aborts the process when two Python threads run parallel kernels
  at once. qstream prefers ``omp`` then ``tbb``; if Numba still ends up on ``workqueue``,
  parallel kernel calls are serialised with a lock instead of crashing.
- :func:`njit` is Numba's, with one change: a build in Numba's on-disk cache is loaded without
  Numba's compiler set-up where it links as it is (:func:`lean_load`, below), in any process
  (the console script, a notebook). Every qstream kernel is defined with it (and with
  :func:`parallel_kernel`, which uses it).
- :func:`~qstream.compile_events.on_compile` lets a front end say "compiling kernels (first run
  only)" while Numba compiles one (a cache miss), instead of pausing silently (listening loads
  no Numba: the listeners are told once this module is loaded). In a Jupyter kernel qstream says
  it itself (:func:`~qstream.jupyter.notebook_notice`): one output line, updated in place.
"""

from __future__ import annotations

import os
import struct
import threading
import types
from collections.abc import Callable, Iterable
from typing import Any, overload

import llvmlite.binding as ll
import numba
import numpy as np
from numba.core.caching import FunctionCache
from numba.core.cpu import CPUContext
from numba.core.runtime import rtsys

from .. import budget, compile_events
from ..compile_events import on_compile as on_compile  # (its users import it from here too)
from ..jupyter import notebook_notice

if "NUMBA_THREADING_LAYER" not in os.environ and "NUMBA_THREADING_LAYER_PRIORITY" not in os.environ:
    # (numba.config sets its settings at import: no declared attributes)
    numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]  # type: ignore[attr-defined]

_lock = threading.Lock()
_serial: bool | None = None  # unknown until the first parallel call has chosen a layer


SERIAL_BELOW = budget.SERIAL_BELOW  # (a global of its own: warm-up changes it for a while)


@overload
def njit(fn: Callable[..., Any], **options: Any) -> Any: ...


@overload
def njit(fn: None = None, **options: Any) -> Callable[[Callable[..., Any]], Any]: ...


def njit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """``numba.njit(**options)``, as a decorator with or without options, whose cached
    builds load lean (:func:`lean_load`) from an on-disk cache made when the kernel first
    needs a build (:class:`LazyCache`)."""
    if fn is None:
        return lambda f: njit(f, **options)
    cache = options.pop("cache", False)
    dispatcher = numba.njit(**options)(fn)
    if cache:
        dispatcher._cache = LazyCache(dispatcher.py_func)  # (what ``cache=True`` sets, later)
    return dispatcher


def helper(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """A larger function that kernels call, compiled on its own once per signature and
    process (and cached): ``njit(cache=True, error_model="numpy", **options)``, the kernels'
    error model (``x / 0`` is inf or NaN), and its own fastmath flags where it gives them.

    Not ``inline="always"``: Numba inlines such a function into its IR, then types, lowers
    and (inside a ``prange`` loop) runs its parallel passes over the body again at every
    call site of every kernel, and those passes grow faster than the loop they analyse. A
    called function is compiled once and linked into each kernel, where LLVM inlines it:
    kernels as fast, their first compiles up to half as long (the parallel builds of the
    fused and calibrating kernels; ``benchmarks/README.md``). Small helpers (a few
    lines, no loop of their own) stay ``inline="always"``: a function of its own costs a
    compile pipeline, which they do not repay; so do those that hold a kernel's ``prange``
    loop (parfors must see it) or take an element operation as an argument (a kernel passing
    a function could not be cached)."""
    options = {"cache": True, "error_model": "numpy", **options}
    return njit(**options) if fn is None else njit(fn, **options)


@overload
def parallel_kernel(
    fn: Callable[..., Any], *, serial_scale: int = 1, inputs: int = 0, **options: Any
) -> Any: ...


@overload
def parallel_kernel(
    fn: None = None, *, serial_scale: int = 1, inputs: int = 0, **options: Any
) -> Callable[[Callable[..., Any]], Any]: ...


def parallel_kernel(
    fn: Callable[..., Any] | None = None,
    *,
    serial_scale: int = 1,
    inputs: int = 0,
    **options: Any,
) -> Any:
    """``@njit(parallel=True, cache=True, nogil=True, **options)`` plus a serial twin compiled
    from the same source, as the ``serial`` attribute (see the module docstring).
    ``serial_scale``: the twin runs below ``serial_scale * SERIAL_BELOW`` elements (for
    kernels whose elements are cheap, e.g. histogram bins scanned once). ``inputs``: how
    many leading arguments the kernel only reads; :func:`run` passes arrays there as
    read-only views, so a memory-mapped (read-only) source and an array in memory call the
    same compiled build (Numba types read-only arrays apart: each would cost a compile of
    its own, ~20 s for the K-quant kernel). The kernel is a Numba dispatcher (untyped
    here: ``Any``)."""

    # NumPy's error model (x / 0 is inf or NaN, no exception) in both builds: the one parfors
    # use inside a prange loop, so the twin computes exactly what the parallel kernel does.
    options = {"error_model": "numpy", **options}

    def wrap(f: Callable[..., Any]) -> Any:
        return ParallelKernel(f, serial_scale, inputs, options)

    return wrap(fn) if fn is not None else wrap


class ParallelKernel:
    """A :func:`parallel_kernel`: its two Numba dispatchers, the parallel build and its serial
    twin (``serial``), made when the kernel is first used. A conversion imports 47 parallel
    kernels and calls 3 to 6: making a dispatcher takes ~0.2 ms (its signature, options and
    cache), 94 of them ~20 ms of every start. Calls, attributes (``signatures``,
    ``py_func``, ...) and Numba's typing (a kernel named inside another) reach the parallel
    build."""

    def __init__(
        self, f: Callable[..., Any], serial_scale: int, inputs: int, options: dict[str, Any]
    ) -> None:
        self.py_func = f
        self.serial_scale = serial_scale
        self.inputs = inputs
        self.kernel_options = options
        self.__name__ = f.__name__
        self.__qualname__ = f.__qualname__
        self.__module__ = f.__module__
        self.__doc__ = f.__doc__
        self._builds: tuple[Any, Any] | None = None

    def builds(self) -> tuple[Any, Any]:
        """``(parallel build, serial twin)``: Numba's dispatchers, made on the first call."""
        if self._builds is None:
            with _making:
                if self._builds is None:
                    f, options = self.py_func, self.kernel_options
                    kernel = njit(parallel=True, cache=True, nogil=True, **options)(f)
                    # A distinct qualified name gives the twin its own entries in Numba's
                    # cache (the cache index does not key on the parallel flag).
                    twin = njit(cache=True, nogil=True, **options)(_copy(f, "serial"))
                    self._builds = (kernel, twin)
        return self._builds

    @property
    def serial(self) -> Any:
        """The serial twin: the same source, ``prange`` run as ``range``."""
        return self.builds()[1]

    @property
    def _numba_type_(self) -> Any:  # (how Numba types a value: the parallel build)
        return self.builds()[0]._numba_type_

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.builds()[0](*args, **kwargs)

    def __reduce__(self) -> Any:
        # pickled by name, as a function is (and unpickled as the same kernel), where the
        # kernel is its module's; else as its parallel build, as Numba pickles a dispatcher
        if _kernel_named(self.__module__, self.__qualname__) is self:
            return _kernel_named, (self.__module__, self.__qualname__)
        return self.builds()[0].__reduce__()

    def __getattr__(self, name: str) -> Any:  # (the rest of a dispatcher: signatures, ...)
        if name == "_builds":  # (not set: a copy being made)
            raise AttributeError(name)
        return getattr(self.builds()[0], name)

    def __repr__(self) -> str:
        return f"<qstream parallel kernel {self.__module__}.{self.__qualname__}>"


_making = threading.RLock()


def _kernel_named(module: str, qualname: str) -> Any:
    """The kernel ``qualname`` of the module ``module`` (None when there is none)."""
    import importlib

    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found


def _copy(
    f: Callable[..., Any], suffix: str, constants: dict[str, Any] | None = None
) -> types.FunctionType:
    """``f`` under the qualified name ``<name>__<suffix>``, with the module-level names in
    ``constants`` bound to other values."""
    g = f.__globals__ if constants is None else {**f.__globals__, **constants}
    copy = types.FunctionType(f.__code__, g, f.__name__, f.__defaults__, f.__closure__)
    copy.__qualname__ = f"{f.__qualname__}__{suffix}"
    copy.__module__ = f.__module__
    copy.__doc__ = f.__doc__
    return copy


def specialize(kernel: Any, suffix: str, **constants: Any) -> Any:
    """Another build of the :func:`parallel_kernel` ``kernel`` (with its serial twin), in
    which the module-level names ``constants`` have the given values. Numba reads a global
    as a compile-time constant and drops the branches that an ``if NAME:`` on it rules out,
    so each build compiles only its own path: code that few jobs need (for non-finite input,
    say) stays out of the build that most jobs compile, which then compiles faster. The
    build has its own entries in Numba's cache (``<name>__<suffix>``). Call it where
    everything the kernel uses is defined (the globals are copied)."""
    return parallel_kernel(
        _copy(kernel.py_func, suffix, constants),
        serial_scale=kernel.serial_scale,
        inputs=kernel.inputs,
        **kernel.kernel_options,
    )


def specialize_function(function: Any, suffix: str, **constants: Any) -> Any:
    """:func:`specialize` for a kernel's helper made by :func:`njit` with ``cache=True`` (a
    function a kernel calls, compiled on its own): its build with the module-level names
    ``constants`` bound to the given values, cached apart (``<name>__<suffix>``)."""
    copy = _copy(function.py_func, suffix, constants)
    options = {k: v for k, v in function.targetoptions.items() if k != "nopython"}
    return njit(copy, cache=True, **options)


def _largest(args: Iterable[Any]) -> int:
    n = 0
    for a in args:
        if isinstance(a, np.ndarray) and a.size > n:
            n = a.size
    return n


def read_only(a: Any) -> Any:
    """``a`` as a read-only view when it is a writable NumPy array (no copy), else ``a``."""
    if isinstance(a, np.ndarray) and a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def run(kernel: Any, *args: Any) -> None:
    """Call ``kernel(*args)``: its serial twin for small work; a parallel kernel serialised
    when the threading layer is not thread-safe. Its ``inputs`` leading arrays are passed
    read-only (see :func:`parallel_kernel`)."""
    global _serial
    n = getattr(kernel, "inputs", 0)
    if n:
        args = (*(read_only(a) for a in args[:n]), *args[n:])
    twin = getattr(kernel, "serial", None)
    if twin is not None and _largest(args) < SERIAL_BELOW * kernel.serial_scale:
        twin(*args)  # no threads: safe from any number of Python threads
        return
    if _serial is False:
        kernel(*args)
        return
    with _lock:
        kernel(*args)
        if _serial is None:
            _serial = threading_layer() == "workqueue"


def threading_layer() -> str | None:
    """The threading layer Numba chose, or None before the first parallel call."""
    try:
        return numba.threading_layer()
    except ValueError:
        return None


def kernel_threads() -> int:
    """The number of threads kernels called from this thread use."""
    return numba.get_num_threads()


def limit_threads(n: int) -> None:
    """Let kernels called from this thread use ``n`` threads (Numba's setting is per thread)."""
    top: int = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]  # (set at import)
    numba.set_num_threads(max(1, min(int(n), top)))


_depth = threading.local()


class _CompileListener(numba.core.event.Listener):
    """Tells the listeners (:mod:`qstream.compile_events`) when a top-level compilation of a qstream
    kernel starts."""

    def on_start(self, event: numba.core.event.Event) -> None:
        depth = getattr(_depth, "n", 0)
        _depth.n = depth + 1
        if depth or not compile_events.LISTENERS:
            return
        func = event.data["dispatcher"].py_func
        if func.__module__.startswith("qstream."):
            compile_events.compiling(func.__qualname__.removesuffix("__serial"))

    def on_end(self, event: numba.core.event.Event) -> None:
        _depth.n = getattr(_depth, "n", 1) - 1


# (Numba's compile events reach the listeners from the moment the kernels are loaded)
numba.core.event.register("numba:compile", _CompileListener())


# (in a notebook, qstream says so while kernels compile: one line, updated in place)
notebook_notice()


# -- lean loads from Numba's cache ----------------------------------------------------------
# Loading a kernel from Numba's on-disk cache without Numba's compiler set-up.
#
# Before Numba loads a kernel from its cache it "refreshes" its CPU target: it imports some
# forty of its own modules (its implementations of Python and NumPy: ``numba.np.arraymath``,
# ``numba.cpython.unicode``, ...) and installs their typing and lowering registries, 0.1-0.45 s
# of the first kernel call of every process, which is most of what a small job waits for. All
# of that serves *compiling* (typing and lowering new code, which does its own refresh first);
# a cached kernel is machine code that needs only Numba's runtime (``rtsys``, set up here as
# Numba does) and the symbols its object code links to.
#
# :func:`lean_load` reads the cached kernel, lists the symbols its object code leaves undefined
# (an ELF reader, :func:`undefined_symbols`), runs the kernel's own load-time set-up (a parallel
# kernel's threading layer) and, when LLVM finds every one of those symbols already, loads it
# without the refresh; anything else (another object format, a symbol not there yet) takes
# Numba's whole path. The kernel loaded is the same machine code either way: a conversion's
# every output file is the same (tests/cli/test_lean_kernel_loads.py). Every qstream kernel's
# cache loads so (:func:`qstream.kernels.runtime.njit`); other Numba functions of the process
# are left as they are. ``LEAN = False`` turns it off (Numba's own path for every load).


#: whether qstream's kernels load lean (False: as Numba loads them)
LEAN = True


class LeanCache(FunctionCache):
    """Numba's on-disk cache of one qstream kernel, loading a build with :func:`lean_load`."""

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        """The build of ``sig`` in the cache, or None (then Numba compiles, refreshing)."""
        if not LEAN:
            return super().load_overload(sig, target_context)
        return lean_load(self, sig, target_context)


class LazyCache:
    """A qstream kernel's on-disk cache, made when the kernel first loads or compiles a build.

    Numba makes a kernel's cache where the kernel is defined (``cache=True``), and checks
    there that its folder is writable by creating a temporary file: 182 kernels are defined
    by the modules a conversion imports, which calls 5 to 8 of them. Each such file is an
    inode made and freed: 10-16 ms of the 35-45 ms those modules took to import on the test
    machine, and more on a file system where inodes freed a moment before make new ones
    slow (``benchmarks/README.md``). The cache is the one Numba makes, lean
    (:class:`LeanCache`); a kernel whose cache cannot be made (no writable cache folder)
    raises Numba's error at its first build rather than at import."""

    __slots__ = ("_made", "_py_func")

    def __init__(self, py_func: Callable[..., Any]) -> None:
        self._py_func = py_func
        self._made: FunctionCache | None = None

    def made(self) -> FunctionCache:
        """The cache itself, made on the first call (Numba calls it under its compiler lock)."""
        if self._made is None:
            cache = FunctionCache(self._py_func)
            if all(hasattr(cache, a) for a in _PARTS):
                cache.__class__ = LeanCache
            self._made = cache
        return self._made

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        """The build of ``sig`` in the cache, or None."""
        return self.made().load_overload(sig, target_context)

    def save_overload(self, sig: Any, data: Any) -> None:
        """Save the build ``data`` of ``sig``."""
        self.made().save_overload(sig, data)

    def __getattr__(self, name: str) -> Any:  # (the rest of Numba's cache: flush, cache_path)
        if name in LazyCache.__slots__:  # (not set: a copy being made)
            raise AttributeError(name)
        return getattr(self.made(), name)


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


def cached_somewhere(kernel: Any) -> bool:
    """Whether Numba's on-disk cache holds some build of ``kernel`` (best effort: True when
    this Numba's cache cannot say)."""
    try:
        return os.path.exists(kernel._cache._cache_file._index_path)
    except (AttributeError, RuntimeError):  # (RuntimeError: no cache can be made)
        return True  # unknown: do not start anything
