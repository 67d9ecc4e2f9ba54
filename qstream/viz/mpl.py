"""matplotlib figures of the calibration views (``pip install 'qstream-zarr[plot]'``).

Imported only when a plot is asked for; without matplotlib every entry point raises an
``ImportError`` that says what to install. Files are drawn on a plain ``Figure`` (no pyplot
state, the Agg/SVG canvases), so writing one works headless.
"""

from __future__ import annotations

import math
import os

from ..calibration.views import ChannelSummary, CheckpointView, GroupSummary, Histogram, ReportView
from .html import describe
from .svg import AFTER, BAR, BEFORE, CLIPPED, color, fmt, fmt_bytes, fmt_size

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


def plot_groups(ax, g: GroupSummary, title: str | None = None):
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


def _scales(ax, scales) -> int:
    """The distribution of the groups' scales (log10); returns how many were drawn."""
    import numpy as np

    s = np.asarray(scales, np.float64).reshape(-1)
    s = s[np.isfinite(s) & (s > 0)]
    if s.size:
        ax.hist(np.log10(s), bins=min(100, max(10, s.size // 20)), color=BAR)
        ax.set_yscale("log")
        ax.set_xlabel("log10 scale of a group")
        ax.set_ylabel("groups")
    return int(s.size)


def group_figure(view: ReportView, scales=None):
    """The one-page figure of a group-wise (blocked) output: the distribution of its groups'
    SQNR (when the output keeps it), its worst groups' SQNR, the distribution of its groups'
    scales (the per-group ranges) and the error summary."""
    _matplotlib()
    from matplotlib.figure import Figure

    fig = Figure(figsize=PAGE, dpi=DPI, layout="constrained")
    g = view.groups
    dist = g is not None and g.histogram is not None
    if dist and scales is not None:
        grid = fig.add_gridspec(2, 3, height_ratios=[1.2, 1], width_ratios=[1, 1, 1])
        top, left = fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, 0])
        middle, right = fig.add_subplot(grid[1, 1]), fig.add_subplot(grid[1, 2])
    else:
        grid = fig.add_gridspec(2, 2, height_ratios=[1.2, 1], width_ratios=[1.4, 1])
        top, left = fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, 0])
        middle, right = None, fig.add_subplot(grid[1, 1])
    scale_ax = middle if dist else top
    if dist:
        plot_groups(top, g)
    if scales is not None and scale_ax is not None:
        n = _scales(scale_ax, scales)
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


def plot_checkpoint(view: CheckpointView, ax=None):
    """The SQNR over a checkpoint's quantized tensors (one count per tensor) with the median
    and worst tensor marked, on ``ax`` (a new figure when None); returns the axes."""
    _matplotlib()
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(8, 3.5))
    ch = view.sqnr
    if ch is None or ch.histogram is None:
        ax.text(0.5, 0.5, "no quantized tensor with an SQNR", ha="center", va="center")
        ax.set_axis_off()
        return ax
    plot_histogram(ax, ch.histogram, view.markers(), log=False, xlabel="SQNR dB of a tensor")
    ax.set_ylabel("tensors")
    exact = f"; {ch.exact} exact" if ch.exact else ""
    ax.set_title(f"SQNR per tensor ({ch.channels} quantized tensors{exact})", fontsize=10)
    return ax


def plot_sizes(ax, view: CheckpointView):
    """The tensors' sizes before and after (histograms of log10 bytes on the same bins)."""
    import numpy as np

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
    ax.legend(fontsize=8)
    ax.set_title(
        f"tensors by size ({view.tensors}; {view.kept} kept):"
        f" {fmt_bytes(view.bytes_before)} -> {fmt_bytes(view.bytes_after)}",
        fontsize=10,
    )
    return ax


def plot_worst_tensors(ax, view: CheckpointView, n: int = 10):
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
        ax.legend(fontsize=7, loc="lower right")
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
        for r in view.largest[:5]:
            lines.append(
                f"  {_short(r['name'], 30)}: {fmt_bytes(r['bytes_before'])} ->"
                f" {fmt_bytes(r['bytes_after'])}"
            )
    return lines


def checkpoint_figure(rows, title: str | None = None):
    """The one-page figure of a converted checkpoint, bounded whatever its number of
    tensors: the SQNR over its quantized tensors (a histogram, median and worst marked),
    the worst tensors, the tensors' sizes before and after (histograms of their bytes) and
    a summary (totals, bytes per target, the largest tensors). ``rows``: the root's index
    rows (``QuantizedCheckpoint.tensors.values()``; no tensor is opened) or a
    :class:`~qstream.calibration.views.CheckpointView`."""
    _matplotlib()
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
