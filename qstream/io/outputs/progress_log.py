"""How far a quantize pass got: the ``_progress`` array of a quantized group.

Blocks are merged in block order by the job's driver, so what has landed is always a prefix
of the blocks. ``_progress`` holds one snapshot: the number of blocks in that prefix and the
error sums folded over exactly those blocks (``ErrorStats`` fields, one row per channel). A
resumed job starts from the snapshot and folds the remaining blocks onto it in the same order,
so its report has the same bits as an uninterrupted run's.

Only the driver writes the snapshot (never the workers), at most about once a second; each
write replaces the array's single chunk as a whole (a renamed file, or one object PUT), so a
kill leaves the old snapshot or the new one, never a torn one. Blocks past the snapshot may
have landed too: a resumed job writes them again, with the same bytes.
"""

from __future__ import annotations

import os
import time
from dataclasses import fields
from typing import Any

import numpy as np

from ...core import aligned_empty
from ...spec import ErrorStats, GroupSQNR, WorstGroups
from ..storage import ArrayWriter

NAME = "_progress"
_FIELDS = [f.name for f in fields(ErrorStats)]
# seconds between snapshots: a crash redoes at most this much work (0: after every block)
SAVE_EVERY = float(os.environ.get("QSTREAM_PROGRESS_EVERY", "1.0"))


class ProgressLog:
    """The resume snapshot of a quantize pass (see module docstring). A blocked spec's
    snapshot also holds the worst groups so far (``WorstGroups.KEEP`` of them, NaN-padded)
    and the counts of their SQNR distribution (``GroupSQNR.SLOTS`` of them, exact in
    float64 below 2**53; a snapshot of an older run has none)."""

    def __init__(self, array: Any) -> None:
        self.array = array
        attrs = array.attrs.asdict()
        self.keep = int(attrs.get("worst_groups", 0))
        self.bins = int(attrs.get("group_bins", 0))
        self.channels = int(attrs.get("channels", (array.shape[0] - 1) // len(_FIELDS)))
        self._writer = ArrayWriter(array)
        self._last = time.monotonic()

    NAME = NAME

    @staticmethod
    def array_spec(channels: int, keep: int = 0, bins: int = 0) -> dict[str, Any]:
        """The ``create_array`` keywords of a new ``_progress`` array for ``channels`` channels
        (and ``keep`` worst groups, ``bins`` counts of their distribution). Until its first
        snapshot it holds no chunk, which reads as zeros: no block has landed."""
        n = 1 + len(_FIELDS) * channels + 3 * keep + bins
        attributes = {"channels": channels, "worst_groups": keep}
        if bins:
            attributes["group_bins"] = bins
        return {
            "shape": (n,),
            "chunks": (n,),
            "dtype": np.float64,
            "fill_value": 0,
            "compressors": None,
            "dimension_names": ["progress"],
            "attributes": attributes,
        }

    @classmethod
    def open(cls, group: Any) -> ProgressLog:
        """The resume snapshot of the quantized group ``group``."""
        return cls(group[NAME])

    def load(self) -> tuple[int, ErrorStats, WorstGroups | None]:
        """(blocks landed, their folded error sums, their worst groups)."""
        raw = np.asarray(self.array[...], np.float64)
        body = len(_FIELDS) * self.channels
        tail = 3 * self.keep + self.bins
        if raw.size != 1 + body + tail or self.bins not in (0, GroupSQNR.SLOTS):
            return 0, ErrorStats.empty(0), None  # written by another layout: start over
        if raw[0] == 0:  # no snapshot yet (the fill value), or one of no blocks
            fresh = WorstGroups.empty(bool(self.bins)) if self.keep else None
            return 0, ErrorStats.empty(self.channels), fresh
        rows = raw[1 : 1 + body].reshape(len(_FIELDS), self.channels)
        stats = ErrorStats(
            **{
                name: rows[i].astype(np.int64) if name in ErrorStats.INTS else rows[i].copy()
                for i, name in enumerate(_FIELDS)
            }
        )
        worst = None
        if self.keep:
            sq, index, max_abs = raw[1 + body : 1 + body + 3 * self.keep].reshape(3, self.keep)
            n = int(np.count_nonzero(~np.isnan(index)))
            groups = None
            counts = raw[1 + body + 3 * self.keep :]
            if self.bins and not np.isnan(counts).any():
                groups = GroupSQNR(counts.astype(np.int64))
            worst = WorstGroups(
                sq[:n].copy(), index[:n].astype(np.int64), max_abs[:n].copy(), groups
            )
        return int(raw[0]), stats, worst

    def save(self, done: int, stats: ErrorStats, worst: WorstGroups | None = None) -> None:
        """Record that blocks ``0 .. done - 1`` have landed with the folded sums ``stats``
        (and, for a blocked spec, the worst groups among them)."""
        # aligned: written as it is (O_DIRECT), never copied (a snapshot of millions of
        # channels is hundreds of MB)
        raw = aligned_empty(self.array.shape[0] * 8).view(np.float64)
        raw[0] = done
        body = len(_FIELDS) * self.channels
        rows = raw[1 : 1 + body].reshape(len(_FIELDS), self.channels)
        for i, name in enumerate(_FIELDS):
            rows[i] = getattr(stats, name)
        if self.keep:
            tail = raw[1 + body : 1 + body + 3 * self.keep].reshape(3, self.keep)
            tail[:] = np.nan
            n = worst.index.size if worst is not None else 0
            if worst is not None and n:
                tail[0, :n], tail[1, :n], tail[2, :n] = worst.sqnr_db, worst.index, worst.max_abs
        if self.bins:  # (none taken: NaN, read back as None: a resumed job starts over)
            groups = worst.groups if worst is not None else None
            raw[1 + body + 3 * self.keep :] = groups.counts if groups is not None else np.nan
        self._writer[(slice(0, raw.size),)] = raw
        self._last = time.monotonic()

    def due(self) -> bool:
        """Whether a snapshot is due (one about every ``SAVE_EVERY`` seconds)."""
        return time.monotonic() - self._last >= SAVE_EVERY
