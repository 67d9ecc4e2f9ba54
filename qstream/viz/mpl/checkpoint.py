"""matplotlib figures of a converted checkpoint, bounded whatever its number of tensors: the
SQNR over its quantized tensors, the worst tensors, the tensors' sizes before and after, and
the one-page figure of them all (:func:`checkpoint_figure`)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from ...spec.views import CheckpointView
from ..svg import AFTER, BAR, BEFORE, CLIPPED, color, fmt_bytes, fmt_size
from .charts import DPI, PAGE, new_axes, plot_histogram, require_matplotlib

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def plot_checkpoint(view: CheckpointView, ax: Axes | None = None) -> Axes:
    """The SQNR over a checkpoint's quantized tensors (one count per tensor) with the median
    and worst tensor marked, on ``ax`` (a new figure when None); returns the axes."""
    require_matplotlib()
    if ax is None:
        ax = new_axes()
    ch = view.sqnr
    if ch is None or ch.histogram is None:
        ax.text(0.5, 0.5, "no quantized tensor with an SQNR", ha="center", va="center")
        ax.set_axis_off()
        return ax
    plot_histogram(ax, ch.histogram, view.markers(), xlabel="SQNR dB of a tensor")
    ax.set_ylabel("tensors (log)" if ax.get_yscale() == "log" else "tensors")
    exact = f"; {ch.exact} exact" if ch.exact else ""
    ax.set_title(f"SQNR per tensor ({ch.channels} quantized tensors{exact})", fontsize=10)
    return ax


def plot_sizes(ax: Axes, view: CheckpointView) -> Axes:
    """The tensors' sizes before and after (histograms of log10 bytes on the same bins)."""
    b, a = view.sizes_before, view.sizes_after
    if b is None or a is None:
        ax.text(0.5, 0.5, "no tensor", ha="center", va="center")
        ax.set_axis_off()
        return ax
    edges = b.edges
    w = (edges[1:] - edges[:-1]) / 2
    ax.bar(edges[:-1], b.counts, width=w, align="edge", color=BEFORE, label="before")
    ax.bar(edges[:-1] + w, a.counts, width=w, align="edge", color=AFTER, label="after")
    ticks = np.arange(math.ceil(b.lo), math.floor(b.hi) + 1)
    ax.set_xticks(ticks, [fmt_size(10.0**t) for t in ticks], fontsize=7)
    ax.set_xlim(b.lo, b.hi)
    ax.set_xlabel("bytes of a tensor (log scale)")
    ax.set_ylabel("tensors")
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    # a row above the bars (matplotlib's "best" place tries every bar: seconds on a busy
    # machine, with a warning)
    ax.set_ylim(0, max(1, int(max(b.counts.max(), a.counts.max()))) * 1.3)
    ax.legend(fontsize=8, loc="upper center", ncols=2)
    ax.set_title(
        f"tensors by size ({view.tensors}; {view.kept} kept):"
        f" {fmt_bytes(view.bytes_before)} -> {fmt_bytes(view.bytes_after)}",
        fontsize=10,
    )
    return ax


def plot_worst_tensors(ax: Axes, view: CheckpointView, n: int = 10) -> Axes:
    """The worst tensors' SQNR as dots (worst at the top), the median tensor's marked; the
    axis spans their values, so close ones stay apart."""
    rows = [r for r in view.worst[:n] if r["sqnr_db"] is not None and math.isfinite(r["sqnr_db"])]
    if not rows:
        ax.set_axis_off()
        return ax
    vals = [r["sqnr_db"] for r in rows]
    ys = range(len(rows))
    ax.hlines(ys, min(vals), vals, color=BAR, linewidth=1)
    ax.plot(vals, ys, "o", color=CLIPPED, markersize=5)
    ax.set_yticks(ys, [_short(r["name"]) for r in rows], fontsize=7)
    for y, v in zip(ys, vals, strict=True):
        ax.annotate(f"{v:.2f}", (v, y), xytext=(4, -3), textcoords="offset points", fontsize=7)
    q = (view.sqnr.quantiles if view.sqnr is not None else None) or {}
    hi = max(vals)
    if q.get("median") is not None and math.isfinite(q["median"]):
        ax.axvline(q["median"], color=color("median"), linestyle="--", label="median tensor")
        # (the worst, smallest values are the top rows: the upper right stays clear)
        ax.legend(fontsize=7, loc="upper right")
        hi = max(hi, q["median"])
    pad = max(0.05, 0.15 * (hi - min(vals)))
    ax.set_xlim(min(vals) - pad, hi + 2 * pad)
    ax.set_xlabel("SQNR dB")
    ax.invert_yaxis()
    ax.set_title(f"worst {len(rows)} tensors", fontsize=10)
    return ax


def _short(name: str, n: int = 36) -> str:
    return name if len(name) <= n else "..." + name[-(n - 3) :]


def _checkpoint_lines(view: CheckpointView) -> list[str]:
    ratio = view.ratio
    lines = [
        f"{view.tensors} tensors: {view.quantized} quantized, {view.kept} kept",
        f"bytes {fmt_bytes(view.bytes_before)} -> {fmt_bytes(view.bytes_after)}"
        + ("" if ratio is None else f" ({100 * ratio:.1f} %)"),
    ]
    q = (view.sqnr.quantiles if view.sqnr is not None else None) or {}
    if q:
        lines.append(f"SQNR dB: min {q['min']:.2f}, median {q['median']:.2f}, max {q['max']:.2f}")
    if view.targets:
        lines.append("stored as (tensors, bytes after):")
        for t in view.targets:
            lines.append(f"  {t['target']}: {t['tensors']}, {fmt_bytes(t['bytes_after'])}")
    if view.largest:
        lines.append("largest tensors (before -> after):")
        for r in view.largest[:5]:  # (two lines each: the panel is ~50 characters wide)
            lines.append(f"  {_short(r['name'], 46)}")
            lines.append(f"    {fmt_bytes(r['bytes_before'])} -> {fmt_bytes(r['bytes_after'])}")
    return lines


def checkpoint_figure(
    rows: CheckpointView | Iterable[dict[str, Any]], title: str | None = None
) -> Figure:
    """The one-page figure of a converted checkpoint, bounded whatever its number of
    tensors: the SQNR over its quantized tensors (a histogram, median and worst marked),
    the worst tensors, the tensors' sizes before and after (histograms of their bytes) and
    a summary (totals, bytes per target, the largest tensors). ``rows``: the root's index
    rows (``QuantizedCheckpoint.tensors.values()``; no tensor is opened) or a
    :class:`~qstream.spec.views.CheckpointView`."""
    require_matplotlib()
    from matplotlib.figure import Figure

    if isinstance(rows, CheckpointView):
        view = rows if title is None else CheckpointView(**{**rows.__dict__, "title": title})
    else:
        view = CheckpointView.from_rows(rows, title or "checkpoint")
    fig = Figure(figsize=PAGE, dpi=DPI, layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 1], width_ratios=[1.3, 1])
    top_left, top_right = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    bottom_left, bottom_right = fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    plot_checkpoint(view, top_left)
    if view.worst:
        plot_worst_tensors(top_right, view)
    else:
        top_right.set_axis_off()
    plot_sizes(bottom_left, view)
    bottom_right.set_axis_off()
    bottom_right.text(
        0,
        1,
        "\n".join(_checkpoint_lines(view)),
        va="top",
        ha="left",
        fontsize=8,
        family="monospace",
    )
    fig.suptitle(view.title, fontsize=11)
    return fig
