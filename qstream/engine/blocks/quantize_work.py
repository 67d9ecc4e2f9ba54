"""The quantize pass's block work: quantize a block, write its chunks, return its errors."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ...budget import Block
from ...core import Layout, blocked_param_shape, param_region, plan_layout, scratch
from ...qtypes import QType
from ...spec import ErrorStats, MergedStats, QuantSpec, WorstGroups
from ..run import SourceRef
from .blockmath import (
    block_errors,
    block_errors_fused,
    block_worst_groups,
    dynamic_blocked,
    dynamic_params,
    nan_to_zero_point,
    quantize_spec,
)
from .fused_rows import quantize_rows_with_errors
from .regions import JobPlan, Key, read_pieces, read_region, relative_key

if TYPE_CHECKING:
    from ...io.storage import Source

# a blocked integer spec's per-group sums (x2, e2, emax), when the error kernel gives them
GroupSums = tuple[np.ndarray, np.ndarray, np.ndarray]


class BlockDest(Protocol):
    """Where the quantize pass writes: a :class:`~qstream.engine.run.handles.DestRef`, or members
    kept in memory (:class:`~qstream.engine.jobs.job_memory.MemoryDest`)."""

    def writer(self, name: str) -> Any:
        """What ``[key] = values`` writes the member ``name`` through (``.array.dtype``: its
        stored type)."""
        ...

    def check(self, node: Any = None) -> None:
        """Refuse to write once another job has taken the output over."""
        ...

    def array(self, name: str) -> Any:
        """The member ``name`` to read (a blocked spec's explicit parameters)."""
        ...


class NonFiniteBlock(Exception):
    """A block held NaN/inf under nan_policy='error' (the job then names the whole count)."""


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
    dest: BlockDest
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
        errs = MergedStats(ErrorStats, plan.block_channels(b))
        blocked = bool(plan.spec.block_size)
        if blocked:
            axis, bs = plan.groups()
        worst = WorstGroups.empty() if blocked and not qt.is_float else None  # integer types
        pieces = self._pieces(source, b)
        if plan.dynamic:  # the block's parameters, gathered from its pieces, written at the end
            pk_block = param_region(b.key, axis, bs)
            pshape = tuple(k.stop - k.start for k in pk_block)
            s_block = scratch("dynamic-scale", pshape, np.float32)
            z_block = scratch("dynamic-zero-point", pshape, np.float64)
        for region, x in pieces:
            rel = relative_key(region, b.key)
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
                pk = param_region(region, axis, bs)
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
                        blocked_param_shape(plan.shape, axis, bs),
                        sums,
                    )
                )
            if copy_back:
                q[rel] = qp
            errs.add(err, plan.offset(region) - plan.offset(b.key))
            if plan.dynamic:
                prel = relative_key(param_region(region, axis, bs), pk_block)
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
        return errs.total, worst

    def _pieces(self, source: Source, b: Block) -> Iterable[tuple[Key, np.ndarray]]:
        """``(region, x)`` of the block piece by piece (one stored chunk each, so each stays in
        the CPU's cache between the kernels that use it); for a dynamic spec only where every
        piece holds whole parameter groups, else the whole block at once."""
        plan = self.plan
        if not plan.dynamic:
            return read_pieces(source, b.key)
        axis, bs = plan.groups()
        n = plan.shape[axis]
        if all(
            r[axis].start % bs == 0 and (r[axis].stop % bs == 0 or r[axis].stop == n)
            for r in source.pieces(b.key)
        ):
            return read_pieces(source, b.key)
        return [(b.key, read_region(source, b.key))]

    def _params(self, key: Key, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, Layout]:
        """(scale, zero_point, layout) for the region ``key`` holding ``x``."""
        plan = self.plan
        if plan.dynamic:  # blocked, each parameter block its own range
            return dynamic_params(x, plan.qt, plan.spec, plan.groups()[0])
        if plan.spec.block_size:  # explicit groups, read from the destination
            axis, bs = plan.groups()
            pk = param_region(key, axis, bs)
            s = np.asarray(self.dest.array("scale")[pk], np.float32)
            z = np.asarray(self.dest.array("zero_point")[pk], np.float64)
            return s, z, plan_layout(x.shape, s.shape, axis, bs)
        scale, zero_point = self.scale, self.zero_point
        assert scale is not None and zero_point is not None  # (given for these specs)
        if plan.axis is None:
            return scale.reshape(()), zero_point.reshape(()), plan_layout(x.shape, (), None, None)
        sl = key[plan.axis]
        s, z = scale[sl], zero_point[sl]
        return s, z, plan_layout(x.shape, s.shape, plan.axis, None)

    def _dynamic_fused(self, x: np.ndarray, out: np.ndarray) -> tuple[Any, ...] | None:
        """:func:`dynamic_blocked` for this job's spec with the error sums where it can take
        them: ``(scale, zero_point, layout, errors)``, without the non-finite count (the
        error sums count them)."""
        fused = dynamic_blocked(x, self.plan.qt, self.plan.spec, self.plan.groups()[0], out, True)
        return None if fused is None else (*fused[:3], fused[4])

    def _quantize_piece(
        self, x: np.ndarray, s: np.ndarray, z: np.ndarray, layout: Layout, out: np.ndarray
    ) -> tuple[ErrorStats, GroupSums | None]:
        """Quantize ``x`` into ``out`` and return its error statistics (:meth:`_errors`)."""
        if self.plan.spec.float_offset:  # z holds the float offsets
            from ...core import offset_quantize
            from ...rounding import round_code

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
        plan = self.plan
        if plan.stat_axis == 0:  # (the error channels are the rows)
            lo_q = plan.qt.qrange(plan.spec.narrow_range)[0]
            err = quantize_rows_with_errors(x, s, z, layout, plan.qt, plan.spec, out, lo_q)
            if err is not None:
                return self._errors(x, s, z, layout, out, (err, None))
        quantize_spec(x, s, z, layout, plan.qt, plan.spec, out)
        return self._errors(x, s, z, layout, out)

    def _errors(
        self,
        x: np.ndarray,
        s: np.ndarray,
        z: np.ndarray,
        layout: Layout,
        out: np.ndarray,
        known: tuple[ErrorStats, GroupSums | None] | None = None,
    ) -> tuple[ErrorStats, GroupSums | None]:
        """The error statistics of ``x`` quantized as ``out``, and for a blocked integer spec
        whose groups the error kernel sums in its pass (``groups_in_pass``) the groups'
        ``(x2, e2, emax)`` (else None: :func:`block_worst_groups` computes them); ``known``:
        both, from the fused kernel. NaN then follows the spec's ``nan_policy``
        (``zero_point``: the zero point; ``min``: the kernel's minimum)."""
        from ...core import affine_dequantize

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
            if spec.block_size and groups_in(layout):
                x2, e2, emax = (scratch(f"group-{k}", layout.pshape3, np.float64) for k in range(3))
                sums = (x2, e2, emax)
            err = block_errors_fused(x, out, s, z, layout, qt, lo_q, plan.stat_axis, sums)
        apply_nan_policy(x, out, z, layout, qt, spec, err)
        return err, sums

    def _offset_errors(
        self, x: np.ndarray, s: np.ndarray, o: np.ndarray, layout: Layout, out: np.ndarray
    ) -> tuple[ErrorStats, None]:
        """:meth:`_errors` of a float-offset spec: the values qstream's dequantize gives
        (``q * scale + offset``), compared in float64; clipped = beyond half a step outside
        the code range."""
        from ...core import offset_dequantize

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


def apply_nan_policy(
    x: np.ndarray,
    out: np.ndarray,
    z: np.ndarray,
    layout: Layout,
    qt: QType,
    spec: QuantSpec,
    err: ErrorStats,
) -> None:
    """Set the codes in ``out`` of ``x``'s NaN values as the spec's ``nan_policy`` says
    (``zero_point``: the zero point ``z``, for integer types; ``fill``: the type's minimum;
    ``min``: the kernel's minimum, left as it is) when ``err`` counted non-finite values."""
    if err.nonfinite.any() and spec.nan_policy == "zero_point" and not qt.is_float:
        nan_to_zero_point(x, out, z, layout, qt)
    if err.nonfinite.any() and spec.nan_policy == "fill":
        fill_nan(x, out, qt)


def groups_in(layout: Layout) -> bool:
    """Whether the error kernel sums a blocked layout's groups in its pass (``groups_in_pass``;
    its module loads Numba: blocked specs only run Numba's kernels)."""
    from ...kernels.error_stats import groups_in_pass

    return groups_in_pass(layout.cblock, layout.iblock, layout.pshape3[2])


def fill_nan(x: np.ndarray, q: np.ndarray, qt: QType) -> None:
    """Set the codes in ``q`` of ``x``'s NaN values to the type's minimum, the code the
    ``fill`` NaN policy reserves for missing values."""
    nan = np.isnan(x)
    q[nan] = np.asarray(qt.qmin).astype(qt.widened).astype(qt.dtype)
