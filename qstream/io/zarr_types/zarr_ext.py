"""Sub-byte Zarr data types, ``bfloat16``, and the ``packbits`` codec, as zarr-extensions
defines them.

Data types ``int4``, ``uint4``, ``int2``, ``uint2`` and ``float4_e2m1fn``
(``zarr-extensions/data-types/*``), whose NumPy form is the ``ml_dtypes`` type (one element
per byte in memory), and the ``packbits`` array -> bytes codec (``zarr-extensions/codecs/
packbits``): elements in C order, ``k`` bits each (4 or 2 here), element ``i`` at bits
``[i*k, (i+1)*k)`` of the byte sequence counting from each byte's least-significant bit, the
last byte padded with zero bits; ``padding_encoding`` ``"none"`` (default), ``"first_byte"``
or ``"last_byte"`` (one byte holding the number of padding bits). Decoding sign-extends the
signed integer types.

They are registered with zarr-python through entry points (``zarr.data_type``,
``zarr.codecs``), and by :func:`register_zarr_types` whenever qstream opens a store. zarr 3.2
and later load data-type entry points, so plain ``zarr.open_array`` reads qstream's packed
outputs when qstream is installed; zarr 3.1 (the last release for Python 3.11) collects them
but never loads them, so there ``qstream.register_zarr_types()`` must run first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NoReturn, Self, TypeGuard, cast, overload

import ml_dtypes
import numpy as np
import zarr.dtype
import zarr.errors
from zarr.abc.codec import ArrayBytesCodec
from zarr.core.dtype.common import DTypeJSON, HasItemSize
from zarr.core.dtype.npy.float import BaseFloat
from zarr.core.dtype.wrapper import ZDType

if TYPE_CHECKING:
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer
    from zarr.core.common import JSON, ZarrFormat

from .packing import packed_nbytes

# zarr 3.2 moved it to zarr.errors, and its old homes warn (ZarrDeprecationWarning) when it is
# taken from them: this module is loaded at every zarr open where qstream is installed (its entry
# points), so it is taken from the new home where there is one, and never from an old one that
# warns
DataTypeValidationError: type[ValueError] = (
    vars(zarr.errors).get("DataTypeValidationError") or vars(zarr.dtype)["DataTypeValidationError"]
)
PADDING = ("none", "first_byte", "last_byte")
_BF16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)


# --------------------------------------------------------------------------- data types


@dataclass(frozen=True, kw_only=True)
class _SubByte(ZDType[np.dtype[Any], np.generic], HasItemSize):
    """A zarr-extensions sub-byte data type backed by its ``ml_dtypes`` NumPy type."""

    _zarr_v3_name: ClassVar[str]
    _native: ClassVar[np.dtype[Any]]
    bits: ClassVar[int]
    signed: ClassVar[bool]

    @classmethod
    def from_native_dtype(cls, dtype: np.dtype[Any]) -> Self:
        """This type, if ``dtype`` is its ``ml_dtypes`` type."""
        if np.dtype(dtype) == cls._native:
            return cls()
        raise DataTypeValidationError(f"Invalid data type {dtype}; expected {cls._native}")

    def to_native_dtype(self) -> np.dtype[Any]:
        """The ``ml_dtypes`` NumPy type (one element per byte in memory)."""
        return self._native

    @classmethod
    def _from_json_v2(cls, data: DTypeJSON) -> Self:
        raise DataTypeValidationError(f"{cls._zarr_v3_name} is a Zarr v3 data type only")

    @classmethod
    def _from_json_v3(cls, data: DTypeJSON) -> Self:
        if data == cls._zarr_v3_name:
            return cls()
        raise DataTypeValidationError(f"expected {cls._zarr_v3_name!r}, got {data!r}")

    @overload
    def to_json(self, zarr_format: Literal[2]) -> NoReturn: ...
    @overload
    def to_json(self, zarr_format: Literal[3]) -> str: ...
    def to_json(self, zarr_format: ZarrFormat) -> str:
        """The type's name in Zarr v3 metadata (it has no Zarr v2 form)."""
        if zarr_format == 3:
            return self._zarr_v3_name
        raise ValueError(f"{self._zarr_v3_name} exists in Zarr format 3 only")

    def _check_scalar(self, data: object) -> bool:
        return isinstance(data, (int, float, np.integer, np.floating)) or (
            isinstance(data, np.generic) and data.dtype == self._native
        )

    def cast_scalar(self, data: object) -> np.generic:
        """``data`` (a Python or NumPy number) as a scalar of this type."""
        if not self._check_scalar(data):
            raise TypeError(f"cannot convert {data!r} to {self._zarr_v3_name}")
        return cast(np.generic, np.array(data).astype(self._native)[()])  # (0-d: a scalar)

    def default_scalar(self) -> np.generic:
        """Zero."""
        return self.cast_scalar(0)

    def from_json_scalar(self, data: JSON, *, zarr_format: ZarrFormat) -> np.generic:
        """A fill value read from metadata (a number)."""
        if isinstance(data, (int, float)):
            return self.cast_scalar(data)
        raise TypeError(f"invalid fill value {data!r} for {self._zarr_v3_name}")

    def to_json_scalar(self, data: object, *, zarr_format: ZarrFormat) -> JSON:
        """A fill value as metadata writes it (a float for float types, else an int)."""
        v = np.array(self.cast_scalar(data))
        return float(v.astype(np.float32)) if self._float else int(v.astype(np.int64))

    @property
    def item_size(self) -> int:
        """Bytes per element in memory."""
        return 1

    _float: ClassVar[bool] = False


def _subtype(name: str, bits: int, signed: bool, is_float: bool = False) -> type[_SubByte]:
    native = np.dtype(getattr(ml_dtypes, name))
    made: type = dataclass(frozen=True, kw_only=True)(
        type(
            name.capitalize().replace("_", ""),
            (_SubByte,),
            {
                "_zarr_v3_name": name,
                "_native": native,
                "dtype_cls": type(native),
                "bits": bits,
                "signed": signed,
                "_float": is_float,
                "__module__": __name__,
                "__qualname__": name.capitalize().replace("_", ""),
            },
        )
    )
    return cast("type[_SubByte]", made)  # (a subclass made at run time)


@dataclass(frozen=True, kw_only=True)
class Bfloat16(BaseFloat[Any, Any]):  # (zarr's type parameters admit its own floats only)
    """The ``bfloat16`` Zarr v3 data type (zarr-extensions ``data-types/bfloat16``; zarrs
    reads it too): two little-endian bytes per value, the ``ml_dtypes.bfloat16`` NumPy type.
    zarr-python has no bfloat16 of its own: without it a bfloat16 array could only be stored
    as uint16 bits or widened to float32."""

    dtype_cls = type(_BF16)
    _zarr_v3_name: ClassVar[str] = "bfloat16"
    _zarr_v2_names: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def _check_native_dtype(cls, dtype: np.dtype[Any]) -> TypeGuard[np.dtype[Any]]:
        return bool(np.dtype(dtype) == _BF16)

    def to_native_dtype(self) -> np.dtype[Any]:
        """``ml_dtypes.bfloat16`` (little-endian only)."""
        if self.endianness == "big":
            raise ValueError("bfloat16 arrays are stored little-endian")
        return _BF16

    @property
    def item_size(self) -> int:
        """Bytes per element."""
        return 2


Int4 = _subtype("int4", 4, True)
Uint4 = _subtype("uint4", 4, False)
Int2 = _subtype("int2", 2, True)
Uint2 = _subtype("uint2", 2, False)
Float4E2m1fn = _subtype("float4_e2m1fn", 4, False, is_float=True)
DATA_TYPES = (Int4, Uint4, Int2, Uint2, Float4E2m1fn)
BITS = {t._zarr_v3_name: t.bits for t in DATA_TYPES}


# --------------------------------------------------------------------------- the codec


@dataclass(frozen=True)
class PackBits(ArrayBytesCodec):
    """The zarr-extensions ``packbits`` codec for qstream's sub-byte types."""

    is_fixed_size = True
    padding_encoding: str = "none"

    def __post_init__(self) -> None:
        if self.padding_encoding not in PADDING:
            raise ValueError(f"padding_encoding must be one of {PADDING}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """The codec of a ``packbits`` entry of an array's metadata."""
        cfg = dict(data.get("configuration") or {})
        if cfg.get("first_bit") not in (None, 0) or cfg.get("last_bit") is not None:
            raise ValueError("packbits: first_bit / last_bit are not supported by qstream")
        return cls(padding_encoding=cfg.get("padding_encoding", "none"))

    def to_dict(self) -> dict[str, JSON]:
        """The codec's entry in an array's metadata."""
        return {"name": "packbits", "configuration": {"padding_encoding": self.padding_encoding}}

    def _bits(self, chunk_spec: ArraySpec) -> tuple[int, bool]:
        dtype = chunk_spec.dtype
        if not isinstance(dtype, _SubByte):
            raise ValueError(f"qstream's packbits codec packs sub-byte types, not {dtype}")
        return dtype.bits, dtype.signed

    async def _decode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> NDBuffer:
        bits, signed = self._bits(chunk_spec)
        raw = np.asarray(chunk_bytes.as_numpy_array()).view(np.uint8)
        if self.padding_encoding == "first_byte":
            raw = raw[1:]
        elif self.padding_encoding == "last_byte":
            raw = raw[:-1]
        n = int(np.prod(chunk_spec.shape))
        if raw.size != packed_nbytes(n, bits):
            raise ValueError(
                f"packbits chunk holds {raw.size} bytes, expected {packed_nbytes(n, bits)}"
            )
        from ...kernels.packing import unpack_codes

        out = np.empty(chunk_spec.shape, chunk_spec.dtype.to_native_dtype())
        unpack_codes(np.ascontiguousarray(raw), n, bits, signed, out.reshape(-1).view(np.uint8))
        return chunk_spec.prototype.nd_buffer.from_numpy_array(out)

    async def _encode_single(self, chunk_array: NDBuffer, chunk_spec: ArraySpec) -> Buffer:
        bits, _ = self._bits(chunk_spec)
        from ...kernels.packing import pack_codes

        a = np.ascontiguousarray(chunk_array.as_numpy_array()).reshape(-1).view(np.uint8)
        body = np.empty(packed_nbytes(a.size, bits), np.uint8)
        pack_codes(a, bits, body)
        pad = (-a.size * bits) % 8
        if self.padding_encoding == "first_byte":
            body = np.concatenate([np.array([pad], np.uint8), body])
        elif self.padding_encoding == "last_byte":
            body = np.concatenate([body, np.array([pad], np.uint8)])
        return chunk_spec.prototype.buffer.from_array_like(body)

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        """Bytes of an encoded chunk of ``input_byte_length`` elements (one byte each)."""
        bits, _ = self._bits(chunk_spec)
        extra = 0 if self.padding_encoding == "none" else 1
        return packed_nbytes(input_byte_length, bits) + extra


_REGISTERED = [False]


def register_zarr_types() -> None:
    """Register qstream's sub-byte data types and the ``packbits`` codec with zarr-python
    (idempotent), so that zarr (and xarray through it) opens packed outputs in a process that
    has not opened a store through qstream. Needed with zarr 3.1; zarr 3.2 and later find
    them through qstream's entry points."""
    if _REGISTERED[0]:
        return
    from zarr.core.dtype import data_type_registry
    from zarr.registry import register_codec

    for t in (*DATA_TYPES, Bfloat16):
        data_type_registry.register(t._zarr_v3_name, t)
    register_codec("packbits", PackBits)
    _REGISTERED[0] = True
