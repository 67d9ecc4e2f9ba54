"""NumPy twins of the kernels a small conversion calls, and the choice of them: no Numba is
loaded for such a job.

A conversion of a few MiB (the bundled sample) would spend more time importing Numba and
loading its cached kernels (~0.3 s) than computing.
:func:`qstream.engine.convert.convert_checkpoint.small_job` decides which jobs are that small;
their block work calls these twins instead of the kernels. The choice belongs to a job, not
to the process: a context variable set for the job's run (:func:`using_numpy_kernels`) and
carried into the threads and tasks that run its work (:func:`carried`; a Dask task gets it as
an argument), so a job running at the same time in another thread keeps its own.

Each twin takes the arguments of the kernel it stands for (``[O, C, I]`` views, parameters
``[Op, Cp, Ip]``, see ``qstream.core.layout``) and gives:

- the same bits for ranges, counts, histograms, percentile ranges and codes: the same float
  operations in the same types, and ties decided as the kernels decide them (a signed zero at
  the end of a range included);
- the same error figures up to the last bits of the four float64 sums (x^2, e^2, x*y, y^2):
  NumPy adds them pairwise, the kernels in the order their vectorised loops take (itself the
  host CPU's); the counts, the largest error and the clipped count are exact.

Tests hold each twin against its kernel (``tests/kernels/test_numpy_twins.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..budget import TILE
from ..rounding import ROUND_MODES

# ---- the choice (a job's, not the process's) ----------------------------------------------

_NUMPY: contextvars.ContextVar[bool] = contextvars.ContextVar("qstream_numpy", default=False)


def numpy_kernels() -> bool:
    """Whether the running job calls the NumPy twins instead of Numba's kernels."""
    return _NUMPY.get()


@contextlib.contextmanager
def using_numpy_kernels(on: bool = True) -> Iterator[None]:
    """Run the block below (and the work it hands to threads through :func:`carried`) with
    the NumPy twins (``on``) or Numba's kernels."""
    token = _NUMPY.set(on)
    try:
        yield
    finally:
        _NUMPY.reset(token)


def carried(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` to be run in another thread under the calling thread's choice (a copy of its
    context, taken now: one per call, as a context runs in one thread at a time)."""
    return functools.partial(contextvars.copy_context().run, fn)


def kernel_threads() -> int:
    """The threads a kernel called from this thread may use (Numba's setting); the machine's
    cores where the job runs the NumPy twins (Numba is not loaded for it)."""
    if numpy_kernels():
        return os.cpu_count() or 1
    from .runtime import kernel_threads as numba_threads

    return numba_threads()


#: columns of the error sums, the kernels' (``error_stats``) and the twin's: count, x^2, e^2,
#: x*y, y^2, max |e|, clipped, NaN, +inf, -inf
N_SUMS = 10


def expand(p: np.ndarray, shape: tuple[int, ...], cblock: int, iblock: int) -> np.ndarray:
    """The parameters ``p[Op, Cp, Ip]`` of each element of an ``[O, C, I]`` view of
    ``shape``, as the kernels pick them (row ``o`` or 0, ``c // cblock``, ``i // iblock`` or
    0), broadcast where they are shared."""
    _, n_c, n_inner = shape
    p = p[:, np.arange(n_c) // cblock] if p.shape[1] > 1 else p
    if p.shape[2] > 1:
        p = p[:, :, :n_inner] if iblock == 1 else p[:, :, np.arange(n_inner) // iblock]
    return p


# ---- ranges (stats.channel_ranges) ------------------------------------------------------


def _signed_zeros(p: np.ndarray, lo: np.ndarray, hi: np.ndarray, first_seen: np.ndarray) -> None:
    """Give a zero ``lo``/``hi`` of each piece (the rows of ``p``) the sign the kernel gives
    it: where ``first_seen``, the first zero's (values compared one by one, an equal one never
    replaces the one kept); elsewhere the integer order keys' (-0.0 below +0.0)."""
    zero = p == 0
    if not zero.any():
        return
    neg = np.signbit(p)
    first = np.take_along_axis(neg, np.argmax(zero, axis=-1)[..., None], axis=-1)[..., 0]
    lo_neg = np.where(first_seen, first, (zero & neg).any(axis=-1))
    hi_neg = np.where(first_seen, first, ~(zero & ~neg).any(axis=-1))
    lo[lo == 0] = np.where(lo_neg, -0.0, 0.0)[lo == 0]
    hi[hi == 0] = np.where(hi_neg, -0.0, 0.0)[hi == 0]


def _piece_ranges(p: np.ndarray, compared: bool) -> tuple[np.ndarray, ...]:
    """``(min, max, finite, NaN, +inf, -inf)`` of each piece (last axis) of the float
    values ``p``, in float64 and int64: a finite piece as the order keys rank it, one holding
    NaN or infinities (or every piece, ``compared``) value by value."""
    lo = p.min(axis=-1).astype(np.float64)  # (exact; NaN or infinities show here)
    hi = p.max(axis=-1).astype(np.float64)
    none = np.zeros(lo.shape, np.int64)
    if np.isfinite(lo).all() and np.isfinite(hi).all():  # every value finite: two passes
        if (lo == 0).any() or (hi == 0).any():
            _signed_zeros(p, lo, hi, np.full(lo.shape, compared))
        return lo, hi, np.full(lo.shape, p.shape[-1], np.int64), none, none, none
    fin = np.isfinite(p)
    lo = np.where(fin, p, np.inf).min(axis=-1).astype(np.float64)
    hi = np.where(fin, p, -np.inf).max(axis=-1).astype(np.float64)
    _signed_zeros(p, lo, hi, ~fin.all(axis=-1) | compared)
    return (
        lo,
        hi,
        fin.sum(axis=-1),
        np.isnan(p).sum(axis=-1),
        (p == np.inf).sum(axis=-1),
        (p == -np.inf).sum(axis=-1),
    )


def _fold_first(current: np.ndarray, parts: np.ndarray, below: bool) -> None:
    """Fold ``parts[P, C]`` into ``current[C]`` in order as the kernels do (``if v < cur:
    cur = v``; ``>`` unless ``below``): the first part holding the extreme replaces it,
    sign of zero included, where it is strictly beyond ``current``."""
    ext = parts.min(axis=0) if below else parts.max(axis=0)
    first = parts[np.argmax(parts == ext, axis=0), np.arange(parts.shape[1])]
    beyond = first < current if below else first > current
    current[beyond] = first[beyond]


def channel_ranges(x, mins, maxs, counts, nans, posinf, neginf) -> None:
    """:func:`qstream.kernels.stats.channel_ranges`: per channel of ``x[O, C, I]`` the finite
    min/max and the counts of finite/NaN/+inf/-inf values, merged into the ``[C]`` outputs."""
    _, n_c, n_inner = x.shape
    v = np.asarray(x)  # (min, max and the tests are exact in the values' own type)
    if n_inner == 1:  # (channels on the fast axis: every value compared, in order)
        parts = _piece_ranges(v[:, :, 0].T, compared=True)
        parts = tuple(a[None, :] for a in parts)
    else:  # rows cut in tiles, each a piece; a channel's pieces in (row, tile) order
        tiles = [
            _piece_ranges(v[:, :, i0 : i0 + TILE], compared=False) for i0 in range(0, n_inner, TILE)
        ]
        parts = tuple(np.stack(k, axis=1).reshape(-1, n_c) for k in zip(*tiles, strict=True))
    _fold_first(mins, parts[0], below=True)
    _fold_first(maxs, parts[1], below=False)
    for total, part in zip((counts, nans, posinf, neginf), parts[2:], strict=True):
        total += part.sum(axis=0)


# ---- histograms (stats.channel_histograms) ----------------------------------------------


def channel_histograms(x, lo, hi, use_abs, hist) -> None:
    """:func:`qstream.kernels.stats.channel_histograms`: each channel's finite values added
    to ``hist[C, nbins]`` over ``[lo[c], hi[c]]``: bin ``min(max((v - lo) / w * nbins, 0),
    nbins - 1)`` truncated, in float64; every value in bin 0 where ``hi - lo`` is not
    positive."""
    n_c, nbins = hist.shape
    v = np.asarray(x, np.float64)
    a = np.abs(v) if use_abs else v
    w = hi - lo
    with np.errstate(all="ignore"):
        f = (a - lo[None, :, None]) / w[None, :, None] * nbins
    top = np.float64(nbins - 1)
    f = np.where(f < 0.0, 0.0, f)  # max(f, 0.0): NaN stays (a non-finite value: not counted)
    f = np.where(top < f, top, f)  # min(f, top)
    f = np.where((w > 0)[None, :, None], f, 0.0)
    fin = np.isfinite(v)
    bins = f[fin].astype(np.uint32).astype(np.int64)
    bins += np.broadcast_to(np.arange(0, n_c * nbins, nbins)[None, :, None], v.shape)[fin]
    if hist.flags.c_contiguous:  # (counted in place: no array of every bin made)
        np.add.at(hist.reshape(-1), bins, 1)
    else:
        hist += np.bincount(bins, minlength=n_c * nbins).reshape(n_c, nbins)


# ---- percentile ranges (search.percentile_ranges) ----------------------------------------


def _edges_at(start: np.ndarray, stop: np.ndarray, nb: int, i: np.ndarray) -> np.ndarray:
    """``np.linspace(start, stop, nb + 1)[i]`` per channel, as NumPy (and the kernel)
    computes it."""
    delta = stop - start
    step = delta / nb
    with np.errstate(all="ignore"):
        v = np.where(step == 0, (i / nb) * delta + start, i * step + start)
    return np.where(i == nb, stop, v)


def percentile_ranges(counts, hlo, hhi, lo, hi, percentile, symmetric, out_lo, out_hi) -> None:
    """:func:`qstream.kernels.search.percentile_ranges`: per channel the range keeping
    ``percentile`` percent of its histogram ``counts[c]`` (edges ``hlo``..``hhi``), clamped to
    the observed ``lo``..``hi``; a channel without counts keeps ``lo``/``hi``."""
    n, nb = counts.shape
    total = counts.sum(axis=1)
    cut = (100.0 - percentile) / 200.0
    wanted = (percentile / 100.0,) if symmetric else (cut, 1.0 - cut)
    # The kernel's cdf (``counts / total`` added in bin order) rises only at a bin with counts,
    # and adding 0.0 changes no sum: so each channel's cdf at its non-empty bins, added in bin
    # order, holds the kernel's values there, and the first bin reaching a fraction above 0 is
    # one of them (a histogram of a few values per channel in 2048 bins is mostly empty).
    flat = np.flatnonzero(counts.reshape(-1) != 0)  # (row by row, bins in order; a mask: 2x faster)
    rows = flat // nb
    cols = flat - rows * nb
    per_row = np.bincount(rows, minlength=n)
    width = max(1, int(per_row.max(initial=0)))
    # each non-empty bin's place in its channel's row of ``[n, width]`` (flat indices)
    slot = np.arange(flat.size) - (np.cumsum(per_row) - per_row)[rows] + rows * width
    cdf = np.zeros((n, width))
    with np.errstate(all="ignore"):
        cdf.reshape(-1)[slot] = counts.reshape(-1)[flat] / total[rows]
    np.cumsum(cdf, axis=1, out=cdf)  # (padding after a channel's last bin adds nothing)
    at = np.full((n, width), nb)
    at.reshape(-1)[slot] = cols
    every = np.arange(n)
    found = np.empty((len(wanted), n), np.int64)
    for k, v in enumerate(wanted):
        if not v > 0.0:  # every bin's cdf (>= 0, or NaN for an empty channel) reaches it
            found[k] = 0
            continue
        first = (cdf >= v).argmax(axis=1)
        reached = cdf[every, first] >= v
        found[k] = np.where(reached, at[every, first], nb)
    if symmetric:
        t = _edges_at(hlo, hhi, nb, found[0])
        a, b = -t, t
    else:
        a = _edges_at(hlo, hhi, nb, found[0])
        b = _edges_at(hlo, hhi, nb, found[1])
    empty = total == 0
    out_lo[:] = np.where(empty | ~(a > lo), lo, a)  # max(lo, a): a only where greater
    out_hi[:] = np.where(empty | ~(b < hi), hi, b)  # min(hi, b): b only where smaller


# ---- quantize (affine.QUANTIZE_KERNELS) ---------------------------------------------------


def _step(up: np.ndarray) -> np.ndarray:
    """1.0 where ``up``, else 0.0, in float64 (the kernels' ``1.0 if ... else 0.0``)."""
    return np.where(up, 1.0, 0.0)


def _half_away(x, s, z):
    v = x / s
    a = np.abs(v)
    t = np.floor(a)
    return np.copysign(t + _step(a - t >= 0.5), v) + z


def _half_toward(x, s, z):
    v = x / s
    a = np.abs(v)
    t = np.floor(a)
    return np.copysign(t + _step(a - t > 0.5), v) + z


def _half_up(x, s, z):
    v = x / s
    f = np.floor(v)
    return f + _step(v - f >= 0.5) + z


def _half_down(x, s, z):
    v = x / s
    f = np.floor(v)
    return f + _step(v - f > 0.5) + z


def _half(v: np.ndarray) -> np.generic:
    return v.dtype.type(0.5)


def _real_away(x, s, z):
    v = x / s
    t = np.floor(np.abs(v) + _half(v))
    return np.where(v < 0, -t, t) + z


def _real_toward(x, s, z):
    v = x / s
    t = np.ceil(np.abs(v) - _half(v))
    return np.where(v < 0, -t, t) + z


def _real_even(x, s, z):
    v = x / s
    up = np.floor(v + _half(v))
    dn = np.ceil(v - _half(v))
    return np.where(np.fmod(up, 2.0) == 0.0, up, dn) + z


def _fma(x, inv, z):
    f64 = np.float64
    return np.rint((x.astype(f64) * inv.astype(f64) + z.astype(f64)).astype(np.float32))


#: the element operations of ``qstream.kernels.rounding``, indexed by ``qstream.rounding``'s
#: codes: ``round(x / s) + z`` in the operands' float types (or torch's and oneDNN's forms)
OPS: tuple[Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray], ...] = (
    lambda x, s, z: np.rint(x / s) + z,
    _half_away,
    _half_toward,
    _half_up,
    _half_down,
    lambda x, s, z: np.ceil(x / s) + z,
    lambda x, s, z: np.floor(x / s) + z,
    lambda x, s, z: np.trunc(x / s) + z,
    lambda x, s, z: np.copysign(np.ceil(np.abs(x / s)), x / s) + z,
    lambda x, inv, z: np.rint(x * inv + z),
    _fma,
    lambda x, s, z: np.rint(x / s + z),
    _real_away,
    _real_toward,
    lambda x, s, z: np.floor(x / s + _half(x / s)) + z,
    lambda x, s, z: np.ceil(x / s - _half(x / s)) + z,
    _real_even,
)
assert len(OPS) == len(ROUND_MODES) + 8  # (every code qstream.rounding defines)


def quantize(code, x, scale, zero_point, cblock, iblock, lo, hi, mask, out) -> None:
    """The quantize kernel of round code ``code`` (``affine.QUANTIZE_KERNELS[code]``, same
    arguments after it): ``out = int32(min(max(lo, op(x, s, z)), hi)) & mask``, NaN to
    ``lo``."""
    with np.errstate(all="ignore"):
        s = expand(scale, x.shape, cblock, iblock)
        v = OPS[code](x, s, expand(zero_point, x.shape, cblock, iblock))
    v = np.fmin(np.fmax(v, lo), hi)  # max(lo, v) then min(., hi): NaN -> lo
    codes = v.astype(np.int32)
    codes &= mask
    np.copyto(out, codes, casting="unsafe")


# ---- error sums (error_stats.error_sums) -------------------------------------------------


def error_sums(x, q, scale, zero_point, cblock, iblock, qmin, qmax, chan_inner, out, groups=None):
    """:func:`qstream.kernels.error_stats.error_sums` (no group sums): add each channel's
    ``out`` row (count, x^2, e^2, x*y, y^2, max |e|, clipped, NaN, +inf, -inf) of ``x``
    against ``y = float32((q - z) * s)``; a NaN or infinity counts as x = y = 0 in the sums
    and the clipped test, and in its own count."""
    if groups is not None:
        raise ValueError("error_sums: the NumPy twin sums no parameter groups")
    s = expand(scale, x.shape, cblock, iblock)
    z = expand(zero_point, x.shape, cblock, iblock)
    xv = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        y = ((q - z) * s).astype(np.float32).astype(np.float64)
    fin = np.isfinite(xv)
    finite = bool(fin.all())
    if not finite:
        xv = np.where(fin, xv, 0.0)
        y = np.where(fin, y, 0.0)
    e = xv - y
    kept = "c" if not chan_inner and out.shape[0] > 1 else ("i" if chan_inner else "")
    terms = f"oci,oci->{kept}"

    def total(a: np.ndarray) -> np.ndarray:
        return np.einsum(f"oci->{kept}", np.broadcast_to(a, x.shape), dtype=np.float64).reshape(-1)

    s64, z64 = s.astype(np.float64), z.astype(np.float64)
    with np.errstate(all="ignore"):
        clip = (xv > (qmax - z64 + 0.5) * s64) | (xv < (qmin - z64 - 0.5) * s64)
    emax = np.abs(e).max(axis=_axes(kept)).reshape(-1) if e.size else np.zeros(out.shape[0])
    out[:, 0] += total(fin)
    out[:, 1] += np.einsum(terms, xv, xv).reshape(-1)
    out[:, 2] += np.einsum(terms, e, e).reshape(-1)
    out[:, 3] += np.einsum(terms, xv, y).reshape(-1)
    out[:, 4] += np.einsum(terms, y, y).reshape(-1)
    out[:, 5] = np.where(emax > out[:, 5], emax, out[:, 5])
    out[:, 6] += total(clip)
    if not finite:
        out[:, 7] += total(np.isnan(x))
        out[:, 8] += total(x == np.inf)
        out[:, 9] += total(x == -np.inf)


def _axes(kept: str) -> tuple[int, ...]:
    """The axes of ``[O, C, I]`` summed away when the channels are ``kept`` (``c``, ``i`` or
    none: one per tensor)."""
    return {"c": (0, 2), "i": (0, 1), "": (0, 1, 2)}[kept]
