"""gpt-oss's MXFP4 experts (``quantization_config.quant_method == "mxfp4"``), read as
transformers 5.24's own conversion gives them (``integrations.mxfp4.convert_moe_packed_tensors``).

Each pair ``<name>_blocks`` (uint8 ``[experts, out, in / 32, 16]``: two E2M1 codes a byte, the
low nibble first) + ``<name>_scales`` (uint8 E8M0 ``[experts, out, in / 32]``) reads as one
tensor ``<name>`` of shape ``[experts, in, out]`` in bfloat16 (transformers' layout of
``gate_up_proj`` / ``down_proj``: the decoded ``[out, in]`` matrix of each expert transposed):
``code * 2 ** (scale - 127)``, the float32 product rounded to bfloat16, expert by expert.
Every other tensor is read as stored. Refused before any block is read: half a pair, blocks or
scales of the wrong dtype or shape, E8M0 NaN (255) scales, a stray tensor stored in 8 bits
beside them that nothing decodes.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .dtypes import BF16
from .tensor import RowDecoded, TensorLike

BLOCKS, SCALES = "_blocks", "_scales"
FORMAT = "gpt-oss MXFP4 (*_blocks + *_scales)"


def read_gpt_oss(
    tensors: Mapping[str, TensorLike], where: str, refused: type[Exception]
) -> dict[str, TensorLike]:
    """``tensors`` with every ``*_blocks`` / ``*_scales`` pair read as its decoded tensor
    (named without the suffix, in the pair's place); ``refused`` is the exception raised
    for what cannot be read exactly."""
    out: dict[str, TensorLike] = {}
    for name, t in tensors.items():
        if name.endswith(BLOCKS):
            base = name.removesuffix(BLOCKS)
            scales = tensors.get(base + SCALES)
            if scales is None:
                raise refused(f"{where}: {name!r} has no {base + SCALES!r} beside it (half a pair)")
            if base in tensors:
                raise refused(f"{where}: {base!r} is stored both plain and as MXFP4 blocks")
            out[base] = _decoded(base, t, scales, f"{where}: {base} ({FORMAT})", refused)
        elif name.endswith(SCALES) and name.removesuffix(SCALES) + BLOCKS in tensors:
            continue
        elif name.endswith(SCALES) and np.dtype(t.dtype) == np.uint8:
            pair = name.removesuffix(SCALES) + BLOCKS
            raise refused(f"{where}: {name!r} has no {pair!r} beside it (half a pair)")
        elif np.dtype(t.dtype).kind in "iub" or np.dtype(t.dtype).itemsize == 1:
            raise refused(
                f"{where}: {name!r} is stored as {np.dtype(t.dtype).name} in an mxfp4 checkpoint,"
                " not a pair of *_blocks and *_scales; refused rather than read as plain values"
            )
        else:
            out[name] = t
    return out


def _decoded(
    base: str, blocks: TensorLike, scales: TensorLike, at: str, refused: type[Exception]
) -> RowDecoded:
    bshape, sshape = tuple(int(n) for n in blocks.shape), tuple(int(n) for n in scales.shape)
    if np.dtype(blocks.dtype) != np.uint8 or np.dtype(scales.dtype) != np.uint8:
        raise refused(
            f"{at}: blocks {np.dtype(blocks.dtype).name} and scales"
            f" {np.dtype(scales.dtype).name}; both must be uint8 (E2M1 pairs, E8M0 exponents)"
        )
    if len(bshape) != 4 or bshape[3] != 16 or bshape[:3] != sshape:
        raise refused(
            f"{at}: blocks {list(bshape)} and scales {list(sshape)}; gpt-oss stores"
            " [experts, out, in / 32, 16] blocks beside [experts, out, in / 32] scales"
        )
    s = np.asarray(scales[...])
    if (s == 255).any():
        raise refused(f"{at}: the scales hold E8M0 NaN (255)")
    experts, rows, groups, _ = bshape
    cols = groups * 32

    def decode(e0: int, e1: int) -> np.ndarray:
        from ...core.float_formats import mx_dequantize

        out = np.empty((e1 - e0, cols, rows), BF16)
        for e in range(e0, e1):
            codes = np.asarray(blocks[e]).reshape(rows, groups * 16)
            out[e - e0] = mx_dequantize(codes, s[e], "mxfp4").T
        return out

    nbytes = int(blocks.nbytes) + int(scales.nbytes)
    return RowDecoded(base, (experts, cols, rows), BF16, nbytes, decode, 1)
