"""One array from start to end: plans, passes, parameters, reports."""

from .array_jobs import DIRECT_BELOW, dequantize_direct, quantize_direct
from .dequantize_job import (
    dequantize,
    dequantized_array,
    dequantized_fingerprint,
    look_dequantize,
)
from .job import QuantizeJob
from .job_memory import calibrated_in_memory, quantize_in_memory
from .kernel_choice import small_array_job, twins_cover
from .passes import report_stage

# the names the folders above may use; the submodules named here are loaded on demand
__all__ = [
    "DIRECT_BELOW",
    "QuantizeJob",
    "array_jobs",
    "calibrated_in_memory",
    "comparison",
    "dequantize",
    "dequantize_direct",
    "dequantized_array",
    "dequantized_fingerprint",
    "look_dequantize",
    "quantize_direct",
    "quantize_in_memory",
    "report_stage",
    "small_array_job",
    "twins_cover",
]
