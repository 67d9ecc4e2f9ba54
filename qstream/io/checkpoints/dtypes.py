"""The element types checkpoints hold: safetensors' dtype codes, the 8-bit floats, bfloat16."""

from __future__ import annotations

from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
    # 8-bit floats (as the format and torch name them; the bytes are ml_dtypes' own)
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "F8_E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
}
FLOAT8_DTYPES = frozenset(SAFETENSORS_DTYPES[k] for k in SAFETENSORS_DTYPES if k[:3] == "F8_")
BF16 = np.dtype(ml_dtypes.bfloat16)


def native(dtype: np.dtype) -> np.dtype:
    """``dtype`` in native byte order (file arrays may be big-endian)."""
    return dtype.newbyteorder("=") if dtype.byteorder not in ("=", "|") else dtype


class DtypeFacts(NamedTuple):
    """What per-tensor code asks of a tensor's dtype (see :func:`dtype_facts`)."""

    dtype: np.dtype[Any]
    name: str
    native: bool  # in native byte order


_FACTS: dict[int, tuple[Any, DtypeFacts]] = {}
_MAX_FACTS = 256  # (a big-endian dtype read from a file is a new object each time)


def dtype_facts(dtype: Any) -> DtypeFacts:
    """``np.dtype(dtype)``, its name and whether it is in native byte order, remembered by
    the dtype object: a checkpoint's tensors share a few, and deriving these (hashing,
    naming or comparing a dtype) costs microseconds per tensor, 16,384 times over."""
    known = _FACTS.get(id(dtype))
    if known is None or known[0] is not dtype:
        if len(_FACTS) >= _MAX_FACTS:
            _FACTS.clear()
        dt = np.dtype(dtype)
        known = _FACTS[id(dtype)] = (dtype, DtypeFacts(dt, dt.name, native(dt) == dt))
    return known[1]
