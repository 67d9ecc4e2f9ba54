"""A watch on imports made by qstream's worker threads (issue 44).

Two threads importing at once can deadlock on Python's module locks (``_DeadlockError:
deadlock detected by _ModuleLock('zarr.abc.codec')``): qstream imports what its workers need
before any pool starts (:mod:`qstream.engine.run.worker_imports`). The watch is a finder consulted
first that finds nothing: it records each module first loaded by a ``qstream-*`` thread where
the ``import`` statement itself is qstream's code (a Numba compile's own imports are Numba's,
taken under its compiler lock). ``conftest.py`` checks it after every test; run as a script it
wraps the command line and prints one line ``WORKER-IMPORTS <json>`` after the command's own
output::

    python tests/support/worker_imports.py convert MODEL OUT ...
"""

from __future__ import annotations

import json
import sys
import threading

found: list[tuple[str, str, str]] = []  # (module, thread, file:line of the import)


def _importer() -> str | None:
    """``file:line`` of the statement that asked for the import, when it is qstream's."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    if frame is None:
        return None
    name = frame.f_globals.get("__name__", "")
    if name != "qstream" and not name.startswith("qstream."):
        return None
    return f"{name}:{frame.f_lineno}"


class Watch:
    """Finds nothing; notes who asked."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        thread = threading.current_thread()
        if thread.name.startswith("qstream-"):
            where = _importer()
            if where is not None:
                found.append((name, thread.name, where))
        return None


def install() -> None:
    """Put the watch first on ``sys.meta_path`` (once)."""
    if Watch not in sys.meta_path:
        sys.meta_path.insert(0, Watch)  # type: ignore[arg-type]


def taken() -> list[tuple[str, str, str]]:
    """What was found since the last call (and forget it)."""
    got = list(found)
    del found[: len(got)]
    return got


if __name__ == "__main__":
    install()
    from cli.main import main
    from cli.process import skip_numba_probes

    skip_numba_probes()  # (as the console script does)
    sys.argv = ["qstream", *sys.argv[1:]]
    code: object = 0
    try:
        main()
    except SystemExit as e:
        code = e.code
    sys.stdout.flush()
    print("WORKER-IMPORTS " + json.dumps(taken()), flush=True)
    sys.exit(code)
