"""Calibration: merged statistics -> ranges -> scale / zero point."""

from .histogram import method_range
from .params import params_from_range, symmetric_steps

# the names the folders above may use
__all__ = [
    "method_range",
    "params_from_range",
    "symmetric_steps",
]
