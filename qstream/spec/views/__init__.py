"""What the calibration views draw, in bounded size: histograms, per-channel summaries, and
each method's error predicted from one histogram.

Everything here is data (frozen dataclasses with a JSON round-trip), no drawing: the SVG and
HTML views are in :mod:`qstream.viz`, the terminal views in the CLI; :mod:`.display` is how
the data asks for its drawing without importing it.

- :class:`Histogram` (:mod:`.histograms`): a fixed-edge histogram with exact integer counts.
  The 2048-bin calibration histograms are kept as :data:`VIEW_BINS` bins by summing adjacent
  bins, so the counts stay exact; when the bins do not divide evenly the top edge is extended
  (the extra bins are empty).
- :class:`ChannelSummary` (:mod:`.summaries`): a per-channel quantity (SQNR in dB) as
  quantiles, a histogram over the channels, and the worst channels; never one entry per
  channel.
- :class:`MethodPrediction` (:mod:`.predictions`): a method's range, parameters and
  *predicted* SQNR and clip fraction (:func:`predict_error`).
- :class:`CalibrationView` (:mod:`.report`): what a calibration keeps for its views
  (``Calibration.view``, stored in an output's ``attrs["qstream"]["calibration"]["view"]``).
- :class:`ReportView` (:mod:`.report`): a calibration view with the error report of a
  quantize pass (assembled from an output's metadata or a report; not stored).
- :class:`GroupSummary` (:mod:`.summaries`): a group-wise (blocked) output's per-group SQNR
  distribution and its worst groups (from ``error["groups"]`` and ``error["worst_groups"]``).
- :class:`CheckpointView` (:mod:`.checkpoints`): a converted checkpoint in bounded size,
  whatever its number of tensors: the SQNR over its quantized tensors (quantiles, a
  histogram, the worst ones), its bytes before and after (totals, per target, the largest
  tensors, a histogram of sizes).
"""

from __future__ import annotations

from .checkpoints import LARGEST_TENSORS, SIZE_BINS, TARGETS, WORST_TENSORS, CheckpointView
from .display import Drawing, register
from .histograms import QUANTILES, SQNR_BINS, VIEW_BINS, Histogram, quantiles
from .predictions import MethodPrediction, predict_error
from .report import CalibrationView, ReportView, calibration_view
from .summaries import (
    GROUP_ROWS,
    WORST,
    ChannelSummary,
    GroupSummary,
    channel_sqnr,
    clip_ratio,
    clip_summary,
    total_sqnr,
)

# the names the folders above may use; the submodules named here are loaded on demand
__all__ = [
    "GROUP_ROWS",
    "LARGEST_TENSORS",
    "QUANTILES",
    "SIZE_BINS",
    "SQNR_BINS",
    "TARGETS",
    "VIEW_BINS",
    "WORST",
    "WORST_TENSORS",
    "CalibrationView",
    "ChannelSummary",
    "CheckpointView",
    "Drawing",
    "GroupSummary",
    "Histogram",
    "MethodPrediction",
    "ReportView",
    "calibration_view",
    "channel_sqnr",
    "clip_ratio",
    "clip_summary",
    "display",
    "predict_error",
    "quantiles",
    "register",
    "total_sqnr",
]
