"""What a calibration keeps for its views (:class:`CalibrationView`) and a quantized output as
its views see it (:class:`ReportView`: the calibration view with the error report)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from .histograms import Histogram, json_float
from .predictions import MethodPrediction
from .summaries import ChannelSummary, GroupSummary, clip_ratio, clip_summary

# What the views read of qstream.spec's classes, as protocols: qstream.spec imports the views
# (a Calibration holds a CalibrationView), so the views do not import it.


class SpecLike(Protocol):
    """What the views read of a :class:`~qstream.spec.QuantSpec`."""

    @property
    def method(self) -> str: ...
    @property
    def symmetric(self) -> bool: ...
    def to_dict(self) -> dict[str, Any]: ...


class RangesLike(Protocol):
    """What the views read of :class:`~qstream.spec.RangeStats`."""

    @property
    def min(self) -> np.ndarray: ...
    @property
    def max(self) -> np.ndarray: ...
    @property
    def count(self) -> np.ndarray: ...


class ReportLike(Protocol):
    """What the views read of a :class:`~qstream.spec.QuantReport`."""

    @property
    def spec(self) -> SpecLike: ...
    @property
    def source(self) -> dict[str, Any]: ...
    @property
    def destination(self) -> str: ...
    @property
    def calibration(self) -> dict[str, Any] | None: ...
    @property
    def error(self) -> dict[str, Any] | None: ...


class CalibrationLike(Protocol):
    """What the views read of a :class:`~qstream.spec.Calibration`."""

    @property
    def spec(self) -> SpecLike: ...
    @property
    def view(self) -> CalibrationView | None: ...


def _pair(values: Sequence[Any]) -> tuple[float, float]:
    """A stored ``[lo, hi]`` (non-finite ends as "inf"/"nan" strings) as floats."""
    lo, hi = values
    return float(lo), float(hi)


@dataclass(frozen=True)
class CalibrationView:
    """What a calibration keeps for its views, in bounded size.

    Per tensor: the observed range, the chosen clip range and (when a histogram was made) the
    histogram in at most :data:`VIEW_BINS` bins, of ``|x|`` for symmetric searches, of ``x``
    otherwise. Per channel: no histograms, the clip ratios' summary (:func:`clip_summary`).
    ``predictions``: every compared method (:func:`qstream.compare_methods`), else empty.
    """

    method: str
    channels: int
    data_range: tuple[float, float]
    clip: tuple[float, float] | None = None
    histogram: Histogram | None = None
    clip_ratio: dict[str, Any] | None = None
    predictions: tuple[MethodPrediction, ...] = field(default_factory=tuple)

    @property
    def best(self) -> str | None:
        """The compared method with the highest predicted SQNR (None without predictions)."""
        if not self.predictions:
            return None
        return max(
            self.predictions, key=lambda p: -math.inf if p.sqnr_db != p.sqnr_db else p.sqnr_db
        ).method

    def prediction(self, method: str) -> MethodPrediction | None:
        return next((p for p in self.predictions if p.method == method), None)

    def markers(self) -> list[tuple[str, float]]:
        """``(label, x)`` of every threshold to mark on the histogram: the chosen clip range
        (``lo`` and ``hi``; ``max(-lo, hi)`` on a ``|x|`` histogram) and every compared
        method's, sorted by position."""
        out: list[tuple[str, float]] = []
        ranges = [
            (p.method, p.lo, p.hi)
            for p in self.predictions
            if p.lo is not None and p.hi is not None
        ]
        if not ranges and self.clip is not None:
            ranges = [(self.method, *self.clip)]
        for name, lo, hi in ranges:
            if self.histogram is not None and self.histogram.abs:
                out.append((name, max(-lo, hi)))
            else:
                out.extend([(name, lo), (name, hi)])
        return sorted(out, key=lambda m: m[1])

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "channels": self.channels,
            "data_range": [json_float(v) for v in self.data_range],
            "clip": None if self.clip is None else [json_float(v) for v in self.clip],
            "histogram": None if self.histogram is None else self.histogram.to_dict(),
            "clip_ratio": self.clip_ratio,
            "predictions": [p.to_dict() for p in self.predictions],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CalibrationView:
        return cls(
            method=d["method"],
            channels=int(d["channels"]),
            data_range=_pair(d["data_range"]),
            clip=None if d.get("clip") is None else _pair(d["clip"]),
            histogram=Histogram.from_dict(d["histogram"]) if d.get("histogram") else None,
            clip_ratio=d.get("clip_ratio"),
            predictions=tuple(MethodPrediction.from_dict(p) for p in d.get("predictions", ())),
        )


def calibration_view(
    spec: SpecLike,
    stats: RangesLike,
    lo: npt.ArrayLike,
    hi: npt.ArrayLike,
    histogram: Histogram | None = None,
    predictions: Iterable[MethodPrediction] = (),
) -> CalibrationView:
    """The :class:`CalibrationView` of a calibration under ``spec`` (per tensor or per axis)
    with observed statistics ``stats`` and chosen per-channel ranges ``lo``/``hi``."""
    has = stats.count > 0
    dmin = np.where(has, stats.min, 0.0)
    dmax = np.where(has, stats.max, 0.0)
    data_range = (float(dmin.min()), float(dmax.max())) if dmin.size else (0.0, 0.0)
    a, b = np.asarray(lo, np.float64).reshape(-1), np.asarray(hi, np.float64).reshape(-1)
    if a.size == 1:
        return CalibrationView(
            spec.method, 1, data_range, (float(a[0]), float(b[0])), histogram, None,
            tuple(predictions),
        )  # fmt: skip
    ratio = clip_ratio(a, b, dmin, dmax, symmetric=spec.symmetric)
    return CalibrationView(
        spec.method, int(a.size), data_range, None, None, clip_summary(ratio), tuple(predictions)
    )


@dataclass(frozen=True)
class ReportView:
    """A quantized output as its views see it: the spec, the calibration view, the error
    summary, the per-channel SQNR summary and, for group-wise outputs, the per-group SQNR
    summary (from a report or an output's metadata)."""

    title: str
    spec: dict[str, Any]
    calibration: CalibrationView | None
    error: dict[str, Any] | None
    channels: ChannelSummary | None
    groups: GroupSummary | None = None

    @classmethod
    def from_parts(
        cls,
        title: str,
        spec: dict[str, Any],
        calibration: dict[str, Any] | None,
        error: dict[str, Any] | None,
    ) -> ReportView:
        """The view of a spec, a calibration summary and an error summary (as stored)."""
        view = (calibration or {}).get("view")
        chans = (error or {}).get("channels")
        return cls(
            title,
            spec,
            CalibrationView.from_dict(view) if view else None,
            error,
            ChannelSummary.from_dict(chans) if chans else None,
            GroupSummary.from_error(error),
        )

    @classmethod
    def from_report(cls, report: ReportLike) -> ReportView:
        title = report.destination or str(report.source.get("path", "array"))
        return cls.from_parts(title, report.spec.to_dict(), report.calibration, report.error)

    @classmethod
    def from_meta(cls, meta: dict[str, Any], title: str = "array") -> ReportView:
        return cls.from_parts(
            title, meta.get("spec") or {}, meta.get("calibration"), meta.get("error")
        )

    @classmethod
    def from_calibration(cls, cal: CalibrationLike, title: str = "calibration") -> ReportView:
        return cls(title, cal.spec.to_dict(), cal.view, None, None)
