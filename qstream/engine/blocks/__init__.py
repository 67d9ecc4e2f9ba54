"""One block's work: read, quantize or measure, write."""

from .blockmath import (
    block_errors_fused,
    block_ranges,
    dynamic_blocked,
    dynamic_quantize,
    fused_applies,
    nan_to_zero_point,
)
from .chunking import check_chunks
from .dequantize_work import DequantizeWork
from .fused_rows import calibrate_rows_with_errors
from .quantize_work import NonFiniteBlock, QuantizeWork, apply_nan_policy, fill_nan
from .regions import JobPlan, channel_pieces, read_region
from .stats_work import HistogramWork, RangesWork

# the names the folders above may use
__all__ = [
    "DequantizeWork",
    "HistogramWork",
    "JobPlan",
    "NonFiniteBlock",
    "QuantizeWork",
    "RangesWork",
    "apply_nan_policy",
    "block_errors_fused",
    "block_ranges",
    "calibrate_rows_with_errors",
    "channel_pieces",
    "check_chunks",
    "dynamic_blocked",
    "dynamic_quantize",
    "fill_nan",
    "fused_applies",
    "nan_to_zero_point",
    "read_region",
]
