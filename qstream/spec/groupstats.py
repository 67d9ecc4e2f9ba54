"""The statistics of a blocked spec's parameter groups: how every group's SQNR is
distributed (:class:`GroupSQNR`, exact counts over fixed bins) and the worst groups
(:class:`WorstGroups`); both merge in any order to the same result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import InvalidParameterError
from .json_helpers import jsonable, jsonable_dict, unjson_float


class GroupSQNR:
    """How the SQNR of every parameter group of a blocked spec is distributed: exact integer
    counts over fixed bins of :data:`STEP_DB` dB from :data:`LO_DB` to :data:`HI_DB`, plus the
    groups below and above that range, the groups without error (infinite SQNR: ``exact``)
    and the groups without signal (all zeros or non-finite: ``zero_signal``).

    The bins are fixed and a group's bin depends on its own sums only, so merging (adding)
    the counts of any partition of the blocks in any order gives the same counts. ``counts``
    holds :data:`SLOTS` int64: ``[below, bin 0, ..., bin BINS - 1, above, exact, zero]``.
    """

    LO_DB = -20.0
    STEP_DB = 0.25
    BINS = 640
    HI_DB = LO_DB + STEP_DB * BINS  # 140 dB
    SLOTS = BINS + 4
    _BELOW, _ABOVE, _EXACT, _ZERO = 0, BINS + 1, BINS + 2, BINS + 3

    __slots__ = ("counts",)

    def __init__(self, counts: npt.ArrayLike) -> None:
        counts = np.asarray(counts, np.int64)
        if counts.shape != (self.SLOTS,):
            raise ValueError(f"GroupSQNR counts: {self.SLOTS} values, got {counts.shape}")
        self.counts = counts

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GroupSQNR):
            return NotImplemented
        return bool(np.array_equal(self.counts, other.counts))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"GroupSQNR({self.groups} groups)"

    @classmethod
    def empty(cls) -> GroupSQNR:
        return cls(np.zeros(cls.SLOTS, np.int64))

    @classmethod
    def of_sums(cls, x2: npt.ArrayLike, e2: npt.ArrayLike) -> GroupSQNR:
        """The distribution of the groups whose signal and error sums are ``x2``/``e2`` (one
        value per group, any shape). A few vectorised passes over the groups (not the
        elements): the bin is ``floor((10 log10(x2 / e2) - LO_DB) / STEP_DB)``."""
        x2 = np.asarray(x2, np.float64).reshape(-1)
        e2 = np.asarray(e2, np.float64).reshape(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            b = np.divide(x2, e2)  # inf: no error; 0: no signal (-inf dB); NaN: neither
            np.log10(b, out=b)
        # (slot 1 + bin): below the range -> 0, above it (and inf) -> BINS + 1; NaN -> 0
        b *= 10.0 / cls.STEP_DB
        b += 1.0 - cls.LO_DB / cls.STEP_DB
        np.fmax(b, 0.0, out=b)
        np.fmin(b, cls.BINS + 1.0, out=b)
        counts = np.zeros(cls.SLOTS, np.int64)
        counts[: cls.BINS + 2] = np.bincount(b.astype(np.int64), minlength=cls.BINS + 2)
        # groups without signal are in slot 0 (NaN or -inf dB), without error (and with
        # signal) in slot BINS + 1 (inf): counted only when those slots hold any
        zero = np.count_nonzero(x2 == 0) if counts[cls._BELOW] else 0
        no_error = np.count_nonzero(e2 == 0) if counts[cls._ABOVE] else 0
        exact = no_error - (np.count_nonzero((x2 == 0) & (e2 == 0)) if zero and no_error else 0)
        counts[cls._BELOW] -= zero
        counts[cls._ABOVE] -= exact
        counts[cls._EXACT] = exact
        counts[cls._ZERO] = zero
        return cls(counts)

    def merged(self, other: GroupSQNR) -> GroupSQNR:
        return GroupSQNR(self.counts + other.counts)

    @property
    def groups(self) -> int:
        return int(self.counts.sum())

    @property
    def bins(self) -> np.ndarray:
        """The counts of the :data:`BINS` bins."""
        return self.counts[1 : self.BINS + 1]

    def summary(self) -> dict[str, Any]:
        """JSON-ready: the occupied span of the bins (``edges_db``, one more than ``counts``;
        empty when no group has a finite SQNR in range) and the other counts."""
        bins = self.bins
        used = np.flatnonzero(bins)
        if used.size:
            first, last = int(used[0]), int(used[-1]) + 1
        else:
            first = last = 0
        edges = [self.LO_DB + self.STEP_DB * k for k in range(first, last + 1)] if used.size else []
        c = self.counts
        return {
            "groups": self.groups,
            "step_db": self.STEP_DB,
            "edges_db": edges,
            "counts": [int(v) for v in bins[first:last]],
            "below": int(c[self._BELOW]),
            "above": int(c[self._ABOVE]),
            "exact": int(c[self._EXACT]),
            "zero_signal": int(c[self._ZERO]),
            "range_db": [self.LO_DB, self.HI_DB],
        }

    @classmethod
    def from_summary(cls, d: dict[str, Any]) -> GroupSQNR:
        """The counts :meth:`summary` describes (its bins on this grid)."""
        counts = np.zeros(cls.SLOTS, np.int64)
        edges, bins = d.get("edges_db") or [], d.get("counts") or []
        if bins:
            first = round((float(edges[0]) - cls.LO_DB) / cls.STEP_DB)
            if not 0 <= first <= cls.BINS - len(bins) or float(d["step_db"]) != cls.STEP_DB:
                raise InvalidParameterError("group SQNR bins on another grid")
            counts[1 + first : 1 + first + len(bins)] = bins
        counts[cls._BELOW], counts[cls._ABOVE] = int(d["below"]), int(d["above"])
        counts[cls._EXACT], counts[cls._ZERO] = int(d["exact"]), int(d["zero_signal"])
        return cls(counts)


@dataclass(frozen=True)
class WorstGroups:
    """The parameter groups of a blocked spec with the lowest SQNR, worst first (ties: lower
    group first), so merging any partition of the blocks in any order gives the same list.
    ``index`` is the flat index of the group in the (blocked) parameter array.

    ``groups``: every group's SQNR as a :class:`GroupSQNR` distribution (merged by adding
    counts); None where it was not taken (a resume snapshot of an older run): a merge with
    None is None, never a partial count."""

    sqnr_db: np.ndarray
    index: np.ndarray
    max_abs: np.ndarray
    groups: GroupSQNR | None = None

    KEEP = 5

    @classmethod
    def empty(cls, distribution: bool = True) -> WorstGroups:
        """No group yet (and an empty distribution, unless ``distribution`` is false)."""
        return cls(
            np.zeros(0),
            np.zeros(0, np.int64),
            np.zeros(0),
            GroupSQNR.empty() if distribution else None,
        )

    @classmethod
    def of(
        cls,
        sqnr_db: npt.ArrayLike,
        index: npt.ArrayLike,
        max_abs: npt.ArrayLike,
        groups: GroupSQNR | None = None,
    ) -> WorstGroups:
        """The ``KEEP`` worst of the given groups."""
        sq, at = np.asarray(sqnr_db, np.float64), np.asarray(index, np.int64)
        order = np.lexsort((at, sq))[: cls.KEEP]
        return cls(sq[order], at[order], np.asarray(max_abs, np.float64)[order], groups)

    def merged(self, other: WorstGroups) -> WorstGroups:
        groups = None
        if self.groups is not None and other.groups is not None:
            groups = self.groups.merged(other.groups)
        return WorstGroups.of(
            np.concatenate([self.sqnr_db, other.sqnr_db]),
            np.concatenate([self.index, other.index]),
            np.concatenate([self.max_abs, other.max_abs]),
            groups,
        )

    def summary(
        self, param_shape: Sequence[int], axis: int, block_size: int
    ) -> list[dict[str, Any]]:
        """One entry per group: its index in the parameter array, its first element, SQNR."""
        out = []
        for sq, i, m in zip(self.sqnr_db, self.index, self.max_abs, strict=True):
            at = [int(v) for v in np.unravel_index(int(i), tuple(param_shape))]
            first = [v * block_size if d == axis else v for d, v in enumerate(at)]
            out.append({"group": at, "first_element": first, "sqnr_db": sq, "max_abs": m})
        return [jsonable_dict(row) for row in out]

    def to_dict(self) -> dict[str, Any]:
        d = {f: jsonable(getattr(self, f)) for f in ("sqnr_db", "index", "max_abs")}
        if self.groups is not None:
            d["groups"] = self.groups.summary()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorstGroups:
        return cls(
            np.asarray([unjson_float(v) for v in d["sqnr_db"]], np.float64),
            np.asarray(d["index"], np.int64),
            np.asarray(d["max_abs"], np.float64),
            GroupSQNR.from_summary(d["groups"]) if d.get("groups") else None,
        )
