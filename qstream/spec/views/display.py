"""How a view is drawn, without the data importing the drawing code.

Calibrations, reports and quantized outputs show a table and an inline SVG in notebooks
(``_repr_html_``) and a matplotlib chart (``.plot()``), but the drawing lives in
:mod:`qstream.viz`, a layer above the data. This registry sits below both: :mod:`qstream.viz`
registers a :class:`Drawing` for each view type when it is imported, and a data class asks for
the drawing of its view with :func:`html` or :func:`plot`. The first request loads
:data:`DRAWING_PACKAGE` by name (as ``qstream/__init__`` loads its names), so no data module
imports the drawing code and the layers stay one above the other.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DRAWING_PACKAGE = "qstream.viz"  # registers the drawings when imported


@dataclass(frozen=True)
class Drawing:
    """The two ways a view type is drawn: ``html(view) -> str`` (a table and inline SVG) and
    ``plot(view, ax=None) -> axes`` (matplotlib; a new figure when ``ax`` is None)."""

    html: Callable[[Any], str]
    plot: Callable[..., Any]


_DRAWINGS: dict[type, Drawing] = {}


def register(view_type: type, drawing: Drawing) -> None:
    """Draw the views of ``view_type`` with ``drawing`` (replacing any earlier one)."""
    _DRAWINGS[view_type] = drawing


def drawing(view: object) -> Drawing:
    """The drawing registered for ``view``'s type (loading :data:`DRAWING_PACKAGE` first when
    none is registered yet)."""
    if type(view) not in _DRAWINGS:
        importlib.import_module(DRAWING_PACKAGE)
    try:
        return _DRAWINGS[type(view)]
    except KeyError:
        raise TypeError(f"no drawing is registered for {type(view).__name__}") from None


def html(view: object) -> str:
    """The notebook HTML of ``view`` (a summary table and inline SVG charts)."""
    return drawing(view).html(view)


def plot(view: object, ax: Any = None) -> Any:
    """Draw ``view``'s main chart on ``ax`` (a matplotlib axes; a new figure when None) with
    matplotlib; returns the figure (``ax.figure``)."""
    return drawing(view).plot(view, ax=ax).figure
