"""Standalone SVG charts (a string, no dependency): a histogram on a log (or linear) count
scale with threshold lines, for notebooks and files.

Every bin is one ``<rect class="bar">`` (``bar clipped`` beyond the chosen clip range; empty
bins have height 0), every threshold one ``<line class="threshold" data-method=...>``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

from ..spec.views import Histogram

COLORS = {
    "minmax": "#6b7280",
    "percentile": "#2563eb",
    "entropy": "#dc2626",
    "mse": "#16a34a",
    "l2": "#9333ea",
    "median": "#0f766e",
    "worst": "#b91c1c",
}
BAR = "#94a3b8"
CLIPPED = "#f87171"
BEFORE = "#d1d5db"  # sizes before conversion
AFTER = "#2563eb"  # sizes after


def color(method: str) -> str:
    """The colour of a method's (or a marker's) lines."""
    return COLORS.get(method, "#111827")


def fmt_bytes(n: float) -> str:
    """``1.5 MiB``: bytes in binary units (as the command line prints them)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_size(n: float) -> str:
    """``10 kB``: a round size in decimal units (the ticks of a log-scale axis of bytes)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 999.5 or unit == "TB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return str(n)


def fmt(v: float) -> str:
    """A short number for axis labels."""
    if v == 0:
        return "0"
    if not math.isfinite(v):
        return str(v)
    return f"{v:.3g}" if abs(v) >= 1e-3 and abs(v) < 1e4 else f"{v:.2e}"


LEFT, RIGHT, BOTTOM = 56, 16, 36  # margins of the plot area (the top one: 24 with a title)


def _start(width: int, height: int, title: str | None) -> list[str]:
    """An SVG document's opening: the root element, a white background, the title."""
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect class="background" x="0" y="0" width="{width}" height="{height}" fill="white"/>',
    ]
    if title:
        out.append(f'<text x="{LEFT}" y="15" font-weight="bold">{escape(title)}</text>')
    return out


def _axes(top: float, pw: float, ph: float) -> list[str]:
    """The x and y axes of a plot area of ``pw`` x ``ph`` at ``(LEFT, top)``."""
    return [
        f'<line class="axis" x1="{LEFT}" y1="{top + ph}" x2="{LEFT + pw}" y2="{top + ph}"'
        ' stroke="#111827"/>',
        f'<line class="axis" x1="{LEFT}" y1="{top}" x2="{LEFT}" y2="{top + ph}" stroke="#111827"/>',
    ]


def _count_ticks(top: float, ph: float, peak: int) -> list[str]:
    """The count axis' ends: ``peak`` at the top, 0 at the bottom."""
    return [
        f'<text x="{LEFT - 4}" y="{top + 8}" text-anchor="end">{peak}</text>',
        f'<text x="{LEFT - 4}" y="{top + ph}" text-anchor="end">0</text>',
    ]


def histogram_svg(
    hist: Histogram,
    markers: Sequence[tuple[str, float]] = (),
    *,
    clip: tuple[float, float] | None = None,
    log: bool = True,
    width: int = 560,
    height: int = 220,
    title: str | None = None,
    xlabel: str | None = None,
) -> str:
    """An SVG document of ``hist``: one bar per bin (height ``log10(1 + count)`` on a log
    scale), bins outside ``clip`` (``|x| > max(-lo, hi)`` on a ``|x|`` histogram) in red, and a
    labelled vertical line per ``(method, x)`` marker."""
    left, top = LEFT, 24 if title else 10
    pw, ph = width - LEFT - RIGHT, height - top - BOTTOM
    counts = [int(c) for c in hist.counts]
    peak = max(counts) if counts else 0

    def yval(c: int) -> float:
        if peak == 0:
            return 0.0
        return math.log10(1 + c) / math.log10(1 + peak) if log else c / peak

    span = hist.hi - hist.lo if hist.hi > hist.lo else 1.0

    def xpos(v: float) -> float:
        return left + pw * (min(max(v, hist.lo), hist.hi) - hist.lo) / span

    out = _start(width, height, title)
    edges = hist.edges
    outside = hist.clipped(clip)
    bw = pw / max(1, hist.nbins)
    for i, c in enumerate(counts):
        h = ph * yval(c)
        lo_e, hi_e = edges[i], edges[i + 1]
        clipped = bool(outside[i])
        cls = "bar clipped" if clipped else "bar"
        fill = CLIPPED if clipped else BAR
        out.append(
            f'<rect class="{cls}" x="{left + i * bw:.2f}" y="{top + ph - h:.2f}"'
            f' width="{max(bw - 0.3, 0.3):.2f}" height="{h:.2f}" fill="{fill}">'
            f"<title>[{fmt(lo_e)}, {fmt(hi_e)}): {c}</title></rect>"
        )
    out += _axes(top, pw, ph)
    for v in (hist.lo, (hist.lo + hist.hi) / 2, hist.hi):
        x = xpos(v)
        out.append(
            f'<text x="{x:.1f}" y="{top + ph + 14}" text-anchor="middle">{escape(fmt(v))}</text>'
        )
    label = xlabel or ("|x|" if hist.abs else "x")
    out.append(
        f'<text x="{left + pw / 2:.1f}" y="{height - 4}" text-anchor="middle"'
        f' fill="#374151">{escape(label)}</text>'
    )
    out += _count_ticks(top, ph, peak)
    scale_name = "count (log)" if log else "count"
    out.append(
        f'<text x="12" y="{top + ph / 2:.1f}" transform="rotate(-90 12 {top + ph / 2:.1f})"'
        f' text-anchor="middle" fill="#374151">{scale_name}</text>'
    )
    # thresholds, labels staggered so neighbours stay readable
    for k, (name, v) in enumerate(markers):
        x = xpos(v)
        col = color(name)
        out.append(
            f'<line class="threshold" data-method="{escape(name)}" data-x="{v!r}"'
            f' x1="{x:.2f}" y1="{top}" x2="{x:.2f}" y2="{top + ph}" stroke="{col}"'
            ' stroke-width="1.5" stroke-dasharray="4 2"/>'
        )
        anchor = "end" if x > left + pw * 0.8 else "start"
        dx = -3 if anchor == "end" else 3
        out.append(
            f'<text x="{x + dx:.1f}" y="{top + 10 + 12 * (k % 4)}" text-anchor="{anchor}"'
            f' fill="{col}">{escape(name)} {escape(fmt(v))}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def paired_svg(
    first: Histogram,
    second: Histogram,
    labels: tuple[str, str] = ("before", "after"),
    *,
    width: int = 560,
    height: int = 200,
    title: str | None = None,
    xlabel: str | None = None,
    tick: Callable[[float], str] = fmt,
) -> str:
    """An SVG document of two histograms on the same bins, side by side in each bin (one
    ``<rect class="bar" data-series=...>`` per bin and series, linear count scale), with a
    legend; ``tick`` formats the axis labels (the bins' edges)."""
    left, top = LEFT, 24 if title else 10
    pw, ph = width - LEFT - RIGHT, height - top - BOTTOM
    peak = max(int(first.counts.max(initial=0)), int(second.counts.max(initial=0)))
    edges = first.edges
    nb = max(1, first.nbins)
    bw = pw / nb
    out = _start(width, height, title)
    for k, (hist, name, fill) in enumerate(
        ((first, labels[0], BEFORE), (second, labels[1], AFTER))
    ):
        for i, c in enumerate(int(v) for v in hist.counts):
            h = ph * (c / peak if peak else 0.0)
            out.append(
                f'<rect class="bar" data-series="{escape(name)}"'
                f' x="{left + i * bw + k * bw / 2:.2f}" y="{top + ph - h:.2f}"'
                f' width="{max(bw / 2 - 0.3, 0.3):.2f}" height="{h:.2f}" fill="{fill}">'
                f"<title>{escape(name)} [{escape(tick(edges[i]))}, {escape(tick(edges[i + 1]))}):"
                f" {c}</title></rect>"
            )
        out.append(
            f'<rect x="{left + pw - 120 + 60 * k}" y="{top}" width="10" height="10"'
            f' fill="{fill}"/><text x="{left + pw - 106 + 60 * k}" y="{top + 9}">'
            f"{escape(name)}</text>"
        )
    out += _axes(top, pw, ph)
    for i in sorted({0, nb // 2, nb}):
        out.append(
            f'<text x="{left + i * bw:.1f}" y="{top + ph + 14}" text-anchor="middle">'
            f"{escape(tick(edges[i]))}</text>"
        )
    if xlabel:
        out.append(
            f'<text x="{left + pw / 2:.1f}" y="{height - 4}" text-anchor="middle"'
            f' fill="#374151">{escape(xlabel)}</text>'
        )
    out += _count_ticks(top, ph, peak)
    out.append("</svg>")
    return "".join(out)
