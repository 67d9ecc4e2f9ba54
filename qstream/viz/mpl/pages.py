"""The one-page matplotlib figures of a report view (:func:`figure`, :func:`group_figure`),
its main chart (:func:`plot_view`) and how a figure is written (:func:`save_figure`).

Files are drawn on a plain ``Figure`` (no pyplot state, the Agg/SVG canvases), so writing one
works headless.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

import numpy.typing as npt

from ...spec.views import ChannelSummary, ReportView
from ..html import describe
from ..svg import fmt
from .charts import (
    DPI,
    PAGE,
    new_axes,
    plot_channels,
    plot_groups,
    plot_histogram,
    plot_predictions,
    plot_scales,
    plot_tail,
    plot_worst,
    plot_worst_groups,
    require_matplotlib,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def plot_view(view: ReportView, ax: Axes | None = None) -> Axes:
    """The main chart of a view on ``ax`` (a new figure when None): the histogram with its
    thresholds per tensor, else the per-channel SQNR; returns the axes."""
    require_matplotlib()
    if ax is None:
        ax = new_axes()
    cal = view.calibration
    ch = _channels(view)
    if cal is not None and cal.histogram is not None:
        plot_histogram(ax, cal.histogram, cal.markers(), clip=cal.clip)
        ax.set_title(f"{view.title}: {describe(view.spec)}", fontsize=10)
    elif ch is not None:
        plot_channels(ax, ch[0], ch[1])
    elif view.groups is not None and view.groups.histogram is not None:
        plot_groups(ax, view.groups)
    elif view.groups is not None and view.groups.worst:
        plot_worst_groups(ax, list(view.groups.worst))
        ax.set_title(f"{view.title}: worst groups", fontsize=10)
    else:
        ax.text(0.5, 0.5, _nothing(view), ha="center", va="center")
        ax.set_axis_off()
    return ax


def _nothing(view: ReportView) -> str:
    """Why there is no histogram to draw."""
    if view.calibration is None:
        return "no calibration view (explicit or per-block scales)"
    return "no histogram kept (minmax per tensor: quantize with --histogram to keep one)"


def _channels(view: ReportView) -> tuple[ChannelSummary, str | None] | None:
    if view.channels is not None:
        return view.channels, None
    cal = view.calibration
    if cal is None:
        return None
    p = cal.prediction(cal.method)
    if p is not None and p.channels is not None:
        return p.channels, f"per-channel SQNR predicted for {cal.method} ({p.channels.channels})"
    return None


def _summary_lines(view: ReportView) -> list[str]:
    lines = [describe(view.spec)]
    err = view.error or {}
    if err:
        sq = err.get("sqnr_db")
        sq = "inf" if sq is None or sq == math.inf else f"{float(sq):.2f}"
        lines += [
            f"SQNR {sq} dB",
            f"MSE {fmt(float(err.get('mse', 0.0)))}",
            f"max abs error {fmt(float(err.get('max_abs', 0.0)))}",
            f"cosine {float(err.get('cosine', 1.0)):.6f}",
            f"clipped {100 * float(err.get('clip_fraction', 0.0)):.4f} %",
        ]
    cal = view.calibration
    if cal is not None:
        lines.append(f"data range [{fmt(cal.data_range[0])}, {fmt(cal.data_range[1])}]")
        if cal.clip is not None:
            lines.append(f"clip range ({cal.method}) [{fmt(cal.clip[0])}, {fmt(cal.clip[1])}]")
        if cal.clip_ratio and cal.clip_ratio.get("quantiles"):
            q = cal.clip_ratio["quantiles"]
            lines.append(f"kept / channel range: median {q['median']:.4f}, min {q['min']:.4f}")
    ch = _channels(view)
    if ch is not None and ch[0].worst:
        lines.append("worst channels (SQNR dB):")
        for w in ch[0].worst:
            s = w["sqnr_db"]
            lines.append(f"  {w['channel']}: {'inf' if s == math.inf else f'{s:.2f}'}")
    g = view.groups
    if g is not None:
        q = g.quantiles or {}
        if g.groups:
            lines.append(f"{g.groups} groups")
        got = [f"{k} {q[k]:.2f}" for k in ("p05", "median", "p95") if q.get(k) is not None]
        if got:
            lines.append("group SQNR dB: " + ", ".join(got))
        if g.notes():
            lines.append(f"  {g.notes()}")
        if g.worst:
            lines.append("worst groups (SQNR dB):")
            for w in g.worst:
                at = ",".join(str(i) for i in w.get("group", ()))
                s = w.get("sqnr_db")
                lines.append(f"  {at}: {'-' if s is None else f'{s:.2f}'}")
    return lines


def figure(view: ReportView) -> Figure:
    """The one-page figure (:data:`PAGE` at :data:`DPI`): the histogram with thresholds,
    the per-channel SQNR (or the methods' predicted SQNR), and the error summary."""
    require_matplotlib()
    from matplotlib.figure import Figure

    fig = Figure(figsize=PAGE, dpi=DPI, layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=[1.2, 1], width_ratios=[1.4, 1])
    top = fig.add_subplot(grid[0, :])
    left = fig.add_subplot(grid[1, 0])
    right = fig.add_subplot(grid[1, 1])
    cal = view.calibration
    ch = _channels(view)
    channels_on_top = False
    if cal is not None and cal.histogram is not None:
        plot_histogram(top, cal.histogram, cal.markers(), clip=cal.clip)
        what = "|x|" if cal.histogram.abs else "x"
        top.set_title(
            f"{what} histogram with clip thresholds, {cal.histogram.total} values", fontsize=10
        )
    elif ch is not None:
        plot_channels(top, ch[0], ch[1])
        channels_on_top = True
    elif view.groups is not None and view.groups.histogram is not None:
        plot_groups(top, view.groups)
    else:
        top.text(0.5, 0.5, _nothing(view), ha="center", va="center")
        top.set_axis_off()
    if view.groups is not None and view.groups.worst and ch is None:
        plot_worst_groups(left, list(view.groups.worst))
        left.set_title("worst groups", fontsize=10)
    elif cal is not None and cal.predictions and len(cal.predictions) > 1:
        plot_predictions(left, view)
        left.set_title("methods compared", fontsize=10)
    elif ch is not None and not channels_on_top:
        plot_channels(left, ch[0], ch[1])
    elif ch is not None and ch[0].worst:
        plot_worst(left, ch[0])
    elif cal is not None and cal.histogram is not None:
        plot_tail(left, cal.histogram, cal.markers())
    else:
        left.text(
            0.5, 0.5, "one SQNR for the whole tensor (see the summary)", ha="center", va="center"
        )
        left.set_axis_off()
    right.set_axis_off()
    right.text(
        0, 1, "\n".join(_summary_lines(view)), va="top", ha="left", fontsize=9, family="monospace"
    )
    fig.suptitle(view.title, fontsize=11)
    return fig


def group_figure(view: ReportView, scales: npt.ArrayLike | None = None) -> Figure:
    """The one-page figure of a group-wise (blocked) output: the distribution of its groups'
    SQNR (when the output keeps it), its worst groups' SQNR, the distribution of its groups'
    scales (the per-group ranges) and the error summary."""
    require_matplotlib()
    from matplotlib.figure import Figure

    fig = Figure(figsize=PAGE, dpi=DPI, layout="constrained")
    g = view.groups
    shown = g if g is not None and g.histogram is not None else None  # a distribution kept
    dist = shown is not None
    if dist and scales is not None:
        grid = fig.add_gridspec(2, 3, height_ratios=[1.2, 1], width_ratios=[1, 1, 1])
        top, left = fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, 0])
        middle, right = fig.add_subplot(grid[1, 1]), fig.add_subplot(grid[1, 2])
    else:
        grid = fig.add_gridspec(2, 2, height_ratios=[1.2, 1], width_ratios=[1.4, 1])
        top, left = fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, 0])
        middle, right = None, fig.add_subplot(grid[1, 1])
    scale_ax = middle if dist else top
    if shown is not None:
        plot_groups(top, shown)
    if scales is not None and scale_ax is not None:
        n = plot_scales(scale_ax, scales)
        what = "(a group's range / its steps)"
        scale_ax.set_title(
            f"{n} groups: their scales" + (f" {what}" if scale_ax is top else f"\n{what}"),
            fontsize=10 if scale_ax is top else 9,
        )
    elif not dist:
        top.text(0.5, 0.5, "no per-group SQNR distribution kept", ha="center", va="center")
        top.set_axis_off()
    if g is not None and g.worst:
        plot_worst_groups(left, list(g.worst))
        left.set_title("worst groups", fontsize=10)
    else:
        left.set_axis_off()
    right.set_axis_off()
    lines = _summary_lines(view)
    if middle is not None:  # a third of the page: long lines wrapped
        lines = [w for line in lines for w in _wrap(line, 40)]
    right.text(0, 1, "\n".join(lines), va="top", ha="left", fontsize=8, family="monospace")
    fig.suptitle(view.title, fontsize=11)
    return fig


def _wrap(line: str, width: int) -> list[str]:
    import textwrap

    indent = line[: len(line) - len(line.lstrip())]
    return textwrap.wrap(line, width, subsequent_indent=indent + "  ") or [line]


def save_figure(
    view: ReportView | None, path: str | os.PathLike[str], fig: Figure | None = None
) -> str:
    """Write :func:`figure` of ``view`` (or the given ``fig``) to ``path`` (``.png`` or
    ``.svg``); returns the path."""
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".png", ".svg"):
        raise ValueError(f"{path}: a figure is written as .png or .svg")
    import matplotlib

    if fig is None:
        if view is None:
            raise ValueError("save_figure needs a view or a figure")
        fig = figure(view)
    # SVG text stays text (searchable, small); no timestamps: the same view, the same file
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "qstream"}):
        meta = {"Date": None} if ext == ".svg" else {"Software": None}
        fig.savefig(path, format=ext[1:], dpi=DPI, metadata=meta)
    return path
