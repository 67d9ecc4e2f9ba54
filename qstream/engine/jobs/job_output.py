"""A store job's output group: its metadata, its members, their creation, and its checks.

The driver alone writes the output's metadata. A new output (:func:`create`) gets its
group's metadata first (``ready: false``), then its members and the parameters, then
``ready: true``; see :mod:`qstream.io.outputs.qarray` for the on-disk format and the destination
rules. The checks here tell whether an output lost parts (:func:`damaged`,
:func:`members_lost`). A ``.zip`` output is built in a directory and packed at the end
(:func:`pack_zip`).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from ...core import param_dimension_names
from ...errors import StoreError
from ...io.outputs import Lease, ProgressLog, destination, qarray
from ...io.storage import ArrayWriter, open_group
from ...io.storage import compression as compressions
from ...spec import Calibration, GroupSQNR, WorstGroups
from .job_report import keeps_worst_groups
from .passes import JobView

PARAM_CHUNK = 1 << 18  # parameters per chunk of a per-axis scale/zero_point (at least)


def new_meta(job: JobView, fp: str, dst: Any) -> dict[str, Any]:
    """The metadata of a new output of ``job`` (``ready``/``complete`` false)."""
    plan, qt = job.plan, job.plan.qt
    return {
        "version": qarray.FORMAT_VERSION,
        "fingerprint": fp,
        "ready": False,
        "complete": False,
        "spec": job.spec.to_dict(),
        "source": job.source.description,
        "dtype": qt.name,
        "axis": plan.axis,
        "storage": qarray.storage_of(qt),
        **({"layout": job.layout} if job.layout != "group" else {}),
        **Lease.fields(dst, job.token),  # object stores: checked before ``complete``
    }


def member_arrays(job: JobView, *, progress_log: bool = True) -> dict[str, dict[str, Any]]:
    """The ``create_array`` keywords of the output's members (``data``, ``scale``,
    ``zero_point`` and, unless ``progress_log`` is false, ``_progress``)."""
    plan, qt, spec = job.plan, job.plan.qt, job.spec
    store_dtype, serializer = qarray.data_encoding(qt)
    zp_dtype = qt.widened if not qt.is_float else np.dtype(np.float32)
    kw: dict[str, Any] = {
        "compressors": compressions.compressors(job.compression),
        "shape": plan.param_shape,
        "fill_value": 0,
        "chunk_key_encoding": qarray.FLAT_KEYS,
        "dimension_names": param_dimension_names(
            len(plan.shape), plan.axis, spec.block_size, job.dims
        ),
    }
    if plan.axis is not None and not spec.block_size:  # ~1 MiB or more each
        c = plan.chunks[plan.axis]
        kw["chunks"] = (max(1, min(plan.param_shape[0], c * max(1, PARAM_CHUNK // c))),)
    elif plan.axis is not None and spec.block_size:
        # one parameter chunk per block: dynamic blocks write their own
        pc = list(plan.chunks)
        pc[plan.axis] = max(1, pc[plan.axis] // spec.block_size)
        kw["chunks"] = tuple(pc)
        # group scales are as many as 1/block_size of the data and hardly compress:
        # stored raw, a block's parameter chunks cost a write, not a zstd pass
        kw["compressors"] = None
    members = {
        "data": {
            "shape": plan.shape,
            "chunks": plan.chunks,
            "dtype": store_dtype,
            "serializer": serializer,
            "fill_value": 0,
            "compressors": compressions.compressors(job.compression, job.source.compressors),
            "config": qarray.WRITE_ALL_CHUNKS,
            "chunk_key_encoding": qarray.FLAT_KEYS,
            "dimension_names": list(job.dims),
        },
        "scale": {"dtype": spec.scale_numpy_dtype, **kw},
        "zero_point": {"dtype": zp_dtype, **kw},
    }
    if spec.float_offset:  # x = q * scale + offset (float64: CF's add_offset)
        members["offset"] = {"dtype": np.float64, **kw}
    if progress_log:
        keep, bins = (WorstGroups.KEEP, GroupSQNR.SLOTS) if keeps_worst_groups(plan) else (0, 0)
        members[ProgressLog.NAME] = ProgressLog.array_spec(plan.channels, keep, bins)
    return members


def whole(shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The key of a whole array of ``shape``."""
    return tuple(slice(0, n) for n in shape)


def create(job: JobView, dst: Any, cal: Calibration, fp: str) -> tuple[Any, dict[str, Any]]:
    """A new output: the group's metadata first (``ready: false``), then the members and
    the parameters, then ``ready: true``. Returns the group and its members (zarr)."""
    plan = job.plan
    meta = new_meta(job, fp, dst)
    group = qarray.create_group(dst, {"qstream": meta}, job.storage_options)
    try:
        arrays = qarray.create_arrays(group, member_arrays(job))
        n_params = math.prod(plan.param_shape)
        if cal.params is not None and n_params:
            ArrayWriter(arrays["scale"])[whole(plan.param_shape)] = cal.params.scale.astype(
                arrays["scale"].dtype
            )
            zp = cal.params.zero_point.astype(arrays["zero_point"].dtype)
            if zp.any():  # all-zero zero points (symmetric) are the fill value
                ArrayWriter(arrays["zero_point"])[whole(plan.param_shape)] = zp
            if cal.params.offset is not None:
                ArrayWriter(arrays["offset"])[whole(plan.param_shape)] = cal.params.offset
    except StoreError:
        raise
    except OSError as e:
        raise StoreError(f"cannot write {dst}: {e}") from None
    meta["calibration"] = cal.summary()
    meta["ready"] = True
    qarray.set_meta(group, meta)
    return group, arrays


def members_lost(dst: Any, storage_options: dict[str, Any] | None) -> bool:
    """Whether the output at ``dst`` lacks one of its member arrays."""
    group = open_group(dst, mode="r", storage_options=storage_options)
    return bool(qarray.missing_members(group))


def damaged(dst: Any, storage_options: dict[str, Any] | None) -> bool:
    """Whether a finished output at ``dst`` lacks some of its parts."""
    try:
        group = open_group(dst, mode="r", storage_options=storage_options)
        return bool(qarray.gaps(group))
    except (StoreError, KeyError):
        return True


def is_zip(dst: Any) -> bool:
    """Whether ``dst`` names a ``.zip`` output (built elsewhere, then packed)."""
    return isinstance(dst, (str, os.PathLike)) and os.fspath(dst).endswith(".zip")


def pack_zip(directory: str, target: str) -> None:
    """The output built in ``directory`` packed into the zip file ``target`` (uncompressed,
    without the lock file; written under a temporary name, then renamed)."""
    import zipfile

    tmp = f"{target}.{os.getpid()}.partial"
    try:
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)  # (every command makes them)
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
            for root, _, files in os.walk(directory):
                for f in sorted(files):
                    if f == destination.LOCK:
                        continue
                    full = os.path.join(root, f)
                    zf.write(full, os.path.relpath(full, directory))
        os.replace(tmp, target)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise StoreError(f"cannot write {target}: {e}") from None
