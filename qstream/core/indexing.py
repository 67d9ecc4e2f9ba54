"""Basic indexing (ints, slices, one Ellipsis) for the lazy array readers."""

from __future__ import annotations

from typing import Any

import numpy as np


def expand_key(key: Any, shape: tuple[int, ...]) -> tuple[int | slice, ...]:
    """Expand a basic-indexing key to one int or slice per dimension (ints made non-negative)."""
    key = key if isinstance(key, tuple) else (key,)
    n_ellipsis = sum(k is Ellipsis for k in key)
    if n_ellipsis > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    n_given = len(key) - n_ellipsis
    if n_given > len(shape):
        raise IndexError(f"too many indices: {n_given} for a {len(shape)}-d tensor")
    if not n_ellipsis:
        key = (*key, Ellipsis)
    at = next(i for i, k in enumerate(key) if k is Ellipsis)
    key = (*key[:at], *(slice(None),) * (len(shape) - n_given), *key[at + 1 :])
    out: list[int | slice] = []
    for k, n in zip(key, shape, strict=True):
        if isinstance(k, slice):
            out.append(k)
        elif isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)):
            i = int(k) + n if k < 0 else int(k)
            if not 0 <= i < n:
                raise IndexError(f"index {int(k)} is out of bounds for an axis of size {n}")
            out.append(i)
        else:
            raise TypeError(f"only ints, slices and '...' are supported as indices, not {k!r}")
    return tuple(out)


def step1_slices(key: Any, shape: tuple[int, ...]) -> tuple[tuple[slice, ...], list[bool]]:
    """``key`` as one step-1 slice per dimension, and which dimensions an int index drops."""
    out, squeeze = [], []
    for k, n in zip(expand_key(key, shape), shape, strict=True):
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            if step != 1:
                raise IndexError("only step-1 slices are supported")
            out.append(slice(start, max(start, stop)))
            squeeze.append(False)
        else:
            out.append(slice(k, k + 1))
            squeeze.append(True)
    return tuple(out), squeeze
