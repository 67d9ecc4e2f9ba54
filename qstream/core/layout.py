"""How an array and its quantization parameters line up: the ``[outer, C, inner]`` view.

Every granularity is one affine map whose parameters are indexed by a projection of the
element's coordinate. The array is viewed as ``x3[O, C, I]`` around the quantized axis and the
parameters as ``p3[Op, Cp, Ip]``; element ``(o, c, i)`` uses
``p3[o if Op > 1 else 0, c // cblock, (i // iblock) if Ip > 1 else 0]``.

When the quantized axis is the last one (``I == 1``) the axis is moved into the inner position
(``x3[O, 1, C]``) so the kernels' inner loop stays long and contiguous.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidParameterError


@dataclass(frozen=True)
class Layout:
    """A planned view of an array and its parameters (see module docstring)."""

    shape: tuple[int, ...]  # the array's own shape
    axis: int | None  # normalised (non-negative) axis, None for per-tensor
    block_size: int | None
    param_shape: tuple[int, ...]  # the shape scale/zero_point must have (after squeezing)
    shape3: tuple[int, int, int]
    pshape3: tuple[int, int, int]
    cblock: int
    iblock: int

    @property
    def granularity(self) -> str:
        if self.axis is None:
            return "per_tensor"
        return "per_axis" if self.block_size is None else "blocked"

    def view(self, a: np.ndarray) -> np.ndarray:
        """``a`` (shaped like the array, C-contiguous) as ``[O, C, I]``."""
        return a.reshape(self.shape3)

    def params(self, p: np.ndarray) -> np.ndarray:
        """A parameter array (of ``param_shape``, or size 1) as ``[Op, Cp, Ip]``."""
        return np.ascontiguousarray(p).reshape(self.pshape3)

    def expand(self, p: np.ndarray) -> np.ndarray:
        """Parameters broadcast to one value per element, shaped like the array (slow path)."""
        p = np.asarray(p)
        if self.axis is None:
            return np.broadcast_to(p.reshape(()), self.shape)
        if self.block_size is None:
            dims = [1] * len(self.shape)
            dims[self.axis] = -1
            return np.broadcast_to(p.reshape(dims), self.shape)
        rep = np.repeat(p.reshape(self.param_shape), self.block_size, axis=self.axis)
        return rep.take(np.arange(self.shape[self.axis]), axis=self.axis)


def param_region(key: tuple[slice, ...], axis: int, block_size: int) -> tuple[slice, ...]:
    """The region of a blocked parameter array that the array region ``key`` uses (``key``
    starts on a parameter block along ``axis``)."""
    return tuple(
        slice(k.start // block_size, -(-k.stop // block_size)) if d == axis else k
        for d, k in enumerate(key)
    )


def blocked_param_shape(shape, axis: int, block_size: int) -> tuple[int, ...]:
    """The parameter shape of a blocked layout: ``shape`` with ``shape[axis]`` replaced by
    ``ceil(shape[axis] / block_size)`` (ONNX layout, the last block may be short)."""
    ps = [int(d) for d in shape]
    ps[axis] = -(-ps[axis] // block_size)
    return tuple(ps)


def normalize_axis(axis: int, ndim: int) -> int:
    """``axis`` in ``[-ndim, ndim)`` made non-negative, else an error naming both."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise InvalidParameterError(f"axis must be an integer, got {axis!r}")
    if ndim == 0:
        raise InvalidParameterError(f"a 0-d array has no axis to quantize along (got axis {axis})")
    if not -ndim <= axis < ndim:
        raise InvalidParameterError(
            f"axis {axis} is out of range for an array of rank {ndim} (valid: {-ndim}..{ndim - 1})"
        )
    return int(axis) % ndim


def plan_layout(
    shape: tuple[int, ...],
    param_shape: tuple[int, ...],
    axis: int | None,
    block_size: int | None,
) -> Layout:
    """Check ``param_shape`` against the granularity and plan the ``[O, C, I]`` view.

    ``axis=None`` or a one-element parameter (without ``block_size``) is per-tensor; ``axis``
    with a 1-D parameter of length ``shape[axis]`` is per-axis; ``axis`` with ``block_size``
    is blocked (ONNX layout: the parameter has the array's shape with ``shape[axis]`` replaced
    by ``ceil(shape[axis] / block_size)``; the last block may be short).
    """
    shape = tuple(int(d) for d in shape)
    param_shape = tuple(int(d) for d in param_shape)
    n = math.prod(shape)
    if block_size is not None and block_size != 0:
        return _blocked(shape, param_shape, axis, int(block_size))
    if axis is None or math.prod(param_shape) == 1:
        if math.prod(param_shape) != 1:
            raise InvalidParameterError(
                f"per-tensor quantization needs a single scale, got shape {param_shape}"
                " (pass axis= for per-axis parameters)"
            )
        return Layout(shape, None, None, (), (1, 1, n), (1, 1, 1), 1, 1)
    if len(shape) == 0:
        raise InvalidParameterError("a 0-d array has no axis to quantize along")
    k = normalize_axis(axis, len(shape))
    c = shape[k]
    if len(param_shape) != 1 or param_shape[0] != c:
        raise InvalidParameterError(
            f"per-axis parameters along axis {k} must be 1-D of length {c}, got shape {param_shape}"
        )
    outer, inner = math.prod(shape[:k]), math.prod(shape[k + 1 :])
    if inner == 1:
        return Layout(shape, k, None, (c,), (outer, 1, c), (1, 1, c), 1, 1)
    return Layout(shape, k, None, (c,), (outer, c, inner), (1, c, 1), 1, 1)


def _blocked(shape, param_shape, axis, block_size) -> Layout:
    if block_size < 0:
        raise InvalidParameterError(f"block_size must be a positive integer, got {block_size}")
    if axis is None:
        raise InvalidParameterError("blocked quantization needs an axis")
    if len(shape) == 0:
        raise InvalidParameterError("a 0-d array has no axis to block along")
    k = normalize_axis(axis, len(shape))
    c = shape[k]
    expected = blocked_param_shape(shape, k, block_size)
    nblocks = expected[k]
    if param_shape != expected:
        raise InvalidParameterError(
            f"blocked parameters for shape {shape}, axis {k}, block_size {block_size} must have"
            f" shape {expected} (ceil({c}/{block_size}) = {nblocks} blocks), got {param_shape}"
        )
    outer, inner = math.prod(shape[:k]), math.prod(shape[k + 1 :])
    if inner == 1:
        return Layout(
            shape, k, block_size, expected, (outer, 1, c), (outer, 1, nblocks), 1, block_size
        )
    return Layout(
        shape, k, block_size, expected, (outer, c, inner), (outer, nblocks, inner), block_size, 1
    )


def dimension_names(ndim: int) -> list[str]:
    """The dimension names qstream writes on an array of ``ndim`` axes (xarray's default
    spelling), so that the arrays of one output share the names of the axes they share."""
    return [f"dim_{i}" for i in range(ndim)]


def param_dimension_names(
    ndim: int, axis: int | None, block_size: int | None, names: list[str] | None = None
) -> list[str]:
    """Dimension names of the scale / zero point of a quantized array of ``ndim`` axes: none
    per tensor; the channel axis's name per axis; a blocked array's axes, the blocked one
    renamed (its length is the number of blocks). ``names``: the array's own (default
    :func:`dimension_names`)."""
    if axis is None:
        return []
    names = list(names) if names else dimension_names(ndim)
    if not block_size:
        return [names[axis]]
    names[axis] += "_blocks"
    return names
