"""Reading quantized arrays lazily: ``open_quantized(path)[0:128]`` reads and dequantizes only
that slab (see ``qstream.api.stores`` for the on-disk layout)."""

from __future__ import annotations

import numpy as np

from ..errors import StoreError
from ..io.stores import open_group
from ..layout import param_region, plan_layout
from ..qtypes import qtype
from ..spec import QuantSpec
from .arrays import affine_dequantize


def open_quantized(
    path, *, allow_incomplete: bool = False, storage_options: dict | None = None
) -> QuantizedArray:
    """Open a quantized group lazily; ``arr[0:128]`` reads and dequantizes only that slab."""
    group = open_group(path, mode="r", storage_options=storage_options)
    meta = group.attrs.get("qstream")
    if not meta:
        raise StoreError(f"{path} is not a qstream quantized array (no 'qstream' attributes)")
    if not meta.get("complete") and not allow_incomplete:
        raise StoreError(
            f"{path} is incomplete (an interrupted or failed job); re-run the job to resume it,"
            " or pass allow_incomplete=True to read it anyway"
        )
    return QuantizedArray(group, meta)


class QuantizedArray:
    """A quantized array on disk, dequantized on indexing (float32)."""

    def __init__(self, group, meta: dict):
        self.group = group
        self.meta = meta
        self.data = group["data"]
        self.spec = QuantSpec.from_dict(meta["spec"])
        self.qtype = qtype(self.spec.dtype)
        self.scale = np.asarray(group["scale"][...], np.float32)
        self.zero_point = np.asarray(group["zero_point"][...])
        self.axis = meta.get("axis")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def report(self) -> dict:
        return {k: self.meta.get(k) for k in ("source", "calibration", "error", "report")}

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return (
            f"QuantizedArray(shape={self.shape}, dtype={self.spec.dtype},"
            f" granularity={self.spec.granularity})"
        )

    def summary(self) -> dict:
        """Spec, parameter summary, calibration and error report (JSON-ready)."""

        def stats(a):
            a = np.asarray(a, np.float64).reshape(-1)
            return {
                "shape": list(np.shape(a)),
                "min": float(a.min()) if a.size else 0.0,
                "max": float(a.max()) if a.size else 0.0,
            }

        return {
            "shape": list(self.shape),
            "dtype": self.spec.dtype,
            "granularity": self.spec.granularity,
            "axis": self.axis,
            "block_size": self.spec.block_size,
            "method": self.spec.method if self.spec.scale is None else "explicit",
            "symmetric": self.spec.symmetric,
            "round_mode": self.spec.round_mode,
            "complete": bool(self.meta.get("complete")),
            "scale": {**stats(self.scale), "shape": list(self.scale.shape)},
            "zero_point": {**stats(self.zero_point), "shape": list(self.zero_point.shape)},
            "calibration": self.meta.get("calibration"),
            "error": self.meta.get("error"),
            "source": self.meta.get("source"),
        }

    def quantized(self, key=...) -> np.ndarray:
        """The stored values of ``key`` as the quantized dtype (ml_dtypes for sub-byte/float)."""
        raw = np.asarray(self.data[key])
        return raw.view(self.qtype.dtype) if raw.dtype != self.qtype.dtype else raw

    def __array__(self, dtype=None, copy=None):
        y = self[...]
        return y if dtype is None else y.astype(dtype)

    def __getitem__(self, key) -> np.ndarray:
        key, squeeze = _normalize_key(key, self.shape)
        y = self.dequantize_region(key, self.quantized(key))
        return y.reshape([d for d, sq in zip(y.shape, squeeze, strict=True) if not sq])

    def dequantize_region(self, key, q, dtype=np.float32, out=None) -> np.ndarray:
        """Dequantize ``q``, the stored values of the region ``key`` (a tuple of step-1
        slices), with the parameters that region uses; ``out`` optionally receives it."""
        q = q.view(self.qtype.dtype) if q.dtype != self.qtype.dtype else q
        if self.axis is None:
            s, z = self.scale.reshape(()), self.zero_point.reshape(()).astype(np.float64)
            layout = plan_layout(q.shape, (), None, None)
        else:
            bs = self.spec.block_size
            k = self.axis
            if bs and key[k].start % bs == 0:  # the region starts on a parameter block
                pk = param_region(key, k, bs)
                s, z = self.scale[pk], self.zero_point[pk].astype(np.float64)
                layout = plan_layout(q.shape, s.shape, k, bs)
            elif bs:  # an arbitrary slice: the parameters element by element (slow path)
                idx = np.arange(key[k].start, key[k].stop)
                pk = tuple(slice(None) if d == k else key[d] for d in range(self.ndim))
                s = np.take(self.scale[pk], idx // bs, axis=k)
                z = np.take(self.zero_point[pk], idx // bs, axis=k)
                y = (q.astype(np.float32) - z.astype(np.float32)) * s
                if out is None:
                    return y.astype(dtype, copy=False)
                out[...] = y
                return out
            else:
                idx = slice(key[k].start, key[k].stop)
                s, z = self.scale[idx], self.zero_point[idx].astype(np.float64)
                layout = plan_layout(q.shape, s.shape, k, None)
        return affine_dequantize(q, s, z, layout, self.qtype, np.dtype(dtype), out=out)


def _normalize_key(key, shape):
    """Basic indexing (ints, slices with step 1, Ellipsis) as full slices + dims to squeeze."""
    if not isinstance(key, tuple):
        key = (key,)
    if Ellipsis in key:
        i = key.index(Ellipsis)
        key = key[:i] + (slice(None),) * (len(shape) - len(key) + 1) + key[i + 1 :]
    key = key + (slice(None),) * (len(shape) - len(key))
    if len(key) != len(shape):
        raise IndexError(f"too many indices for an array of rank {len(shape)}")
    out, squeeze = [], []
    for k, d in zip(key, shape, strict=True):
        if isinstance(k, (int, np.integer)):
            k = int(k) + (d if k < 0 else 0)
            if not 0 <= k < d:
                raise IndexError(f"index {k} is out of bounds for size {d}")
            out.append(slice(k, k + 1))
            squeeze.append(True)
        elif isinstance(k, slice):
            start, stop, step = k.indices(d)
            if step != 1:
                raise IndexError("only step-1 slices are supported")
            out.append(slice(start, max(start, stop)))
            squeeze.append(False)
        else:
            raise IndexError(f"unsupported index {k!r}")
    return tuple(out), squeeze
