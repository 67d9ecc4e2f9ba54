"""Element-type arguments of the profiles: the spec's own names and qstream's.

Every dtype argument of every profile accepts, for each type the profile supports:

- the framework's own name (``s8``, ``f8_e4m3``, ``qint8``, ``i32``, ``FLOAT8E4M3FN`` ...);
- qstream's name (``qstream.qtypes.QTYPES``, and ``float16``/``bfloat16``/``float32``/
  ``float64`` for real types);
- a NumPy / ml_dtypes dtype of that type, or an object whose ``name`` is one of the above
  (e.g. a TensorFlow ``DType``).

Names are matched case-insensitively. Anything else raises ``InvalidDTypeError`` listing both
spellings of every supported type.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import numpy as np
import numpy.typing as npt

from ..errors import InvalidDTypeError
from ..qtypes import is_float_dtype, is_qtype_dtype, qtype


def _qstream_name(value: object) -> str | None:
    """qstream's name of a dtype-like ``value`` (None if it is not a quantized or real type)."""
    try:
        dt = np.dtype(cast(npt.DTypeLike, value))  # (anything: np.dtype says what it is not)
    except (TypeError, ValueError):
        return None
    if is_qtype_dtype(dt):
        return qtype(dt).name
    if is_float_dtype(dt):
        return dt.name
    return None


def resolve_type(value: object, native: Mapping[str, str], what: str, *, prefix: str = "") -> str:
    """qstream's name of the type ``value`` names, among the types a profile supports.

    ``native`` maps the framework's names to qstream's names; its values are the supported
    types. With ``prefix`` (torch's ``"torch."``), a string starting with it must continue
    with a native name (``str(torch.qint8)`` is ``"torch.qint8"``).
    """
    by_native = {k.lower(): v for k, v in native.items()}
    supported = tuple(dict.fromkeys(native.values()))
    found = None
    if isinstance(value, str) or not _is_dtype_like(value):
        text = value if isinstance(value, str) else getattr(value, "name", None)
        text = (text if isinstance(text, str) else str(value)).strip().lower()
        if prefix and text.startswith(prefix.lower()):
            found = by_native.get(text[len(prefix) :])
        else:
            found = by_native.get(text) or (text if text in supported else None)
    elif _qstream_name(value) in supported:
        found = _qstream_name(value)
    if found is None:
        raise InvalidDTypeError(
            f"unsupported {what} {value!r}; expected one of: {', '.join(native)}"
            f" (or qstream's names: {', '.join(supported)})"
        )
    return found


def _is_dtype_like(value: object) -> bool:
    """A NumPy dtype, a scalar type, or anything ``np.dtype`` turns into a dtype qstream
    knows (ml_dtypes types included)."""
    return isinstance(value, (np.dtype, type)) or _qstream_name(value) is not None
