"""matplotlib charts of the calibration views, each drawn on a given axes: a histogram with
thresholds, the per-channel and per-group SQNR, the worst channels and groups, the tail of a
histogram, the methods' predicted SQNR and the groups' scales.

matplotlib is imported only when a chart is asked for (:func:`require_matplotlib` says what to
install without it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ...spec.views import ChannelSummary, GroupSummary, Histogram, ReportView
from ..svg import BAR, CLIPPED, color, fmt

if TYPE_CHECKING:
    from types import ModuleType

    from matplotlib.axes import Axes

PAGE = (10.0, 7.0)  # inches; at DPI, 1000 x 700 pixels
DPI = 100


def require_matplotlib() -> ModuleType:
    """matplotlib, or an ``ImportError`` that says what to install."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "plotting needs matplotlib: pip install 'qstream-zarr[plot]'"
            " (or pip install matplotlib)"
        ) from None
    return matplotlib


def new_axes(figsize: tuple[float, float] = (8, 3.5)) -> Axes:
    """The axes of a new figure for a ``.plot()``: through pyplot (``plt.show()`` shows it),
    except in a Jupyter kernel, where a plain ``Figure`` is made: the cell shows the figure
    ``.plot()`` returns once, where pyplot's inline backend would show it a second time."""
    from ...jupyter import jupyter_cell

    # (constrained layout: the axis labels stay inside the figure a plain ``savefig`` writes)
    if jupyter_cell() is not None:
        from matplotlib.figure import Figure

        return Figure(figsize=figsize, layout="constrained").add_subplot()
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=figsize, layout="constrained")[1]


#: the largest count from which a count axis is drawn log scale (below, linear reads better)
LOG_FROM = 20


def log_counts(ax: Axes) -> None:
    """A log count axis labelled with plain numbers (1, 10, 100, ...; not 6x10^0)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def plot_histogram(
    ax: Axes,
    hist: Histogram,
    markers: Sequence[tuple[str, float]] = (),
    *,
    clip: tuple[float, float] | None = None,
    log: bool = True,
    xlabel: str | None = None,
) -> Axes:
    """Bars of ``hist`` (log count scale when ``log`` and a bin holds more than
    :data:`LOG_FROM`), bins beyond ``clip`` in red, a dashed line per
    ``(method, x)`` marker; returns ``ax``."""
    edges = hist.edges
    widths = edges[1:] - edges[:-1]
    colors = [CLIPPED if c else BAR for c in hist.clipped(clip)]
    ax.bar(edges[:-1], hist.counts, width=widths, align="edge", color=colors, linewidth=0)
    if log and hist.counts.max(initial=0) > LOG_FROM:
        log_counts(ax)
    else:
        log = False
    seen = set()
    for name, x in markers:
        ax.axvline(
            x,
            color=color(name),
            linestyle="--",
            linewidth=1.2,
            label=None if name in seen else f"{name} {fmt(x)}",
        )
        seen.add(name)
    if markers:
        # a row above the tallest bar, never over it
        top = max(1.0, float(hist.counts.max(initial=0)))
        ax.set_ylim(top=top * (10 ** max(0.6, 0.35 * math.log10(top)) if log else 1.35))
        ax.legend(fontsize=8, loc="upper center", ncols=min(3, len(seen)))
    # (a margin on either side: a marker at the first or last edge, the worst channel's
    # SQNR say, stays a visible line and not the axes' own border)
    pad = 0.02 * (hist.hi - hist.lo) if hist.hi > hist.lo else 0.5
    ax.set_xlim(hist.lo - pad, hist.hi + pad)
    ax.set_xlabel(xlabel or ("|x|" if hist.abs else "x"))
    ax.set_ylabel("count (log)" if log else "count")
    return ax


def plot_channels(ax: Axes, ch: ChannelSummary, title: str | None = None) -> Axes:
    """The per-channel SQNR distribution with its median and worst channel marked."""
    if ch.histogram is None:
        ax.text(0.5, 0.5, "no finite per-channel SQNR", ha="center", va="center")
        ax.set_axis_off()
        return ax
    markers = []
    if ch.quantiles:
        markers = [("median", ch.quantiles["median"]), ("worst", ch.quantiles["min"])]
    plot_histogram(ax, ch.histogram, markers, xlabel="SQNR dB")  # (log: the worst show)
    ax.set_ylabel("channels (log)" if ax.get_yscale() == "log" else "channels")
    ax.set_title(title or f"per-channel SQNR ({ch.channels} channels)", fontsize=10)
    return ax


def plot_worst(ax: Axes, ch: ChannelSummary) -> Axes:
    """The worst channels' SQNR against the median channel's."""
    names = [str(w["channel"]) for w in ch.worst]
    vals = [w["sqnr_db"] if math.isfinite(w["sqnr_db"]) else 0.0 for w in ch.worst]
    ax.barh(names, vals, color=CLIPPED)
    if ch.quantiles:
        ax.axvline(ch.quantiles["median"], color=color("median"), linestyle="--", label="median")
        # (above the axes, at the right of the title: the bars fill the axes' width)
        ax.legend(fontsize=8, loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False)
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.2f}", va="center", fontsize=8)
    ax.set_xlabel("SQNR dB")
    ax.set_ylabel("channel")
    ax.set_title(f"worst {len(names)} channels", fontsize=10)
    ax.invert_yaxis()
    return ax


def plot_groups(ax: Axes, g: GroupSummary, title: str | None = None) -> Axes:
    """The per-group SQNR distribution (log count scale) with its median and worst group
    marked; what lies outside it in the title."""
    h = g.shown()
    if h is None:
        ax.text(0.5, 0.5, "no per-group SQNR distribution kept", ha="center", va="center")
        ax.set_axis_off()
        return ax
    plot_histogram(ax, h, g.markers(), log=True, xlabel="SQNR dB of a group")
    ax.set_ylabel("groups (log)")
    notes = g.notes()
    ax.set_title(
        title or f"per-group SQNR ({g.groups} groups)" + (f"; {notes}" if notes else ""),
        fontsize=10,
    )
    return ax


def plot_tail(ax: Axes, hist: Histogram, markers: Sequence[tuple[str, float]] = ()) -> Axes:
    """The share of values beyond each edge (log scale), with the share each threshold
    clips: how far out the tail reaches."""
    total = hist.total
    if not total:
        ax.set_axis_off()
        return ax
    beyond = 1.0 - np.concatenate([[0], np.cumsum(hist.counts)]) / total
    edges = hist.edges
    keep = beyond > 0
    ax.step(edges[keep], beyond[keep], where="post", color="#334155")
    ax.set_yscale("log")
    for name, x in markers:
        k = min(hist.nbins, max(0, int(np.searchsorted(edges, x, side="right")) - 1))
        ax.axvline(x, color=color(name), linestyle="--", linewidth=1.0)
        if beyond[k] > 0:  # (the threshold: the exact share clipped is in the summary)
            ax.annotate(
                f"{name} {fmt(x)}",
                (x, beyond[k]),
                fontsize=7,
                color=color(name),
                xytext=(3, 3),
                textcoords="offset points",
            )
    ax.set_xlim(hist.lo, hist.hi)
    ax.set_xlabel("|x|" if hist.abs else "x")
    ax.set_ylabel("share of values beyond")
    ax.set_title("tail: share of values beyond x (bin resolution)", fontsize=10)
    return ax


def plot_predictions(ax: Axes, view: ReportView) -> Axes:
    """Predicted SQNR per compared method (the best in colour)."""
    cal = view.calibration
    if cal is None:
        raise ValueError("plot_predictions needs a view with a calibration")
    preds = cal.predictions
    best = cal.best
    names = [p.method for p in preds]
    vals = [p.sqnr_db if math.isfinite(p.sqnr_db) else 0.0 for p in preds]
    ax.barh(names, vals, color=[color(n) if n == best else BAR for n in names])
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.2f}", va="center", fontsize=8)
    ax.set_xlabel("predicted SQNR dB (from the histogram)")
    ax.invert_yaxis()
    return ax


def plot_worst_groups(ax: Axes, worst: list[dict[str, Any]]) -> Axes:
    """The worst parameter groups of a group-wise output (their SQNR), worst at the top."""
    names = [",".join(str(i) for i in w["group"]) for w in worst]
    vals = [float(w["sqnr_db"]) if w.get("sqnr_db") is not None else math.inf for w in worst]
    ax.barh(names, [v if math.isfinite(v) else 0.0 for v in vals], color=CLIPPED)
    for i, v in enumerate(vals):
        ax.text(v if math.isfinite(v) else 0.0, i, f" {v:.2f}", va="center", fontsize=8)
    ax.set_xlabel("SQNR dB of the group")
    ax.set_ylabel("group (row, block)")
    ax.invert_yaxis()
    return ax


def plot_scales(ax: Axes, scales: npt.ArrayLike) -> int:
    """The distribution of the groups' scales (log10); returns how many were drawn."""
    s = np.asarray(scales, np.float64).reshape(-1)
    s = s[np.isfinite(s) & (s > 0)]
    if s.size:
        ax.hist(np.log10(s), bins=min(100, max(10, s.size // 20)), color=BAR)
        log_counts(ax)
        ax.set_xlabel("log10 scale of a group")
        ax.set_ylabel("groups")
    return int(s.size)
