"""A compressed-tensors preset's arithmetic on rows of one weight: the tensors its compressor
writes for a module (``weight`` / ``weight_packed``, ``weight_scale``, ``weight_zero_point``,
``weight_shape``, ``weight_global_scale``), computed as compressed-tensors 0.20's
``calculate_qparams`` + ``quantize`` (after llm-compressor's min-max observer) compute them.

Float presets go through :mod:`qstream.core.float_formats` / :mod:`qstream.core.nvfp4`. The
int presets (``W4A16``, ``W8A16``, ``W4A16_ASYM``, groups of 128 along ``in``) are computed
here, each step in the weight's dtype (a bfloat16 step is a float32 one rounded to bfloat16,
as PyTorch does on CPU): symmetric ``scale = absmax / ((2**bits - 1) / 2)``; asymmetric
``scale = (max(mx, 0) - min(mn, 0)) / (2**bits - 1)`` and ``zp = round(clamp(-2**(bits-1) -
mn / scale))``; a zero scale becomes the dtype's epsilon; ``q = round(clamp(w / scale + zp))``
(to nearest even). Codes are packed into int32 words (``pack-quantized``), the zero point
along the output axis; scales are stored in the weight's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ..core import float_formats as ff
from ..core import nvfp4 as nv
from ..core.presets import Preset
from ..errors import InvalidParameterError
from . import compressed_tensors as ct

TAGS = {np.dtype(np.float32): "F32", ff.BF16: "BF16"}


@dataclass(frozen=True)
class Param:
    """One tensor a quantized module is written as: its suffix (after the module's name),
    safetensors tag, shape and how many weight rows make one of its rows (0: not by rows)."""

    suffix: str
    tag: str
    shape: tuple[int, ...]
    rows_per: int


def row_align(preset: Preset) -> int:
    """Weight rows a slab of ``preset``'s arithmetic must start on (128 for 128x128 blocks, 8
    for a zero point packed along the output axis, else 1)."""
    w = preset.weights
    assert w is not None
    if w.strategy == "block":
        return int((w.block_structure or (128, 128))[0])
    return 8 if not w.symmetric else 1


def params(preset: Preset, shape: tuple[int, int], dtype: np.dtype) -> list[Param]:
    """The tensors compressed-tensors writes for a ``[out, in]`` weight under ``preset``."""
    w = preset.weights
    assert w is not None
    out, cols = shape
    scale_tag = TAGS[np.dtype(dtype)]
    fmt = preset.float_format
    if fmt == "fp8":
        gran = {"tensor": "tensor", "channel": "channel", "block": "block"}[w.strategy]
        sshape = ff.fp8_scale_shape(shape, gran, w.block_structure or (128, 128))
        per = int((w.block_structure or (128, 128))[0]) if gran == "block" else 1
        return [
            Param("weight", "F8_E4M3", shape, 1),
            Param("weight_scale", scale_tag, sshape, per if gran != "tensor" else 0),
        ]
    if fmt == "nvfp4":
        return [
            Param("weight_packed", "U8", (out, cols // 2), 1),
            Param("weight_scale", "F8_E4M3", (out, cols // nv.NVFP4_GROUP), 1),
            Param("weight_global_scale", "F32", (1,), 0),
        ]
    if fmt in ("mxfp4", "mxfp8"):
        codes = Param("weight_packed", "U8", (out, cols // 2), 1)
        if fmt == "mxfp8":
            codes = Param("weight", "F8_E4M3", shape, 1)
        return [codes, Param("weight_scale", "U8", (out, cols // ff.MX_GROUP), 1)]
    group = int(w.group_size or cols)
    found = [
        Param("weight_packed", "I32", (out, -(-cols * w.num_bits // 32)), 1),
        Param("weight_scale", scale_tag, (out, cols // group), 1),
        Param("weight_shape", "I64", (2,), 0),
    ]
    if not w.symmetric:
        found.append(
            Param("weight_zero_point", "I32", (-(-out * w.num_bits // 32), cols // group), 8)
        )
    return found


def quantize_rows(
    preset: Preset, rows: np.ndarray, shape: tuple[int, int], amax: float | None = None
) -> dict[str, np.ndarray]:
    """The tensors of :func:`params` for a slab of weight rows (float32 or bfloat16; a slab
    starts on :func:`row_align`); ``amax``: the whole weight's largest magnitude (NVFP4's
    global scale)."""
    w = preset.weights
    assert w is not None
    fmt = preset.float_format
    if fmt == "fp8":
        gran = w.strategy
        codes, scale = ff.fp8_quantize(rows, gran, w.block_structure or (128, 128))
        return {"weight": codes.view(ml_dtypes.float8_e4m3fn), "weight_scale": scale}
    if fmt == "nvfp4":
        # one more row holding the weight's largest magnitude makes the global scale the
        # whole weight's (rows are quantized independently otherwise)
        extra = np.zeros((1, rows.shape[1]), rows.dtype)
        extra[0, 0] = amax
        packed, scale, gs = nv.nvfp4_quantize(np.concatenate([rows, extra]))
        return {"weight_packed": packed[:-1], "weight_scale": scale[:-1], "weight_global_scale": gs}
    if fmt in ("mxfp4", "mxfp8"):
        codes, scales = ff.mx_quantize(rows, fmt)
        key = "weight_packed" if fmt == "mxfp4" else "weight"
        if fmt == "mxfp8":
            codes = codes.view(ml_dtypes.float8_e4m3fn)
        return {key: codes, "weight_scale": scales}
    return int_rows(rows, w.num_bits, int(w.group_size or rows.shape[1]), w.symmetric, shape)


def int_rows(
    rows: np.ndarray, bits: int, group: int, symmetric: bool, shape: tuple[int, int]
) -> dict[str, np.ndarray]:
    """``pack-quantized`` tensors of int weights in groups along ``in`` (module docstring)."""
    x, dtype = ff.source_values(rows, "int quantization")
    n, cols = x.shape
    g = x.reshape(n, cols // group, group)
    q_min, q_max = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    levels = np.float32((1 << bits) - 1)
    zp = None
    with np.errstate(invalid="ignore", divide="ignore"):
        if symmetric:
            scale = ff.divide(np.abs(g).max(axis=-1), levels / np.float32(2), dtype)
        else:
            mn = np.minimum(g.min(axis=-1), np.float32(0))
            mx = np.maximum(g.max(axis=-1), np.float32(0))
            scale = ff.divide(ff.round_to(mx - mn, dtype), levels, dtype)
            zf = ff.round_to(np.float32(q_min) - ff.divide(mn, scale, dtype), dtype)
            zp = np.round(np.clip(zf, q_min, q_max)).astype(np.float32)
        eps = np.float32(ml_dtypes.finfo(dtype).eps)
        scale = np.where(scale == 0, eps, scale).astype(np.float32)
        scaled = ff.divide(g, scale[..., None], dtype)
        if zp is not None:
            scaled = ff.round_to(scaled + zp[..., None], dtype)
    q = np.round(np.clip(scaled, q_min, q_max)).astype(np.int8).reshape(n, cols)
    found = {
        "weight_packed": ct.pack_rows(q, bits),
        "weight_scale": scale.astype(dtype),
        "weight_shape": np.array(shape, np.int64),
    }
    if zp is not None:
        found["weight_zero_point"] = ct.pack_columns(zp.astype(np.int8), bits)
    return found


def check_weight(preset: Preset, name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """Refuse a weight ``preset`` cannot write (before any byte is read), naming why."""
    w = preset.weights
    assert w is not None
    if np.dtype(dtype) not in TAGS:
        raise InvalidParameterError(
            f"{name}: {np.dtype(dtype).name} weights; --scheme {preset.name} computes"
            " compressed-tensors' arithmetic for float32 and bfloat16 sources only"
        )
    if len(shape) != 2:
        raise InvalidParameterError(f"{name}: a {len(shape)}-D weight (2-D Linear weights)")
    group = w.group_size if w.strategy in ("group", "tensor_group") else None
    if group and shape[1] % group:
        raise InvalidParameterError(
            f"{name}: {shape[1]} columns are not divisible by {preset.name}'s group size"
            f" {group} (compressed-tensors refuses such a weight)"
        )
    if w.type == "int" and w.num_bits not in (4, 8):
        raise InvalidParameterError(
            f"{preset.name}: {w.num_bits}-bit int weights are not written by qstream"
            " (W4A16, W4A16_ASYM and W8A16 are)"
        )
