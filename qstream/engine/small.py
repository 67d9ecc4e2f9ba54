"""Tensors that are one block of their job, converted start to end in one unit of work.

A checkpoint's cost per tensor is what a job costs beyond its blocks: passes handed to an
executor and merged, a group created, made ready and completed document by document. A
mixture-of-experts checkpoint has tens of thousands of tensors, most of them small. Here a
tensor whose job is one block is read, calibrated, quantized and written by one worker
thread (or one Dask task) with nothing else in between: the same :class:`QuantizeJob` plans
and computes it, its passes run inline (:class:`~qstream.engine.executors.InlineExecutor`),
so values, parameters and report are those of the job's own run, bit for bit; its members
are kept in memory (:class:`MemoryDest`) and its group is written whole and published by one
rename (:func:`qstream.io.qarray.write_group`): a tensor's folder is complete or absent.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..io import destination, qarray
from ..io.destination import Action, Destination
from ..spec import ErrorStats, WorstGroups, merge_into
from .executors import InlineExecutor
from .job import QuantizeJob
from .plan import block_budget
from .work import QuantizeWork, worker_cached


class _Captured:
    """What a block work writes to one member, kept in memory."""

    def __init__(self, dtype) -> None:
        self.array = type("A", (), {"dtype": np.dtype(dtype)})()
        self.values: np.ndarray | None = None
        self.shape: tuple[int, ...] = ()

    def __setitem__(self, key, value) -> None:
        if self.values is None:
            whole = tuple(slice(0, n) for n in self.shape)
            if key == whole and np.shape(value) == self.shape:  # (one block: no zeros first)
                self.values = np.array(value, self.array.dtype)
                return
            self.values = np.zeros(self.shape, self.array.dtype)
        self.values[key] = value


class MemoryDest:
    """A destination whose members are arrays in memory (the work's ``dest``)."""

    def __init__(self, members: dict[str, dict]) -> None:
        self._members = {}
        for name, kw in members.items():
            c = _Captured(kw["dtype"])
            c.shape = tuple(kw["shape"])
            self._members[name] = c

    def check(self, node=None) -> None:
        """(Nothing to check: nothing is written until the group is published.)"""

    def writer(self, name: str) -> _Captured:
        return self._members[name]

    def values(self, name: str) -> np.ndarray | None:
        return self._members[name].values


def is_small(t, spec, max_memory) -> bool:
    """Whether the tensor ``t`` is one block of its job under ``spec`` (at most one block
    budget of float32 or wider values), so :func:`convert_small` takes it."""
    if spec.scale is not None and spec.block_size:  # explicit group scales: read from DST
        return False
    itemsize = max(4, np.dtype(t.dtype).itemsize)
    return math.prod(t.shape) * itemsize <= block_budget(max_memory)


def convert_small(
    t,
    spec,
    path,
    *,
    source: str,
    name: str,
    compression: str,
    max_memory=None,
    overwrite: bool = False,
) -> dict[str, Any] | None:
    """Convert the checkpoint tensor ``t`` into the new group ``path`` (a local path inside a
    locked root) in this thread; its result (as the conversion lists it), or None when its job
    is more than one block (then the job runs as usual). A finished group of the same job at
    ``path`` is reused; anything of qstream's there is replaced."""
    t0 = time.perf_counter()
    job = QuantizeJob(
        t,
        spec,
        max_memory=max_memory,
        executor=InlineExecutor(),
        checkpoint=(source, name),
        compression=compression,
    )
    try:
        if len(job.blocks) != 1:
            return None
        # read once (not mapped: see Source.maps), for every pass
        job.source.maps = False
        whole = tuple(slice(0, n) for n in job.plan.shape)
        job.source.pinned = job.source.read(whole, np.empty(job.plan.shape, job.source.dtype))
        fp = job.fingerprint()
        action, existing = Destination(path, "quantized", fp).look(overwrite=overwrite)
        if action is Action.COMPLETE:
            return _result(job, existing.meta["report"])
        if action is not Action.CREATE:
            destination.remove_output(path, existing)
        cal = job.calibration()
        members = job.member_arrays(progress_log=False)
        dest = MemoryDest(members)
        per = cal.params is not None and not spec.block_size
        work = QuantizeWork(
            job.plan,
            job.ref,
            dest,
            cal.params.scale if per else None,
            cal.params.zero_point if per else None,
        )
        errors = ErrorStats.empty(job.plan.channels)
        worst = [WorstGroups.empty() if job.keeps_worst_groups() else None]

        def merge(b, result) -> None:
            err, groups = result
            merge_into(errors, err, job.plan.offset(b.key))
            if groups is not None:
                worst[0] = worst[0].merged(groups)

        job.scan(job.blocks, work, merge, None)
        if cal.params is not None and math.prod(job.plan.param_shape):
            scale = cal.params.scale.astype(members["scale"]["dtype"])
            zero_point = cal.params.zero_point.astype(members["zero_point"]["dtype"])
        else:  # dynamic groups: what the block wrote
            scale, zero_point = dest.values("scale"), dest.values("zero_point")
        summary = cal.summary()
        meta = {**job.new_meta(fp, path), "calibration": summary, "ready": True}
        meta, report, data_attrs = job.finished(
            meta, summary, (errors, worst[0]), path, t0, 0, scale, zero_point
        )
        if zero_point is not None and not np.any(zero_point):
            zero_point = None  # the fill value: not written
        qarray.write_group(
            path,
            {"qstream": meta},
            {
                "data": (members["data"], dest.values("data"), data_attrs),
                "scale": (members["scale"], scale, None),
                "zero_point": (members["zero_point"], zero_point, None),
            },
        )
        return _result(job, report.to_dict())
    finally:
        job.close()


def one_chunk(arr) -> bool:
    """Whether the quantized tensor ``arr`` is stored in one chunk (see
    :func:`dequantize_small`)."""
    return math.prod(-(-n // c) for n, c in zip(arr.shape, arr.data.chunks, strict=True)) == 1


def dequantize_small(
    arr, src_loc: str, path, *, dtype: str, compression: str, fresh: bool = False
) -> dict | None:
    """Dequantize the quantized tensor ``arr`` (one stored chunk) into the new array ``path``
    (a local path inside a locked root) in this thread, as :func:`qstream.engine.job.
    dequantize` would, bytes and metadata alike; its result, or None when ``arr`` is more
    than one chunk (then the job runs as usual). ``fresh``: the root is new, nothing is at
    ``path`` to look at."""
    from ..qtypes import float_dtype
    from .job import dequantized_array, dequantized_fingerprint

    if not one_chunk(arr):
        return None
    out_dtype = float_dtype(dtype)
    fp = dequantized_fingerprint(src_loc, arr, out_dtype, compression)
    result = {"kept": False, "bytes_written": int(math.prod(arr.shape) * out_dtype.itemsize)}
    if not fresh:
        action, existing = Destination(path, "dequantized", fp).look(overwrite=False)
        if action is Action.COMPLETE:
            return result
        if action is not Action.CREATE:
            destination.remove_output(path, existing)
    whole = tuple(slice(0, n) for n in arr.shape)
    y = arr.dequantize_region(whole, arr.quantized(whole), out_dtype)
    kw = dequantized_array(arr, out_dtype, compression)
    meta = {"dequantized_from": src_loc, "dtype": out_dtype.name, "fingerprint": fp}
    values = y.view(kw["dtype"]) if y.dtype != kw["dtype"] else y
    qarray.write_array(path, kw, values, {"qstream": {**meta, "complete": True}})
    return result


@dataclass(frozen=True)
class TensorItem:
    """One small tensor of a conversion, as a unit of work (``shape``: its size as float32,
    which executors use to size their tasks)."""

    index: int
    name: str
    key: str
    spec: dict | None  # None: kept
    shape: tuple[int, ...]
    keep_dtype: str | None = None  # kept: rounded to this type (a recipe's keep rule)


@dataclass(frozen=True, eq=False)
class SmallTensorWork:
    """Converts a :class:`TensorItem` into its group below ``dst``: picklable (the checkpoint
    is opened by path, once per process), so that a cluster's workers convert tensors too.
    Returns the tensor's result, or None when its job is more than one block (the driver then
    runs the job as usual)."""

    token: str
    checkpoint: Any  # its path, or a CheckpointSource (every worker reads it)
    source: str  # its location, as the jobs' identities name it
    dst: str
    compression: str
    max_memory: int | None
    overwrite: bool

    def register(self, tensors) -> None:
        """Use the already open checkpoint ``tensors`` in this process."""
        worker_cached((self.token, "checkpoint"), lambda: tensors)

    def __call__(self, item: TensorItem) -> dict | None:
        from ..io.checkpoints import open_checkpoint
        from ..spec import QuantSpec
        from .checkpoint import keep_tensor

        ck = self.checkpoint
        opener = ck.open if hasattr(ck, "open") else lambda: open_checkpoint(ck)
        tensors = worker_cached((self.token, "checkpoint"), opener)
        t = tensors[item.name]
        path = destination.tensor_path(self.dst, item.key)
        if item.spec is None:
            return keep_tensor(t, path, self.compression, self.max_memory, item.keep_dtype)
        return convert_small(
            t,
            QuantSpec.from_dict(item.spec),
            path,
            source=self.source,
            name=item.name,
            compression=self.compression,
            max_memory=self.max_memory,
            overwrite=self.overwrite,
        )


def _result(job: QuantizeJob, report: dict) -> dict[str, Any]:
    """The conversion's entry for a tensor whose job reported ``report``."""
    params = (report.get("calibration") or {}).get("params")
    return {
        "kept": False,
        "error": report.get("error"),
        "bytes_after": int(qarray.stored_nbytes(job.plan.shape, job.plan.qt)),
        "passes": report.get("passes"),
        "params": bool(params),
    }
