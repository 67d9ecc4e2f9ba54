"""qstream outputs as xarray objects: lazy (Dask-backed), dequantized, float32, exact.

Each chunk of the stored ``data`` is dequantized by the same code as
:meth:`qstream.QuantizedArray.__getitem__` when Dask computes it, so the values are bit-identical
to ``qstream.dequantize`` for every granularity and type. Needs ``xarray`` and ``dask``.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import numpy as np

from .quantized import QuantizedArray
from .reader import QuantizedCheckpoint, open_output

if TYPE_CHECKING:
    import xarray as xr

# Dask chunks as dask spells them: a size, "auto", one size (or tuple of sizes) per axis, or
# {axis: size}; None: the stored chunks
Chunks = int | str | tuple[int, ...] | tuple[tuple[int, ...], ...] | dict[int, int] | None


def open_xarray(
    path: Any, *, storage_options: dict[str, Any] | None = None, chunks: Chunks = None
) -> xr.DataArray | xr.Dataset:
    """Open a quantized output as a lazy, dequantized float32 ``xarray.DataArray`` (dims as
    stored, e.g. ``dim_0, dim_1``; Dask chunks = the stored chunks unless ``chunks``), or a
    converted checkpoint's root as an ``xarray.Dataset`` with one such variable per tensor
    (kept tensors as stored; each tensor's dims prefixed with its name, since tensors of one
    checkpoint have unrelated shapes)."""
    try:
        import dask.array  # noqa: F401
        import xarray  # noqa: F401
    except ImportError as e:
        from ..errors import InvalidParameterError

        raise InvalidParameterError(
            f"open_xarray needs xarray and dask ({e.name} is missing):"
            " pip install 'qstream-zarr[xarray]'"
        ) from None
    opened = open_output(path, storage_options=storage_options)
    if isinstance(opened, QuantizedCheckpoint):
        import xarray as xr

        return xr.Dataset(
            {name: _tensor(opened[name], name, chunks) for name in opened},
            attrs={"qstream_checkpoint": str(opened.meta.get("source"))},
        )
    return _quantized(opened, "data", None, chunks)


def _dims(array: Any, prefix: str | None) -> list[str]:
    names = getattr(array.metadata, "dimension_names", None) or [
        f"dim_{i}" for i in range(len(array.shape))
    ]
    return [f"{prefix}/{n}" if prefix else str(n) for n in names]


def _quantized(arr: QuantizedArray, name: str, prefix: str | None, chunks: Chunks) -> xr.DataArray:
    import dask.array as da
    import xarray as xr

    lazy = da.from_array(
        arr,
        chunks=chunks or arr.data.chunks,
        asarray=False,
        lock=False,
        fancy=False,
        meta=np.empty((0,) * arr.ndim, np.float32),
        name=f"qstream-dequantize-{uuid.uuid4().hex}",
    )
    spec = arr.spec
    attrs = {
        "quantized_dtype": spec.dtype,
        "granularity": spec.granularity,
        "method": "explicit" if spec.scale is not None else spec.method,
    }
    err = arr.meta.get("error") or {}
    if err.get("sqnr_db") is not None:
        attrs["sqnr_db"] = err["sqnr_db"]
    return xr.DataArray(lazy, dims=_dims(arr.data, prefix), name=name, attrs=attrs)


def _tensor(t: Any, name: str, chunks: Chunks) -> xr.DataArray:
    if isinstance(t, QuantizedArray):
        return _quantized(t, name, name, chunks)
    import dask.array as da
    import xarray as xr

    lazy = da.from_array(t, chunks=chunks or t.chunks, lock=False)
    attrs = {"kept": True, "dtype": dict(t.attrs.get("qstream", {})).get("dtype", str(t.dtype))}
    return xr.DataArray(lazy, dims=_dims(t, name), name=name, attrs=attrs)
