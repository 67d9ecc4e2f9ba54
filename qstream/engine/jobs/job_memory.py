"""A one-block job's quantize pass run in this thread, its members kept in memory.

The small tensors of a conversion (:mod:`qstream.engine.convert.one_block`) and its packs
(:mod:`qstream.engine.convert.pack_writer`) are jobs whose output is written whole once they are
done:
:func:`quantize_in_memory` runs the quantize pass of such a job into a :class:`MemoryDest`
and hands back the members' values and the merged error statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...budget import Block
from ...core import ALIGN, aligned_empty
from ...spec import Calibration, ErrorStats, MergedStats, RangeStats, WorstGroups
from ..blocks import QuantizeWork

if TYPE_CHECKING:
    from .job import QuantizeJob


class Captured:
    """What a block work writes to one member, kept in memory."""

    def __init__(self, dtype: Any) -> None:
        self.array = type("A", (), {"dtype": np.dtype(dtype)})()
        self.values: np.ndarray | None = None
        self.shape: tuple[int, ...] = ()

    def __setitem__(self, key: tuple[slice, ...], value: np.ndarray) -> None:
        if self.values is None:
            whole = tuple(slice(0, n) for n in self.shape)
            if key == whole and np.shape(value) == self.shape:  # (one block: no zeros first)
                dtype = self.array.dtype
                if _writable_as_is(value, dtype):
                    # the worker's own buffer, kept until it is written (quantize_in_memory)
                    self.values = value
                    return
                # on a 4 KiB boundary, as the O_DIRECT write of the chunk needs (no copy there)
                raw = aligned_empty(max(1, math.prod(self.shape)) * dtype.itemsize)
                self.values = raw.view(dtype)[: math.prod(self.shape)].reshape(self.shape)
                self.values[...] = value
                return
            self.values = np.zeros(self.shape, self.array.dtype)
        self.values[key] = value


def _writable_as_is(value: Any, dtype: np.dtype) -> bool:
    """Whether ``value`` can be written as it is: C-contiguous ``dtype`` values on an
    ``ALIGN`` boundary, as the ``O_DIRECT`` write of a chunk needs."""
    return (
        isinstance(value, np.ndarray)
        and value.dtype == dtype
        and value.flags.c_contiguous
        and value.ctypes.data % ALIGN == 0
    )


class MemoryDest:
    """A destination whose members are arrays in memory (the work's ``dest``)."""

    def __init__(self, members: dict[str, dict]) -> None:
        self._members = {}
        for name, kw in members.items():
            c = Captured(kw["dtype"])
            c.shape = tuple(kw["shape"])
            self._members[name] = c

    def check(self, node: Any = None) -> None:
        """(Nothing to check: nothing is written until the group is published.)"""

    def writer(self, name: str) -> Captured:
        """The member ``name``, kept in memory."""
        return self._members[name]

    def array(self, name: str) -> Any:
        """(Not available: the members in memory are written, never read. No job run in
        memory has explicit parameter groups, the only members a block reads.)"""
        raise TypeError(f"the member {name!r} of a job run in memory cannot be read")

    def values(self, name: str) -> np.ndarray | None:
        """What was written to the member ``name`` (None: nothing)."""
        return self._members[name].values


@dataclass
class MemoryOutput:
    """What :func:`quantize_in_memory` gives: the members' ``create_array`` keywords, their
    values (``zero_point`` None: all zero, the fill value, never written) and the merged
    error statistics (``worst``: the worst parameter groups, where the job keeps them)."""

    members: dict[str, dict]
    data: np.ndarray | None
    scale: np.ndarray | None
    zero_point: np.ndarray | None
    errors: ErrorStats
    worst: WorstGroups | None


def calibrated_in_memory(job: QuantizeJob) -> tuple[Calibration, MemoryOutput]:
    """``job.calibration()`` then :func:`quantize_in_memory`: in one pass over the values
    where :func:`~qstream.engine.blocks.calibrate_rows_with_errors` applies (a job of one
    block taken as one piece, its values read once and kept (``source.pinned``), calibrated
    per channel on axis 0 by the channels' ranges, whose rows are its channels): each row's range,
    parameters, codes and error sums are taken by one kernel call while the row is in the
    CPU's cache, the same results bit for bit, the report included: they count as the two
    passes they are (``passes``, ``bytes_read``), made row by row. Raises
    :class:`~qstream.errors.NonFiniteInputError` as the calibration does."""
    out = _calibrated_rows(job)
    if out is not None:
        return out
    cal = job.calibration()
    return cal, quantize_in_memory(job, cal)


def _calibrated_rows(job: QuantizeJob) -> tuple[Calibration, MemoryOutput] | None:
    """:func:`calibrated_in_memory` by the kernel that calibrates too, or None where it
    does not apply."""
    from dataclasses import replace

    from ...core import plan_layout, scratch
    from ..blocks import apply_nan_policy, calibrate_rows_with_errors, read_region
    from .calibration_passes import from_ranges

    plan, spec = job.plan, job.spec
    if (
        job.source.pinned is None
        or len(job.blocks) != 1
        or job.source.pieces(job.blocks[0].key) != [job.blocks[0].key]  # (passes sum by pieces)
        or plan.axis != 0
        or plan.stat_axis != 0
        or plan.dynamic
        or spec.method != "minmax"
        or spec.scale is not None
        or spec.float_offset
        or len(plan.shape) < 2
        or (job.view_histogram and plan.channels == 1)
    ):
        return None
    (b,) = job.blocks
    x = read_region(job.source, b.key)
    q = scratch("quantized", b.shape, plan.qt.dtype)
    got = calibrate_rows_with_errors(x, plan.qt, spec, q)
    if got is None:
        return None
    st, scale, zero_point, err = got
    job.passes += 2  # (the ranges pass and the quantize pass, row by row)
    job.bytes_read += 2 * x.size * job.source.dtype.itemsize
    ranges = MergedStats(RangeStats, plan.channels)
    ranges.add(st)
    cal = from_ranges(
        job, replace(ranges.total, first_nonfinite=st.first_nonfinite), None, (scale, zero_point)
    )
    layout = plan_layout(x.shape, scale.shape, 0, None)
    apply_nan_policy(x, q, zero_point, layout, plan.qt, spec, err)
    errors = MergedStats(ErrorStats, plan.channels)
    errors.add(err)
    members = job.member_arrays(progress_log=False)
    dest = MemoryDest(members)
    data = dest.writer("data")
    stored = data.array.dtype
    data[b.key] = q.view(stored) if q.dtype != stored else q
    assert cal.params is not None  # (from the kernel)
    out = MemoryOutput(
        members,
        dest.values("data"),
        cal.params.scale.astype(members["scale"]["dtype"]),
        cal.params.zero_point.astype(members["zero_point"]["dtype"]),
        errors.total,
        None,
    )
    return cal, out


def quantize_in_memory(job: QuantizeJob, cal: Calibration) -> MemoryOutput:
    """Run the quantize pass of ``job`` (calibrated: ``cal``) on its blocks in this thread,
    into members kept in memory. Raises
    :class:`~qstream.engine.blocks.quantize_work.NonFiniteBlock` as the pass does.

    A job of one block hands back its codes in this thread's own buffer (no copy of a pack's
    codes, ~3% of a conversion of 1024 tensors): ``data`` is valid until this thread runs a
    quantize pass again, so write it first, as both callers do."""
    plan = job.plan
    members = job.member_arrays(progress_log=False)
    dest = MemoryDest(members)
    params = cal.params
    given = None if params is None or plan.spec.block_size else params  # (per tensor or axis)
    work = QuantizeWork(
        plan,
        job.ref,
        dest,
        None if given is None else given.scale,
        None if given is None else given.zero_point,
    )
    errors = MergedStats(ErrorStats, plan.channels)
    worst = [WorstGroups.empty() if job.keeps_worst_groups() else None]

    def merge(b: Block, result: tuple[ErrorStats, WorstGroups | None]) -> None:
        err, groups = result
        errors.add(err, plan.offset(b.key))
        if groups is not None and worst[0] is not None:
            worst[0] = worst[0].merged(groups)

    job.scan(job.blocks, work, merge, None)
    scale: np.ndarray | None
    zero_point: np.ndarray | None
    if params is not None and 0 not in plan.param_shape:
        scale = params.scale.astype(members["scale"]["dtype"])
        zero_point = params.zero_point.astype(members["zero_point"]["dtype"])
    else:  # dynamic groups: what the blocks wrote
        scale, zero_point = dest.values("scale"), dest.values("zero_point")
    return MemoryOutput(members, dest.values("data"), scale, zero_point, errors.total, worst[0])
