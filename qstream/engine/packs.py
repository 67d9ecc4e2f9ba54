"""Runs of small, alike tensors converted as one unit of work into one pack.

A checkpoint of many tensors pays per tensor what a job costs beyond its bytes: a job's
set-up, a report built channel by channel, a group of arrays written file by file. Here a
run of consecutive tensors with the same shape, dtype and spec (the experts of a layer) is
read into one stacked array and quantized by *one* :class:`~qstream.engine.job.QuantizeJob`
whose spec makes each tensor's parameters exactly its own:

- ``rows``: per channel on axis 0 (the default recipe): the tensors stacked along axis 0 are
  one array whose channels are theirs;
- ``flat``: per tensor: each tensor one row of ``[n, size]``, quantized per channel on axis 0
  (the parameters are computed element by element from each row's range, as a tensor's are);
- ``blocks``: blocked along an axis: the tensors stacked along a new first axis, the blocks
  along the same axis of each (no block crosses two tensors).

The codes and parameters are those of each tensor's own job, bit for bit (the kernels are
element-wise given the parameters; the ranges are exact min/max). The pack is written as one
group (:mod:`qstream.io.packs`); each tensor's error figures come from its own channels'
sums (``blocks``: from one error pass over the tensor). Other tensors (histogram methods,
explicit scales, per-channel on another axis, float offsets) are converted one by one.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..core.layout import dimension_names, normalize_axis, param_dimension_names
from ..errors import NonFiniteInputError
from ..io import packs, qarray
from ..io.packs import ERROR_COLUMNS
from ..spec import ErrorStats, merge_into
from .executors import InlineExecutor
from .plan import block_budget
from .small import MemoryDest
from .work import worker_cached

MAX_PER_PACK = 4096  # tensors of one pack (its document lists each)


def pack_mode(t, spec) -> str | None:
    """How the tensor ``t`` joins a pack under ``spec`` (module docstring), or None."""
    if spec.scale is not None or spec.float_offset or not len(t.shape) or not math.prod(t.shape):
        return None
    if spec.block_size:
        if spec.method not in ("minmax", "dynamic") or spec.axis is None:
            return None
        if spec.qtype.is_float:
            return None
        return "blocks"
    if spec.method != "minmax":
        return None
    if spec.axis is None:
        return "flat"
    return "rows" if normalize_axis(spec.axis, len(t.shape)) == 0 else None


def source_bytes(t) -> int:
    """The tensor's size as its job counts it (float32 or wider values)."""
    return math.prod(t.shape) * max(4, np.dtype(t.dtype).itemsize)


@dataclass(frozen=True)
class PackItem:
    """One pack of a conversion as a unit of work (``shape``: its size as float32, which
    executors use to size their tasks)."""

    seq: int
    names: tuple[str, ...]
    keys: tuple[str, ...]
    positions: tuple[int, ...]
    spec: dict
    mode: str
    shape: tuple[int, ...]

    @property
    def name(self) -> str:
        return packs.pack_name(self.seq)


def plan_packs(entries, max_memory) -> list[tuple[int, int]]:
    """The packs of ``entries`` (``(t, spec)`` of consecutive tensors, None where a tensor is
    not packable): ``(first, end)`` index ranges of runs of at least two alike tensors, each
    within one block budget of source values and :data:`MAX_PER_PACK` tensors."""
    budget = block_budget(max_memory)
    out: list[tuple[int, int]] = []
    start, key, size = 0, None, 0
    spec_keys: dict[int, tuple] = {}  # id(spec) -> (spec, its JSON): recipes share specs
    for i, entry in enumerate([*entries, None]):
        k = None
        if entry is not None:
            t, spec = entry
            known = spec_keys.get(id(spec))
            if known is None or known[0] is not spec:
                known = spec_keys[id(spec)] = (spec, json.dumps(spec.to_dict(), sort_keys=True))
            mode = pack_mode(t, spec)
            if mode is not None and source_bytes(t) <= budget // 2:
                k = (mode, known[1], t.dtype, tuple(t.shape))
        nbytes = source_bytes(entry[0]) if k is not None else 0
        if k is None or k != key or size + nbytes > budget or i - start >= MAX_PER_PACK:
            if key is not None and i - start >= 2:
                out.append((start, i))
            start, key, size = i, k, 0
        size += nbytes
    return out


@dataclass(frozen=True, eq=False)
class PackWork:
    """Converts a :class:`PackItem` into its pack below ``dst``: picklable (the checkpoint is
    opened by path, once per process), like :class:`~qstream.engine.small.SmallTensorWork`.
    Returns the pack's tensors' results, in order."""

    token: str
    checkpoint: Any
    source: str
    dst: str
    compression: str
    max_memory: int | None

    def __call__(self, item: PackItem) -> list[dict]:
        from ..io.checkpoints import open_checkpoint
        from ..spec import QuantSpec

        ck = self.checkpoint
        opener = ck.open if hasattr(ck, "open") else lambda: open_checkpoint(ck)
        tensors = worker_cached((self.token, "checkpoint"), opener)
        ts = [tensors[n] for n in item.names]
        spec = QuantSpec.from_dict(item.spec)
        path = packs.pack_path(self.dst, item.name)
        fp = _fingerprint(item, ts, spec, self.compression)
        found = packs.read_pack_doc(path)
        if found is not None and found.get("fingerprint") == fp and found.get("complete"):
            return results(found)
        if found is not None:  # a pack of another run of this root: made again
            packs.remove_pack(path)
        return convert_pack(item, ts, spec, path, fp, self.source, self.compression)


@dataclass(frozen=True, eq=False)
class UnitWork:
    """A conversion's unit of work: a pack (:class:`PackWork`) or a small tensor
    (:class:`~qstream.engine.small.SmallTensorWork`), so that both share one pipeline."""

    small: Any
    pack: Any

    def __call__(self, item):
        return self.pack(item) if isinstance(item, PackItem) else self.small(item)


def _fingerprint(item: PackItem, ts, spec, compression: str) -> str:
    """What makes two packs the same: the format, the spec, the compression and each
    tensor's name, type, shape and place in its file (with the file's version)."""
    h = hashlib.sha256()
    h.update(f"qstream-pack-{packs.VERSION}-format-{qarray.FORMAT_VERSION}".encode())
    h.update(json.dumps([spec.to_dict(), item.mode, compression], sort_keys=True).encode())
    files: dict[str, list] = {}
    described = []
    for name, t in zip(item.names, ts, strict=True):
        where = getattr(t, "file", None)
        described.append([name, np.dtype(t.dtype).str, list(t.shape), where])
        if where is not None and where[0] not in files:
            st = os.stat(where[0])
            files[where[0]] = [st.st_size, st.st_mtime_ns]
    h.update(json.dumps([described, files], sort_keys=True).encode())
    return h.hexdigest()[:32]


def read_stack(ts) -> np.ndarray:
    """The tensors ``ts`` (same shape and dtype) stacked along a new first axis: one read when
    they lie one after another in one file (safetensors), else one read each."""
    from ..core.scratch import scratch

    t0 = ts[0]
    out = scratch("pack-stack", (len(ts), *t0.shape), t0.dtype)  # (valid until the next pack)
    whole = tuple(slice(0, n) for n in t0.shape)
    f0 = getattr(t0, "file", None)
    if f0 is not None and all(
        getattr(t, "file", None) == (f0[0], f0[1] + i * t0.nbytes) for i, t in enumerate(ts)
    ):
        from ..io.checkpoints import read_file_run

        read_file_run(f0[0], f0[1], out)
        return out
    for i, t in enumerate(ts):
        if not t.read_into(whole, out[i]):
            out[i] = t[whole]
    return out


class _Stack:
    """A pack's stacked values as its job's source (an array-like: no digest of the values,
    which the pack's own fingerprint replaces)."""

    def __init__(self, values: np.ndarray, name: str) -> None:
        self.values, self.name = values, name
        self.shape, self.dtype = values.shape, values.dtype

    def __getitem__(self, key):
        return self.values[key]


def _stacked(x: np.ndarray, spec, mode: str):
    """The stacked array and spec of the pack's job."""
    if mode == "rows":
        return x.reshape(-1, *x.shape[2:]), spec
    if mode == "flat":
        return x.reshape(x.shape[0], -1), replace(spec, axis=0)
    return x, replace(spec, axis=normalize_axis(spec.axis, x.ndim - 1) + 1)


def convert_pack(item: PackItem, ts, spec, path: str, fp: str, source: str, compression: str):
    """Quantize the pack's tensors ``ts`` as one stacked job and publish the pack at ``path``;
    the tensors' results (as the conversion lists them)."""
    from .job import QuantizeJob

    n, shape = len(ts), tuple(ts[0].shape)
    x = read_stack(ts)
    stacked, job_spec = _stacked(x, spec, item.mode)
    job = QuantizeJob(
        _Stack(stacked, item.name), job_spec, executor=InlineExecutor(), compression=compression
    )
    try:
        job.source.pinned = stacked
        try:
            cal = job.calibration()
        except NonFiniteInputError:
            raise _nonfinite(item, x) from None
        members = job.member_arrays(progress_log=False)
        dest = MemoryDest(members)
        from .work import NonFiniteBlock, QuantizeWork

        per = cal.params is not None
        work = QuantizeWork(
            job.plan,
            job.ref,
            dest,
            cal.params.scale if per else None,
            cal.params.zero_point if per else None,
        )
        errors = ErrorStats.empty(job.plan.channels)

        def merge(b, result) -> None:
            merge_into(errors, result[0], job.plan.offset(b.key))

        try:
            job.scan(job.blocks, work, merge, None)
        except NonFiniteBlock:
            raise _nonfinite(item, x) from None
        if per:
            scale = cal.params.scale.astype(members["scale"]["dtype"])
            zero_point = cal.params.zero_point.astype(members["zero_point"]["dtype"])
        else:
            scale, zero_point = dest.values("scale"), dest.values("zero_point")
            if zero_point is None:  # (all zero: never written, the fill value)
                zero_point = np.zeros(scale.shape, members["zero_point"]["dtype"])
        data = dest.values("data")
        pshape = _param_shape(shape, spec)
        scale = scale.reshape(n, *pshape)
        zero_point = zero_point.reshape(n, *pshape)
        data = data.reshape(n, *shape)
        if item.mode == "blocks":
            summaries = _block_errors(x, data, scale, zero_point, spec)
            ranges = {}
        else:
            summaries = brief_errors(errors, n)
            ranges = _ranges(cal.stats, n)
    finally:
        job.close()
    qt = spec.qtype
    entries = {
        "name": list(item.names),
        "key": None if item.keys == item.names else list(item.keys),  # (None: the names)
        "pos": list(item.positions),
        **ranges,
        "error": summaries,
    }
    axis = None if spec.axis is None else normalize_axis(spec.axis, len(shape))
    meta = {
        "version": packs.VERSION,
        "format": qarray.FORMAT_VERSION,
        "fingerprint": fp,
        "complete": True,
        "name": item.name,
        "spec": spec.to_dict(),
        "mode": item.mode,
        "dtype": qt.name,
        "axis": axis,
        "storage": qarray.storage_of(qt),
        "shape": list(shape),
        "passes": job.passes,
        "params": False,  # (as the one-by-one conversion lists it: no parameters in its report)
        "source": {"kind": "checkpoint", "path": source, "dtype": np.dtype(ts[0].dtype).name},
        "tensors": entries,
    }
    kw = _member_kw(members, n, shape, spec, axis)
    if zero_point is not None and not np.any(zero_point):
        zero_point = None  # the fill value: not written
    os.makedirs(os.path.dirname(path), exist_ok=True)
    qarray.write_group(
        path,
        {packs.KEY: meta},
        {
            "data": (kw["data"], data, None),
            "scale": (kw["scale"], scale, None),
            "zero_point": (kw["zero_point"], zero_point, None),
        },
    )
    return results(meta)


def results(meta: dict) -> list[dict]:
    """The conversion's results for the tensors of the pack ``meta`` (as it lists them)."""
    from ..qtypes import qtype

    nbytes = int(qarray.stored_nbytes(meta["shape"], qtype(meta["dtype"])))
    cols = meta["tensors"]["error"]
    errors = zip(*(cols[k] for k in ERROR_COLUMNS), strict=True)
    return [
        {
            "kept": False,
            "error": dict(zip(ERROR_COLUMNS, e, strict=True)),
            "bytes_after": nbytes,
            "passes": meta["passes"],
            "params": meta["params"],
            "pack": meta["name"],
            "slot": i,
        }
        for i, e in enumerate(errors)
    ]


def _param_shape(shape, spec) -> tuple[int, ...]:
    from ..core.layout import blocked_param_shape

    if spec.axis is None:
        return ()
    axis = normalize_axis(spec.axis, len(shape))
    if spec.block_size:
        return tuple(blocked_param_shape(shape, axis, spec.block_size))
    return (shape[axis],)


def _member_kw(members: dict, n: int, shape, spec, axis) -> dict:
    """The pack's members' ``create_array`` keywords: the job's, stacked on a ``tensor``
    axis, each one chunk."""
    dims = dimension_names(len(shape))
    pshape = _param_shape(shape, spec)
    pdims = param_dimension_names(len(shape), axis, spec.block_size, dims) if pshape else []
    out = {}
    for m, full, names in (("data", shape, dims), ("scale", pshape, pdims)):
        kw = {k: v for k, v in members[m].items() if k != "config"}
        kw.update(shape=(n, *full), chunks=(n, *full), dimension_names=["tensor", *names])
        out[m] = kw
    zp = {k: v for k, v in members["zero_point"].items() if k != "config"}
    zp.update(shape=(n, *pshape), chunks=(n, *pshape), dimension_names=["tensor", *pdims])
    out["zero_point"] = zp
    out["scale"]["compressors"] = out["zero_point"]["compressors"] = members["scale"].get(
        "compressors"
    )
    return out


def _nonfinite(item: PackItem, x: np.ndarray) -> NonFiniteInputError:
    """The refusal naming the pack's first tensor that holds non-finite values."""
    from .blockmath import block_ranges

    for i, name in enumerate(item.names):
        st = block_ranges(np.ascontiguousarray(x[i]), None)
        if st.nonfinite:
            return st.refusal(name, x.shape[1:])
    return NonFiniteInputError(f"pack {item.name}: non-finite values")  # (not reached)


def _ranges(stats, n: int) -> dict:
    """Each tensor's calibration range (its channels' finite min and max; 0 where none is
    finite), as columns ``min`` and ``max``."""
    lo = np.where(stats.count > 0, stats.min, np.inf).reshape(n, -1).min(axis=1)
    hi = np.where(stats.count > 0, stats.max, -np.inf).reshape(n, -1).max(axis=1)
    return {
        "min": np.where(np.isfinite(lo), lo, 0.0).tolist(),
        "max": np.where(np.isfinite(hi), hi, 0.0).tolist(),
    }


WORST = 5  # channels listed per tensor (worst SQNR first)


def brief_errors(errors: ErrorStats, n: int, worst: int = WORST) -> dict:
    """The error figures of ``n`` tensors from the per-channel sums ``errors`` (the tensors'
    channels one after another), as columns (one list per figure, a value per tensor): the
    figures of :meth:`~qstream.spec.ErrorStats.summary` and, with several channels, the
    ``worst`` channels by SQNR (``worst_channel``, ``worst_sqnr_db``, ``worst_max_abs``:
    a list per tensor); not the per-channel distribution."""
    from ..calibration.views import channel_sqnr

    def total(a):
        return a.reshape(n, -1).sum(axis=1)

    count = total(errors.count)
    x2, e2 = total(errors.sum_x2), total(errors.sum_e2)
    xy, y2 = total(errors.sum_xy), total(errors.sum_y2)
    clipped = total(errors.clipped)
    nan, pinf, ninf = total(errors.nan), total(errors.posinf), total(errors.neginf)
    with np.errstate(divide="ignore", invalid="ignore"):
        sqnr = np.where(e2 == 0, np.inf, np.where(x2 == 0, -np.inf, 10.0 * np.log10(x2 / e2)))
        mse = np.where(count > 0, e2 / np.maximum(count, 1), 0.0)
        denom = np.sqrt(x2 * y2)
        cosine = np.where(denom > 0, xy / denom, np.where((x2 == 0) & (y2 == 0), 1.0, 0.0))
        clip_fraction = np.where(count > 0, clipped / np.maximum(count, 1), 0.0)
    cols = {
        "sqnr_db": _numbers(sqnr),
        "mse": mse.tolist(),
        "max_abs": errors.max_abs.reshape(n, -1).max(axis=1).tolist(),
        "cosine": cosine.tolist(),
        "clipped": clipped.tolist(),
        "clip_fraction": clip_fraction.tolist(),
        "nonfinite": (nan + pinf + ninf).tolist(),
        "count": count.tolist(),
        "nan": nan.tolist(),
        "posinf": pinf.tolist(),
        "neginf": ninf.tolist(),
    }
    channels = errors.count.size // max(n, 1)
    if channels > 1:
        sq = channel_sqnr(errors.sum_x2, errors.sum_e2).reshape(n, channels)
        order = np.argsort(sq, axis=1, kind="stable")[:, :worst]
        cols["worst_channel"] = order.tolist()
        worst_sq = np.take_along_axis(sq, order, axis=1).tolist()
        cols["worst_sqnr_db"] = [[v if math.isfinite(v) else str(v) for v in r] for r in worst_sq]
        mx = errors.max_abs.reshape(n, channels)
        cols["worst_max_abs"] = np.take_along_axis(mx, order, axis=1).tolist()
    return cols


def _numbers(a: np.ndarray) -> list:
    """``a``'s values as JSON holds them: non-finite figures as strings (as in every
    report)."""
    return [v if math.isfinite(v) else str(v) for v in a.tolist()]


def _block_errors(x, q, scale, zero_point, spec) -> dict:
    """The blocked tensors' error columns: one error pass over each tensor."""
    from ..core.layout import plan_layout
    from .blockmath import block_errors_fused

    qt = spec.qtype
    lo_q = qt.qrange(spec.narrow_range)[0]
    axis = normalize_axis(spec.axis, x.ndim - 1)
    layout = plan_layout(x.shape[1:], scale.shape[1:], axis, spec.block_size)
    total = ErrorStats.empty(x.shape[0])
    for i in range(x.shape[0]):
        err = block_errors_fused(x[i], q[i], scale[i], zero_point[i], layout, qt, lo_q, None)
        merge_into(total, err, i)
    return brief_errors(total, x.shape[0])
