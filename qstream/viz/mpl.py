"""matplotlib figures of the calibration views (``pip install 'qstream-zarr[plot]'``).

Imported only when a plot is asked for; without matplotlib every entry point raises an
``ImportError`` that says what to install. Files are drawn on a plain ``Figure`` (no pyplot
state, the Agg/SVG canvases), so writing one works headless.
"""

from __future__ import annotations

import math
import os

from ..calibration.views import ChannelSummary, Histogram, ReportView
from .html import describe
from .svg import BAR, CLIPPED, color, fmt

PAGE = (10.0, 7.0)  # inches; at DPI, 1000 x 700 pixels
DPI = 100


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "plotting needs matplotlib: pip install 'qstream-zarr[plot]'"
            " (or pip install matplotlib)"
        ) from None
    return matplotlib


def plot_histogram(ax, hist: Histogram, markers=(), *, clip=None, log=True, xlabel=None):
    """Bars of ``hist`` (log count scale), bins beyond ``clip`` in red, a dashed line per
    ``(method, x)`` marker; returns ``ax``."""
    edges = hist.edges
    widths = edges[1:] - edges[:-1]
    colors = [CLIPPED if c else BAR for c in hist.clipped(clip)]
    ax.bar(edges[:-1], hist.counts, width=widths, align="edge", color=colors, linewidth=0)
    if log and hist.counts.max(initial=0) > 0:
        ax.set_yscale("log")
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
        ax.legend(fontsize=8, loc="upper right")
    ax.set_xlim(hist.lo, hist.hi)
    ax.set_xlabel(xlabel or ("|x|" if hist.abs else "x"))
    ax.set_ylabel("count (log)" if log else "count")
    return ax


def plot_channels(ax, ch: ChannelSummary, title: str | None = None):
    """The per-channel SQNR distribution with its median and worst channel marked."""
    if ch.histogram is None:
        ax.text(0.5, 0.5, "no finite per-channel SQNR", ha="center", va="center")
        ax.set_axis_off()
        return ax
    markers = []
    if ch.quantiles:
        markers = [("median", ch.quantiles["median"]), ("worst", ch.quantiles["min"])]
    plot_histogram(ax, ch.histogram, markers, log=False, xlabel="SQNR dB")
    ax.set_ylabel("channels")
    ax.set_title(title or f"per-channel SQNR ({ch.channels} channels)", fontsize=10)
    return ax


def plot_worst(ax, ch: ChannelSummary):
    """The worst channels' SQNR against the median channel's."""
    names = [str(w["channel"]) for w in ch.worst]
    vals = [w["sqnr_db"] if math.isfinite(w["sqnr_db"]) else 0.0 for w in ch.worst]
    ax.barh(names, vals, color=CLIPPED)
    if ch.quantiles:
        ax.axvline(ch.quantiles["median"], color=color("median"), linestyle="--", label="median")
        ax.legend(fontsize=8, loc="lower right")
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.2f}", va="center", fontsize=8)
    ax.set_xlabel("SQNR dB")
    ax.set_ylabel("channel")
    ax.set_title(f"worst {len(names)} channels", fontsize=10)
    ax.invert_yaxis()
    return ax


def plot_tail(ax, hist: Histogram, markers=()):
    """The share of values beyond each edge (log scale), with the share each threshold
    clips: how far out the tail reaches."""
    import numpy as np

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
        if beyond[k] > 0:
            ax.annotate(
                f"{name} {100 * beyond[k]:.3g} %",
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


def plot_predictions(ax, view: ReportView):
    """Predicted SQNR per compared method (the best in colour)."""
    preds = view.calibration.predictions
    best = view.calibration.best
    names = [p.method for p in preds]
    vals = [p.sqnr_db if math.isfinite(p.sqnr_db) else 0.0 for p in preds]
    ax.barh(names, vals, color=[color(n) if n == best else BAR for n in names])
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.2f}", va="center", fontsize=8)
    ax.set_xlabel("predicted SQNR dB (from the histogram)")
    ax.invert_yaxis()
    return ax


def plot_view(view: ReportView, ax=None):
    """The main chart of a view on ``ax`` (a new figure when None): the histogram with its
    thresholds per tensor, else the per-channel SQNR; returns the axes."""
    _matplotlib()
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(8, 3.5))
    cal = view.calibration
    ch = _channels(view)
    if cal is not None and cal.histogram is not None:
        plot_histogram(ax, cal.histogram, cal.markers(), clip=cal.clip)
        ax.set_title(f"{view.title}: {describe(view.spec)}", fontsize=10)
    elif ch is not None:
        plot_channels(ax, ch[0], ch[1])
    else:
        ax.text(0.5, 0.5, _nothing(view), ha="center", va="center")
        ax.set_axis_off()
    return ax


def _nothing(view: ReportView) -> str:
    """Why there is no histogram to draw."""
    if view.calibration is None:
        return "no calibration view (explicit or per-block scales)"
    return "no histogram kept (minmax per tensor: quantize with --histogram to keep one)"


def _channels(view: ReportView):
    if view.channels is not None:
        return view.channels, None
    cal = view.calibration
    p = cal.prediction(cal.method) if cal is not None else None
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
    return lines


def figure(view: ReportView):
    """The one-page figure (:data:`PAGE` at :data:`DPI`): the histogram with thresholds,
    the per-channel SQNR (or the methods' predicted SQNR), and the error summary."""
    _matplotlib()
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
    else:
        top.text(0.5, 0.5, _nothing(view), ha="center", va="center")
        top.set_axis_off()
    if cal is not None and cal.predictions and len(cal.predictions) > 1:
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


def plot_worst_groups(ax, worst: list[dict]):
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


def group_figure(view: ReportView, scales):
    """The one-page figure of a group-wise (blocked) output: the distribution of its groups'
    scales (the per-group ranges), its worst groups' SQNR and the error summary."""
    _matplotlib()
    import numpy as np
    from matplotlib.figure import Figure

    fig = Figure(figsize=PAGE, dpi=DPI, layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=[1.2, 1], width_ratios=[1.4, 1])
    top, left = fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, 0])
    right = fig.add_subplot(grid[1, 1])
    s = np.asarray(scales, np.float64).reshape(-1)
    s = s[np.isfinite(s) & (s > 0)]
    if s.size:
        top.hist(np.log10(s), bins=min(100, max(10, s.size // 20)), color=BAR)
        top.set_yscale("log")
        top.set_xlabel("log10 scale of a group")
        top.set_ylabel("groups")
    top.set_title(f"{s.size} groups: their scales (a group's range / its steps)", fontsize=10)
    worst = (view.error or {}).get("worst_groups") or []
    if worst:
        plot_worst_groups(left, worst)
        left.set_title("worst groups", fontsize=10)
    else:
        left.set_axis_off()
    right.set_axis_off()
    right.text(
        0, 1, "\n".join(_summary_lines(view)), va="top", ha="left", fontsize=9, family="monospace"
    )
    fig.suptitle(view.title, fontsize=11)
    return fig


def checkpoint_figure(rows: list[dict], title: str):
    """The one-page figure of a converted checkpoint: each quantized tensor's SQNR (worst
    first) and every tensor's size before and after, from the root's index (no tensor is
    opened)."""
    _matplotlib()
    from matplotlib.figure import Figure

    fig = Figure(figsize=PAGE, dpi=DPI, layout="constrained")
    top, bottom = fig.subplots(2, 1, height_ratios=[1.2, 1])
    quant = [r for r in rows if not r.get("kept") and (r.get("error") or {}).get("sqnr_db")]
    quant.sort(key=lambda r: float(r["error"]["sqnr_db"]))
    if quant:
        sq = [float(r["error"]["sqnr_db"]) for r in quant]
        top.plot(range(len(sq)), sq, ".", color=BAR, markersize=3)
        top.set_xlabel(f"quantized tensors, worst first ({len(sq)})")
        top.set_ylabel("SQNR dB")
        for i in range(min(3, len(quant))):
            top.annotate(quant[i]["name"], (i, sq[i]), fontsize=7, xytext=(4, 4 + 8 * i),
                         textcoords="offset points")  # fmt: skip
        top.set_title("SQNR per tensor", fontsize=10)
    else:
        top.text(0.5, 0.5, "no quantized tensor", ha="center", va="center")
        top.set_axis_off()
    before = sum(int(r.get("bytes_before") or 0) for r in rows)
    after = sum(int(r.get("bytes_after") or 0) for r in rows)
    kept = [r for r in rows if r.get("kept")]
    sizes = sorted(rows, key=lambda r: -int(r.get("bytes_before") or 0))
    xs = range(len(sizes))
    bottom.bar(xs, [int(r.get("bytes_before") or 0) for r in sizes], color="#cccccc",
               label="before", width=1.0)  # fmt: skip
    bottom.bar(xs, [int(r.get("bytes_after") or 0) for r in sizes], color=BAR, label="after",
               width=1.0)  # fmt: skip
    bottom.set_yscale("log")
    bottom.set_xlabel(f"tensors by size ({len(rows)}; {len(kept)} kept)")
    bottom.set_ylabel("bytes")
    bottom.legend(fontsize=8)
    bottom.set_title(f"size per tensor: {fmt(before)} B -> {fmt(after)} B", fontsize=10)
    fig.suptitle(title, fontsize=11)
    return fig


def save_figure(view, path, fig=None) -> str:
    """Write :func:`figure` of ``view`` (or the given ``fig``) to ``path`` (``.png`` or
    ``.svg``); returns the path."""
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".png", ".svg"):
        raise ValueError(f"{path}: a figure is written as .png or .svg")
    import matplotlib

    fig = fig if fig is not None else figure(view)
    # SVG text stays text (searchable, small); no timestamps: the same view, the same file
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "qstream"}):
        meta = {"Date": None} if ext == ".svg" else {"Software": None}
        fig.savefig(path, format=ext[1:], dpi=DPI, metadata=meta)
    return path
