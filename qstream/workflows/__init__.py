"""Workflows below the public functions: a checkpoint conversion planned then carried out
(Zarr group, GGUF file, compressed-tensors folder, preset), and decoding to files."""

from . import conversion_run, dequantize_files
from .conversion_plan import ConversionPlan, missing_parents, plan_convert, tensor_rows
from .types import (
    ArraySource,
    ExecutorLike,
    Location,
    OnTensor,
    PathLike,
    Progress,
    StorageOptions,
)

# the names the folders above may use
__all__ = [
    "ArraySource",
    "ConversionPlan",
    "ExecutorLike",
    "Location",
    "OnTensor",
    "PathLike",
    "Progress",
    "StorageOptions",
    "conversion_run",
    "dequantize_files",
    "missing_parents",
    "plan_convert",
    "tensor_rows",
]
