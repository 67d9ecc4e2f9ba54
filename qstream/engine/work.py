"""The per-block work of each pass, as small picklable objects.

A work object holds only what names the job: where the source and destination are (paths or
URLs and their storage options), the plan, the spec and the small parameter arrays. Calling
it on a block opens what it needs once per process (cached), reads the block, runs the
kernels, writes the block's output chunk (the quantize and dequantize passes) and returns the
block's statistics. No closures, no locks, no open files travel with it, so an executor can
run blocks in this process's threads or hand them to other processes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.layout import blocked_param_shape, param_region, plan_layout
from ..core.scratch import scratch
from ..qtypes import QType, qtype
from ..spec import ErrorStats, QuantSpec, RangeStats, WorstGroups, merge_into
from .blockmath import (
    block_errors,
    block_errors_fused,
    block_ranges,
    block_worst_groups,
    channel_view,
    dynamic_blocked,
    dynamic_params,
    nan_to_zero_point,
    quantize_spec,
)
from .plan import Block

_OPEN: dict[tuple, Any] = {}
_OPEN_LOCK = threading.RLock()  # handles open others (a writer its array)


def worker_cached(key: tuple, make):
    """``make()`` once per process and key (stores, arrays, chunk files); keys start with the
    run's token, so no run ever sees another run's handles."""
    with _OPEN_LOCK:
        if key not in _OPEN:
            _OPEN[key] = make()
        return _OPEN[key]


def forget(token: str) -> None:
    """Drop the cached handles of one run (when it ends)."""
    with _OPEN_LOCK:
        for key in [k for k in _OPEN if k[0] == token]:
            del _OPEN[key]


@dataclass(frozen=True, eq=False)
class SourceRef:
    """How a worker opens the source: a path or URL any process can open (with ``tensor``:
    the tensor of that checkpoint), or (``obj``) an in-process object (a NumPy array, a
    ``zarr.Array``, a checkpoint tensor), which cannot be sent to another process."""

    token: str  # the run's
    url: str | None
    storage_options: dict | None = None
    obj: Any = field(default=None, repr=False)
    tensor: str | None = None
    # how a process opens the checkpoint of ``tensor`` (a ``CheckpointSource``; None: ``url``)
    opener: Any = None

    @property
    def key(self) -> tuple:
        return (self.token, "source")  # a run reads one source

    def open(self):
        from ..io.stores import open_source

        if self.tensor is not None:
            return worker_cached(self.key, lambda: open_source(self._checkpoint()[self.tensor]))
        if self.url is None:
            return worker_cached(self.key, lambda: open_source(self.obj))
        return worker_cached(
            self.key, lambda: open_source(self.url, storage_options=self.storage_options)
        )

    def _checkpoint(self):
        from ..io.checkpoints import open_checkpoint

        if self.opener is not None:
            return worker_cached((self.token, "checkpoint"), self.opener.open)
        return worker_cached((self.token, "checkpoint"), lambda: open_checkpoint(self.url))

    def register(self, source) -> None:
        """Use the already open ``source`` in this process."""
        worker_cached(self.key, lambda: source)

    def __getstate__(self):
        if self.url is None:
            raise TypeError(
                "an in-memory source (NumPy array, in-process Zarr array or checkpoint tensor)"
                " cannot be sent to another process; store it where workers can read it"
            )
        return {**self.__dict__, "obj": None}


@dataclass(frozen=True, eq=False)
class DestRef:
    """How a worker opens the arrays of the destination group."""

    token: str  # the run's
    url: str
    storage_options: dict | None = None

    def writer(self, name: str):
        from ..io.stores import ArrayWriter

        return worker_cached((self.token, "writer", name), lambda: ArrayWriter(self.array(name)))

    def register(self, group, arrays: dict | None = None) -> None:
        """Use the already open destination ``group`` (and its open member ``arrays``) in
        this process."""
        worker_cached((self.token, "group"), lambda: group)
        for name, arr in (arrays or {}).items():
            worker_cached((self.token, "array", name), lambda arr=arr: arr)

    def check(self, node=None) -> None:
        """On an object store, refuse to write once another job has taken the output over
        (its metadata names another writer): a block of a job that lost its output never
        lands in the other job's (``node``: the output's node, default its group)."""
        from ..io.destination import is_local_node
        from ..io.qarray import check_writer
        from ..io.stores import open_group

        if node is None:
            node = worker_cached(
                (self.token, "group"),
                lambda: open_group(self.url, mode="a", storage_options=self.storage_options),
            )
        if not is_local_node(node):
            check_writer(node, self.token, self.url)

    def array(self, name: str):
        from ..io.stores import open_group

        def make():
            group = worker_cached(
                (self.token, "group"),
                lambda: open_group(self.url, mode="a", storage_options=self.storage_options),
            )
            return group[name]

        return worker_cached((self.token, "array", name), make)


@dataclass(frozen=True)
class JobPlan:
    """The shape of a job: what every pass needs to know about the array and the spec."""

    spec: QuantSpec
    shape: tuple[int, ...]
    chunks: tuple[int, ...]  # destination chunks; one block each
    axis: int | None  # normalised
    stat_axis: int | None  # statistics per channel along this axis (None: per tensor)
    channels: int
    param_shape: tuple[int, ...]
    dynamic: bool  # blocked, each parameter block takes its own range

    @property
    def qt(self) -> QType:
        return qtype(self.spec.dtype)

    def block_channels(self, b: Block) -> int:
        return 1 if self.stat_axis is None else b.shape[self.stat_axis]

    def channels_of(self, b: Block, lo: int, hi: int) -> tuple[int, int]:
        """The channels ``[c0, c1)`` of block ``b`` within ``[lo, hi)`` (``c1 <= c0``: none)."""
        first = self.offset(b.key)
        return max(lo, first), min(hi, first + self.block_channels(b))

    def offset(self, key: tuple[slice, ...]) -> int:
        """The first channel of the region ``key``."""
        return key[self.stat_axis].start if self.stat_axis is not None else 0


class NonFiniteBlock(Exception):
    """A block held NaN/inf under nan_policy='error' (the job then names the whole count)."""


# --------------------------------------------------------------------------- reading


def read_region(source, key: tuple[slice, ...]) -> np.ndarray:
    """The region ``key`` of the source as a C-contiguous float32/float64 array: a view of
    the mapped chunk file where possible, else a buffer of the calling thread."""
    x = source.view(key)
    if x is None or not x.flags.c_contiguous:
        shape = tuple(k.stop - k.start for k in key)
        x = source.read(key, out=scratch("source", shape, source.dtype))
    if x.dtype.itemsize < 4:  # float16 / bfloat16: widen exactly for the kernels
        wide = scratch("source-f32", x.shape, np.float32)
        wide[...] = x
        return wide
    return x


def read_pieces(source, key: tuple[slice, ...]):
    """``(region, x)`` for the pieces of ``key`` that lie in one stored source chunk each, in
    order: a block is processed piece by piece, so a piece is read (or mapped) once and stays
    in the CPU's cache between the kernels that use it."""
    for region in source.pieces(key):
        yield region, read_region(source, region)


def _relative(region, key) -> tuple[slice, ...]:
    return tuple(
        slice(r.start - k.start, r.stop - k.start) for r, k in zip(region, key, strict=True)
    )


# --------------------------------------------------------------------------- passes


@dataclass(frozen=True, eq=False)
class RangesWork:
    """Pass 1: exact per-channel ranges and non-finite counts of a block."""

    plan: JobPlan
    source: SourceRef

    def __call__(self, b: Block) -> RangeStats:
        source = self.source.open()
        plan = self.plan
        st = RangeStats.empty(plan.block_channels(b))
        first = -1
        for region, x in read_pieces(source, b.key):
            part = block_ranges(x, plan.stat_axis)
            merge_into(st, part, plan.offset(region) - plan.offset(b.key))
            if part.first_nonfinite >= 0:  # as an index into the whole array
                local = np.unravel_index(part.first_nonfinite, x.shape)
                at = tuple(k.start + i for k, i in zip(region, local, strict=True))
                flat = int(np.ravel_multi_index(at, plan.shape)) if at else 0
                first = flat if first < 0 else min(first, flat)
        return RangeStats(st.min, st.max, st.count, st.nan, st.posinf, st.neginf, first)


def channel_pieces(plan: JobPlan, source, key, c0: int, c1: int):
    """The pieces of the block ``key`` as ``[O, C, I]`` channel views restricted to channels
    ``c0 .. c1``: ``(view, first channel, end channel)`` for each piece holding some."""
    for region, x in read_pieces(source, key):
        v = channel_view(x, plan.stat_axis)
        r0 = plan.offset(region)
        p0, p1 = max(c0, r0), min(c1, r0 + v.shape[1])
        if p1 <= p0:
            continue
        if (p0, p1) != (r0, r0 + v.shape[1]):  # part of the piece's channels
            v = np.ascontiguousarray(v[:, p0 - r0 : p1 - r0])
        yield v, p0, p1


@dataclass(frozen=True, eq=False)
class HistogramWork:
    """Pass 2: fixed-edge histograms of the channels ``lo_channel .. hi_channel`` of a block
    (``|x|`` over ``[0, edges_hi]`` when ``sym``, else ``x`` over ``[edges_lo, edges_hi]``);
    ``edges_*`` cover just those channels. Returns ``(first channel, counts)`` or None when
    the block holds none of them.

    With ``ranges`` (the channels' observed ``(lo, hi)``; only when every block holds whole
    channels), the block's histograms are searched here for the spec's method and
    ``(first channel, lo, hi)`` of its channels comes back instead of the counts."""

    plan: JobPlan
    source: SourceRef
    edges_lo: np.ndarray
    edges_hi: np.ndarray
    sym: bool
    lo_channel: int
    hi_channel: int
    ranges: tuple[np.ndarray, np.ndarray] | None = None

    def __call__(self, b: Block):
        from ..kernels.stats import channel_histograms

        plan = self.plan
        c0, c1 = plan.channels_of(b, self.lo_channel, self.hi_channel)
        if c1 <= c0:
            return None
        nbins = plan.spec.num_bins
        h = np.zeros((c1 - c0, nbins), np.int64)
        for v, p0, p1 in channel_pieces(plan, self.source.open(), b.key, c0, c1):
            e = slice(p0 - self.lo_channel, p1 - self.lo_channel)
            channel_histograms(
                v,
                np.ascontiguousarray(self.edges_lo[e]),
                np.ascontiguousarray(self.edges_hi[e]),
                self.sym,
                h[p0 - c0 : p1 - c0],
            )
        if self.ranges is None:
            return c0, h
        from ..calibration.histogram import method_range

        e = slice(c0 - self.lo_channel, c1 - self.lo_channel)
        counts = {"counts": h, "lo": self.edges_lo[e], "hi": self.edges_hi[e], "abs": self.sym}
        lo, hi = (r[e] for r in self.ranges)
        return (c0, *method_range(counts, lo, hi, plan.spec, plan.qt.bits))

    def combine(self, results: list) -> list:
        """The results of consecutive blocks with their histograms summed into the first
        (int64 sums: exact in any order) and None for the rest, so one partial travels back
        from a task; searched ranges are returned as they are."""
        parts = [p for p in results if p is not None]
        if self.ranges is not None or len(parts) < 2:
            return results
        c0 = min(at for at, _ in parts)
        c1 = max(at + h.shape[0] for at, h in parts)
        out = np.zeros((c1 - c0, parts[0][1].shape[1]), np.int64)
        for at, h in parts:
            out[at - c0 : at - c0 + h.shape[0]] += h
        return [(c0, out), *([None] * (len(results) - 1))]


@dataclass(frozen=True, eq=False)
class QuantizeWork:
    """The quantize pass: quantize a block, write its data chunk (and, for dynamic blocked
    specs, its parameter chunks) and return its error statistics.

    ``scale``/``zero_point`` are the per-tensor or per-axis parameters; None for blocked
    specs, whose parameters the block reads from (explicit) or writes to (dynamic) the
    destination's ``scale``/``zero_point`` arrays. A float-offset spec (``spec.offset``)
    passes its float64 offsets as ``zero_point`` (its zero points are all 0)."""

    plan: JobPlan
    source: SourceRef
    dest: DestRef
    scale: np.ndarray | None
    zero_point: np.ndarray | None

    def __call__(self, b: Block) -> tuple[ErrorStats, WorstGroups | None]:
        """The block's error statistics and, for a blocked spec, its worst groups."""
        plan = self.plan
        qt = plan.qt
        source = self.source.open()
        data = self.dest.writer("data")
        stored = data.array.dtype
        q = scratch("quantized", b.shape, qt.dtype)
        errs = ErrorStats.empty(plan.block_channels(b))
        bs = plan.spec.block_size
        worst = WorstGroups.empty() if bs and not qt.is_float else None  # integer types
        pieces = self._pieces(source, b)
        if plan.dynamic:  # the block's parameters, gathered from its pieces, written at the end
            pk_block = param_region(b.key, plan.axis, bs)
            pshape = tuple(k.stop - k.start for k in pk_block)
            s_block = scratch("dynamic-scale", pshape, np.float32)
            z_block = scratch("dynamic-zero-point", pshape, np.float64)
        for region, x in pieces:
            rel = _relative(region, b.key)
            qp = q[rel] if rel else q
            copy_back = not qp.flags.c_contiguous  # the piece is not a run of the block
            if copy_back:
                qp = scratch("quantized-piece", x.shape, qt.dtype)
            fused = self._dynamic_fused(x, qp) if plan.dynamic else None
            if fused is not None:  # ranges, parameters and values (and errors) in one pass
                s, z, layout, errors = fused
                err, sums = self._errors(x, s, z, layout, qp, errors)
            else:
                s, z, layout = self._params(region, x)
                err, sums = self._quantize_piece(x, s, z, layout, qp)
            if err.nonfinite.any() and plan.spec.nan_policy == "error":
                raise NonFiniteBlock(b)  # before anything of this block is written
            if worst is not None:
                pk = param_region(region, plan.axis, bs)
                worst = worst.merged(
                    block_worst_groups(
                        x,
                        qp,
                        s,
                        z,
                        layout,
                        qt,
                        qt.qrange(plan.spec.narrow_range)[0],
                        [k.start for k in pk],
                        blocked_param_shape(plan.shape, plan.axis, bs),
                        sums,
                    )
                )
            if copy_back:
                q[rel] = qp
            merge_into(errs, err, plan.offset(region) - plan.offset(b.key))
            if plan.dynamic:
                prel = _relative(param_region(region, plan.axis, bs), pk_block)
                s_block[prel] = s
                z_block[prel] = z
        self.dest.check()
        if plan.dynamic:
            scale_out = self.dest.writer("scale")
            scale_out[pk_block] = s_block.astype(scale_out.array.dtype, copy=False)
            if z_block.any():  # all-zero zero points (symmetric) are the fill value: not written
                zp_out = self.dest.writer("zero_point")
                zp_out[pk_block] = z_block.astype(zp_out.array.dtype)
        data[b.key] = q.view(stored) if q.dtype != stored else q  # float8: bit patterns
        return errs, worst

    def _pieces(self, source, b: Block):
        """``(region, x)`` of the block piece by piece (one stored chunk each, so each stays in
        the CPU's cache between the kernels that use it); for a dynamic spec only where every
        piece holds whole parameter groups, else the whole block at once."""
        plan = self.plan
        if not plan.dynamic:
            return read_pieces(source, b.key)
        bs, n = plan.spec.block_size, plan.shape[plan.axis]
        if all(
            r[plan.axis].start % bs == 0 and (r[plan.axis].stop % bs == 0 or r[plan.axis].stop == n)
            for r in source.pieces(b.key)
        ):
            return read_pieces(source, b.key)
        return [(b.key, read_region(source, b.key))]

    def _params(self, key: tuple[slice, ...], x: np.ndarray):
        """(scale, zero_point, layout) for the region ``key`` holding ``x``."""
        plan = self.plan
        bs = plan.spec.block_size
        if plan.dynamic:  # blocked, each parameter block its own range
            return dynamic_params(x, plan.qt, plan.spec, plan.axis)
        if plan.axis is None:
            return (
                self.scale.reshape(()),
                self.zero_point.reshape(()),
                plan_layout(x.shape, (), None, None),
            )
        if bs:
            pk = param_region(key, plan.axis, bs)
            s = np.asarray(self.dest.array("scale")[pk], np.float32)
            z = np.asarray(self.dest.array("zero_point")[pk], np.float64)
            return s, z, plan_layout(x.shape, s.shape, plan.axis, bs)
        sl = key[plan.axis]
        s, z = self.scale[sl], self.zero_point[sl]
        return s, z, plan_layout(x.shape, s.shape, plan.axis, None)

    def _dynamic_fused(self, x, out):
        """:func:`dynamic_blocked` for this job's spec with the error sums where it can take
        them: ``(scale, zero_point, layout, errors)``, without the non-finite count (the
        error sums count them)."""
        fused = dynamic_blocked(x, self.plan.qt, self.plan.spec, self.plan.axis, out, True)
        return None if fused is None else (*fused[:3], fused[4])

    def _quantize_piece(self, x, s, z, layout, out) -> ErrorStats:
        """Quantize ``x`` into ``out`` and return its error statistics (:meth:`_errors`)."""
        if self.plan.spec.float_offset:  # z holds the float offsets
            from ..core.offsets import offset_quantize
            from ..rounding import round_code

            spec = self.plan.spec
            offset_quantize(
                x,
                s,
                z,
                layout,
                self.plan.qt,
                code=round_code(spec.round_mode),
                narrow_range=spec.narrow_range,
                out=out,
            )
            return self._offset_errors(x, s, z, layout, out)
        quantize_spec(x, s, z, layout, self.plan.qt, self.plan.spec, out)
        return self._errors(x, s, z, layout, out)

    def _errors(self, x, s, z, layout, out, known=None):
        """The error statistics of ``x`` quantized as ``out``, and for a blocked integer spec
        whose groups the error kernel sums in its pass (``groups_in_pass``) the groups'
        ``(x2, e2, emax)`` (else None: :func:`block_worst_groups` computes them); ``known``:
        both, from the fused kernel. NaN then follows the spec's ``nan_policy``
        (``zero_point``: the zero point; ``min``: the kernel's minimum)."""
        from ..core.affine import affine_dequantize
        from ..kernels.errors import groups_in_pass

        plan = self.plan
        qt, spec = plan.qt, plan.spec
        lo_q, hi_q = qt.qrange(spec.narrow_range)
        sums = None
        if known is not None:
            err, sums = known
        elif qt.is_float:
            xhat = affine_dequantize(out, s, None, layout, qt)
            s_e = layout.expand(s).astype(np.float64)
            z_e = layout.expand(z).astype(np.float64)
            err = block_errors(x, xhat, s_e, z_e, qt, lo_q, hi_q, plan.stat_axis)
        else:
            if spec.block_size and groups_in_pass(layout.cblock, layout.iblock, layout.pshape3[2]):
                sums = tuple(scratch(f"group-{k}", layout.pshape3, np.float64) for k in range(3))
            err = block_errors_fused(x, out, s, z, layout, qt, lo_q, plan.stat_axis, sums)
        if err.nonfinite.any() and spec.nan_policy == "zero_point" and not qt.is_float:
            nan_to_zero_point(x, out, z, layout, qt)
        if err.nonfinite.any() and spec.nan_policy == "fill":
            fill_nan(x, out, qt)
        return err, sums

    def _offset_errors(self, x, s, o, layout, out):
        """:meth:`_errors` of a float-offset spec: the values qstream's dequantize gives
        (``q * scale + offset``), compared in float64; clipped = beyond half a step outside
        the code range."""
        from ..core.offsets import offset_dequantize

        plan = self.plan
        qt, spec = plan.qt, plan.spec
        lo_q, hi_q = qt.qrange(spec.narrow_range)
        xhat = offset_dequantize(out, s, o, layout, np.float32)
        s_e = layout.expand(np.asarray(s, np.float64))
        # (block_errors counts x beyond (hi_q - zp + 0.5) * s: with zp = -o / s, the range's)
        z_e = -layout.expand(np.asarray(o, np.float64)) / s_e
        err = block_errors(x, xhat, s_e, z_e, qt, lo_q, hi_q, plan.stat_axis)
        if err.nonfinite.any() and spec.nan_policy == "zero_point":
            nan_to_zero_point(x, out, np.zeros(np.shape(s)), layout, qt)
        if err.nonfinite.any() and spec.nan_policy == "fill":
            fill_nan(x, out, qt)
        return err, None


@dataclass(frozen=True, eq=False)
class DequantizeWork:
    """The dequantize pass: read a block of a quantized group, write it as ``dtype``."""

    source: DestRef  # the quantized group
    dest: DestRef  # the plain output array (``url`` is the array itself)
    dtype: str

    def __call__(self, b: Block) -> None:
        from ..io.stores import ArrayWriter, open_source

        token = self.dest.token
        arr = worker_cached((token, "qarray"), self._open_quantized)
        reader = worker_cached((token, "qreader"), lambda: open_source(arr.data))
        writer = worker_cached((token, "deq-writer"), self._open_writer(ArrayWriter))
        out_dtype = np.dtype(self.dtype) if self.dtype != "bfloat16" else _bf16()
        q = reader.view(b.key)  # a mapped uncompressed chunk, else read into a buffer
        if q is None or not q.flags.c_contiguous:
            q = reader.read(b.key, out=scratch("q", b.shape, reader.dtype))
        y = arr.dequantize_region(b.key, q, out_dtype, out=scratch("y", b.shape, out_dtype))
        self.dest.check(writer.array)
        writer[b.key] = y.view(writer.array.dtype)

    def _open_quantized(self):
        from ..io.qarray import open_quantized

        return open_quantized(self.source.url, storage_options=self.source.storage_options)

    def _open_writer(self, cls):
        def make():
            import zarr

            from ..io.stores import open_store

            store = open_store(self.dest.url, mode="w", storage_options=self.dest.storage_options)
            return cls(zarr.open_array(store=store, mode="r+"))

        return make


def fill_nan(x: np.ndarray, q: np.ndarray, qt) -> None:
    """Set the codes in ``q`` of ``x``'s NaN values to the type's minimum, the code the
    ``fill`` NaN policy reserves for missing values."""
    nan = np.isnan(x)
    q[nan] = np.asarray(qt.qmin).astype(qt.widened).astype(qt.dtype)


def _bf16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)
