"""The ``qstream`` process's own housekeeping: its cycle collector run rarely, its freed
memory kept for reuse, Numba's probes for SciPy's BLAS and for CFFI skipped, and its end
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
qstream kernel uses BLAS or CFFI, and qstream imports neither SciPy nor CFFI. And when Numba
is imported, its settings module imports PyYAML (7-10 ms) to read a ``.numba_config.yaml``
in the current folder, which is seldom there. :func:`skip_numba_probes` makes those imports,
from those probes only, fail as if the packages were absent (PyYAML's only where there is no
such file): Numba then leaves ``np.dot``, ``@`` and CFFI calls unsupported in this process
(as it does without them), and ``import scipy.linalg``, ``import cffi`` or ``import yaml``
still works for anyone else, later too.

Numba's cached kernels load without its compiler set-up in any process, not only here
(:func:`qstream.kernels.runtime.lean_load`).

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
import os
import sys
import threading
from typing import NoReturn

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
    "yaml": ("numba.core.config", "<module>"),  # to read NUMBA_CONFIG_FILE, where there is one
}
#: the settings file Numba reads from the current folder (with PyYAML) when it is imported
NUMBA_CONFIG_FILE = ".numba_config.yaml"


def numba_probes() -> dict[str, tuple[str, str]]:
    """:data:`NUMBA_PROBES` that find nothing this process needs: PyYAML's only where there is
    no :data:`NUMBA_CONFIG_FILE` to read."""
    probes = dict(NUMBA_PROBES)
    if os.path.isfile(NUMBA_CONFIG_FILE):
        del probes["yaml"]
    return probes


class _NoNumbaProbes:
    """An import finder that fails each import of :data:`NUMBA_PROBES` made by its probe,
    once; it is gone once both have been; no other import is touched."""

    def __init__(self) -> None:
        self.waiting = numba_probes()

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
    """Have Numba's probes for BLAS, CFFI and PyYAML find none, without importing SciPy, CFFI
    or PyYAML (see the module's docstring); whether the probes are still to come (False: Numba
    is imported or its CPU target set up already, or those packages are imported already)."""
    probes = numba_probes()
    probers = {module for module, _ in probes.values()}
    if any(m in sys.modules for m in (*probes, *probers)):
        return False
    if not any(isinstance(f, _NoNumbaProbes) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoNumbaProbes())  # type: ignore[arg-type]
    return True


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
