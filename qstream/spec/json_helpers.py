"""The JSON round trip the data classes share: values made JSON-ready and read back, the
fields of a dataclass, and the keys of a dict checked against the valid ones."""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection
from dataclasses import fields
from typing import Any

import numpy as np

from ..errors import InvalidParameterError

_PLAIN = (int, str, bool, type(None))
NON_FINITE = ("nan", "inf", "-inf")  # how non-finite floats are written


def jsonable(v: Any) -> Any:
    """``v`` with NumPy arrays and scalars as Python values, tuples as lists and non-finite
    floats as the strings ``"nan"``/``"inf"``/``"-inf"`` (JSON has no NaN/inf literals)."""
    t = type(v)
    if t is float:
        return v if math.isfinite(v) else str(v)
    if t in _PLAIN:
        return v
    if t is dict:
        return {k: jsonable(x) for k, x in v.items()}
    if t is list or t is tuple:
        if all(type(x) in _PLAIN for x in v):  # (a list of plain values: as it is)
            return list(v)
        return [jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, float):
        return float(v) if math.isfinite(v) else str(v)
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    return v


def jsonable_dict(d: dict[str, Any]) -> dict[str, Any]:
    """:func:`jsonable` of a dict (the same values, typed as a dict)."""
    return {k: jsonable(x) for k, x in d.items()}


def unjson_float(v: Any) -> Any:
    """A value :func:`jsonable` wrote, with ``"nan"``/``"inf"``/``"-inf"`` read back as floats."""
    return float(v) if isinstance(v, str) and v in NON_FINITE else v


def field_values(obj: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict, values as they are."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def check_keys(d: dict[str, Any], valid: Collection[str], what: str) -> None:
    """Refuse keys of ``d`` outside ``valid``, naming them, a close match, and the valid ones."""
    unknown = [k for k in d if k not in valid]
    if not unknown:
        return
    k = unknown[0]
    close = difflib.get_close_matches(str(k), list(valid), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise InvalidParameterError(f"unknown {what} key {k!r}{hint}; valid keys: {', '.join(valid)}")
