"""Tensors that are one block of their job, converted start to end in one unit of work.

A checkpoint's cost per tensor is what a job costs beyond its blocks: passes handed to an
executor and merged, a group created, made ready and completed document by document. A
mixture-of-experts checkpoint has tens of thousands of tensors, most of them small. Here a
tensor whose job is one block is read, calibrated, quantized and written by one worker
thread (or one Dask task) with nothing else in between: the same :class:`QuantizeJob` plans
and computes it, its passes run inline (:class:`~qstream.engine.run.executors.InlineExecutor`),
so values, parameters and report are those of the job's own run, bit for bit; its members
are kept in memory (:func:`~qstream.engine.jobs.job_memory.calibrated_in_memory`) and its group is
written whole and published by one rename (:func:`qstream.io.outputs.qarray.write_group`): a
tensor's folder is complete or absent.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...budget import block_budget
from ...io.outputs import Action, Destination, destination, qarray
from ...spec import QuantSpec
from ..jobs import QuantizeJob, calibrated_in_memory
from ..run import InlineExecutor, worker_cached
from .kept import keep_tensor


def is_small(t: Any, spec: QuantSpec, max_memory: int | None) -> bool:
    """Whether the tensor ``t`` is one block of its job under ``spec`` (at most one block
    budget of float32 or wider values), so :func:`convert_small` takes it."""
    if spec.scale is not None and spec.block_size:  # explicit group scales: read from DST
        return False
    itemsize = max(4, np.dtype(t.dtype).itemsize)
    return math.prod(t.shape) * itemsize <= block_budget(max_memory)


def convert_small(
    t: Any,
    spec: QuantSpec,
    path: str,
    *,
    source: str,
    name: str,
    compression: str,
    max_memory: int | None = None,
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
        dest = Destination(path, "quantized", fp)
        action, existing = dest.look(overwrite=overwrite)
        if action is Action.COMPLETE:
            assert existing.meta is not None  # (a complete output has its metadata)
            dest.clear_stale_lock()
            return _result(job, existing.meta["report"])
        if action is not Action.CREATE:
            destination.remove_output(path, existing)
        cal, out = calibrated_in_memory(job)
        summary = cal.summary()
        meta = {**job.new_meta(fp, path), "calibration": summary, "ready": True}
        meta, report, data_attrs = job.finished(
            meta, summary, (out.errors, out.worst), path, t0, 0, out.scale, out.zero_point
        )
        zero_point = out.zero_point
        if zero_point is not None and not np.any(zero_point):
            zero_point = None  # the fill value: not written
        qarray.write_group(
            path,
            {"qstream": meta},
            {
                "data": (out.members["data"], out.data, data_attrs),
                "scale": (out.members["scale"], out.scale, None),
                "zero_point": (out.members["zero_point"], zero_point, None),
            },
        )
        return _result(job, report.to_dict())
    finally:
        job.close()


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

    def register(self, tensors: Any) -> None:
        """Use the already open checkpoint ``tensors`` in this process."""
        worker_cached((self.token, "checkpoint"), lambda: tensors)

    def __call__(self, item: TensorItem) -> dict[str, Any] | None:
        from ...io.checkpoints import open_checkpoint

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
        "bytes_after": qarray.quantized_nbytes(job.plan.shape, job.spec),  # (with parameters)
        "passes": report.get("passes"),
        "params": bool(params),
    }
