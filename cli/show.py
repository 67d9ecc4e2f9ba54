"""Terminal views of a calibration or a quantized output (``--show``, ``--compare``).

A histogram is drawn as rows of horizontal bars on a log count scale (~26 rows: adjacent
bins summed, exact), with a line at every clip threshold; rows beyond the chosen clip range
are drawn in red (``x`` instead of ``#`` in plain text). On a terminal it is Rich text;
otherwise (pipes, logs, CI) plain lines such as ``    0.4688 |#######           1234``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import typer

import qstream as qs

from .output import console, fmt_bytes, fmt_db, fmt_g, table

ROWS = 26  # at most, for a histogram
WIDTH = 40  # bar characters, at most

STYLES = {
    "minmax": "bright_black",
    "percentile": "blue",
    "entropy": "red",
    "mse": "green",
    "l2": "magenta",
    "median": "cyan",
}


def _num(v: float | str | None) -> str:
    if v is None:
        return "-"
    x = float(v)
    return f"{x:.6g}" if math.isfinite(x) else str(x)


def _edge(v: float) -> str:
    return f"{float(v):.4g}"


class Lines:
    """Lines of styled segments, printed as Rich text on a terminal, plain otherwise."""

    def __init__(self) -> None:
        self.lines: list[list[tuple[str, str | None]]] = []
        self.out = console()
        self.rich = self.out.is_terminal

    def add(self, *segments: tuple[str, str | None]) -> None:
        """A line of ``(text, Rich style or None)`` segments."""
        self.lines.append(list(segments))

    def text(self, s: str, style: str | None = None) -> None:
        """A line of one segment."""
        self.add((s, style))

    def flush(self) -> None:
        """Print the lines so far."""
        if self.rich:
            from rich.text import Text

            for segs in self.lines:
                t = Text()
                for s, style in segs:
                    t.append(s, style=style)
                self.out.print(t, soft_wrap=True)
        else:
            for segs in self.lines:
                typer.echo("".join(s for s, _ in segs).rstrip())
        self.lines = []

    @property
    def bar_width(self) -> int:
        """Characters for the longest bar: what the terminal leaves, at most WIDTH."""
        return max(10, min(WIDTH, self.out.width - 32)) if self.rich else WIDTH


def histogram_lines(
    out: Lines,
    hist: Any,
    markers: Iterable[tuple[str, float]] = (),
    *,
    clip: tuple[float, float] | None = None,
    log: bool = True,
    rows: int = ROWS,
    label_fmt: Callable[[float], str] = _edge,
) -> None:
    """Rows of ``hist`` (regrouped into at most ``rows`` rows) with a marker line at each
    ``(name, x)`` of ``markers``, between the row holding ``x`` and the next."""
    h = hist.regroup(rows)
    edges = h.edges
    counts = [int(c) for c in h.counts]
    outside = h.clipped(clip)
    peak = max(counts, default=0)
    width = out.bar_width
    label_w = max(len(label_fmt(e)) for e in edges[:-1])
    count_w = len(str(peak))
    pending = sorted(markers, key=lambda m: m[1])

    def scaled(c: int) -> int:
        if peak == 0 or c == 0:
            return 0
        f = math.log10(1 + c) / math.log10(1 + peak) if log else c / peak
        return max(1, round(width * f))

    def marker(name: str, x: float) -> None:
        style = STYLES.get(name, "yellow")
        rule = "-" * max(2, width // 2)
        out.add((" " * label_w + " +" + rule + f" {name} {label_fmt(x)}", style))

    for r, c in enumerate(counts):
        while pending and pending[0][1] <= edges[r]:
            marker(*pending.pop(0))
        n = scaled(c)
        clipped = bool(outside[r])
        bar: tuple[str, str | None]
        if out.rich:
            bar = ("█" * n, "red" if clipped else "cyan")
        else:
            bar = (("x" if clipped else "#") * n, None)
        out.add(
            (f"{label_fmt(edges[r]):>{label_w}} |", "bright_black"),
            bar,
            (" " * (width - n) + f" {c:>{count_w}}", None),
        )
    for m in pending:
        marker(*m)


def _view_histogram(out: Lines, cal: Any, what: str) -> None:
    hist = cal.histogram
    kind = "|x|" if hist.abs else "x"
    shown = hist.regroup(ROWS)
    per_row = -(-hist.nbins // shown.nbins)
    out.text(
        f"{kind} histogram of {what}: {hist.total} values, log count scale"
        + (f", {per_row} of the {hist.nbins} stored bins a row" if per_row > 1 else ""),
        "bold",
    )
    if cal.clip is not None:
        out.text(
            f"clip range ({cal.method}): [{_num(cal.clip[0])}, {_num(cal.clip[1])}];"
            + (" red rows are clipped" if out.rich else " rows of x are clipped")
        )
    histogram_lines(out, hist, cal.markers(), clip=cal.clip)


def _channel_lines(out: Lines, ch: Any, title: str) -> None:
    out.text(
        f"{title}: {ch.channels} channels" + (f", {ch.exact} exact" if ch.exact else ""), "bold"
    )
    if ch.quantiles:
        q = ch.quantiles
        out.text(
            "SQNR dB: "
            + ", ".join(f"{k} {q[k]:.2f}" for k in ("min", "p05", "median", "p95", "max"))
        )
    if ch.histogram is not None:
        markers = [("median", ch.quantiles["median"])] if ch.quantiles else []
        histogram_lines(out, ch.histogram, markers, log=False, label_fmt=lambda v: f"{v:.2f} dB")


def _worst_table(ch: Any, title: str = "worst channels") -> None:
    cols = ["channel", "SQNR dB", "clip %"]
    with_err = any(w.get("max_abs") is not None for w in ch.worst)
    rows = []
    for w in ch.worst:
        clip = w.get("clip_fraction")
        row = [
            str(w["channel"]),
            fmt_db(w["sqnr_db"]),
            "-" if clip is None else f"{100 * clip:.3f}",
        ]
        if with_err:
            row.append(fmt_g(w.get("max_abs"), 4))
        rows.append(row)
    table(title, [*cols, "max err"] if with_err else cols, rows)


def _clip_ratio_line(out: Lines, cal: Any) -> None:
    """Per channel, how much of each channel's range the calibration keeps (when it clips)."""
    if cal.clip_ratio and cal.clip_ratio.get("quantiles"):
        q = cal.clip_ratio["quantiles"]
        if q["min"] >= 1.0:
            out.text(f"{cal.method} keeps every channel's whole range")
            return
        low = ", ".join(f"{r['channel']} ({r['ratio']:.4f})" for r in cal.clip_ratio["lowest"])
        out.text(
            f"kept range / channel range ({cal.method}): median {q['median']:.4f},"
            f" p05 {q['p05']:.4f}, min {q['min']:.4f}; lowest: {low}"
        )


def comparison_table(cal: qs.Calibration, what: str) -> None:
    """Every compared method's range, parameters and predicted SQNR, the best starred."""
    view = cal.view
    assert view is not None  # (a comparison keeps its view)
    best = view.best
    per_tensor = view.channels == 1
    rows = []
    for p in view.predictions:
        star = " *" if p.method == best else ""
        if per_tensor:
            rows.append(
                [
                    p.method,
                    _num(p.lo),
                    _num(p.hi),
                    _num(p.scale),
                    _num(p.zero_point),
                    f"{100 * p.clip_fraction:.4f}",
                    fmt_db(p.sqnr_db) + star,
                ]
            )
        else:
            q = (p.channels.quantiles or {}) if p.channels else {}
            r = (p.clip_ratio or {}).get("quantiles") or {}
            rows.append(
                [
                    p.method,
                    fmt_db(q.get("min")),
                    fmt_db(q.get("median")),
                    f"{100 * p.clip_fraction:.4f}",
                    "-" if "median" not in r else f"{r['median']:.4f}",
                    fmt_db(p.sqnr_db) + star,
                ]
            )
    cols = (
        ["method", "lo", "hi", "scale", "zero point", "clip %", "pred. SQNR dB"]
        if per_tensor
        else ["method", "ch. SQNR min", "ch. SQNR median", "clip %", "kept range", "pred. SQNR dB"]
    )
    table(f"methods compared on {what} (one histogram pass)", cols, rows)
    typer.echo(
        "* highest predicted SQNR. Predicted from the 2048-bin histogram (values spread evenly"
        " within their bin), not measured."
    )


def show_calibration(cal: qs.Calibration, what: str) -> None:
    """``calibrate --show`` / ``--compare``: the histogram with every threshold, the methods
    side by side, and per channel the predicted SQNR distribution and the worst channels."""
    view = cal.view
    if view is None:
        typer.echo("nothing to draw: this calibration keeps no histogram")
        return
    out = Lines()
    if view.histogram is not None:
        _view_histogram(out, view, what)
    _clip_ratio_line(out, view)
    p = view.prediction(view.method)
    if p is not None and p.channels is not None:
        out.text("")
        _channel_lines(out, p.channels, f"per-channel SQNR predicted for {view.method}")
    out.flush()
    if p is not None and p.channels is not None and p.channels.worst:
        _worst_table(p.channels, f"worst channels predicted for {view.method}")
    if len(view.predictions) > 1:
        comparison_table(cal, what)


def show_report(view: Any, what: str) -> None:
    """``inspect --show``: the stored histogram with the clip threshold (per tensor), the
    per-channel SQNR distribution and the worst channels (per channel)."""
    out = Lines()
    cal = view.calibration
    drew = False
    if cal is not None and cal.histogram is not None:
        _view_histogram(out, cal, what)
        drew = True
    if cal is not None:
        _clip_ratio_line(out, cal)
    if view.channels is not None:
        if drew:
            out.text("")
        _channel_lines(out, view.channels, "per-channel SQNR")
        drew = True
    g = getattr(view, "groups", None)
    if g is not None and g.histogram is not None:  # group-wise: every group's SQNR
        if drew:
            out.text("")
        notes = g.notes()
        out.text(f"per-group SQNR: {g.groups} groups" + (f" ({notes})" if notes else ""), "bold")
        q = g.quantiles or {}
        got = [f"{k} {q[k]:.2f}" for k in ("min", "p05", "median", "p95") if q.get(k) is not None]
        if got:
            out.text(f"SQNR dB: {', '.join(got)} (quantiles to {g.step_db:g} dB bins)")
        histogram_lines(out, g.histogram, g.markers(), log=True, label_fmt=lambda v: f"{v:.2f} dB")
        drew = True
    if not drew:
        if cal is not None and cal.clip is not None:
            out.text(
                f"range [{_num(cal.clip[0])}, {_num(cal.clip[1])}] ({cal.method});"
                " no histogram kept: a per-tensor minmax job makes no histogram pass"
                " (quantize with --histogram to keep one)"
            )
        else:
            out.text("no calibration view kept for this output (explicit or per-block scales)")
    out.flush()
    if view.channels is not None and view.channels.worst:
        _worst_table(view.channels)
    if g is not None and g.worst:
        rows = [
            [
                ",".join(str(i) for i in w["group"]),
                ",".join(str(i) for i in w["first_element"]),
                fmt_db(w["sqnr_db"]),
                fmt_g(w.get("max_abs"), 4),
            ]
            for w in g.worst
        ]
        table("worst groups", ["group", "first element", "SQNR dB", "max err"], rows)


def show_checkpoint(view: Any) -> None:
    """``inspect --show`` of a converted checkpoint (a
    :class:`~qstream.spec.views.CheckpointView`): totals, the SQNR over its quantized
    tensors, the worst and the largest tensors, the bytes per target."""
    out = Lines()
    out.text(
        f"{view.title}: {view.tensors} tensors ({view.quantized} quantized, {view.kept} kept),"
        f" {fmt_bytes(view.bytes_before)} -> {fmt_bytes(view.bytes_after)}",
        "bold",
    )
    if view.sqnr is not None:
        q = view.sqnr.quantiles or {}
        got = [f"{k} {q[k]:.2f}" for k in ("min", "p05", "median", "p95", "max") if k in q]
        out.text(f"SQNR over the {view.quantized} quantized tensors: {', '.join(got)} dB")
        if view.sqnr.histogram is not None:
            histogram_lines(
                out,
                view.sqnr.histogram,
                view.markers(),
                log=False,
                label_fmt=lambda v: f"{v:.2f} dB",
            )
    out.flush()

    def rows(rs: Iterable[dict[str, Any]]) -> list[list[str]]:
        return [
            [
                str(r.get("name")),
                str(r.get("target")),
                fmt_db(r.get("sqnr_db")),
                f"{fmt_bytes(r.get('bytes_before') or 0)} ->"
                f" {fmt_bytes(r.get('bytes_after') or 0)}",
            ]
            for r in rs
        ]

    cols = ["tensor", "stored as", "SQNR dB", "bytes"]
    if view.worst:
        table("worst tensors", cols, rows(view.worst))
    if view.largest:
        table("largest tensors", cols, rows(view.largest))
    if view.targets:
        table(
            "bytes by target",
            ["target", "tensors", "bytes"],
            [
                [
                    t["target"],
                    str(t["tensors"]),
                    f"{fmt_bytes(t['bytes_before'])} -> {fmt_bytes(t['bytes_after'])}",
                ]
                for t in view.targets
            ],
        )
