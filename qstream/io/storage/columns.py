"""Columns of floating-point figures in qstream's JSON documents, stored as float64 bytes.

A pack's document (:mod:`qstream.io.outputs.pack_layout`) and a batch of the root's index
(:mod:`qstream.io.outputs.rootindex`) hold a figure per tensor for hundreds of tensors. JSON spells
out each value (~0.4 us apiece, holding the interpreter's lock); a column is stored instead
as ``{"float64": <base64>}``, the values' little-endian bytes (:func:`float_column`), and
read back as the list it was (:func:`float_values`): the same floats, -0.0 and non-finite
values included, non-finite SQNRs as the strings every report uses (:data:`TEXT_NONFINITE`).
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import numpy as np

# the columns whose non-finite values read as strings ("inf"), as in every report
TEXT_NONFINITE = ("sqnr_db", "worst_sqnr_db")
_FLOAT64 = "float64"
_TEXT = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def float_column(values: np.ndarray) -> dict[str, str]:
    """The column ``values`` (flattened) as float64 bytes (module docstring)."""
    raw = np.ascontiguousarray(values, "<f8").tobytes()
    return {_FLOAT64: base64.b64encode(raw).decode("ascii")}


def float_values(value: dict[str, Any], name: str) -> list[Any]:
    """The values of a :func:`float_column` (``name``: the column's, for its non-finite
    values and for errors). Raises ValueError for a damaged column."""
    raw = value.get(_FLOAT64)
    if not isinstance(raw, str) or len(value) != 1:
        raise ValueError(f"column {name!r} is neither a list nor float64 values")
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"column {name!r}: its float64 values are not base64") from None
    if len(data) % 8:
        raise ValueError(f"column {name!r}: {len(data)} bytes are not float64 values")
    a = np.frombuffer(data, "<f8")
    values: list[Any] = a.tolist()
    if name in TEXT_NONFINITE and not np.isfinite(a).all():
        values = [v if math.isfinite(v) else str(v) for v in values]
    return values


def listed_floats(name: str, values: list[Any]) -> list[Any] | dict[str, str]:
    """The figures ``values`` of the column ``name`` as a :func:`float_column` when
    :func:`float_values` gives them back exactly (every value a float; in a
    :data:`TEXT_NONFINITE` column, a finite one or the text of a non-finite one), else the
    list as it is."""
    if not values:
        return values
    if name not in TEXT_NONFINITE:
        if all(type(v) is float for v in values):
            return float_column(np.array(values))
        return values
    floats = []
    for v in values:
        if type(v) is float and math.isfinite(v):
            floats.append(v)
        elif type(v) is str and v in _TEXT:
            floats.append(_TEXT[v])
        else:
            return values
    return float_column(np.array(floats))
