"""Restore a converted checkpoint: every tensor dequantized (or, kept, copied) into a group.

``dst`` becomes a Zarr group of plain arrays, one per tensor at its key; its root's
``attrs["qstream_restored"]`` names the source and lists the tensors, so a re-run resumes
(finished tensors are skipped), and ``complete`` is written last. A tensor stored in one chunk
is dequantized whole in this thread (:func:`dequantize_small`); a larger one is a dequantize
job of its own (:func:`qstream.engine.jobs.job.dequantize`).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ...budget import check_fits
from ...core import dimension_names
from ...io.outputs import Action, Destination, destination, qarray
from ...io.outputs import pack_layout as packs
from ...io.storage import compression as compressions
from ...io.storage import location, open_group, read_all, read_region, tensor_key
from ...qtypes import float_dtype
from . import kept
from .events import TensorEvent
from .kept import remove_own
from .rootjob import same_job

if TYPE_CHECKING:
    from zarr.abc.store import Store

    from ..run import Executor


def _prepared(
    src: Any, dst: Any, dtype: str, max_memory: int | None, compression: str | None
) -> tuple[qarray.QuantizedCheckpoint, str, dict[str, Any], Destination]:
    """What a restore checks before it writes (the run's and the plan's alike): the
    checkpoint opened under the memory bound, the destination separate and writable; the
    checkpoint, its location, the job's identity and the destination."""
    ck = qarray.open_quantized(src)
    assert isinstance(ck, qarray.QuantizedCheckpoint)  # (the API restores checkpoints here)
    ck.max_memory = max_memory  # (its packs are held to the bound)
    src_loc = location(src) or str(src)
    destination.check_separate(src_loc, dst)
    destination.check_writable(dst)
    ident = {"from": src_loc, "dtype": dtype, "compression": compressions.canonical(compression)}
    dest = Destination(
        dst, "restored", json.dumps(ident, sort_keys=True), same_job=lambda m: same_job(m, ident)
    )
    return ck, src_loc, ident, dest


def look_restore(
    src: Any,
    dst: Any,
    *,
    dtype: str = "float32",
    max_memory: int | None = None,
    overwrite: bool = False,
    compression: str | None = compressions.AUTO,
) -> tuple[str, list[dict[str, Any]]]:
    """What :func:`restore` with these arguments would do, refusing what it refuses, writing
    nothing: its action on ``dst`` and a row per tensor (name, shape, stored type, target:
    ``dtype`` or ``keep``, bytes before and after), from the root's index."""
    ck, _, _, dest = _prepared(src, dst, dtype, max_memory, compression)
    action, _ = dest.look(overwrite=overwrite)
    size = float_dtype(dtype).itemsize
    rows = []
    for name, r in ck.tensors.items():
        shape = [int(d) for d in r.get("shape", ())]
        kept, stored = bool(r.get("kept")), int(r.get("bytes_after", 0))
        rows.append({
            "name": name, "shape": shape, "kept": kept,
            "dtype": str(r.get("dtype" if kept else "target", "")),  # (as stored)
            "target": "keep" if kept else dtype, "bytes_before": stored,
            "bytes_after": stored if kept else math.prod(shape) * size,
        })  # fmt: skip
    return action.value, rows


def restore(
    src: str | os.PathLike[str] | Store,
    dst: str | os.PathLike[str] | Store,
    *,
    dtype: str = "float32",
    max_memory: int | None = None,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
    executor: str | Executor | None = None,
    compression: str | None = compressions.AUTO,
    on_tensor: Callable[[TensorEvent], None] | None = None,
) -> dict[str, Any]:
    """Dequantize every tensor of the converted checkpoint ``src`` into the group ``dst``
    (kept tensors are copied as stored); see :func:`qstream.dequantize_store`. A re-run
    resumes: finished tensors are skipped.

    ``on_tensor`` is called before (``result`` None) and after each tensor with a
    :class:`TensorEvent`: its ``dtype`` the stored type (the quantized type, or a kept
    tensor's), ``target`` the restored ``dtype`` or ``"keep"``, ``result`` its entry of the
    result's ``tensors`` (``kept``, ``bytes_written``)."""
    ck, src_loc, ident, dest = _prepared(src, dst, dtype, max_memory, compression)
    compression = ident["compression"]
    t0 = time.perf_counter()
    with dest.claim(overwrite=overwrite) as (action, existing):
        if action is Action.COMPLETE:
            assert existing.meta is not None  # (a complete output has its metadata)
            return {**existing.meta["result"], "already_complete": True, "seconds": 0.0}
        names = list(ck)
        meta = {**ident, "tensors": {n: {"key": tensor_key(n)} for n in names}, "complete": False}
        if action is Action.RESUME:
            root = open_group(dst, mode="a")
        else:
            root = qarray.create_group(dst, {"qstream_restored": meta})
        results: dict[str, dict] = {}
        local = dest.local is not None  # (small tensors are made whole, in this thread)
        fresh = local and action is Action.CREATE  # (a new root, locked: nothing below it)
        _restore_tensors(
            ck, src, src_loc, dest, names, results, local, fresh,
            dtype=dtype, compression=compression, max_memory=max_memory,
            progress=progress, executor=executor, on_tensor=on_tensor,
        )  # fmt: skip
        results = {n: results[n] for n in names}
        result = {
            "source": str(src),
            "destination": str(dst),
            "dtype": dtype,
            "tensors": results,
            "bytes_written": sum(r["bytes_written"] for r in results.values()),
            "already_complete": False,
        }
        qarray.set_meta(root, {**meta, "complete": True, "result": result}, "qstream_restored")
        destination.clean_partials(dst)  # of a killed run's root metadata writes
    return {**result, "seconds": time.perf_counter() - t0}


def _restore_tensors(ck, src, src_loc, dest, names, results, local, fresh, **job) -> None:
    """The loop of :func:`restore`: each tensor dequantized (one stored chunk: made whole
    here, see :func:`dequantize_small`; else a job of its own) or, if
    kept, copied; its result put in ``results``; ``on_tensor`` told before and after each
    (from what is open already: nothing more is read for it). (Threads do not help: creating
    entries in one folder is serialised by the file system.)"""
    dtype, on_tensor = job["dtype"], job.pop("on_tensor")
    total = len(names)
    for index, name in enumerate(names):
        key = tensor_key(name)
        path = os.path.join(dest.local, key) if fresh else dest.child(key)
        t = ck[name]
        if on_tensor is not None:
            quantized = isinstance(t, qarray.QuantizedArray)
            stored = t.spec.dtype if quantized else str(t.dtype)
            event = TensorEvent(
                index, total, name, tuple(t.shape), stored, dtype if quantized else "keep"
            )
            on_tensor(event)
        _restore_tensor(t, name, ck, src, src_loc, path, results, local, fresh, **job)
        if on_tensor is not None:
            on_tensor(TensorEvent(**{**event.__dict__, "result": results[name]}))


def _restore_tensor(t, name, ck, src, src_loc, path, results, local, fresh, **job) -> None:
    """One tensor of :func:`_restore_tensors`, opened (``t``), restored to ``path``."""
    dtype, compression = job["dtype"], job["compression"]
    if not isinstance(t, qarray.QuantizedArray):
        results[name] = {"kept": True, "bytes_written": _copy_kept(t, path, compression, local)}
        return
    pack = t.meta.get("pack")
    where: str | None
    if pack is not None:  # (named by its pack and slot)
        where = f"{src_loc}/{packs.PACKS}/{os.path.basename(pack['path'])}[{pack['slot']}]"
    else:
        where = location(destination.tensor_path(src, ck.key_of(name)))
    # a chunk is dequantized whole (here, or by the job): its declared size against the bound
    check_fits(job["max_memory"], t.data.chunks, np.dtype(np.float32), 1, tuple(t.shape))
    if local and one_chunk(t):
        kw = {"dtype": dtype, "compression": compression, "fresh": fresh}
        results[name] = dequantize_small(t, where, path, **kw)
        return
    from ..jobs import dequantize

    r = dequantize(
        destination.tensor_path(src, ck.key_of(name)),
        path,
        dtype=dtype,
        max_memory=job["max_memory"],
        progress=job["progress"],
        executor=job["executor"],
        compression=compression,
    )
    results[name] = {"kept": False, "bytes_written": r["bytes_written"]}


def _copy_kept(a: Any, path: str, compression: str, local: bool) -> int:
    """Copy the kept tensor ``a`` (a zarr array) to ``path`` (see
    :func:`~qstream.engine.convert.kept.store_kept`)."""
    remove_own(path)  # what a killed run left of this tensor
    kw = {
        "shape": a.shape,
        "chunks": a.chunks,
        "dtype": a.dtype,
        "compressors": compressions.compressors(compression, a.compressors),
        "dimension_names": dimension_names(a.ndim),
    }
    whole = (slice(0, a.shape[0]),) if a.shape else ()
    # (read whole from its chunk files: zarr's reads take a round trip each)
    kept.store_kept(
        path,
        kw,
        dict(a.attrs),
        lambda key: read_all(a) if key == whole else read_region(a, key),
        itemsize=a.dtype.itemsize,
        local=local,
    )
    return int(a.size * a.dtype.itemsize)


def one_chunk(arr: qarray.QuantizedArray) -> bool:
    """Whether the quantized tensor ``arr`` is stored in one chunk (see
    :func:`dequantize_small`)."""
    return math.prod(-(-n // c) for n, c in zip(arr.shape, arr.data.chunks, strict=True)) == 1


def dequantize_small(
    arr: qarray.QuantizedArray,
    src_loc: str | None,
    path: str,
    *,
    dtype: str,
    compression: str,
    fresh: bool = False,
) -> dict[str, Any] | None:
    """Dequantize the quantized tensor ``arr`` (one stored chunk) into the new array ``path``
    (a local path inside a locked root) in this thread, as :func:`qstream.engine.jobs.job.
    dequantize` would, bytes and metadata alike; its result, or None when ``arr`` is more
    than one chunk (then the job runs as usual). ``fresh``: the root is new, nothing is at
    ``path`` to look at."""
    from ...qtypes import float_dtype
    from ..jobs import dequantized_array, dequantized_fingerprint

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
