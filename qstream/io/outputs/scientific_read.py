"""Reading outputs with float offsets or in the codec layout (see :mod:`qstream.core.offsets`
and :mod:`qstream.io.outputs.codec`)."""

from __future__ import annotations

import numpy as np

from ...core import plan_layout


def dequantize_scientific(arr, key, q, dtype, out) -> np.ndarray:
    """:meth:`QuantizedArray.dequantize_region` of a float-offset or codec-layout output
    (per tensor or per axis): the codec's own decode for the codec layout, else
    ``q * scale + offset`` in float64 (:func:`~qstream.core.offsets.offset_dequantize`)."""
    from ...core import codec_decode, offset_dequantize

    dtype = np.dtype(dtype)
    if arr.codec is not None:
        y = codec_decode(q.astype(arr.qtype.widened), *arr.codec)
        if out is None:
            return y.astype(dtype, copy=False)
        out[...] = y
        return out
    if arr.axis is None:
        s, o = arr.scale.reshape(()), arr.offset.reshape(())
        layout = plan_layout(q.shape, (), None, None)
    else:
        k = arr.axis
        sl = slice(key[k].start, key[k].stop)
        s, o = arr.scale[sl], arr.offset[sl]
        layout = plan_layout(q.shape, s.shape, k, None)
    return offset_dequantize(q.astype(arr.qtype.widened, copy=False), s, o, layout, dtype, out=out)
