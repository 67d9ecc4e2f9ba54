"""qstream: exact, out-of-core quantization of arrays.

``import qstream`` is cheap: NumPy-level functions and store functions are loaded on first use,
and Numba only when a kernel first runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the names below load lazily, for type checkers (keep the two in step)
    from . import compat as compat
    from .api.arrays import GroupQuantized as GroupQuantized
    from .api.arrays import dequantize as dequantize
    from .api.arrays import quantize as quantize
    from .api.arrays import quantize_dynamic as quantize_dynamic
    from .api.convert import ConversionPlan as ConversionPlan
    from .api.convert import ConversionResult as ConversionResult
    from .api.convert import TensorEvent as TensorEvent
    from .api.convert import convert_checkpoint as convert_checkpoint
    from .api.convert import open_checkpoint as open_checkpoint
    from .api.convert import plan_conversion as plan_conversion
    from .api.convert import plan_convert as plan_convert
    from .api.exports import export_gguf as export_gguf
    from .api.exports import export_safetensors as export_safetensors
    from .api.readers import open_quantized as open_quantized
    from .api.store_jobs import calibrate as calibrate
    from .api.store_jobs import dequantize_store as dequantize_store
    from .api.store_jobs import plan_dequantize as plan_dequantize
    from .api.store_jobs import plan_quantize as plan_quantize
    from .api.store_jobs import quantize_store as quantize_store
    from .api.views import compare_methods as compare_methods
    from .api.views import save_plot as save_plot
    from .compile_events import on_compile as on_compile
    from .engine.run.dask import DaskExecutor as DaskExecutor
    from .engine.run.dask import QstreamWorkerPlugin as QstreamWorkerPlugin
    from .engine.run.executors import LocalExecutor as LocalExecutor
    from .engine.warmup import warm_up as warm_up
    from .errors import DestinationBusyError as DestinationBusyError
    from .errors import InvalidDTypeError as InvalidDTypeError
    from .errors import InvalidParameterError as InvalidParameterError
    from .errors import NonFiniteInputError as NonFiniteInputError
    from .errors import QStreamError as QStreamError
    from .errors import QStreamWarning as QStreamWarning
    from .errors import StoreError as StoreError
    from .exports.gguf.importance import ImatrixSummary as ImatrixSummary
    from .exports.gguf.importance import compute_imatrix as compute_imatrix
    from .exports.safetensors import describe_export as describe_export
    from .io.outputs.qarray import QuantizedArray as QuantizedArray
    from .io.outputs.qarray import QuantizedCheckpoint as QuantizedCheckpoint
    from .io.outputs.xarrays import open_xarray as open_xarray
    from .io.zarr_types.zarr_ext import register_zarr_types as register_zarr_types
    from .qtypes import QTYPES as QTYPES
    from .qtypes import QType as QType
    from .rounding import ROUND_MODES as ROUND_MODES
    from .spec import Calibration as Calibration
    from .spec import QuantReport as QuantReport
    from .spec import QuantSpec as QuantSpec
    from .spec.recipe import Recipe as Recipe
    from .workflows.source_description import describe_checkpoint as describe_checkpoint
    from .workflows.warm_up import warm_common as warm_common

__version__ = "0.1.0"

_EXPORTS = {
    "quantize": "qstream.api.arrays",
    "dequantize": "qstream.api.arrays",
    "quantize_dynamic": "qstream.api.arrays",
    "GroupQuantized": "qstream.api.arrays",
    "quantize_store": "qstream.api.store_jobs",
    "dequantize_store": "qstream.api.store_jobs",
    "plan_dequantize": "qstream.api.store_jobs",
    "plan_quantize": "qstream.api.store_jobs",
    "calibrate": "qstream.api.store_jobs",
    "compare_methods": "qstream.api.views",
    "save_plot": "qstream.api.views",
    "open_quantized": "qstream.api.readers",
    "QuantizedArray": "qstream.io.outputs.qarray",
    "QuantizedCheckpoint": "qstream.io.outputs.qarray",
    "open_xarray": "qstream.io.outputs.xarrays",
    "export_safetensors": "qstream.api.exports",
    "export_gguf": "qstream.api.exports",
    "compute_imatrix": "qstream.exports.gguf.importance",
    "ImatrixSummary": "qstream.exports.gguf.importance",
    "describe_export": "qstream.exports.safetensors",
    "describe_checkpoint": "qstream.workflows.source_description",
    "convert_checkpoint": "qstream.api.convert",
    "open_checkpoint": "qstream.api.convert",
    "plan_conversion": "qstream.api.convert",
    "plan_convert": "qstream.api.convert",
    "ConversionPlan": "qstream.api.convert",
    "ConversionResult": "qstream.api.convert",
    "TensorEvent": "qstream.api.convert",
    "Recipe": "qstream.spec.recipe",
    "QuantSpec": "qstream.spec",
    "QuantReport": "qstream.spec",
    "Calibration": "qstream.spec",
    "QType": "qstream.qtypes",
    "QTYPES": "qstream.qtypes",
    "ROUND_MODES": "qstream.rounding",
    "QStreamError": "qstream.errors",
    "QStreamWarning": "qstream.errors",
    "InvalidParameterError": "qstream.errors",
    "DestinationBusyError": "qstream.errors",
    "InvalidDTypeError": "qstream.errors",
    "NonFiniteInputError": "qstream.errors",
    "StoreError": "qstream.errors",
    "LocalExecutor": "qstream.engine.run.executors",
    "DaskExecutor": "qstream.engine.run.dask",
    "QstreamWorkerPlugin": "qstream.engine.run.dask",
    "on_compile": "qstream.compile_events",
    "warm_up": "qstream.engine.warmup",
    "warm_common": "qstream.workflows.warm_up",
    "register_zarr_types": "qstream.io.zarr_types.zarr_ext",
}
_SUBMODULES = ("compat",)

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


if not TYPE_CHECKING:  # (type checkers see the names above, and flag a misspelt one)

    def __getattr__(name: str) -> Any:
        """Load an exported name (or submodule) on first use, and keep it."""
        if name in _EXPORTS:
            value = getattr(importlib.import_module(_EXPORTS[name]), name)
        elif name in _SUBMODULES:
            value = importlib.import_module(f"qstream.{name}")
        else:
            raise AttributeError(f"module 'qstream' has no attribute {name!r}")
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    """The exported names (loaded or not)."""
    return __all__
