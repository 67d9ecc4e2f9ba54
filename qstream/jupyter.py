"""The running Jupyter kernel a process is in, if any: where qstream draws its one-line
notices (kernel compilations, a library job's progress) in a notebook cell. IPython is never
imported here: only found when the process has imported it already."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def jupyter_cell() -> tuple[Callable[..., Any], Any] | None:
    """``IPython.display.display`` and the shell, in a running Jupyter kernel (IPython
    imported, its shell attached to a kernel); None elsewhere: no IPython, or a terminal
    IPython (a line there would be noise in the scrollback)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        shell = ipython.get_ipython()
        from IPython.display import display
    except Exception:  # (an IPython too old or half-imported: no line)
        return None
    if shell is None or getattr(shell, "kernel", None) is None:
        return None
    return display, shell
