"""qstream's own safetensors exports read back: each quantized tensor as its dequantized
float32 values, computed from the exported codes and parameters exactly as
``qstream.dequantize`` computes them from the output they came from (``(q - zero_point) *
scale`` in float32; float types ``q * scale``), read by slabs of rows.

Both layouts are read: ``qstream`` (``N``, ``N_scale``, ``N_zero_point``) and
``compressed-tensors`` (``M.weight`` or ``M.weight_packed`` + ``M.weight_shape``,
``M.weight_scale``, ``M.weight_zero_point``). The parameter tensors are consumed; kept tensors
read as stored. This is what ``open_quantized``, ``dequantize`` and ``convert`` see when given
a file (or index) qstream exported.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...core import expand_key
from ...errors import StoreError
from ...qtypes import qtype
from .export_meta import export_metadata
from .tensor import Shaped, TensorLike


def exported_format(meta: dict[str, Any] | None) -> str | None:
    """The layout a safetensors file's ``__metadata__`` says qstream exported, or None."""
    if not isinstance(meta, dict) or not isinstance(meta.get("qstream"), str):
        return None
    fmt = meta.get("qstream_format", "qstream")  # exports before the option: qstream's layout
    return fmt if fmt in ("qstream", "compressed-tensors") else None


def dequantizing(
    path: str, tensors: Mapping[str, TensorLike], meta: dict[str, Any]
) -> dict[str, TensorLike]:
    """``tensors`` (a qstream export's, as stored) with each quantized tensor replaced by a
    :class:`DequantizedTensor` and its parameter tensors consumed, in the file's order."""
    fmt = exported_format(meta)
    if fmt is None:
        raise StoreError(f"{path}: not a qstream export")
    try:
        described = json.loads(meta["qstream"])
    except (ValueError, TypeError):
        raise StoreError(f"{path}: its qstream metadata is not JSON") from None
    if not isinstance(described, dict):
        raise StoreError(f"{path}: its qstream metadata is not a table of tensors")
    parts: dict[str, dict[str, Any]] = {}
    for name, d in described.items():
        if not isinstance(d, dict):
            raise StoreError(f"{path}: bad qstream metadata for {name!r}")
        if fmt == "qstream":
            names: dict[str, str | None] = {
                "codes": name,
                "scale": f"{name}_scale",
                "zp": f"{name}_zero_point",
            }
        else:
            m = name[: -len("weight")]
            packed = f"{m}weight_packed" in tensors
            names = {
                "codes": f"{m}weight_packed" if packed else f"{m}weight",
                "shape": f"{m}weight_shape" if packed else None,
                "scale": f"{m}weight_scale",
                "zp": f"{m}weight_zero_point",
            }
        found = {k: tensors.get(v) for k, v in names.items() if v is not None}
        if found["codes"] is None or found["scale"] is None:
            raise StoreError(f"{path}: the export lacks the codes or scale of {name!r}")
        parts[name] = {"names": names, **found, **d}
    consumed = {v for p in parts.values() for v in p["names"].values() if v}
    owners = {p["names"]["codes"]: q for q, p in parts.items()}  # (one lookup per tensor)
    out: dict[str, TensorLike] = {}
    for n, t in tensors.items():
        owner = owners.get(n)
        if owner is not None:
            out[owner] = DequantizedTensor(owner, fmt, parts[owner])
        elif n not in consumed:
            out[n] = t
    return out


class DequantizedTensor(Shaped):
    """An exported quantized tensor read as float32 values (see the module docstring)."""

    def __init__(self, name: str, fmt: str, part: dict[str, Any]) -> None:
        self.name, self.fmt = name, fmt
        self.codes, self.scale_t, self.zp_t = part["codes"], part["scale"], part.get("zp")
        self.axis, self.block = part.get("axis"), part.get("block_size")
        try:
            self.qtype = qtype(str(part.get("dtype", "int8")))
        except Exception:
            raise StoreError(
                f"{name}: the export names an unknown type {part.get('dtype')!r}"
            ) from None
        self.is_float = self.qtype.is_float
        if part.get("shape") is not None:  # pack-quantized: the logical shape is stored
            self.shape = tuple(int(v) for v in np.asarray(part["shape"][...]).reshape(-1))
        else:
            self.shape = tuple(self.codes.shape)
        self.dtype = np.dtype(np.float32)
        self.chunks = None
        self._params: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def nbytes(self) -> int:
        """The bytes of its float32 values."""
        return self.size * 4

    def __repr__(self) -> str:
        return f"DequantizedTensor({self.name!r}, shape={list(self.shape)}, {self.fmt})"

    def _parameters(self) -> tuple[np.ndarray, np.ndarray]:
        if self._params is None:
            s = np.asarray(self.scale_t[...], np.float32)
            if self.zp_t is None:
                z = np.zeros(1, np.float32)
            else:
                z = np.asarray(self.zp_t[...])
                if self.fmt == "compressed-tensors" and z.dtype == np.int32:  # packed on dim 0
                    z = _unpack(z.T, self.shape[0]).T
                z = z.astype(np.float32)
            self._params = (s, z)
        return self._params

    def _rows(self, r0: int, r1: int) -> np.ndarray:
        if self.fmt == "compressed-tensors" and self.codes.dtype == np.int32:
            return _unpack(np.asarray(self.codes[r0:r1]), self.shape[1]).astype(np.float32)
        q = np.asarray(self.codes[r0:r1] if self.codes.ndim else self.codes[...])
        if self.is_float and q.dtype == np.uint8:  # other float types: their bit patterns
            q = q.view(self.qtype.dtype)
        return q.astype(np.float32)

    def __getitem__(self, key: Any) -> np.ndarray:
        full = expand_key(key, self.shape)
        if not self.shape:
            r0, r1 = 0, 1
        else:
            k0 = full[0]
            r0, r1, _ = k0.indices(self.shape[0]) if isinstance(k0, slice) else (k0, k0 + 1, 1)
        x = self._values(r0, r1)
        if not self.shape:
            return x.reshape(())
        first = full[0]
        local = (
            slice(0, r1 - r0, first.step) if isinstance(first, slice) else 0,
            *full[1:],
        )
        return np.ascontiguousarray(x[local])

    def _values(self, r0: int, r1: int) -> np.ndarray:
        """Rows ``r0:r1`` (along axis 0) dequantized, with the parameters each element uses
        (per tensor, per axis, or blocks of ``block_size`` along ``axis``)."""
        q = self._rows(r0, r1).reshape((r1 - r0, *self.shape[1:]) if self.shape else (1,))
        s, z = self._parameters()
        if self.axis is not None and s.size > 1:
            a = self.axis % len(self.shape)
            n = self.shape[a]
            if self.block:  # the data's shape with ceil(n / block) along the axis
                pshape = list(self.shape)
                pshape[a] = -(-n // self.block)
            else:  # one per index along the axis, broadcast over the others
                pshape = [1] * len(self.shape)
                pshape[a] = n
            s = s.reshape(pshape)
            z = z.reshape(pshape) if z.size > 1 else np.zeros(pshape, np.float32)
            if a != 0 and self.block:  # this slab's rows first (a row has its own groups)
                s, z = s[r0:r1], z[r0:r1]
            idx = np.arange(r0, r1) if a == 0 else np.arange(n)
            if self.block:
                idx = idx // self.block
            s, z = np.take(s, idx, axis=a), np.take(z, idx, axis=a)
        else:
            s, z = s.reshape(-1)[0], z.reshape(-1)[0]
        if self.is_float:
            return (q * s).astype(np.float32)
        return ((q - z) * s).astype(np.float32)


def _unpack(words: np.ndarray, n: int, bits: int = 4) -> np.ndarray:
    """int32 words of ``2**(bits-1)``-offset codes packed from the low bits -> ``[R, n]`` signed
    codes (compressed-tensors' packing)."""
    per = 32 // bits
    w = np.ascontiguousarray(words).view(np.uint32).astype(np.int64)
    vals = (w[..., None] >> (bits * np.arange(per))) & ((1 << bits) - 1)
    return (vals.reshape(*w.shape[:-1], -1)[..., :n] - (1 << (bits - 1))).astype(np.int16)


def maybe_dequantizing(path: str, tensors: Mapping[str, TensorLike]) -> dict[str, TensorLike]:
    """``tensors`` of the safetensors file or index ``path``, read through
    :func:`dequantizing` when qstream exported it (its metadata says so), else as they are."""
    meta = export_metadata(path)
    if meta is None:
        return dict(tensors)
    if path.endswith(".json"):  # an index: the tensors' description is in its shards
        files = {f[0] for t in tensors.values() if (f := getattr(t, "file", None))}
        meta = export_metadata(sorted(files)[0]) if files else None
    if meta is None or exported_format(meta) is None:
        return dict(tensors)
    return dequantizing(path, tensors, meta)
