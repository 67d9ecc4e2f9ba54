"""The preamble of child processes that SIGKILL themselves at their n-th write event (env
``KILL_AT``): just before or just after each atomic rename or link. Every chunk, metadata and
snapshot write of qstream and of zarr's local store goes through one (a new metadata document
of qstream's is linked into place, a replaced one renamed), so every state a kill can leave on
disk between two writes is reached. ``count[0]`` holds the events seen so far."""

import textwrap

import pytest

KILL_HOOK = textwrap.dedent(
    """
    import os, signal, threading

    kill_at = int(os.environ.get("KILL_AT", "-1"))
    count = [0]
    _lock = threading.Lock()
    _real_replace = os.replace

    def _event():
        with _lock:
            n = count[0]
            count[0] += 1
        if n == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def _replace(a, b, *args, **kw):
        if str(b).endswith((".nbi", ".nbc")):  # Numba's cache, written only when a kernel
            return _real_replace(a, b, *args, **kw)  # compiles: not an event of the job
        _event()
        _real_replace(a, b, *args, **kw)
        _event()

    _real_link = os.link

    def _link(a, b, *args, **kw):
        _event()
        _real_link(a, b, *args, **kw)
        _event()

    os.replace = _replace
    os.link = _link
    """
)


# A kill test runs its child twice per kill point (~2 s each). The default run kills at a few
# points chosen to reach each kind of state (early, mid-pass, after the last chunk); the full
# sweep of points, the same test with every point, is marked slow (`pytest -m slow`).
SWEEPS = ["spot", pytest.param("sweep", marks=pytest.mark.slow)]


def kill_points(sweep: str, every: set[int], spot: set[int]) -> list[int]:
    """The kill points of one run: ``every`` for the full sweep, ``spot`` (a subset) else."""
    assert spot <= every, (spot, every)
    return sorted(every if sweep == "sweep" else spot)
