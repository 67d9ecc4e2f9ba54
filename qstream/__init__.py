"""qstream: exact, out-of-core quantization of arrays.

``import qstream`` is cheap: NumPy-level functions and store functions are loaded on first use,
and Numba only when a kernel first runs.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "quantize": "qstream.api.arrays",
    "dequantize": "qstream.api.arrays",
    "quantize_dynamic": "qstream.api.arrays",
    "GroupQuantized": "qstream.api.arrays",
    "quantize_store": "qstream.api.stores",
    "dequantize_store": "qstream.api.stores",
    "calibrate": "qstream.api.stores",
    "compare_methods": "qstream.api.views",
    "open_quantized": "qstream.io.qarray",
    "QuantizedArray": "qstream.io.qarray",
    "QuantizedCheckpoint": "qstream.io.qarray",
    "open_xarray": "qstream.io.xarrays",
    "export_safetensors": "qstream.io.export",
    "export_gguf": "qstream.io.gguf",
    "convert_checkpoint": "qstream.api.convert",
    "plan_conversion": "qstream.api.convert",
    "TensorEvent": "qstream.api.convert",
    "Recipe": "qstream.recipe",
    "QuantSpec": "qstream.spec",
    "QuantReport": "qstream.spec",
    "Calibration": "qstream.spec",
    "QType": "qstream.qtypes",
    "QTYPES": "qstream.qtypes",
    "ROUND_MODES": "qstream.rounding",
    "QStreamError": "qstream.errors",
    "QStreamWarning": "qstream.errors",
    "InvalidParameterError": "qstream.errors",
    "InvalidDTypeError": "qstream.errors",
    "NonFiniteInputError": "qstream.errors",
    "StoreError": "qstream.errors",
    "LocalExecutor": "qstream.engine.executors",
    "DaskExecutor": "qstream.engine.dask",
    "QstreamWorkerPlugin": "qstream.engine.dask",
    "on_compile": "qstream.kernels.runtime",
    "warm_up": "qstream.engine.warmup",
    "register_zarr_types": "qstream.io.zarr_ext",
}
_SUBMODULES = ("compat",)

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"qstream.{name}")
    else:
        raise AttributeError(f"module 'qstream' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return __all__
