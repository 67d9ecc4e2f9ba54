"""Compact HTML for notebooks (``_repr_html_`` of reports, calibrations and quantized
arrays): a table of the numbers and inline SVG charts (:mod:`qstream.viz.svg`)."""

from __future__ import annotations

import math
from html import escape

from ..calibration.views import ChannelSummary, ReportView
from .svg import fmt, histogram_svg

STYLE = (
    "<style>.qstream-view table{border-collapse:collapse;margin:4px 0}"
    ".qstream-view td,.qstream-view th{padding:1px 8px;text-align:right;"
    "border-bottom:1px solid #e5e7eb}.qstream-view td:first-child,"
    ".qstream-view th:first-child{text-align:left}</style>"
)


def granularity(spec: dict) -> str:
    if spec.get("axis") is None:
        return "per tensor"
    if spec.get("block_size"):
        return f"blocks of {spec['block_size']} along axis {spec['axis']}"
    return f"per channel, axis {spec['axis']}"


def describe(spec: dict) -> str:
    """``int8, per tensor, entropy, symmetric`` (explicit scales: ``explicit scale``)."""
    method = "explicit scale" if spec.get("scale") is not None else spec.get("method", "?")
    sym = "symmetric" if spec.get("symmetric", True) else "asymmetric"
    return f"{spec.get('dtype', '?')}, {granularity(spec)}, {method}, {sym}"


def _num(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return fmt(float(v))


def _db(v) -> str:
    if v is None:
        return "-"
    v = float(v)
    return "inf" if v == math.inf else f"{v:.2f}"


def _table(rows, header=None) -> str:
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>")
    for r in rows:
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>")
    out.append("</table>")
    return "".join(out)


def channels_svg(ch: ChannelSummary, title: str) -> str | None:
    if ch.histogram is None:
        return None
    markers = []
    if ch.quantiles:
        markers = [("median", ch.quantiles["median"])]
    return histogram_svg(
        ch.histogram, markers, log=False, title=title, xlabel="SQNR dB (one count per channel)"
    )


def _worst(ch: ChannelSummary) -> str:
    rows = []
    for w in ch.worst:
        clip = w.get("clip_fraction")
        rows.append(
            [
                str(w["channel"]),
                _db(w["sqnr_db"]),
                "-" if clip is None else f"{100 * clip:.3f}",
                _num(w.get("max_abs")),
            ]
        )
    return _table(rows, ["worst channel", "SQNR dB", "clip %", "max err"])


def view_html(view: ReportView) -> str:
    """The notebook view: a summary table, the histogram with thresholds (per tensor), the
    methods compared, and the per-channel SQNR with the worst channels."""
    cal, err = view.calibration, view.error
    parts = [STYLE, '<div class="qstream-view">']
    parts.append(f"<b>{escape(view.title)}</b> <span>{escape(describe(view.spec))}</span>")
    rows = []
    if err:
        rows += [
            ["SQNR dB", _db(err.get("sqnr_db"))],
            ["MSE", _num(err.get("mse"))],
            ["max abs error", _num(err.get("max_abs"))],
            ["cosine", _num(err.get("cosine"))],
            ["clipped %", f"{100 * float(err.get('clip_fraction') or 0):.4f}"],
        ]
    if cal is not None:
        rows.append(["data range", f"[{_num(cal.data_range[0])}, {_num(cal.data_range[1])}]"])
        if cal.clip is not None:
            rows.append(
                [
                    f"clip range ({escape(cal.method)})",
                    f"[{_num(cal.clip[0])}, {_num(cal.clip[1])}]",
                ]
            )
        if cal.clip_ratio and cal.clip_ratio.get("quantiles"):
            q = cal.clip_ratio["quantiles"]
            rows.append(
                ["kept range / channel range", f"median {q['median']:.4f}, min {q['min']:.4f}"]
            )
    if rows:
        parts.append(_table(rows))
    if cal is not None and cal.predictions:
        best = cal.best
        prow = []
        for p in cal.predictions:
            name = f"<b>{escape(p.method)}</b>" if p.method == best else escape(p.method)
            prow.append(
                [
                    name,
                    _num(p.lo),
                    _num(p.hi),
                    _num(p.scale),
                    f"{100 * p.clip_fraction:.4f}",
                    _db(p.sqnr_db),
                    "-"
                    if p.channels is None or not p.channels.quantiles
                    else _db(p.channels.quantiles["min"]),
                ]
            )
        parts.append(
            _table(
                prow,
                ["method", "lo", "hi", "scale", "clip %", "predicted SQNR dB", "worst channel dB"],
            )
        )
    if cal is not None and cal.histogram is not None:
        what = "|x|" if cal.histogram.abs else "x"
        parts.append(
            "<div>"
            + histogram_svg(
                cal.histogram,
                cal.markers(),
                clip=cal.clip,
                title=f"{what} histogram, {cal.histogram.total} values (log count)",
            )
            + "</div>"
        )
    ch = view.channels
    title = "per-channel SQNR"
    if ch is None and cal is not None and cal.prediction(cal.method) is not None:
        ch = cal.prediction(cal.method).channels
        title = f"per-channel SQNR predicted for {cal.method}"
    if ch is not None:
        svg = channels_svg(ch, f"{title} ({ch.channels} channels)")
        if svg:
            parts.append(f"<div>{svg}</div>")
        parts.append(_worst(ch))
    parts.append("</div>")
    return "".join(parts)
