"""Ending the ``qstream`` process quickly once a command is done.

After a command, the interpreter's own shutdown (freeing every module, Numba's and LLVM's
objects) takes 0.2-0.4 s, as long as a small conversion's work. Nothing of it is needed: the
command has closed its files. :func:`leave` does what a normal exit does that matters (runs
the ``atexit`` handlers, flushes stdout and stderr) and then ends the process with
``os._exit``. It takes the normal exit where it cannot be sure: while another thread still
runs (Python waits for it), or where ``atexit`` cannot be run early.

Only the console script (:func:`qstream.cli.main.console`) leaves so; ``main()`` raises
``SystemExit`` as before, for callers that go on after it.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


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
