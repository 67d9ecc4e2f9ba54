"""The tensors a safetensors export writes, as :class:`~qstream.exports.files.Entry`
values: their names, safetensors types and shapes, and readers of their rows.

A quantized tensor is written in the ``qstream`` layout (codes, ``_scale``, ``_zero_point``;
:func:`quantized_entries`), the ``compressed-tensors`` one (:func:`ct_entries`, see
:mod:`qstream.exports.compressed_tensors`) or as its dequantized values (:func:`float_entry`); a
kept tensor in its own type (:func:`entries`). Every reader opens its tensor through a
:class:`Tensors` when it is called, so that an export holds one tensor open at a time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from ..errors import InvalidParameterError
from ..io.outputs import QuantizedArray, QuantizedCheckpoint
from ..io.storage import read_region
from . import compressed_tensors as ct
from .files import Entry

FLOAT_TYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_INT_TAGS = {
    "int8": "I8",
    "uint8": "U8",
    "int16": "I16",
    "uint16": "U16",
    "int32": "I32",
    "int4": "I8",
    "int2": "I8",
    "uint4": "U8",
    "uint2": "U8",
}
_FLOAT_TAGS = {"float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}
_PLAIN_TAGS = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}


class Tensors:
    """The tensors of an export, opened when their entries are read and one at a time (the
    last one is kept: its entries are written one after another), so that an export of many
    tensors holds one tensor's parameters, not all of them."""

    def __init__(self, opened: Any, name: str) -> None:
        self.opened, self.single = opened, name
        self.last: tuple[str, Any] | None = None

    def names(self) -> list[str]:
        """The names of the tensors, in the order they are written."""
        if isinstance(self.opened, QuantizedCheckpoint):
            return list(self.opened)
        return [self.single]

    def __call__(self, name: str) -> Any:
        """The tensor ``name`` (a :class:`QuantizedArray` or a kept ``zarr.Array``)."""
        if self.last is None or self.last[0] != name:
            t = self.opened[name] if isinstance(self.opened, QuantizedCheckpoint) else self.opened
            self.last = (name, t)
        return self.last[1]


def entries(name: str, t: Any, get: Tensors) -> list[Entry]:
    """The entries of the tensor ``name`` (``t``, open now); their readers open it again
    through ``get``."""
    if isinstance(t, QuantizedArray):
        return quantized_entries(name, t, get)
    dtype = dict(t.attrs.get("qstream", {})).get("dtype", np.dtype(t.dtype).name)
    if dtype not in _PLAIN_TAGS:
        raise InvalidParameterError(f"{name}: no safetensors type for {dtype}")
    out = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)

    def read(r0: int, r1: int) -> np.ndarray:
        t = get(name)
        v = read_region(t, (slice(r0, r1),) if t.ndim else ())  # (a corrupt chunk named)
        return np.ascontiguousarray(v.astype(out, copy=False))

    return [Entry(name, _PLAIN_TAGS[dtype], t.shape, out.itemsize, read)]


def quantized_entries(name: str, arr: QuantizedArray, get: Tensors) -> list[Entry]:
    """The ``qstream`` layout's entries of the quantized tensor ``name``: its codes, its
    scale and (unless every one is 0) its zero point."""
    qt = arr.qtype
    if qt.name in _INT_TAGS:
        tag = _INT_TAGS[qt.name]
        values = np.dtype(qt.widened)
    else:
        tag = _FLOAT_TAGS.get(qt.name, "U8")
        values = np.dtype(np.uint8)

    def read(r0: int, r1: int) -> np.ndarray:
        a = get(name)
        q = a.quantized((slice(r0, r1),) if a.ndim else ...)
        v = q.astype(values, copy=False) if qt.name in _INT_TAGS else q.view(np.uint8)
        return np.ascontiguousarray(v)

    out = [Entry(name, tag, arr.shape, values.itemsize, read)]
    s, z = param_shape(arr)
    scale_dtype, scale_tag = scale_form(arr)

    def read_scale(r0: int, r1: int) -> np.ndarray:
        scale: np.ndarray = get(name).scale.reshape(s).astype(scale_dtype)[r0:r1]
        return scale

    def read_zero_point(r0: int, r1: int) -> np.ndarray:
        zero_point: np.ndarray = get(name).zero_point.reshape(z).astype(values)[r0:r1]
        return zero_point

    out.append(Entry(f"{name}_scale", scale_tag, s, scale_dtype.itemsize, read_scale))
    if not qt.is_float and np.any(arr.zero_point != 0):
        out.append(Entry(f"{name}_zero_point", tag, z, values.itemsize, read_zero_point))
    return out


def scale_form(arr: QuantizedArray) -> tuple[np.dtype[Any], str]:
    """The dtype and safetensors tag an output's scales are exported in: as stored when
    float16 or bfloat16 (``QuantSpec.scale_dtype``: values of that type, exported exactly),
    else float32."""
    stored = np.dtype(arr.scale_dtype)
    dtype = stored if stored.name in ("float16", "bfloat16") else np.dtype(np.float32)
    return dtype, FLOAT_TYPES[dtype.name]


def float_entry(name: str, arr: QuantizedArray, get: Tensors, dtype: str) -> Entry:
    """The dequantized values of ``name`` in ``dtype``, read in slabs."""
    out = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)

    def read(r0: int, r1: int) -> np.ndarray:
        a = get(name)
        v = a[r0:r1] if a.ndim else a[...]
        return np.ascontiguousarray(np.asarray(v).astype(out, copy=False))

    return Entry(name, FLOAT_TYPES[dtype], arr.shape, out.itemsize, read)


def ct_entries(name: str, arr: QuantizedArray, lay: ct.Layout, get: Tensors) -> list[Entry]:
    """The compressed-tensors entries of the quantized weight ``name`` (see
    :mod:`qstream.exports.compressed_tensors`)."""
    out, cols = arr.shape
    m = lay.module

    def codes(r0: int, r1: int) -> np.ndarray:
        return ct.signed_codes(get(name).quantized((slice(r0, r1),)), lay)

    def packed(r0: int, r1: int) -> np.ndarray:
        return ct.pack_rows(codes(r0, r1))

    def logical_shape(r0: int, r1: int) -> np.ndarray:
        return np.array([out, cols], np.int64)

    if lay.bits == 8:
        found = [Entry(f"{m}weight", "I8", arr.shape, 1, codes)]
    else:
        words = -(-cols * lay.bits // 32)
        found = [
            Entry(f"{m}weight_packed", "I32", (out, words), 4, packed),
            Entry(f"{m}weight_shape", "I64", (2,), 8, logical_shape),
        ]
    pshape: tuple[int, ...] = {"tensor": (1,), "channel": (out, 1)}.get(
        lay.strategy, tuple(arr.scale.shape)
    )
    sdtype, tag = scale_form(arr)

    def scales(r0: int, r1: int) -> np.ndarray:
        scale: np.ndarray = get(name).scale.reshape(pshape).astype(sdtype)[r0:r1]
        return scale

    found.append(Entry(f"{m}weight_scale", tag, pshape, sdtype.itemsize, scales))
    if not lay.symmetric:

        def zero_points() -> np.ndarray:
            zp = np.rint(get(name).zero_point.reshape(pshape)).astype(np.int16)
            signed: np.ndarray = (zp - lay.offset).astype(np.int8)
            return signed

        def read_zp(r0: int, r1: int) -> np.ndarray:
            if lay.bits == 8:
                return zero_points()[r0:r1]
            return ct.pack_columns(zero_points(), lay.bits)[r0:r1]

        zshape = pshape if lay.bits == 8 else (-(-pshape[0] * lay.bits // 32), pshape[1])
        tag, size = ("I8", 1) if lay.bits == 8 else ("I32", 4)
        found.append(Entry(f"{m}weight_zero_point", tag, zshape, size, read_zp))
    return found


def exported_nbytes(name: str, shape: Sequence[int], spec: Any, format: str) -> int:
    """Every byte a ``.safetensors`` export in ``format`` holds for the tensor ``name`` of
    ``shape`` quantized under ``spec``: its entries as :func:`ct_entries` and
    :func:`quantized_entries` write them (compressed-tensors: int8 codes, or 4-bit codes
    packed in int32 words row by row plus the ``weight_shape`` entry; qstream's layout: each
    code in its widened type); scales in float32 (float16 or bfloat16 where stored so); a
    zero point where quantized_nbytes counts one (not a signed symmetric type). What
    ``qstream inspect`` of the file counts: a conversion's "after" for such a destination."""
    dims = [int(d) for d in shape]
    n = math.prod(dims)
    each = 2 if spec.scale_dtype in ("float16", "bfloat16") else 4
    qt = spec.qtype
    if format == "compressed-tensors":
        lay = ct.layout(name, dims, spec)
        out, cols = dims
        # (4 bits: words of 32 bits a row, and the logical shape as two int64)
        codes = out * cols if lay.bits == 8 else out * -(-cols * lay.bits // 32) * 4 + 16
        if lay.strategy == "tensor":
            pshape = (1, 1)
        elif lay.strategy == "channel":
            pshape = (out, 1)
        else:
            pshape = (out, -(-cols // int(lay.group_size or cols)))
        total = codes + pshape[0] * pshape[1] * each
        if not lay.symmetric:
            zp_rows = pshape[0] if lay.bits == 8 else -(-pshape[0] * lay.bits // 32) * 4
            total += zp_rows * pshape[1]
        return total
    params = 1
    if spec.axis is not None and dims:
        axis = spec.axis % len(dims)
        params = dims[axis]
        if spec.block_size:
            params = n // max(1, dims[axis]) * -(-dims[axis] // spec.block_size)
    width = np.dtype(qt.widened).itemsize if qt.name in _INT_TAGS else 1
    total = n * width + params * each
    if not qt.is_float and (not spec.symmetric or not qt.signed):
        total += params * width
    return total


def param_shape(arr: QuantizedArray) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shape of the exported scale / zero point (see :mod:`qstream.exports.safetensors`)."""
    if arr.axis is None:
        return (1,), (1,)
    if arr.spec.block_size:
        return arr.scale.shape, arr.scale.shape
    shape = [1] * arr.ndim
    shape[arr.axis] = arr.shape[arr.axis]
    return tuple(shape), tuple(shape)


def tensor_bytes(listed: list[dict[str, Any]], quantized: Mapping[str, Any]) -> dict[str, int]:
    """Each tensor's stored bytes, as convert and export count them: a quantized tensor's
    codes and its parameters' entries (``NAME_scale``, ``NAME_zero_point``, a packed form's
    ``NAME_packed``, ``NAME_global_scale``...), every other entry its own; in the file's
    order. A parameter belongs to NAME when NAME is quantized (the file's metadata says so),
    packed (``NAME_packed``) or stored as codes (an integer or 8-bit float entry): a float
    tensor ``x`` beside an ``x_scale`` of its own, or an ``rnn.w_l0_reverse`` beside
    ``rnn.w_l0``, stays apart. Each entry of ``listed`` gets its ``tensor``."""
    by_name = {e["name"]: e for e in listed}
    out: dict[str, int] = {}
    for e in listed:
        name = e["name"]
        base = next((name[: -len(x)] for x in _PARAMETERS if name.endswith(x)), None)
        owned = base is not None and (
            base in quantized
            or f"{base}_packed" in by_name
            or str((by_name.get(base) or {}).get("dtype")) in _CODE_TAGS
        )
        owner = base if owned and base is not None else name
        e["tensor"] = owner
        out[owner] = out.get(owner, 0) + int(e["bytes"])
    return out


# the entries stored beside a quantized weight NAME: its packed codes and its parameters
_PARAMETERS = ("_packed", "_global_scale", "_scale", "_zero_point", "_shape", "_g_idx")
# the safetensors dtypes quantized codes are stored as (float weights are not codes)
_CODE_TAGS = {"I8", "U8", "I16", "U16", "I32", "F8_E4M3", "F8_E5M2"}


def recorded_sqnr(opened: Any, name: str) -> float | str | None:
    """The SQNR (dB) the conversion measured for the tensor ``name`` of ``opened`` (a
    checkpoint's index row, or one array's report), rounded to 0.01 dB, as an export's
    metadata records it: ``"inf"`` for an exact tensor (JSON has no infinity); None where
    it has none."""
    if isinstance(opened, QuantizedCheckpoint):
        row = opened.tensors.get(name) or {}
        error = row.get("error")
    else:
        error = (getattr(opened, "report", None) or {}).get("error")
    return sqnr_value(error.get("sqnr_db") if isinstance(error, dict) else None)


def sqnr_value(value: object) -> float | str | None:
    """An SQNR (dB) as exports record it: rounded to 0.01 dB, ``"inf"`` for an exact tensor
    (JSON has no infinity), None for anything but a number."""
    if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
        return None
    return "inf" if math.isinf(value) else round(float(value), 2)


def recorded_db(value: object) -> float | None:
    """An SQNR as an export's metadata records it (:func:`recorded_sqnr`), as a number
    (``"inf"``: infinity); None for anything else."""
    if value == "inf":
        return math.inf
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None
