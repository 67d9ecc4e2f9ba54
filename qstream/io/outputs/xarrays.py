"""qstream outputs as xarray objects: lazy (Dask-backed), dequantized, float32, exact.

Each chunk of the stored ``data`` is dequantized by the same code as
:meth:`qstream.QuantizedArray.__getitem__` when Dask computes it, so the values are bit-identical
to ``qstream.dequantize`` for every granularity and type. Needs ``xarray`` and ``dask``.
"""

from __future__ import annotations

import math
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
    path: Any,
    *,
    storage_options: dict[str, Any] | None = None,
    chunks: Chunks = None,
    max_memory: int | None = None,
) -> xr.DataArray | xr.Dataset:
    """Open a quantized output as a lazy, dequantized float32 ``xarray.DataArray`` (dims as
    stored, e.g. ``dim_0, dim_1``; Dask chunks = the stored chunks unless ``chunks``), or a
    converted checkpoint's root as an ``xarray.Dataset`` with one such variable per tensor
    (kept tensors as stored; each tensor's dims prefixed with its name, since tensors of one
    checkpoint have unrelated shapes).

    ``max_memory`` (bytes, default 1 GiB) bounds what one Dask task holds: a stored chunk
    (read whole) and a Dask chunk as float32 of more than half of it are refused here, as is
    a checkpoint's pack (read whole) of more than half of it, before anything is read.

    An array's variable is named as the source's was (``t2m`` for a source
    ``era5.zarr/t2m``; ``data`` when the source had no name: a NumPy array, say) and keeps
    the source's descriptive attributes (``units``, ``long_name``, ...) beside qstream's
    (``quantized_dtype``, ``granularity``, ``method``, ``sqnr_db``); arrays of the output's
    group named by its dimensions (1-D, as long as the axis) are its coordinates, with their
    attributes."""
    try:
        import dask.array  # noqa: F401
        import xarray  # noqa: F401
    except ImportError as e:
        from ...errors import InvalidParameterError

        raise InvalidParameterError(
            f"open_xarray needs xarray and dask ({e.name} is missing):"
            " pip install 'qstream-zarr[xarray]'"
        ) from None
    opened = open_output(path, storage_options=storage_options, max_memory=max_memory)
    if isinstance(opened, QuantizedCheckpoint):
        import xarray as xr

        opened.max_memory = max_memory  # (its packs are held to the bound when opened)
        return xr.Dataset(
            {name: _tensor(opened[name], name, chunks, max_memory) for name in opened},
            attrs={"qstream_checkpoint": str(opened.meta.get("source"))},
        )
    out = _quantized(opened, _source_name(opened.meta.get("source")), None, chunks, max_memory)
    return _with_coords(out, opened)


_MEMBERS = {"data", "scale", "zero_point", "offset", "_progress"}  # (an output's own arrays)


def _source_name(source: Any) -> str:
    """The name of the variable a quantized array came from: the last part of a Zarr
    source's path (``era5.zarr/t2m`` -> ``t2m``), else ``data``."""
    if not isinstance(source, dict) or source.get("kind") != "zarr":
        return "data"
    path = source.get("path")
    name = str(path).rstrip("/").rsplit("/", 1)[-1] if isinstance(path, str) else ""
    if not name or name.endswith(".zarr") or not name.isprintable() or len(name) > 255:
        return "data"  # (a source that is a whole store: no variable name)
    return name


def _with_coords(out: xr.DataArray, arr: QuantizedArray) -> xr.DataArray:
    """``out`` with the 1-D arrays of ``arr``'s group named by its dimensions (as long as
    the axis; values read now, attributes kept) as coordinates."""
    import xarray as xr

    group = getattr(arr, "group", None)
    if group is None:
        return out
    coords = {}
    for dim, n in zip(out.dims, out.shape, strict=True):
        if dim in _MEMBERS:
            continue
        try:
            member = group[str(dim)]
        except (KeyError, TypeError, ValueError):
            continue
        if getattr(member, "shape", None) != (n,) or not hasattr(member, "dtype"):
            continue
        from .scientific import carried_attrs

        attrs = {k: v for k, v in carried_attrs(dict(member.attrs)).items() if k != "qstream"}
        coords[dim] = xr.Variable((dim,), np.asarray(member[...]), attrs)
    if not coords:
        return out
    try:  # (CF-decoded as xr.open_zarr decodes them: "hours since ..." times as datetime64)
        decoded = xr.decode_cf(xr.Dataset(coords=coords))
        return out.assign_coords({dim: decoded[dim] for dim in coords})
    except (ValueError, TypeError, OverflowError):  # (units xarray cannot decode: as stored)
        return out.assign_coords(coords)


def _check_chunks(lazy: Any, stored: Any, itemsize: int, name: str, max_memory: int | None) -> None:
    """Refuse a variable whose stored chunks (``stored``: read whole, of ``itemsize`` bytes a
    value) or Dask chunks (of float32, or as kept) need more than half the memory bound in
    one task: the sizes come from documents, which a crafted output can make any size."""
    from ...budget import memory_limit, mib

    limit = memory_limit(max_memory)
    task = math.prod(max(c, default=0) for c in lazy.chunks) * lazy.dtype.itemsize
    chunk = math.prod(int(c) for c in stored) * itemsize
    need = 2 * max(task, chunk)
    if need > limit:
        from ...errors import StoreError

        raise StoreError(
            f"{name}: a Dask task reads a stored chunk of {list(stored)} ({mib(chunk)}) whole"
            f" and makes {mib(task)} of values: the memory bound max_memory ({mib(limit)}) must"
            f" be at least {mib(need)}; pass smaller chunks= or a larger max_memory (a"
            " stored chunk this large comes from a damaged or crafted output)"
        )


def _dims(array: Any, prefix: str | None) -> list[str]:
    names = getattr(array.metadata, "dimension_names", None) or [
        f"dim_{i}" for i in range(len(array.shape))
    ]
    return [f"{prefix}/{n}" if prefix else str(n) for n in names]


def _quantized(
    arr: QuantizedArray, name: str, prefix: str | None, chunks: Chunks, max_memory: int | None
) -> xr.DataArray:
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
    _check_chunks(lazy, arr.data.chunks, np.dtype(arr.data.dtype).itemsize, name, max_memory)
    from .scientific import carried_attrs

    spec = arr.spec
    attrs = {
        **carried_attrs(dict(arr.data.attrs)),  # the source's units, long_name, ...
        "quantized_dtype": spec.dtype,
        "granularity": spec.granularity,
        "method": "explicit" if spec.scale is not None else spec.method,
    }
    err = arr.meta.get("error") or {}
    if err.get("sqnr_db") is not None:
        attrs["sqnr_db"] = err["sqnr_db"]
    return xr.DataArray(lazy, dims=_dims(arr.data, prefix), name=name, attrs=attrs)


def _tensor(t: Any, name: str, chunks: Chunks, max_memory: int | None) -> xr.DataArray:
    if isinstance(t, QuantizedArray):
        return _quantized(t, name, name, chunks, max_memory)
    import dask.array as da
    import xarray as xr

    lazy = da.from_array(t, chunks=chunks or t.chunks, lock=False)
    _check_chunks(lazy, t.chunks, np.dtype(t.dtype).itemsize, name, max_memory)
    attrs = {"kept": True, "dtype": dict(t.attrs.get("qstream", {})).get("dtype", str(t.dtype))}
    return xr.DataArray(lazy, dims=_dims(t, name), name=name, attrs=attrs)
