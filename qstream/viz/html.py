"""Compact HTML for notebooks (``_repr_html_`` of reports, calibrations and quantized
arrays): a table of the numbers and inline SVG charts (:mod:`qstream.viz.svg`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any, SupportsFloat

from ..spec.views import ChannelSummary, CheckpointView, GroupSummary, ReportView
from .svg import fmt, fmt_bytes, fmt_size, histogram_svg, paired_svg

STYLE = (
    "<style>.qstream-view table{border-collapse:collapse;margin:4px 0}"
    ".qstream-view td,.qstream-view th{padding:1px 8px;text-align:right;"
    "border-bottom:1px solid #e5e7eb}.qstream-view td:first-child,"
    ".qstream-view th:first-child{text-align:left}</style>"
)


def granularity(spec: dict[str, Any]) -> str:
    """``per tensor``, ``per channel, axis 0`` or ``blocks of 32 along axis 1``."""
    if spec.get("axis") is None:
        return "per tensor"
    if spec.get("block_size"):
        return f"blocks of {spec['block_size']} along axis {spec['axis']}"
    return f"per channel, axis {spec['axis']}"


def describe(spec: dict[str, Any]) -> str:
    """``int8, per tensor, entropy, symmetric`` (explicit scales: ``explicit scale``)."""
    method = "explicit scale" if spec.get("scale") is not None else spec.get("method", "?")
    sym = "symmetric" if spec.get("symmetric", True) else "asymmetric"
    return f"{spec.get('dtype', '?')}, {granularity(spec)}, {method}, {sym}"


def _num(v: SupportsFloat | str | None) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return fmt(float(v))


def _db(v: SupportsFloat | str | None) -> str:
    if v is None:
        return "-"
    f = float(v)
    return "inf" if f == math.inf else f"{f:.2f}"


def _table(rows: Iterable[Sequence[str]], header: Sequence[str] | None = None) -> str:
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>")
    for r in rows:
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>")
    out.append("</table>")
    return "".join(out)


def channels_svg(ch: ChannelSummary, title: str) -> str | None:
    """The per-channel SQNR distribution (one count per channel), the median marked."""
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


def groups_svg(g: GroupSummary, block_size: int | None = None) -> str | None:
    """The per-group SQNR distribution (log count scale), median and worst group marked."""
    h = g.shown()
    if h is None:
        return None
    of = f" of {block_size}" if block_size else ""
    return histogram_svg(
        h,
        g.markers(),
        log=True,
        title=f"per-group SQNR ({g.groups} groups{of}, log count)",
        xlabel="SQNR dB (one count per parameter group)",
    )


def _worst_groups(g: GroupSummary) -> str:
    rows = [
        [
            escape(",".join(str(i) for i in w.get("group", ()))),
            escape(",".join(str(i) for i in w.get("first_element", ()))),
            _db(w.get("sqnr_db")),
            _num(w.get("max_abs")),
        ]
        for w in g.worst
    ]
    return _table(rows, ["worst group", "first element", "SQNR dB", "max err"])


def _groups_html(g: GroupSummary, spec: dict[str, Any]) -> list[str]:
    """The per-group section: the distribution, what lies outside it, the worst groups."""
    parts = []
    svg = groups_svg(g, spec.get("block_size"))
    if svg:
        parts.append(f"<div>{svg}</div>")
    q = g.quantiles or {}
    line = [f"{k} {_db(q[k])} dB" for k in ("p05", "median", "p95") if q.get(k) is not None]
    if line and g.step_db:
        line[-1] += f" ({g.step_db:g} dB bins)"
    if g.notes():
        line.append(g.notes())
    if line:
        parts.append(f"<div>groups: {escape('; '.join(line))}</div>")
    if g.worst:
        parts.append(_worst_groups(g))
    return parts


def view_html(view: ReportView) -> str:
    """The notebook view: a summary table, the histogram with thresholds (per tensor), the
    methods compared, the per-channel SQNR with the worst channels, and for group-wise
    outputs the per-group SQNR distribution with the worst groups."""
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
    predicted = cal.prediction(cal.method) if ch is None and cal is not None else None
    if cal is not None and predicted is not None:
        ch = predicted.channels
        title = f"per-channel SQNR predicted for {cal.method}"
    if ch is not None:
        svg = channels_svg(ch, f"{title} ({ch.channels} channels)")
        if svg:
            parts.append(f"<div>{svg}</div>")
        parts.append(_worst(ch))
    if view.groups is not None:
        parts += _groups_html(view.groups, view.spec)
    parts.append("</div>")
    return "".join(parts)


def checkpoint_html(view: CheckpointView, limit: int | None = None) -> str:
    """The notebook view of a converted checkpoint (bounded whatever its number of tensors):
    totals, the SQNR over its tensors with the worst ones, bytes per target, the largest
    tensors, and the tensors' sizes before and after. ``limit``: rows of each table (all
    the view keeps when None)."""
    parts = [STYLE, '<div class="qstream-view">']
    parts.append(
        f"<b>{escape(view.title)}</b> <span>{view.tensors} tensors: {view.quantized}"
        f" quantized, {view.kept} kept</span>"
    )
    ratio = view.ratio
    rows = [
        [
            "bytes",
            f"{fmt_bytes(view.bytes_before)} &#8594; {fmt_bytes(view.bytes_after)}"
            + ("" if ratio is None else f" ({100 * ratio:.1f} %)"),
        ]
    ]
    ch = view.sqnr
    if ch is not None and ch.quantiles:
        q = ch.quantiles
        rows.append(
            [
                "SQNR dB over tensors",
                f"min {_db(q['min'])}, median {_db(q['median'])}, max {_db(q['max'])}",
            ]
        )
    if ch is not None and ch.exact:
        rows.append(["exact tensors (no error)", str(ch.exact)])
    parts.append(_table(rows))
    if ch is not None and ch.histogram is not None:
        svg = histogram_svg(
            ch.histogram,
            view.markers(),
            log=False,
            title=f"SQNR per tensor ({ch.channels} quantized tensors)",
            xlabel="SQNR dB (one count per tensor)",
        )
        parts.append(f"<div>{svg}</div>")
    n = limit or max(len(view.worst), len(view.largest), len(view.targets))
    if view.worst:
        parts.append(
            _table(
                [
                    [
                        escape(r["name"]),
                        escape(r["target"]),
                        _db(r["sqnr_db"]),
                        f"{fmt_bytes(r['bytes_before'])} &#8594; {fmt_bytes(r['bytes_after'])}",
                    ]
                    for r in view.worst[:n]
                ],
                ["worst tensor", "stored as", "SQNR dB", "bytes"],
            )
        )
    if view.targets:
        parts.append(
            _table(
                [
                    [
                        escape(t["target"]),
                        str(t["tensors"]),
                        fmt_bytes(t["bytes_before"]),
                        fmt_bytes(t["bytes_after"]),
                    ]
                    for t in view.targets[:n]
                ],
                ["stored as", "tensors", "bytes before", "bytes after"],
            )
        )
    if view.sizes_before is not None and view.sizes_after is not None:
        svg = paired_svg(
            view.sizes_before,
            view.sizes_after,
            title=f"tensor sizes before and after ({view.tensors} tensors)",
            xlabel="bytes of a tensor (log scale)",
            tick=lambda v: fmt_size(10.0**v),
        )
        parts.append(f"<div>{svg}</div>")
    if view.largest:
        parts.append(
            _table(
                [
                    [
                        escape(r["name"]),
                        escape(r["target"]),
                        fmt_bytes(r["bytes_before"]),
                        fmt_bytes(r["bytes_after"]),
                        _db(r["sqnr_db"]),
                    ]
                    for r in view.largest[:n]
                ],
                ["largest tensor", "stored as", "bytes before", "bytes after", "SQNR dB"],
            )
        )
    parts.append("</div>")
    return "".join(parts)
