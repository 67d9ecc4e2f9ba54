"""What the store functions return: the resolved parameters (:class:`QuantParams`), a
calibration (:class:`Calibration`) and a conversion's report (:class:`QuantReport`).

Their views (a table and an inline SVG in notebooks, matplotlib on demand) are drawn by
:mod:`qstream.viz`, which these data classes do not import: they ask
:mod:`qstream.spec.views.display` for the drawing of their view.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from .json_helpers import check_keys, field_values, jsonable, jsonable_dict
from .quantspec import QuantSpec
from .stats import RangeStats
from .views import CalibrationView, ReportView, display


@dataclass(frozen=True)
class QuantParams:
    """Resolved parameters: ``scale``/``zero_point`` shaped for ``qstream.quantize``."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None
    block_size: int | None
    offset: np.ndarray | None = None  # float offsets (float64), shaped like ``scale``

    def to_dict(self) -> dict[str, Any]:
        d = {
            "scale": jsonable(self.scale),
            "zero_point": jsonable(self.zero_point),
            "axis": self.axis,
            "block_size": self.block_size,
        }
        if self.offset is not None:
            d["offset"] = jsonable(self.offset)
        return d


@dataclass(frozen=True)
class Calibration:
    """Statistics gathered from a source and the parameters they give under a spec."""

    spec: QuantSpec
    stats: RangeStats | None
    # method detail: chosen lo/hi per channel
    thresholds: dict[str, Any] = field(default_factory=dict)
    params: QuantParams | None = None
    view: CalibrationView | None = None  # what the views draw

    @property
    def scale(self) -> np.ndarray:
        return self._params().scale

    @property
    def zero_point(self) -> np.ndarray:
        return self._params().zero_point

    def _params(self) -> QuantParams:
        if self.params is None:
            raise AttributeError("this calibration has no parameters (params is None)")
        return self.params

    def to_dict(self, *, with_params: bool = True) -> dict[str, Any]:
        d = {
            "spec": self.spec.to_dict(),
            "stats": self.stats.to_dict() if self.stats is not None else None,
            "thresholds": jsonable(self.thresholds),
        }
        if with_params and self.params is not None:
            d["params"] = self.params.to_dict()
        if self.view is not None:
            d["view"] = self.view.to_dict()
        return d

    def summary(self, limit: int = 16) -> dict[str, Any]:
        """``to_dict`` without parameters, per-channel arrays longer than ``limit`` reduced to
        ``{"size", "min", "max"}`` (for metadata: the per-channel results are the stored
        scale / zero point arrays)."""

        def shrink(v: Any) -> Any:
            if not (isinstance(v, np.ndarray) and v.ndim == 1 and v.size > limit):
                return v
            finite = v[np.isfinite(v)] if v.dtype.kind == "f" else v
            return {
                "size": int(v.size),
                "min": finite.min() if finite.size else None,
                "max": finite.max() if finite.size else None,
            }

        stats: dict[str, Any] | None = None
        if self.stats is not None:
            stats = {f.name: shrink(getattr(self.stats, f.name)) for f in fields(self.stats)}
        out = {
            "spec": self.spec.to_dict(),
            "stats": stats,
            "thresholds": {k: shrink(v) for k, v in self.thresholds.items()},
        }
        if self.view is not None:  # bounded: see qstream.spec.views
            out["view"] = self.view.to_dict()
        return jsonable_dict(out)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        spec = QuantSpec.from_dict(d["spec"])
        params = None
        if d.get("params"):
            p = d["params"]
            params = QuantParams(
                np.asarray(p["scale"], np.float32),
                np.asarray(p["zero_point"], np.float64),
                p["axis"],
                p["block_size"],
                np.asarray(p["offset"], np.float64) if p.get("offset") is not None else None,
            )
        stats = RangeStats.from_dict(d["stats"]) if d.get("stats") else None
        view = CalibrationView.from_dict(d["view"]) if d.get("view") else None
        return cls(spec, stats, d.get("thresholds", {}), params, view)

    # ---- views (drawn by qstream.viz): a table and an inline SVG in notebooks; matplotlib
    # on demand

    def _repr_html_(self) -> str:
        return display.html(ReportView.from_calibration(self))

    def plot(self, ax: Any = None) -> Any:
        """Draw the histogram with the chosen (and compared) thresholds on ``ax`` (a
        matplotlib axes; a new figure when None) with matplotlib (``pip install
        'qstream-zarr[plot]'``); returns the figure."""
        return display.plot(ReportView.from_calibration(self), ax=ax)


@dataclass(frozen=True)
class QuantReport:
    """What a store conversion did: spec, source, calibration, error and cost."""

    spec: QuantSpec
    source: dict[str, Any]
    destination: str
    calibration: dict[str, Any] | None
    error: dict[str, Any] | None
    passes: int
    seconds: float
    bytes_read: int
    bytes_written: int  # the codes
    resumed_blocks: int = 0  # blocks an interrupted run had finished
    missing_chunks: int = 0  # source chunks never written: read as the fill value
    already_complete: bool = False  # the output was complete: nothing was done
    # the source's values, and every byte the output holds for them (codes and parameters:
    # the "after" of a dry run, inspect and convert); 0 in reports of older outputs
    bytes_before: int = 0
    bytes_after: int = 0

    def to_dict(self) -> dict[str, Any]:
        # (calibration and error are JSON-ready summaries already: not walked again)
        d = field_values(self)
        d["spec"] = self.spec.to_dict()
        return {k: v if k in ("calibration", "error") else jsonable(v) for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QuantReport:
        d = dict(d)
        check_keys(d, [f.name for f in fields(cls)], "QuantReport")
        d["spec"] = QuantSpec.from_dict(d["spec"])
        return cls(**d)

    # ---- views (drawn by qstream.viz): a table and an inline SVG in notebooks; matplotlib
    # on demand

    def _repr_html_(self) -> str:
        return display.html(ReportView.from_report(self))

    def plot(self, ax: Any = None) -> Any:
        """Draw the calibration histogram with its thresholds (per tensor) or the per-channel
        SQNR distribution (per channel) on ``ax`` (a matplotlib axes; a new figure when None)
        with matplotlib (``pip install 'qstream-zarr[plot]'``); returns the figure."""
        return display.plot(ReportView.from_report(self), ax=ax)
