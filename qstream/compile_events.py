"""Who is told when a qstream kernel starts compiling: the listeners, kept apart from the
kernels (:mod:`qstream.kernels.runtime`, which imports Numba and tells them), so that
listening loads no Numba. A job that never loads Numba (a small job's NumPy twins, a
finished output) never compiles, and its listeners are never called."""

from __future__ import annotations

from collections.abc import Callable

#: the listeners, in the order they were added (:func:`on_compile`)
LISTENERS: list[Callable[[str], None]] = []


def on_compile(listener: Callable[[str], None]) -> Callable[[], None]:
    """Call ``listener(kernel_name)`` whenever a qstream kernel starts compiling (a Numba cache
    miss: the first run on a machine, or after an upgrade). Returns a function that removes
    the listener. The listener may be called from any thread. Loads no Numba."""
    LISTENERS.append(listener)
    return lambda: LISTENERS.remove(listener) if listener in LISTENERS else None


def compiling(name: str) -> None:
    """Tell every listener that the kernel ``name`` starts compiling."""
    for listener in list(LISTENERS):
        listener(name)
