"""FP8 checkpoint tensors, and FP8 weights paired with their block scales.

Checkpoints stored in FP8 (``F8_E4M3`` and friends) keep a weight ``W`` as FP8 values and a
float32 tensor of one scale per block (DeepSeek-V3's ``W_scale_inv``, ``[ceil(M/128),
ceil(N/128)]`` for a ``[M, N]`` weight). :func:`pair_scales` turns each such pair into one
:class:`Float8Tensor`: the weight's values as float32, ``float32(W[i, j]) * S[i // bm,
j // bn]`` (one float32 multiply, rounded to nearest even, as the reference dequantization
computes it), read region by region; the scale tensors are consumed. An FP8 tensor without a
scale reads as its float32 values (exact). The pairing is a recipe's ``[scales]`` table
(:class:`ScaleRule`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from ...core import expand_key
from ...errors import StoreError
from ...spec import ScaleRule
from .dtypes import FLOAT8_DTYPES
from .tensor import Shaped, TensorLike, forward_key

PREFERRED_BLOCK = 128  # a block length the shapes leave open is this one when it fits
_SCALE_DTYPES = ("float32", "bfloat16", "float16")
_F32 = np.dtype(np.float32)


def is_float8(dtype: DTypeLike) -> bool:
    """Whether ``dtype`` is one of the 8-bit float types checkpoints hold."""
    try:
        return np.dtype(dtype) in FLOAT8_DTYPES
    except TypeError:
        return False


def pair_scales(
    tensors: Mapping[str, TensorLike], rule: ScaleRule | None = None
) -> dict[str, TensorLike]:
    """``tensors`` with every FP8 tensor as a :class:`Float8Tensor` (paired with its scale
    tensor where ``rule`` finds one; the scale tensors consumed), in the same order."""
    rule = rule or ScaleRule()
    out: dict[str, TensorLike] = {}
    consumed: set[str] = set()
    for name, t in tensors.items():
        if not is_float8(t.dtype):
            out[name] = t
            continue
        scale_name = None
        if rule.enabled:
            scale_name = next(
                (name + s for s in rule.suffixes if name + s in tensors and name + s != name),
                None,
            )
        if scale_name is None:
            out[name] = Float8Tensor(name, t)
            continue
        scale = tensors[scale_name]
        block = _block_shape(name, t.shape, scale_name, scale, rule.block)
        out[name] = Float8Tensor(name, t, scale, block, scale_name)
        consumed.add(scale_name)
    return {n: t for n, t in out.items() if n not in consumed}


def _block_shape(
    name: str,
    shape: tuple[int, ...],
    scale_name: str,
    scale: TensorLike,
    given: tuple[int, ...] | None,
) -> tuple[int, ...]:
    """The block shape that maps the weight ``shape`` onto the scale tensor's shape."""
    at = f"FP8 tensor {name!r} and its scale {scale_name!r}"
    sdtype = np.dtype(scale.dtype)
    if sdtype.name not in _SCALE_DTYPES:
        raise StoreError(
            f"{at}: the scale has dtype {sdtype.name}; block scales are float32, bfloat16 or"
            " float16 (turn pairing off with [scales] enabled = false)"
        )
    sshape = tuple(scale.shape)
    if math.prod(sshape) == 1 and len(sshape) <= len(shape):  # one scale for the tensor
        return tuple(max(1, n) for n in shape)
    if len(sshape) != len(shape):
        raise StoreError(
            f"{at}: shapes {list(shape)} and {list(sshape)} have different ranks; a block"
            " scale has one entry per block along every axis"
        )
    if given is not None and len(given) != len(shape):
        raise StoreError(
            f"{at}: the recipe's block {list(given)} has {len(given)} axes, the weight {len(shape)}"
        )
    block = []
    for d, (m, s) in enumerate(zip(shape, sshape, strict=True)):
        if given is not None:
            b = given[d]
            if -(-m // b) != s:
                raise StoreError(
                    f"{at}: shapes {list(shape)} and {list(sshape)} do not match the block"
                    f" {list(given)} (axis {d}: {m} in blocks of {b} needs {-(-m // b)}"
                    " scales)"
                )
        elif m == 0 or s == 0:
            if m != s:
                raise StoreError(f"{at}: shapes {list(shape)} and {list(sshape)} do not match")
            b = PREFERRED_BLOCK
        elif s == 1:
            b = m  # (any block of at least m gives the same values)
        else:
            lo, hi = -(-m // s), -(-m // (s - 1)) - 1  # every b with ceil(m / b) == s
            if lo > hi:
                raise StoreError(
                    f"{at}: shapes {list(shape)} and {list(sshape)} do not match: no block"
                    f" length cuts {m} into {s} blocks"
                )
            powers = [1 << k for k in range(63) if lo <= 1 << k <= hi]
            if lo == hi:
                b = lo
            elif lo <= PREFERRED_BLOCK <= hi:
                b = PREFERRED_BLOCK
            elif len(powers) == 1:
                b = powers[0]
            else:
                raise StoreError(
                    f"{at}: the block length along axis {d} is ambiguous ({m} values in {s}"
                    f" blocks: any of {lo}..{hi}); name it in the recipe: [scales] block ="
                    f" [...]"
                )
        block.append(int(b))
    return tuple(block)


class Float8Tensor(Shaped):
    """An FP8 checkpoint tensor read as float32: ``float32(W) * S[block]`` with a block
    ``scale`` tensor, ``float32(W)`` without. Looks like a checkpoint tensor to the engine
    (``name``, ``shape``, ``dtype``, ``t[key]``, ``read_into``); ``nbytes`` are the stored
    bytes (weight and scale)."""

    chunks = None
    file = None

    def __init__(
        self,
        name: str,
        weight: TensorLike,
        scale: TensorLike | None = None,
        block: tuple[int, ...] | None = None,
        scale_name: str | None = None,
    ) -> None:
        self.name, self.weight, self.scale = name, weight, scale
        self.block, self.scale_name = block, scale_name
        self.shape = tuple(weight.shape)
        self.dtype = _F32
        self.source_dtype = np.dtype(weight.dtype)
        self.nbytes = int(weight.nbytes) + (int(scale.nbytes) if scale is not None else 0)

    def __repr__(self) -> str:
        pair = f", scale={self.scale_name!r}, block={self.block}" if self.scale else ""
        return f"Float8Tensor({self.name!r}, {self.shape}, {self.source_dtype.name}{pair})"

    def __getitem__(self, key: Any) -> np.ndarray:
        """The region ``key`` (basic indexing) as float32 values."""
        fwd, flip = forward_key(expand_key(key, self.shape), self.shape)
        box: list[slice] = []
        inner: list[int | slice] = []
        for k, n in zip(fwd, self.shape, strict=True):
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                stop = max(start, stop)
                box.append(slice(start, stop))
                inner.append(slice(0, stop - start, step))
            else:
                box.append(slice(k, k + 1))
                inner.append(0)
        out = np.empty(tuple(b.stop - b.start for b in box), _F32)
        self._fill(tuple(box), out)
        part = out[tuple(inner)]
        if flip:
            part = np.flip(part, axis=flip)
        return np.array(part, dtype=_F32, order="C", copy=True)

    def read_into(self, key: tuple[slice, ...], out: np.ndarray) -> bool:
        """The region ``key`` (forward slices of step 1) into ``out`` (float32,
        C-contiguous, the region's shape)."""
        if (
            out.dtype != _F32
            or not out.flags.c_contiguous
            or len(key) != len(self.shape)
            or any(not isinstance(k, slice) or k.step not in (None, 1) for k in key)
            or out.shape != tuple(k.stop - k.start for k in key)
        ):
            return False
        self._fill(tuple(key), out)
        return True

    def _fill(self, box: tuple[slice, ...], out: np.ndarray) -> None:
        if out.size == 0:
            return
        w = self.weight[box]  # the FP8 values of the region (1 byte each)
        if self.scale is None:
            out[...] = w  # exact
            return
        # IEEE float32 products, as the reference computes them: beyond float32's range they are
        # inf, and inf * 0 (float8_e5m2's inf, a zero scale) NaN, without a RuntimeWarning
        with np.errstate(over="ignore", invalid="ignore"):
            self._scale_into(w, box, out)

    def _scale_into(self, w: np.ndarray, box: tuple[slice, ...], out: np.ndarray) -> None:
        """``out`` = float32(``w``) * its block scales (``self.scale`` is not None)."""
        assert self.scale is not None
        if not self.shape:
            out[...] = w
            out *= np.asarray(self.scale[...], _F32).reshape(())
            return
        b = self.block
        assert b is not None  # (a scale comes with its block shape)
        blo = [k.start // bd for k, bd in zip(box, b, strict=True)]
        bhi = [-(-k.stop // bd) for k, bd in zip(box, b, strict=True)]
        if math.prod(self.scale.shape) == 1:
            s = np.asarray(self.scale[...], _F32).reshape(-1)[0]
            out[...] = w
            out *= s
            return
        sk = tuple(slice(lo, hi) for lo, hi in zip(blo, bhi, strict=True))
        scales = np.asarray(self.scale[sk]).astype(_F32)  # (bf16/f16 scales widen exactly)
        # the scales of the axes after the first, one per value of the region: [blocks, ...]
        for d in range(1, len(b)):
            scales = np.repeat(scales, b[d], axis=d)
            off = box[d].start - blo[d] * b[d]
            cut = [slice(None)] * scales.ndim
            cut[d] = slice(off, off + box[d].stop - box[d].start)
            scales = scales[tuple(cut)]
        lo0 = box[0].start
        for i in range(bhi[0] - blo[0]):
            r0 = max(lo0, (blo[0] + i) * b[0]) - lo0
            r1 = min(box[0].stop, (blo[0] + i + 1) * b[0]) - lo0
            o = out[r0:r1]
            o[...] = w[r0:r1]  # FP8 -> float32, exact
            o *= scales[i]  # one float32 multiply, rounded to nearest even
