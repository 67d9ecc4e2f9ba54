"""A converted checkpoint in bounded size, whatever its number of tensors
(:class:`CheckpointView`): the SQNR over its quantized tensors, its bytes before and after."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .histograms import Histogram, json_float, read_float
from .summaries import ChannelSummary

WORST_TENSORS = 10  # worst tensors listed
LARGEST_TENSORS = 10  # largest tensors listed
TARGETS = 8  # targets listed by bytes (the rest summed as "other")
SIZE_BINS = 24  # bins of the histogram of tensor sizes


def _sqnr_of(row: dict[str, Any]) -> float | None:
    """A checkpoint row's SQNR (dB) as a float; None when it has none."""
    v = (row.get("error") or {}).get("sqnr_db")
    if v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _tensor_row(row: dict[str, Any], sqnr: float | None) -> dict[str, Any]:
    return {
        "name": str(row.get("name")),
        "target": "kept" if row.get("kept") else str(row.get("target")),
        "shape": list(row.get("shape") or []),
        "bytes_before": int(row.get("bytes_before") or 0),
        "bytes_after": int(row.get("bytes_after") or 0),
        "sqnr_db": sqnr,
    }


@dataclass(frozen=True)
class CheckpointView:
    """A converted checkpoint as its views see it, in bounded size whatever its number of
    tensors (from the root's index rows, no tensor opened).

    ``sqnr``: the SQNR over the quantized tensors that have one (a :class:`ChannelSummary`
    whose "channels" are tensors: quantiles, a histogram, the exact ones); ``worst``: the
    :data:`WORST_TENSORS` lowest; ``largest``: the :data:`LARGEST_TENSORS` largest tensors;
    ``targets``: bytes per target (``int4/axis1/block32``, ``kept``, ...; the
    :data:`TARGETS` largest, the rest as ``other``); ``sizes_before``/``sizes_after``:
    histograms of ``log10(bytes)`` over the tensors, on the same bins."""

    title: str
    tensors: int
    quantized: int
    kept: int
    bytes_before: int
    bytes_after: int
    sqnr: ChannelSummary | None = None
    worst: tuple[dict[str, Any], ...] = ()
    largest: tuple[dict[str, Any], ...] = ()
    targets: tuple[dict[str, Any], ...] = ()
    sizes_before: Histogram | None = None
    sizes_after: Histogram | None = None

    @classmethod
    def from_rows(cls, rows: Iterable[dict[str, Any]], title: str = "checkpoint") -> CheckpointView:
        """The view of a checkpoint's index rows (``QuantizedCheckpoint.tensors.values()``)."""
        table = list(rows)
        n = len(table)
        kept = np.fromiter((bool(r.get("kept")) for r in table), bool, n)
        before = np.fromiter((int(r.get("bytes_before") or 0) for r in table), np.int64, n)
        after = np.fromiter((int(r.get("bytes_after") or 0) for r in table), np.int64, n)
        sq = [None if k else _sqnr_of(r) for r, k in zip(table, kept, strict=True)]
        has = np.fromiter((v is not None for v in sq), bool, n)
        sqnr = np.fromiter((v for v in sq if v is not None), np.float64)
        summary = ChannelSummary.from_sqnr(sqnr, worst=0) if sqnr.size else None
        at = np.flatnonzero(has)
        key = np.where(np.isnan(sqnr), -np.inf, sqnr)
        worst = at[np.argsort(key, kind="stable")[:WORST_TENSORS]]
        largest = np.argsort(-before, kind="stable")[:LARGEST_TENSORS]
        targets: dict[str, list[int]] = {}
        for r, k, b, a in zip(table, kept, before.tolist(), after.tolist(), strict=True):
            t = targets.setdefault("kept" if k else str(r.get("target")), [0, 0, 0])
            t[0] += 1
            t[1] += b
            t[2] += a
        order = sorted(targets.items(), key=lambda kv: (-kv[1][1], kv[0]))
        listed = [
            {"target": name, "tensors": c, "bytes_before": b, "bytes_after": a}
            for name, (c, b, a) in order[:TARGETS]
        ]
        rest = order[TARGETS:]
        if rest:
            listed.append(
                {
                    "target": f"other ({len(rest)} targets)",
                    "tensors": sum(v[0] for _, v in rest),
                    "bytes_before": sum(v[1] for _, v in rest),
                    "bytes_after": sum(v[2] for _, v in rest),
                }
            )
        hb, ha = _size_histograms(before, after)
        return cls(
            title=title,
            tensors=n,
            quantized=int(n - kept.sum()),
            kept=int(kept.sum()),
            bytes_before=int(before.sum()),
            bytes_after=int(after.sum()),
            sqnr=summary,
            worst=tuple(_tensor_row(table[i], sq[i]) for i in worst),
            largest=tuple(_tensor_row(table[i], sq[i]) for i in largest),
            targets=tuple(listed),
            sizes_before=hb,
            sizes_after=ha,
        )

    @property
    def ratio(self) -> float | None:
        """Bytes after / bytes before (None for an empty checkpoint)."""
        return self.bytes_after / self.bytes_before if self.bytes_before else None

    def markers(self) -> list[tuple[str, float]]:
        """``(label, dB)`` on the SQNR histogram: the worst tensor and the median one."""
        q = (self.sqnr.quantiles if self.sqnr is not None else None) or {}
        marks = [("worst", q.get("min")), ("median", q.get("median"))]
        return [(k, v) for k, v in marks if v is not None and math.isfinite(v)]

    def to_dict(self) -> dict[str, Any]:
        def rows(rs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
            return [{k: json_float(v) if k == "sqnr_db" else v for k, v in r.items()} for r in rs]

        return {
            "title": self.title,
            "tensors": self.tensors,
            "quantized": self.quantized,
            "kept": self.kept,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "sqnr": None if self.sqnr is None else self.sqnr.to_dict(),
            "worst": rows(self.worst),
            "largest": rows(self.largest),
            "targets": list(self.targets),
            "sizes_before": None if self.sizes_before is None else self.sizes_before.to_dict(),
            "sizes_after": None if self.sizes_after is None else self.sizes_after.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CheckpointView:
        def rows(rs: Iterable[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
            return tuple(
                {k: read_float(v) if k == "sqnr_db" else v for k, v in r.items()} for r in rs
            )

        def hist(h: dict[str, Any] | None) -> Histogram | None:
            return Histogram.from_dict(h) if h else None

        return cls(
            title=d["title"],
            tensors=int(d["tensors"]),
            quantized=int(d["quantized"]),
            kept=int(d["kept"]),
            bytes_before=int(d["bytes_before"]),
            bytes_after=int(d["bytes_after"]),
            sqnr=ChannelSummary.from_dict(d["sqnr"]) if d.get("sqnr") else None,
            worst=rows(d.get("worst", ())),
            largest=rows(d.get("largest", ())),
            targets=tuple(d.get("targets", ())),
            sizes_before=hist(d.get("sizes_before")),
            sizes_after=hist(d.get("sizes_after")),
        )


def _size_histograms(
    before: npt.ArrayLike, after: npt.ArrayLike
) -> tuple[Histogram | None, Histogram | None]:
    """Histograms of ``log10(bytes)`` of the tensors before and after, on the same bins
    (whole powers of ten at the ends; tensors of 0 bytes are left out)."""
    b = np.asarray(before, np.float64)
    a = np.asarray(after, np.float64)
    lb, la = np.log10(b[b > 0]), np.log10(a[a > 0])
    both = np.concatenate([lb, la])
    if not both.size:
        return None, None
    lo, hi = math.floor(both.min()), math.ceil(both.max())
    if hi <= lo:
        hi = lo + 1
    cb, _ = np.histogram(lb, bins=SIZE_BINS, range=(lo, hi))
    ca, _ = np.histogram(la, bins=SIZE_BINS, range=(lo, hi))
    return (
        Histogram(float(lo), float(hi), cb.astype(np.int64)),
        Histogram(float(lo), float(hi), ca.astype(np.int64)),
    )
