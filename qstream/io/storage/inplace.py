"""A file's bytes read in place: a private, writable (copy-on-write) map of them.

The kernels then read the page cache itself, with no copy (copying a run out of the page
cache costs about 0.4 s a GiB of CPU on the 2-core test machine; the map's page faults,
16 pages at a time, a tenth of that). The map is writable though never written: a read-only
array is another type to Numba, which would compile every kernel a second time for it. It is
unmapped when the last array viewing it goes.

A file cut shorter while its map is read ends the process with SIGBUS where a read would
fail with an error; callers check the file's size first, so only a cut during the read
itself does (seen with a checkpoint truncated mid-conversion: the output stays incomplete,
never looking complete, and the next run names the truncated tensor).
"""

from __future__ import annotations

import mmap

import numpy as np


def map_bytes(fd: int, offset: int, nbytes: int) -> np.ndarray:
    """``nbytes`` bytes of the open file ``fd`` from ``offset`` on, as a uint8 array over a
    private map (``nbytes > 0``). Raises :class:`OSError` where the file cannot be mapped."""
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    m = mmap.mmap(fd, offset + nbytes - start, access=mmap.ACCESS_COPY, offset=start)
    return np.frombuffer(m, np.uint8, nbytes, offset - start)
