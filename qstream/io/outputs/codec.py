"""The codec layout: ``data`` as one Zarr v3 array that decodes itself to floats.

A per-tensor output written with ``layout="codec"`` stores the same integer codes (the same
chunk bytes) as the default layout, but ``data``'s metadata declares a float32 array with the
filters ``scale_offset`` and ``cast_value`` (zarr-extensions; zarr-python >= 3.2 with
``cast-value-rs``) in front of its byte codecs, so any Zarr v3 reader that knows them (zarr,
xarray, no qstream) reads floats. Decode: ``cast_value`` turns the codes into float32, then
``scale_offset`` computes ``x / scale + offset`` in float32, with ``scale = float32(1 /
s)``; a zero point (integer specs) is a second ``scale_offset`` that subtracts it first (exact).
``nan_policy="fill"`` maps the reserved code to NaN (``scalar_map``).

qstream writes the codes through a plain integer array and swaps ``data/zarr.json`` to the
codec form when the job finishes (a resumed run swaps it back first); qstream's own readers
read the codes through the plain form and decode them with the codec's arithmetic
(:func:`qstream.core.offsets.codec_decode`), so ``qstream.dequantize``, ``open_quantized`` and
zarr give the same floats. Zarr's own arithmetic divides, so these floats can differ from the
default layout's (a multiply) by one float32 rounding (<= 1 ulp).

The codec array is read-only in spirit: writing floats through zarr re-quantizes with zarr's
rule, not qstream's.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InvalidParameterError, StoreError
from ...paths import local_path
from ...qtypes import QType

if TYPE_CHECKING:
    from ...spec import QuantSpec

LAYOUTS = ("group", "codec")
_CODEC_NAMES = ("scale_offset", "cast_value")


def unavailable() -> str | None:
    """Why this zarr cannot write or read the codec layout (None: it can)."""
    import zarr
    from zarr import codecs

    if not hasattr(codecs, "ScaleOffset") or not hasattr(codecs, "CastValue"):
        return (
            f"layout 'codec' needs zarr >= 3.2 (its scale_offset and cast_value codecs; zarr"
            f" >= 3.2 needs Python >= 3.12), this is zarr {zarr.__version__}: pip install"
            " 'qstream-zarr[codec]' on Python >= 3.12 (zarr >= 3.2 and cast-value-rs), or use"
            " the default layout, which xarray decodes through CF attributes"
        )
    try:
        import cast_value_rs  # noqa: F401
    except ImportError:
        return (
            "layout 'codec' needs the cast-value-rs package for zarr's cast_value codec:"
            " pip install 'qstream-zarr[codec]'"
        )
    return None


def check_layout(layout: str, spec: QuantSpec, qt: QType) -> str:
    """``layout`` checked against ``spec`` and this zarr (refusals before any work)."""
    if layout not in LAYOUTS:
        raise InvalidParameterError(
            f"unknown layout {layout!r}; expected one of: {', '.join(LAYOUTS)}"
        )
    if layout == "group":
        return layout
    if spec.axis is not None:
        raise InvalidParameterError(
            "layout 'codec' is per tensor only (zarr's scale_offset takes one scale and one"
            " offset); per-axis outputs decode through qstream.open_xarray"
        )
    if qt.is_float or qt.bits not in (8, 16):
        raise InvalidParameterError(
            f"layout 'codec' stores 8- or 16-bit integer codes, not {qt.name}"
        )
    why = unavailable()
    if why:
        raise InvalidParameterError(why)
    return layout


def codec_document(
    raw: dict[str, Any], qt: QType, c: float, zp: float, o: float, fill: bool
) -> dict[str, Any]:
    """``data``'s metadata document in the codec form, from its plain (integer) form
    ``raw``."""
    from ...core import codec_decode

    code = np.dtype(qt.widened).name
    main: dict[str, Any] = {"scale": c}
    if o != 0.0:
        main["offset"] = o
    filters: list[dict[str, Any]] = [{"name": "scale_offset", "configuration": main}]
    if zp != 0.0:
        filters.append({"name": "scale_offset", "configuration": {"offset": -zp}})
    cast: dict[str, Any] = {"data_type": code, "rounding": "nearest-even", "out_of_range": "clamp"}
    fill_value: str | float
    if fill:
        q = int(qt.qmin)
        cast["scalar_map"] = {"encode": [["NaN", q]], "decode": [[q, "NaN"]]}
        fill_value = "NaN"
    else:  # what a chunk of code 0 (the plain array's fill value) decodes to
        fill_value = float(codec_decode(np.zeros((), qt.widened), c, zp, o))
    filters.append({"name": "cast_value", "configuration": cast})
    doc = dict(raw)
    doc["data_type"] = "float32"
    doc["fill_value"] = fill_value
    doc["codecs"] = [*filters, *raw["codecs"]]
    attrs = dict(doc.get("attributes") or {})
    attrs["qstream_codec"] = {"read_only": True, "plain_data_type": code}
    doc["attributes"] = attrs
    return doc


def plain_document(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The plain (integer) form of a codec-form ``data`` document; None if it is plain."""
    codecs = doc.get("codecs") or []
    names = [c.get("name") if isinstance(c, dict) else c for c in codecs]
    if not any(n in _CODEC_NAMES for n in names):
        return None
    cast = next(c for c in codecs if isinstance(c, dict) and c.get("name") == "cast_value")
    out = dict(doc)
    out["data_type"] = cast["configuration"]["data_type"]
    out["fill_value"] = 0
    out["codecs"] = [c for c, n in zip(codecs, names, strict=True) if n not in _CODEC_NAMES]
    attrs = dict(doc.get("attributes") or {})
    attrs.pop("qstream_codec", None)
    out["attributes"] = attrs
    return out


def _key(group: Any, name: str) -> str:
    prefix = group.store_path.path
    return f"{prefix}/{name}/zarr.json" if prefix else f"{name}/zarr.json"


def read_doc(group: Any, name: str = "data") -> dict[str, Any]:
    """The metadata document of the member ``name`` of the zarr group ``group``."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    raw = sync(group.store_path.store.get(_key(group, name), default_buffer_prototype()))
    if raw is None:
        raise KeyError(name)
    doc: dict[str, Any] = json.loads(raw.to_bytes())
    return doc


def write_doc(group: Any, dst: object, doc: dict[str, Any], name: str = "data") -> None:
    """Replace the member's document in one write (local: a renamed file)."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    body = json.dumps(doc, indent=2, allow_nan=False).encode()
    local = local_path(dst)
    try:
        if local is not None:
            path = os.path.join(local, name, "zarr.json")
            tmp = f"{path}.qstream-codec.partial"
            with open(tmp, "wb") as f:
                f.write(body)
            os.replace(tmp, path)
            return
        buf = default_buffer_prototype().buffer.from_bytes(body)
        sync(group.store_path.store.set(_key(group, name), buf))
    except OSError as e:
        raise StoreError(f"cannot write {dst}: {e}") from None


def to_codec(group: Any, dst: object, qt: QType, c: float, zp: float, o: float, fill: bool) -> None:
    """Swap ``data``'s document to the codec form (the chunks stay as they are)."""
    doc = read_doc(group)
    if plain_document(doc) is None:
        write_doc(group, dst, codec_document(doc, qt, c, zp, o, fill))


def to_plain(group: Any, dst: object) -> None:
    """Swap ``data``'s document back to its plain form (a resumed run writes codes)."""
    try:
        doc = read_doc(group)
    except KeyError:
        return
    plain = plain_document(doc)
    if plain is not None:
        write_doc(group, dst, plain)


def open_plain(group: Any) -> Any:
    """``data`` of a codec-layout output as its plain integer array (a ``zarr.Array`` over
    the same chunks)."""
    import zarr
    from zarr.core.array import AsyncArray
    from zarr.core.metadata.v3 import ArrayV3Metadata

    doc = read_doc(group)
    plain = plain_document(doc) or doc
    meta = ArrayV3Metadata.from_dict(plain)
    prefix = group.store_path.path
    path = f"{prefix}/data" if prefix else "data"
    return zarr.Array(AsyncArray(meta, zarr.storage.StorePath(group.store_path.store, path)))


def constants(meta_codec: dict[str, Any]) -> tuple[float, float, float]:
    """``(c, zp, o)`` recorded in an output's ``qstream`` metadata (``codec`` entry)."""
    return float(meta_codec["scale"]), float(meta_codec["zero_point"]), float(meta_codec["offset"])
