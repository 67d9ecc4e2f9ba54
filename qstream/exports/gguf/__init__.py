"""GGUF files as llama.cpp's converter writes them."""

from ...compat.gguf_names import EXPERTS, LAYER_NAMES, expert_of, gguf_name, row_order, skipped
from .arch import architecture_of
from .export import destination_action, export_gguf, write_plan
from .file import describe, written_by_qstream
from .imatrix import read_imatrix, write_imatrix
from .importance import ImatrixSummary, compute_imatrix
from .plan import plan_gguf

# the names the folders above may use
__all__ = [
    "EXPERTS",
    "LAYER_NAMES",
    "ImatrixSummary",
    "architecture_of",
    "compute_imatrix",
    "describe",
    "destination_action",
    "expert_of",
    "export_gguf",
    "gguf_name",
    "plan_gguf",
    "read_imatrix",
    "row_order",
    "skipped",
    "write_imatrix",
    "write_plan",
    "written_by_qstream",
]
