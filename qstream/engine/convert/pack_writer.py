"""Small, alike tensors converted as one unit of work into one pack (which tensors join
which pack: :mod:`.pack_plan`).

A checkpoint of many tensors pays per tensor what a job costs beyond its bytes: a job's
set-up, a report built channel by channel, a group of arrays written file by file. Here
tensors with the same shape, dtype and spec (a run of them: the experts of a layer; or, left
alone between others, gathered: a model's router gates, one a layer; see
:func:`~.pack_plan.plan_packs`) are read into one stacked array and quantized by *one*
:class:`~qstream.engine.jobs.job.QuantizeJob` whose spec makes each tensor's parameters exactly
its own:

- ``rows``: per channel on axis 0 (the default recipe): the tensors stacked along axis 0 are
  one array whose channels are theirs;
- ``flat``: per tensor: each tensor one row of ``[n, size]``, quantized per channel on axis 0
  (the parameters are computed element by element from each row's range, as a tensor's are);
- ``blocks``: blocked along an axis: the tensors stacked along a new first axis, the blocks
  along the same axis of each (no block crosses two tensors).

The codes and parameters are those of each tensor's own job, bit for bit (the kernels are
element-wise given the parameters; the ranges are exact min/max). The pack is written as one
group (:mod:`qstream.io.outputs.pack_layout`); each tensor's error figures come from its own
channels'
sums (``blocks``: from one error pass over the tensor). Other tensors (histogram methods,
explicit scales, per-channel on another axis, float offsets) are converted one by one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...core import (
    blocked_param_shape,
    dimension_names,
    normalize_axis,
    param_dimension_names,
)
from ...errors import NonFiniteInputError
from ...io.outputs import ERROR_COLUMNS, qarray
from ...io.outputs import pack_layout as packs
from ...spec import QuantSpec
from ..blocks import NonFiniteBlock
from ..jobs import calibrated_in_memory
from ..run import InlineExecutor, worker_cached
from .pack_figures import blocked_errors, brief_errors, tensor_ranges
from .pack_plan import PackItem


@dataclass(frozen=True, eq=False)
class PackWork:
    """Converts a :class:`PackItem` into its pack below ``dst``: picklable (the checkpoint is
    opened by path, once per process), like
    :class:`~qstream.engine.convert.one_block.SmallTensorWork`.
    Returns the pack's :class:`PackResult`."""

    token: str
    checkpoint: Any
    source: str
    dst: str
    compression: str
    max_memory: int | None

    def __call__(self, item: PackItem) -> PackResult:
        from ...io.checkpoints import open_checkpoint

        ck = self.checkpoint
        opener = ck.open if hasattr(ck, "open") else lambda: open_checkpoint(ck)
        tensors = worker_cached((self.token, "checkpoint"), opener)
        ts = [tensors[n] for n in item.names]
        spec = QuantSpec.from_dict(item.spec)
        path = packs.pack_path(self.dst, item.name)
        fp = _fingerprint(item, ts, spec, self.compression)
        found = packs.read_pack_doc(path)
        done = (fp, True, item.name)  # (this pack, finished, under its own name)
        if found is not None and tuple(map(found.get, ("fingerprint", "complete", "name"))) == done:
            with contextlib.suppress(ValueError, KeyError, TypeError):  # (damaged: made again)
                return results(found, len(item.names))
        if found is not None:  # a pack of another run of this root: made again
            packs.remove_pack(path)
        return convert_pack(item, ts, spec, path, fp, self.source, self.compression)


def _fingerprint(item: PackItem, ts: list[Any], spec: QuantSpec, compression: str) -> str:
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


def read_stack(ts: Sequence[Any]) -> np.ndarray:
    """The tensors ``ts`` (same shape and dtype) stacked along a new first axis: read in
    place when they lie one after another in one file (safetensors: a map of the file, see
    :func:`~qstream.io.checkpoints.open.map_file_run`), else read into a scratch array (valid
    until this thread's next pack)."""
    from ...core import scratch

    t0 = ts[0]
    shape = (len(ts), *t0.shape)
    whole = tuple(slice(0, n) for n in t0.shape)
    f0 = getattr(t0, "file", None)
    if f0 is not None and all(
        getattr(t, "file", None) == (f0[0], f0[1] + i * t0.nbytes) for i, t in enumerate(ts)
    ):
        from ...io.checkpoints import map_file_run, read_file_run

        mapped = map_file_run(f0[0], f0[1], shape, np.dtype(t0.dtype))
        if mapped is not None:
            return mapped
        out = scratch("pack-stack", shape, t0.dtype)
        read_file_run(f0[0], f0[1], out)
        return out
    out = scratch("pack-stack", shape, t0.dtype)
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

    def __getitem__(self, key: Any) -> np.ndarray:
        return self.values[key]


def _stacked(x: np.ndarray, spec: QuantSpec, mode: str) -> tuple[np.ndarray, QuantSpec]:
    """The stacked array and spec of the pack's job."""
    if mode == "rows":
        return x.reshape(-1, *x.shape[2:]), spec
    if mode == "flat":
        return x.reshape(x.shape[0], -1), replace(spec, axis=0)
    assert spec.axis is not None  # (blocks: a blocked spec has an axis)
    return x, replace(spec, axis=normalize_axis(spec.axis, x.ndim - 1) + 1)


def convert_pack(
    item: PackItem,
    ts: list[Any],
    spec: QuantSpec,
    path: str,
    fp: str,
    source: str,
    compression: str,
) -> PackResult:
    """Quantize the pack's tensors ``ts`` as one stacked job and publish the pack at
    ``path``; its :class:`PackResult`."""
    from ..jobs import QuantizeJob

    n, shape = len(ts), tuple(ts[0].shape)
    x = read_stack(ts)
    stacked, job_spec = _stacked(x, spec, item.mode)
    job = QuantizeJob(
        _Stack(stacked, item.name),
        job_spec,
        executor=InlineExecutor(),
        compression=compression,
        views=False,  # (a pack lists its tensors' figures, not its job's report)
    )
    try:
        job.source.pinned = stacked
        try:
            cal, out = calibrated_in_memory(job)
        except (NonFiniteInputError, NonFiniteBlock):
            raise _nonfinite(item, x) from None
        members = out.members
        scale, zero_point, data = out.scale, out.zero_point, out.data
        assert scale is not None and data is not None  # (a pack's tensors are never empty)
        if zero_point is None:  # (all zero: never written, the fill value)
            zero_point = np.zeros(scale.shape, members["zero_point"]["dtype"])
        pshape = _param_shape(shape, spec)
        scale = scale.reshape(n, *pshape)
        zero_point = zero_point.reshape(n, *pshape)
        data = data.reshape(n, *shape)
        if item.mode == "blocks":
            summaries = blocked_errors(x, data, scale, zero_point, spec)
            ranges = {}
        else:
            summaries = brief_errors(out.errors, n)
            assert cal.stats is not None  # (rows and flat packs take their ranges first)
            ranges = tensor_ranges(cal.stats, n)
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
    return results(meta, n)


@dataclass(frozen=True)
class PackResult:
    """What a pack gives its conversion: its name, the stored bytes of each of its tensors,
    whether their reports list parameters, and their error figures as columns
    (:data:`~qstream.io.outputs.pack_layout.ERROR_COLUMNS`, a value per tensor, in the
    pack's order)."""

    pack: str
    bytes_after: int
    params: bool
    errors: dict[str, list[Any]]


def results(meta: dict, n: int) -> PackResult:
    """The :class:`PackResult` of the pack ``meta`` of ``n`` tensors (ValueError, KeyError
    or TypeError: the document is damaged)."""
    nbytes = qarray.quantized_nbytes(meta["shape"], QuantSpec.from_dict(meta["spec"]))
    cols = packs.decoded_columns({k: meta["tensors"]["error"][k] for k in ERROR_COLUMNS})
    if not all(isinstance(v, list) and len(v) == n for v in cols.values()):
        raise ValueError(f"pack {meta['name']}: its error columns do not list {n} tensors")
    return PackResult(meta["name"], nbytes, bool(meta["params"]), cols)


def _param_shape(shape: tuple[int, ...], spec: QuantSpec) -> tuple[int, ...]:
    if spec.axis is None:
        return ()
    axis = normalize_axis(spec.axis, len(shape))
    if spec.block_size:
        return tuple(blocked_param_shape(shape, axis, spec.block_size))
    return (shape[axis],)


def _member_kw(
    members: dict, n: int, shape: tuple[int, ...], spec: QuantSpec, axis: int | None
) -> dict[str, dict]:
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
    from ..blocks import block_ranges

    for i, name in enumerate(item.names):
        st = block_ranges(np.ascontiguousarray(x[i]), None)
        if st.nonfinite:
            return st.refusal(name, x.shape[1:])
    return NonFiniteInputError(f"pack {item.name}: non-finite values")  # (not reached)
