"""Specs and metadata: frozen dataclasses, each with an explicit JSON round-trip.

``QuantSpec`` says what to do (:mod:`.quantspec`); ``RangeStats``/``ErrorStats`` are the
mergeable statistics gathered while streaming (:mod:`.stats`), ``GroupSQNR``/``WorstGroups``
those of a blocked spec's parameter groups (:mod:`.groupstats`); ``QuantParams`` holds the
scale/zero point a spec resolved to, and ``Calibration`` and ``QuantReport`` are what the store
functions return (:mod:`.reports`). The JSON helpers they share are in :mod:`.jsonable`.
"""

from __future__ import annotations

from .groupstats import GroupSQNR, WorstGroups
from .json_helpers import check_keys, jsonable
from .quantspec import (
    HISTOGRAM_METHODS,
    MAX_BINS,
    METHODS,
    NAN_POLICIES,
    OFFSET_MODES,
    SCALE_DTYPES,
    SYMMETRIC_LEVELS,
    QuantSpec,
)
from .recipe import ACTIVATION_PARAMS, DEFAULT_SPEC, DEFAULT_SUFFIXES, Recipe, ScaleRule
from .reports import Calibration, QuantParams, QuantReport
from .stats import ErrorStats, MergedStats, RangeStats, error_metrics, merge_into

# the names the folders above may use
__all__ = [
    "ACTIVATION_PARAMS",
    "DEFAULT_SPEC",
    "DEFAULT_SUFFIXES",
    "HISTOGRAM_METHODS",
    "MAX_BINS",
    "METHODS",
    "NAN_POLICIES",
    "OFFSET_MODES",
    "SCALE_DTYPES",
    "SYMMETRIC_LEVELS",
    "Calibration",
    "ErrorStats",
    "GroupSQNR",
    "MergedStats",
    "QuantParams",
    "QuantReport",
    "QuantSpec",
    "RangeStats",
    "Recipe",
    "ScaleRule",
    "WorstGroups",
    "check_keys",
    "error_metrics",
    "jsonable",
    "merge_into",
]
