"""Checkpoints quantized already: how each tensor is read, decided before any is read.

A source's ``config.json`` ``quantization_config`` and its tensor-name layout decide it
(:func:`read_quantized`): compressed-tensors checkpoints (``float-quantized`` FP8 per tensor,
channel and block; ``int-quantized`` / ``naive-quantized``; ``pack-quantized`` int1..8 with or
without zero points; ``nvfp4-pack-quantized``; ``mxfp4-pack-quantized``; ``mxfp8-quantized``)
read as the values compressed-tensors 0.20's decompressors give, bit for bit, in their dtype
(the scale's; bfloat16 for NVFP4 and MX), row by row. Activation parameters (``input_scale``
and friends) stay plain tensors. DeepSeek's ``fp8`` block scales are paired later
(:mod:`qstream.io.checkpoints.fp8`). Every other quantized layout (GPTQ, AWQ, bitsandbytes,
a compressed-tensors format not listed) is refused by name, as are scales of
the wrong shape or dtype, non-finite, zero or negative scales and half pairs: the scales are
read here (they are small), the weights only when asked. gpt-oss's ``mxfp4`` experts are read
by :mod:`qstream.io.checkpoints.gpt_oss_mxfp4`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from ...errors import InvalidParameterError, QStreamError, StoreError
from ...spec import ACTIVATION_PARAMS
from .dtypes import BF16
from .tensor import RowDecoded, TensorLike


class LayoutRefused(StoreError, InvalidParameterError):
    """A quantized layout refused before any of its tensors is read: a
    :class:`~qstream.errors.StoreError` (what opening a checkpoint raises) and an invalid
    input (the command line's exit 2)."""


F32 = np.dtype(np.float32)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
_FLOAT_SCALES = (F32, BF16, np.dtype(np.float16))
# compressed-tensors formats read here -> (the weight's companion tensors' suffixes)
CT_FORMATS = (
    "float-quantized",
    "int-quantized",
    "naive-quantized",
    "pack-quantized",
    "nvfp4-pack-quantized",
    "mxfp4-pack-quantized",
    "mxfp8-quantized",
)
_PARAMS = (
    "weight_scale",
    "weight_zero_point",
    "weight_global_scale",
    "weight_shape",
    "weight_g_idx",
)
# activation / attention parameters: plain tensors, never weights to decode nor to quantize
ACTIVATION_SUFFIXES = ACTIVATION_PARAMS


def is_activation_param(name: str) -> bool:
    """Whether ``name`` is an activation / attention parameter of a quantized checkpoint
    (``input_scale``, ``k_scale``, ...): a plain tensor, no weight, left out of decoded models."""
    return name.rpartition(".")[2] in ACTIVATION_SUFFIXES


# layouts of other libraries, recognised by name: (suffix, the format it marks)
FOREIGN = (
    (".qweight", "GPTQ/AWQ packed int4 (qweight/qzeros/scales)"),
    (".qzeros", "GPTQ/AWQ packed int4 (qweight/qzeros/scales)"),
    (".g_idx", "GPTQ act-order (g_idx)"),
    ("_blocks", "gpt-oss MXFP4 (*_blocks + *_scales)"),
    (".weight_packed", "compressed-tensors packed weights"),
    (".weight_global_scale", "compressed-tensors NVFP4"),
    (".weight_zero_point", "compressed-tensors zero points"),
    (".weight_shape", "compressed-tensors packed weights"),
    (".SCB", "bitsandbytes int8"),
    (".absmax", "bitsandbytes 4-bit"),
    (".quant_map", "bitsandbytes 4-bit"),
)


def quant_config(doc: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ``quantization_config`` of a model config (None: none, or one qstream exported:
    its own tensors are read by :mod:`qstream.io.checkpoints.exported`)."""
    if not doc or "qstream_export" in doc:
        return None
    qc = doc.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise LayoutRefused("config.json: quantization_config is not an object")
    return qc


def check_quant_config(qc: Mapping[str, Any], where: str) -> None:
    """Refuse a ``quantization_config`` whose method or format is not decoded here."""
    method = qc.get("quant_method")
    if method in ("fp8", "mxfp4"):
        return
    if method != "compressed-tensors":
        raise LayoutRefused(
            f"{where}: quantized with quant_method {method!r}, a layout qstream does not decode"
            " (read: compressed-tensors, DeepSeek fp8, gpt-oss mxfp4); its tensors would be"
            " read as something they are not"
        )
    for fmt in sorted(_formats(qc)):
        if fmt not in (*CT_FORMATS, "dense"):
            raise LayoutRefused(
                f"{where}: compressed-tensors format {fmt!r} is not decoded by qstream (read:"
                f" {', '.join(CT_FORMATS)})"
            )


def _formats(qc: Mapping[str, Any]) -> set[str]:
    groups = qc.get("config_groups") or {}
    top = qc.get("format")
    fmts = {g.get("format") or top for g in groups.values() if isinstance(g, dict)}
    if not groups and top:
        fmts.add(top)
    fmts.discard(None)
    if "mixed-precision" in fmts and len(fmts) > 1:
        fmts.discard("mixed-precision")
    return {str(f) for f in fmts}


def _weight_args(qc: Mapping[str, Any], fmt: str) -> list[dict[str, Any]]:
    """The ``weights`` arguments of the config groups written in ``fmt``."""
    top = qc.get("format")
    out = []
    for g in (qc.get("config_groups") or {}).values():
        if isinstance(g, dict) and (g.get("format") or top) == fmt and g.get("weights"):
            out.append(dict(g["weights"]))
    return out


def read_quantized(
    tensors: Mapping[str, TensorLike], doc: Mapping[str, Any] | None, where: str
) -> dict[str, TensorLike]:
    """``tensors`` as they are to be read, given the model config ``doc`` beside them:
    compressed-tensors weights decoded (their parameters consumed), everything else as is.
    Refuses, before any weight is read, what would otherwise be read wrongly."""
    qc = quant_config(doc)
    if qc is None:
        _refuse_bare_layouts(tensors, where)
        return dict(tensors)
    check_quant_config(qc, where)
    if qc.get("quant_method") == "fp8":
        return dict(tensors)
    if qc.get("quant_method") == "mxfp4":
        from .gpt_oss_mxfp4 import read_gpt_oss

        return read_gpt_oss(tensors, where, LayoutRefused)
    out: dict[str, TensorLike] = {}
    consumed: set[str] = set()
    for name, t in tensors.items():
        base, _, leaf = name.rpartition(".")
        if leaf in ("weight", "weight_packed") and _has_params(tensors, base):
            fmt, declared = _layout(tensors, base, leaf, where), _formats(qc)
            if fmt == "naive-quantized" and fmt not in declared and "int-quantized" in declared:
                fmt = "int-quantized"  # (the same layout)
            if fmt not in declared:
                raise LayoutRefused(
                    f"{where}: {name!r} is stored as {fmt}, which the quantization_config does"
                    f" not declare (formats {sorted(_formats(qc))})"
                )
            out[name.removesuffix("_packed")] = _decoder(tensors, base, fmt, qc, where)
            consumed |= {f"{base}.{p}" for p in _PARAMS}
        elif leaf == "weight_packed" or (leaf == "weight" and np.dtype(t.dtype).itemsize == 1):
            raise LayoutRefused(f"{where}: {name!r} has no weight_scale beside it (half a pair)")
        else:
            out[name] = t
    for name in out:
        if name.rpartition(".")[2] in _PARAMS and name not in consumed:
            raise LayoutRefused(f"{where}: {name!r} belongs to no quantized weight (half a pair)")
    return {n: t for n, t in out.items() if n not in consumed}


def _has_params(tensors: Mapping[str, TensorLike], base: str) -> bool:
    return any(f"{base}.{p}" in tensors for p in _PARAMS[:3])


def _refuse_bare_layouts(tensors: Mapping[str, TensorLike], where: str) -> None:
    """A quantized layout without a quantization_config naming it: refused."""
    for name in tensors:
        for suffix, what in FOREIGN:
            if name.endswith(suffix):
                raise LayoutRefused(
                    f"{where}: tensor {name!r} is {what}, a quantized layout without a"
                    " quantization_config qstream decodes; refused rather than read as plain"
                    " values"
                )
        if name.endswith(".weight_scale") and name[: -len("_scale")] in tensors:
            w = tensors[name[: -len("_scale")]]
            if np.dtype(w.dtype).itemsize == 1:
                raise LayoutRefused(
                    f"{where}: {name[: -len('_scale')]!r} is 8-bit with a weight_scale beside it"
                    " (a compressed-tensors layout) but the checkpoint has no config.json"
                    " quantization_config saying how; refused rather than read without its scale"
                )


def _layout(tensors: Mapping[str, TensorLike], base: str, leaf: str, where: str) -> str:
    """The compressed-tensors format the stored tensors of ``base`` are in."""
    scale = tensors.get(f"{base}.weight_scale")
    if scale is None:
        raise LayoutRefused(f"{where}: {base}.{leaf!r} has no weight_scale beside it (half a pair)")
    w = tensors[f"{base}.{leaf}"]
    wd, sd = np.dtype(w.dtype), np.dtype(scale.dtype)
    if leaf == "weight_packed":
        if f"{base}.weight_global_scale" in tensors:
            return "nvfp4-pack-quantized"
        if wd == np.uint8 and sd == np.uint8:
            return "mxfp4-pack-quantized"
        if wd == np.int32:
            return "pack-quantized"
    elif sd == np.uint8 and wd in (E4M3, np.dtype(np.uint8)):
        return "mxfp8-quantized"
    elif wd == E4M3:
        return "float-quantized"
    elif wd == np.int8:
        return "naive-quantized"
    raise LayoutRefused(
        f"{where}: {base}.{leaf} ({wd.name}) with a {sd.name} weight_scale is not a layout"
        " qstream decodes"
    )


# -- decoders --------------------------------------------------------------------------------


def _decoder(
    tensors: Mapping[str, TensorLike], base: str, fmt: str, qc: Mapping[str, Any], where: str
) -> RowDecoded:
    name = f"{base}.weight"
    at = f"{where}: {name} ({fmt})"
    scale_t = tensors[f"{base}.weight_scale"]
    packed = fmt in ("pack-quantized", "nvfp4-pack-quantized", "mxfp4-pack-quantized")
    w = tensors[name + ("_packed" if packed else "")]
    if len(w.shape) != 2:
        raise LayoutRefused(f"{at}: a {len(w.shape)}-D weight; qstream decodes 2-D ones")
    scale = _read_small(scale_t, at, "weight_scale")
    nbytes = int(w.nbytes) + int(scale_t.nbytes)
    rows = int(w.shape[0])
    try:
        if fmt in ("mxfp4-pack-quantized", "mxfp8-quantized", "nvfp4-pack-quantized"):
            cols = int(w.shape[1]) * (2 if packed else 1)
            return _fp4_mx(tensors, base, fmt, w, scale, (rows, cols), nbytes, at)
        if fmt == "float-quantized":
            return _fp8(name, w, scale, _weight_args(qc, fmt), nbytes, at)
        return _int(tensors, base, fmt, w, scale, _weight_args(qc, fmt), nbytes, at)
    except QStreamError as e:
        if isinstance(e, StoreError):
            raise
        raise LayoutRefused(f"{at}: {e}") from None


def _read_small(t: TensorLike, at: str, what: str) -> np.ndarray:
    """A parameter tensor read whole (scales are small)."""
    return np.asarray(t[...])


def _check_float_scale(s: np.ndarray, at: str, what: str, allow_zero: bool = False) -> None:
    if s.dtype not in _FLOAT_SCALES and s.dtype != E4M3:
        raise LayoutRefused(f"{at}: {what} has dtype {s.dtype.name}, not a float scale")
    f = s.astype(F32)
    if not np.isfinite(f).all():
        raise LayoutRefused(f"{at}: {what} holds NaN or infinite scales")
    if (f < 0).any() or (not allow_zero and (f == 0).any()):
        raise LayoutRefused(f"{at}: {what} holds {'negative' if (f < 0).any() else 'zero'} scales")


def _fp8(
    name: str, w: TensorLike, scale: np.ndarray, args: list[dict[str, Any]], nbytes: int, at: str
) -> RowDecoded:
    from ...core.float_formats import fp8_dequantize

    if scale.dtype not in (F32, BF16):
        raise LayoutRefused(f"{at}: weight_scale has dtype {scale.dtype.name} (float32/bfloat16)")
    _check_float_scale(scale, at, "weight_scale")
    rows, cols = (int(n) for n in w.shape)
    granularity, block = _fp8_strategy(scale.shape, rows, cols, args, at)
    align = block[0] if granularity == "block" else 1

    def decode(r0: int, r1: int) -> np.ndarray:
        if granularity == "tensor":
            s = scale.reshape(1)
        elif granularity == "channel":
            s = scale[r0:r1]
        else:
            s = scale[r0 // block[0] : -(-r1 // block[0])]
        return fp8_dequantize(w[r0:r1], s, granularity, block)

    return RowDecoded(name, (rows, cols), np.dtype(scale.dtype), nbytes, decode, align)


def _fp8_strategy(
    sshape: tuple[int, ...], rows: int, cols: int, args: list[dict[str, Any]], at: str
) -> tuple[str, tuple[int, int]]:
    """(granularity, block) the scale's shape and the config's arguments agree on."""
    for a in args or [{}]:
        strat = a.get("strategy")
        blk = tuple(a.get("block_structure") or (128, 128))
        if strat in (None, "tensor") and math.prod(sshape) == 1:
            return "tensor", (128, 128)
        if strat in (None, "channel") and tuple(sshape) == (rows, 1):
            return "channel", (128, 128)
        want = (-(-rows // blk[0]), -(-cols // blk[1]))
        if strat in (None, "block") and tuple(sshape) == want and len(blk) == 2:
            return "block", (int(blk[0]), int(blk[1]))
    raise LayoutRefused(
        f"{at}: weight_scale of shape {list(sshape)} matches no strategy of the"
        f" quantization_config for a [{rows}, {cols}] weight"
    )


def _fp4_mx(
    tensors: Mapping[str, TensorLike],
    base: str,
    fmt: str,
    w: TensorLike,
    scale: np.ndarray,
    shape: tuple[int, int],
    nbytes: int,
    at: str,
) -> RowDecoded:
    from ...core.float_formats import mx_dequantize
    from ...core.nvfp4 import nvfp4_dequantize

    rows, cols = shape
    group = 16 if fmt.startswith("nvfp4") else 32
    if tuple(scale.shape) != (rows, cols // group) or cols % group:
        raise LayoutRefused(
            f"{at}: weight_scale of shape {list(scale.shape)}, a [{rows}, {cols}] weight in"
            f" groups of {group} needs [{rows}, {cols // group}]"
        )
    if fmt.startswith("nvfp4"):
        if scale.dtype != E4M3:
            raise LayoutRefused(
                f"{at}: weight_scale has dtype {scale.dtype.name}, not float8_e4m3fn"
            )
        _check_float_scale(scale, at, "weight_scale", allow_zero=True)
        gs = _read_small(tensors[f"{base}.weight_global_scale"], at, "weight_global_scale")
        if gs.dtype != F32 or gs.size != 1:
            raise LayoutRefused(
                f"{at}: weight_global_scale must be one float32, got {gs.dtype} {list(gs.shape)}"
            )
        _check_float_scale(gs, at, "weight_global_scale")

        def decode(r0: int, r1: int) -> np.ndarray:
            return nvfp4_dequantize(w[r0:r1], scale[r0:r1], gs)

    else:
        if scale.dtype != np.uint8:
            raise LayoutRefused(f"{at}: weight_scale has dtype {scale.dtype.name}, not uint8 E8M0")
        if (scale == 255).any():
            raise LayoutRefused(f"{at}: weight_scale holds E8M0 NaN (255) scales")
        kind = "mxfp4" if fmt.startswith("mxfp4") else "mxfp8"

        def decode(r0: int, r1: int) -> np.ndarray:
            return mx_dequantize(w[r0:r1], scale[r0:r1], kind)

    return RowDecoded(f"{base}.weight", shape, BF16, nbytes, decode, 1)


def _int(
    tensors: Mapping[str, TensorLike],
    base: str,
    fmt: str,
    w: TensorLike,
    scale: np.ndarray,
    args: list[dict[str, Any]],
    nbytes: int,
    at: str,
) -> RowDecoded:
    """``int-quantized`` (int8 codes) and ``pack-quantized`` (int32 words): ``(q - zp) *
    scale`` in the scale's dtype, as compressed-tensors' ``_dequantize``."""
    if scale.dtype not in _FLOAT_SCALES:
        raise LayoutRefused(f"{at}: weight_scale has dtype {scale.dtype.name}, not a float scale")
    _check_float_scale(scale, at, "weight_scale")
    rows = int(w.shape[0])
    if fmt == "pack-quantized":
        shape_t = tensors.get(f"{base}.weight_shape")
        if shape_t is None:
            raise LayoutRefused(f"{at}: weight_packed has no weight_shape beside it (half a pair)")
        ws = _read_small(shape_t, at, "weight_shape").reshape(-1)
        if ws.size != 2 or ws.dtype.kind not in "iu" or int(ws[0]) != rows or ws[1] < 0:
            raise LayoutRefused(f"{at}: weight_shape {ws.tolist()} does not fit {list(w.shape)}")
        cols = int(ws[1])
        bits = _bits(args, cols, int(w.shape[1]), at)
    else:
        cols, bits = int(w.shape[1]), 8
    sym = all(a.get("symmetric", True) for a in args) if args else True
    zp_t = tensors.get(f"{base}.weight_zero_point")
    zp = None
    groups = scale.shape[-1] if scale.ndim == 2 else 1
    if zp_t is not None:
        zp = _read_small(zp_t, at, "weight_zero_point")
        if fmt == "pack-quantized" and scale.ndim == 2 and scale.shape[0] == rows:
            zp = _unpack(zp.T, bits, rows, at, "weight_zero_point").T
        if tuple(zp.shape) != tuple(scale.shape):
            raise LayoutRefused(
                f"{at}: weight_zero_point {list(zp.shape)} and weight_scale"
                f" {list(scale.shape)} differ"
            )
    elif not sym:
        raise LayoutRefused(f"{at}: asymmetric weights without a weight_zero_point (half a pair)")
    if math.prod(scale.shape) == 1:
        kind = "tensor"
    elif tuple(scale.shape) == (rows, 1):
        kind = "channel"
    elif scale.ndim == 2 and scale.shape[0] == rows and cols % groups == 0:
        kind = "group"
    else:
        raise LayoutRefused(
            f"{at}: weight_scale of shape {list(scale.shape)} fits no strategy of a"
            f" [{rows}, {cols}] weight"
        )
    if f"{base}.weight_g_idx" in tensors:
        raise LayoutRefused(f"{at}: act-order weight_g_idx is not decoded by qstream")
    out_dtype = np.dtype(scale.dtype)

    def decode(r0: int, r1: int) -> np.ndarray:
        raw = np.asarray(w[r0:r1])
        q = _unpack(raw, bits, cols, at, "weight_packed") if fmt == "pack-quantized" else raw
        v = q.astype(F32)
        if kind == "tensor":
            s = scale.astype(F32).reshape(1, 1)
            z = None if zp is None else zp.astype(F32).reshape(1, 1)
        else:
            s = scale[r0:r1].astype(F32)
            z = None if zp is None else zp[r0:r1].astype(F32)
            if kind == "group":
                s = np.repeat(s, cols // groups, axis=1)
                z = None if z is None else np.repeat(z, cols // groups, axis=1)
        if z is not None:
            v = _round(v - _round(z, out_dtype), out_dtype)
        return _round(v * s, out_dtype).astype(out_dtype)

    return RowDecoded(f"{base}.weight", (rows, cols), out_dtype, nbytes, decode, 1)


def _round(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Float32 values rounded to ``dtype`` (torch's float32 op then cast), as float32."""
    return x if dtype == F32 else x.astype(dtype).astype(F32)


def _bits(args: list[dict[str, Any]], cols: int, words: int, at: str) -> int:
    """The bit width of packed codes: the config's, checked against the packed width."""
    declared = {int(a.get("num_bits", 0)) for a in args}
    fits = [b for b in range(1, 9) if -(-cols * b // 32) == words]
    found = [b for b in fits if b in declared]
    if len(found) != 1:
        raise LayoutRefused(
            f"{at}: {words} int32 words a row fit {fits or 'no'} bit width(s) for {cols} values;"
            f" the quantization_config declares {sorted(declared)}"
        )
    return found[0]


def _unpack(words: np.ndarray, bits: int, cols: int, at: str, what: str) -> np.ndarray:
    """compressed-tensors' dense int32 packing undone: value ``i`` of a row at bits
    ``[i * bits, (i + 1) * bits)`` of its little-endian words, minus ``2 ** (bits - 1)``."""
    if words.dtype != np.int32:
        raise LayoutRefused(f"{at}: {what} has dtype {words.dtype.name}, not int32")
    if words.shape[-1] * 32 < cols * bits:
        raise LayoutRefused(f"{at}: {what} {list(words.shape)} is too narrow for {cols} values")
    w = np.ascontiguousarray(words).astype("<i4")
    stream = np.unpackbits(w.view(np.uint8).reshape(w.shape[0], -1), axis=1, bitorder="little")
    vals = stream[:, : cols * bits].reshape(w.shape[0], cols, bits).astype(np.int16)
    q = (vals << np.arange(bits, dtype=np.int16)).sum(axis=2, dtype=np.int16)
    return (q - (1 << (bits - 1))).astype(np.int8)
