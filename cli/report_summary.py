"""The top-level ``summary`` of every ``--json`` report (:func:`cli.output.emit_json`): the
counts a log line or a dashboard wants without walking the report, and the worst SQNR where
the report has one.

Its keys, each present only where the report says it:

* ``tensors``, ``quantized``, ``kept``: model tensors (of an export: the file's entries
  without the ``_scale``/``_zero_point`` entries of quantized tensors), those quantized,
  those stored as they were; ``entries``: an inspected export's file entries, parameters
  included;
* ``worst_sqnr_db`` and ``worst_tensor``: the lowest SQNR over the quantized tensors (of one
  array: its SQNR; ``null``, as every non-finite figure of a strict JSON report: no error at
  all, or, rarely, error sums that overflowed for codes that dequantize beyond the float
  range, -inf dB), and which tensor has it;
* ``predicted_sqnr_db``: a calibration's predicted SQNR for its method (``--show``,
  ``--compare``);
* ``bytes_before``, ``bytes_after``, ``bytes_written``, ``bytes``, ``files``, ``seconds``,
  ``complete``, ``already_complete``, ``resumed``: copied from the report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: report keys copied into the summary as they are
COPIED = (
    "bytes_before",
    "bytes_after",
    "bytes_written",
    "bytes",
    "seconds",
    "complete",
    "already_complete",
    "resumed",
)
_PARAMETER_SUFFIXES = ("_scale", "_zero_point")


def summarize(report: Mapping[str, Any]) -> dict[str, Any]:
    """The summary of one ``--json`` report (any command's: conversion, plan, export,
    inspection, quantization, calibration, warm-up)."""
    out: dict[str, Any] = {}
    tensors = report.get("tensors")
    rows = report.get("plan")
    if isinstance(tensors, Mapping) and all(isinstance(t, Mapping) for t in tensors.values()):
        _count(out, {n: bool(t.get("kept")) for n, t in tensors.items()})
        _worst(out, {n: t.get("error") for n, t in tensors.items() if not t.get("kept")})
    elif isinstance(rows, list) and all(isinstance(r, Mapping) for r in rows):  # plans, GGUF
        _count(out, {r["name"]: _kept_row(r) for r in rows})
    elif isinstance(tensors, list) and isinstance(report.get("tensor_bytes"), Mapping):
        quantized = set(report.get("quantized") or ())  # an export: its tensors, not entries
        _count(out, {n: n not in quantized for n in report["tensor_bytes"]})
    elif isinstance(tensors, list):  # an export's file entries
        _count(out, _export_entries(tensors))
    elif isinstance(tensors, int) and not isinstance(tensors, bool):  # an export, inspected
        out["tensors"] = tensors  # (a safetensors export's as convert counts them...)
        entries = report.get("entries")
        if isinstance(entries, int):  # (...and its entries: a quantized tensor's parameters)
            out["entries"] = entries
        if isinstance(report.get("quantized"), Mapping):
            out["quantized"] = len(report["quantized"])
            _worst(out, {n: q for n, q in report["quantized"].items() if isinstance(q, Mapping)})
        elif isinstance(report.get("tensor_list"), list):  # a GGUF: the SQNR qstream recorded
            listed = [t for t in report["tensor_list"] if isinstance(t, Mapping)]
            _worst(out, {t["name"]: t for t in listed if "sqnr_db" in t})
    if "tensors" not in out and isinstance(tensors, Mapping) and tensors:  # GGUF: name -> type
        out["tensors"] = len(tensors)
    errors = report.get("error")
    if isinstance(errors, Mapping) and "sqnr_db" in errors:  # one array
        out["worst_sqnr_db"] = _db(errors["sqnr_db"])
    elif isinstance(errors, Mapping) and errors:  # GGUF: name -> error
        _worst(out, dict(errors))
    view = report.get("view")
    if isinstance(view, Mapping):  # a calibration
        out["channels"] = view.get("channels")
        chosen = [p for p in view.get("predictions") or () if p.get("method") == view["method"]]
        if chosen:
            out["predicted_sqnr_db"] = _db(chosen[0].get("predicted_sqnr_db"))
    if isinstance(report.get("specs"), list):  # warm-up
        out["job_kinds"] = len(report["specs"])
    if isinstance(report.get("files"), list):
        out["files"] = len(report["files"])
    out.update({k: report[k] for k in COPIED if k in report})
    return out


def _kept_row(row: Mapping[str, Any]) -> bool:
    """Whether a plan's row keeps its tensor (a plan without ``kept``: its target says)."""
    return bool(row.get("kept", str(row.get("target", "")).startswith("keep")))


def _count(out: dict[str, Any], kept: Mapping[str, bool]) -> None:
    out["tensors"] = len(kept)
    out["quantized"] = sum(1 for k in kept.values() if not k)
    out["kept"] = len(kept) - out["quantized"]


def _export_entries(names: list[str]) -> dict[str, bool]:
    """An export's entries as tensors: name -> kept (an entry with a ``_scale`` beside it is
    quantized; the scale and zero-point entries are its parameters, not tensors)."""
    present = set(names)
    quantized = {n for n in names if n + "_scale" in present}
    parameters = {n + s for n in quantized for s in _PARAMETER_SUFFIXES} & present
    return {n: n not in quantized for n in names if n not in parameters}


def _db(value: object) -> float | None:
    """A decibel value as a number (None: none, or no error at all: infinite)."""
    if value is None:
        return None
    db = float(value)  # type: ignore[arg-type]
    return db if math.isfinite(db) else None


def _worst(out: dict[str, Any], errors: Mapping[str, object]) -> None:
    """The lowest SQNR over ``errors`` (name -> error summary) and its tensor; an error-free
    tensor (infinite SQNR) counts as the best."""
    worst: tuple[float, str] | None = None
    for name, e in errors.items():
        if not isinstance(e, Mapping) or "sqnr_db" not in e:
            continue
        db = math.inf if e["sqnr_db"] is None else float(e["sqnr_db"])
        if worst is None or db < worst[0]:
            worst = (db, name)
    if worst is not None:
        out["worst_sqnr_db"] = worst[0] if math.isfinite(worst[0]) else None
        out["worst_tensor"] = worst[1]
