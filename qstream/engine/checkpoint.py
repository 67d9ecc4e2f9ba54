"""Convert a whole checkpoint: one quantized group (or kept array) per tensor.

``dst`` (a local directory) becomes a Zarr group; each tensor is stored at its name: a
quantized group (see ``qstream.io.qarray``) or, for kept tensors, a plain array of the
original values (in their own dtype, bfloat16 included; the original dtype in its attributes).
Tensors are converted in order, each with the bounded memory of one store job (two at a time
on the local executor, each within half the bound); the root's ``attrs["qstream_checkpoint"]``
lists the finished tensors, so a re-run resumes, and ``complete`` is written last.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import threading
import time
import uuid
import warnings
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from ..core.layout import dimension_names
from ..errors import InvalidParameterError, QStreamWarning, StoreError
from ..io import compression as compressions
from ..io import destination, packs, qarray
from ..io.checkpoints import read_rows
from ..io.destination import Action, Destination
from ..io.names import tensor_key
from ..io.rootindex import RootIndex, compact
from ..io.stores import location, open_group, open_store
from ..io.zarr_ext import register_zarr_types
from ..recipe import Recipe
from . import executors, pipeline
from .executors import LocalExecutor
from .job import QuantizeJob, report_stage
from .packs import PackItem, PackWork, UnitWork, pack_mode, plan_packs, source_bytes
from .plan import check_fits
from .small import SmallTensorWork, TensorItem, dequantize_small, is_small, one_chunk


@dataclass(frozen=True)
class TensorEvent:
    """Reported to ``on_tensor`` before (``result`` None) and after each tensor."""

    index: int
    total: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    target: str  # e.g. "int8 per_axis(0)" or "keep"
    result: dict | None = None


def convert(
    checkpoint,
    dst,
    recipe: Recipe,
    *,
    max_memory: int | None = None,
    overwrite: bool = False,
    on_tensor: Callable[[TensorEvent], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    executor=None,
    compression: str | None = compressions.AUTO,
    storage_options: dict | None = None,
    store: str | None = None,
    packs: bool | None = None,
) -> dict:
    """Quantize every tensor of ``checkpoint`` the recipe selects into the group ``dst``
    (see :func:`qstream.convert_checkpoint`). ``packs``: store runs of small, alike tensors
    as packs (:mod:`qstream.io.packs`); None: when the checkpoint holds at least
    :data:`AUTO_PACK_TENSORS` tensors and ``dst`` is a local directory."""
    from ..io.checkpoints import CheckpointSource, source_locations
    from ..io.remote import is_url

    compression = compressions.canonical(compression)

    if str(dst).lower().endswith(".zip"):  # checked before anything is read or written
        raise InvalidParameterError(
            f"cannot convert into {dst}: a converted checkpoint is a directory (a Zarr group)"
            " or a .safetensors file, not a .zip; convert into a directory, then zip it"
            " (zip -r0) if a single file is needed"
        )
    executor = executors.resolve(executor)
    executors.check_shared("checkpoint", checkpoint, executor=executor)
    executors.check_shared("destination", dst, executor=executor)
    opener = CheckpointSource(
        _fspath(checkpoint),
        storage_options if is_url(checkpoint) else None,
        store if is_url(checkpoint) else None,
        None if recipe.scales.is_default() else recipe.scales.to_dict(),
    )
    raw = opener.open_raw()
    tensors = opener.pair(raw)  # FP8 weights with their block scales, as float32
    source = location(checkpoint) or str(checkpoint)
    destination.check_separate(source_locations(checkpoint, raw), dst)
    # a URL destination is written through fsspec: with store="obstore", storage_options are
    # obstore's and the destination takes fsspec's own configuration (the environment)
    dst_options = storage_options if store in (None, "fsspec") else None
    destination.check_writable(dst)
    keys = tensor_keys(tensors)  # (refuses names no tensor may have before anything is written)
    for warning in recipe.check(tensors):  # (an axis a tensor lacks: refused here, too)
        warnings.warn(warning, QStreamWarning, stacklevel=3)
    ident = {"source": source, "recipe": recipe.to_dict(), "compression": compression}
    packed = _use_packs(packs, tensors, dst)
    if packed:  # (outputs without packs keep their identity)
        ident["layout"] = "packed"
    dest = Destination(
        dst,
        "checkpoint",
        json.dumps(ident, sort_keys=True),
        storage_options=dst_options,
        same_job=lambda meta: _same_job(meta, ident),
    )
    job = {"max_memory": max_memory, "overwrite": overwrite, "compression": compression}
    root_store = (
        None
        if destination.local_path(dst)
        else open_store(dst, mode="w", storage_options=dst_options)
    )
    with dest.claim(overwrite=overwrite) as (action, existing):
        if action in (Action.RESUME, Action.COMPLETE):
            index = RootIndex.open(dst, existing.meta, root_store)
            if action is Action.RESUME:
                index.upgrade()
        else:
            index = RootIndex.create(dst, {**ident, "tensors_total": len(tensors)}, root_store)
        return _convert(
            tensors,
            keys,
            index,
            action is Action.COMPLETE,
            opener,
            source,
            dest,
            recipe,
            on_tensor,
            progress,
            executor,
            packed=packed,
            **job,
        )


AUTO_PACK_TENSORS = 512  # checkpoints of at least this many tensors are packed by default


def _use_packs(packs: bool | None, tensors, dst) -> bool:
    """Whether this conversion writes packs (see :func:`convert`)."""
    if packs is not None and not isinstance(packs, bool):
        raise InvalidParameterError(f"packs must be True, False or None, got {packs!r}")
    if packs is False:
        return False
    local = destination.local_path(dst) is not None
    if packs and not local:
        raise InvalidParameterError(
            f"packs are written to a local directory; {dst} is not one (pass packs=None)"
        )
    return local and (packs or len(tensors) >= AUTO_PACK_TENSORS)


TENSORS_IN_FLIGHT = 2  # local runs: one tensor's setup and last blocks overlap the next's
ROWS_PER_BATCH = 128  # finished tensors listed in one new document of the root's index


def _convert(
    tensors,
    keys,
    index,
    complete: bool,
    checkpoint,
    source,
    dest,
    recipe,
    on_tensor,
    progress,
    executor,
    *,
    max_memory,
    overwrite: bool,
    compression: str,
    packed: bool = False,
) -> dict:
    t0 = time.perf_counter()
    dst = dest.target
    conversion = _Conversion(
        tensors,
        keys,
        index,
        dest,
        source,
        on_tensor,
        progress,
        executor,
        max_memory=max_memory,
        overwrite=overwrite,
        compression=compression,
        checkpoint=checkpoint,
        packed=packed,
    )
    if not complete:
        session = executor.session() if isinstance(executor, LocalExecutor) else nullcontext()
        with session:
            conversion.run(recipe)
        index.set_meta(complete=True)
        destination.clean_partials(dst)  # of killed writers
    results = {n: conversion.results[n] for n in tensors if n in conversion.results}
    before = sum(r["bytes_before"] for r in results.values())
    after = sum(r["bytes_after"] for r in results.values())
    return {
        "checkpoint": str(getattr(checkpoint, "path", checkpoint)),
        "destination": str(dst),
        "tensors": results,
        "bytes_before": before,
        "bytes_after": after,
        "seconds": 0.0 if complete else time.perf_counter() - t0,
        "recipe": recipe.to_dict(),
        "compression": compression,
        "already_complete": complete,
    }


class _Conversion:
    """The tensors of one conversion, in checkpoint order: runs of small tensors (one block
    of their job each) handed to the executor as units of work (``qstream.engine.small``),
    larger tensors as jobs of their own (two at once on a local run, each within half the
    memory bound, their passes on the same workers). Results are listed in the root's index
    ``ROWS_PER_BATCH`` at a time (a count, so that a run writes the same documents whatever
    its speed), each batch a new document: a tensor finished but not listed when a run is
    killed is found complete by its own job on the re-run (a cheap look at its metadata)."""

    def __init__(
        self,
        tensors,
        keys,
        index,
        dest,
        source,
        on_tensor,
        progress,
        executor,
        *,
        max_memory,
        overwrite,
        compression,
        checkpoint,
        packed: bool = False,
    ) -> None:
        self.tensors, self.keys, self.index, self.dest = tensors, keys, index, dest
        self.source, self.on_tensor, self.progress = source, on_tensor, progress
        self.executor = executor
        self.max_memory, self.overwrite, self.compression = max_memory, overwrite, compression
        self.checkpoint = checkpoint  # a CheckpointSource (workers open it themselves)
        self.results: dict[str, dict] = index.rows()
        self.pending: list[dict] = []
        self.keep_dtypes: dict[str, str | None] = {}
        self.positions = {n: i for i, n in enumerate(tensors)}
        self.stop = threading.Event()
        self.in_flight = 1 if executor.distributed else TENSORS_IN_FLIGHT
        local_dst = destination.local_path(dest.target) is not None
        self.small_work = None
        if local_dst or executor.distributed:
            self.small_work = SmallTensorWork(
                uuid.uuid4().hex,
                _fspath(checkpoint) if isinstance(checkpoint, (str, os.PathLike)) else checkpoint,
                source,
                _fspath(dest.target),
                compression,
                max_memory,
                overwrite,
            )
            self.small_work.register(tensors)
        self.pack_work = None
        if packed:
            self.pack_work = PackWork(
                self.small_work.token,
                self.small_work.checkpoint,
                source,
                _fspath(dest.target),
                compression,
                max_memory,
            )

    def run(self, recipe) -> None:
        todo = []
        n = len(self.tensors)
        specs = [recipe.spec_for(name, t.shape, t.dtype) for name, t in self.tensors.items()]
        pack_of: dict[int, tuple[int, int, int]] = {}  # tensor -> (pack, first, end)
        if self.pack_work is not None:  # planned over every tensor: the same packs on a re-run
            entries = [
                None if spec is None else (t, spec)
                for t, spec in zip(self.tensors.values(), specs, strict=True)
            ]
            for seq, (a, b) in enumerate(plan_packs(entries, self.max_memory)):
                for i in range(a, b):
                    pack_of[i] = (seq, a, b)
        for i, (name, t) in enumerate(self.tensors.items()):
            spec = specs[i]
            keep_as = recipe.keep_dtype(name, t.shape, t.dtype) if spec is None else None
            self.keep_dtypes[name] = keep_as
            target = (
                ("keep" if not keep_as else f"keep/{keep_as}")
                if spec is None
                else describe_target(spec)
            )
            shown = _dtype_name(getattr(t, "source_dtype", t.dtype))  # (FP8: as stored)
            event = TensorEvent(i, n, name, tuple(t.shape), shown, target)
            if name in self.results:
                if self.on_tensor:
                    self.on_tensor(TensorEvent(**{**event.__dict__, "result": self.results[name]}))
                continue
            if i in pack_of:
                kind = ("pack", pack_of[i][0])
            elif self.small_work is not None and (
                spec is None or is_small(t, spec, self.max_memory)
            ):
                kind = ("small",)
            else:
                kind = ("job",)
            todo.append((event, t, spec, kind))
        try:
            runs = itertools.groupby(todo, key=lambda item: item[3][0] == "job")
            for job, run in runs:
                (self._jobs if job else self._units)(list(run))
        except BaseException:  # a failure or Ctrl-C: what finished is listed, then re-raised
            self.stop.set()
            with contextlib.suppress(Exception):
                self.index.append(self.pending)
            raise
        self.index.append(self.pending)

    def _units(self, run) -> None:
        """A run of small tensors and packs, a unit of work each on the executor's workers
        (one pipeline: packs and the small tensors between them overlap); a pack's tensors
        are listed in the index as one batch once it is published."""
        items: list = []
        rows: dict[str, tuple] = {}
        for kind, group in itertools.groupby(run, key=lambda item: item[3]):
            group = list(group)
            for ev, t, spec, _ in group:
                rows[ev.name] = (ev, t, spec)
            if kind[0] == "pack":
                spec = group[0][2]
                items.append(
                    PackItem(
                        kind[1],
                        tuple(ev.name for ev, *_ in group),
                        tuple(self.keys[ev.name] for ev, *_ in group),
                        tuple(self.positions[ev.name] for ev, *_ in group),
                        spec.to_dict(),
                        pack_mode(group[0][1], spec),
                        (sum(max(1, source_bytes(t) // 4) for _, t, *_ in group),),
                    )
                )
                continue
            items.extend(
                TensorItem(
                    ev.index,
                    ev.name,
                    self.keys[ev.name],
                    None if spec is None else spec.to_dict(),
                    (max(1, source_bytes(t) // 4),),
                    self.keep_dtypes.get(ev.name),
                )
                for ev, t, spec, _ in group
            )
        if self.pack_work is not None and any(isinstance(i, PackItem) for i in items):
            packs.ensure_folder(self.dest.local)
        # (a small tensor is mostly Python, which one thread runs at a time: more workers than
        # cores only take turns)
        workers = min(pipeline.default_workers(), os.cpu_count() or 1)
        inflight = None if self.executor.distributed else workers  # (as many as run at once)
        work = UnitWork(self.small_work, self.pack_work)
        results = self.executor.map_ordered(items, work, workers=workers, inflight=inflight)
        try:
            for item, result in results:
                if isinstance(item, PackItem):
                    self._flush()  # (a pack's rows are a batch of their own)
                    for name, r in zip(item.names, result, strict=True):
                        ev, t, _ = rows[name]
                        if self.on_tensor:
                            self.on_tensor(ev)
                        self._finished(ev, t, r, flush=False)
                    self._flush()
                    continue
                ev, t, spec = rows[item.name]
                if self.on_tensor:
                    self.on_tensor(ev)
                if result is None:  # more than one block after all: a job of its own
                    result = self._one(t, spec, item.name)
                self._finished(ev, t, result)
        finally:
            results.close()

    def _flush(self) -> None:
        self.index.append(self.pending)
        self.pending = []

    def _jobs(self, run) -> None:
        """A run of larger tensors, each a job of its own (``in_flight`` at once)."""
        with ThreadPoolExecutor(self.in_flight, thread_name_prefix="qstream-tensor") as pool:
            running: deque = deque()
            try:
                for event, t, spec, _ in run:
                    if len(running) == self.in_flight:
                        self._finished(*running.popleft(), wait=True)
                    if self.on_tensor:
                        self.on_tensor(event)
                    running.append((event, t, pool.submit(self._one, t, spec, event.name)))
                while running:
                    self._finished(*running.popleft(), wait=True)
            except BaseException:  # stop the other tensor's job at its next block (it stays
                self.stop.set()  # resumable), list what finished
                for event, t, fut in running:
                    with contextlib.suppress(Exception):
                        self._finished(event, t, fut, wait=True)
                raise

    def _one(self, t, spec, name) -> dict:
        path = self.dest.child(self.keys[name])
        if spec is None:
            return keep_tensor(
                t,
                path,
                self.compression,
                self.max_memory,
                self.keep_dtypes.get(name),
                storage_options=self.dest.storage_options,
            )
        job = QuantizeJob(
            t,
            spec,
            max_memory=self.max_memory,
            executor=self.executor,
            storage_options=self.dest.storage_options,
            checkpoint=(self.source, name, self.checkpoint),
            memory_share=self.in_flight,
            compression=self.compression,
        )
        report = job.run(
            path, progress=_Stoppable(self.progress, self.stop), overwrite=self.overwrite
        )
        params = report.calibration.get("params") if report.calibration else None
        return {
            "kept": False,
            "error": report.error,
            "bytes_after": int(qarray.stored_nbytes(t.shape, spec.qtype)),
            "passes": report.passes,
            "params": bool(params),
        }

    def _finished(self, event, t, result, *, wait: bool = False, flush: bool = True) -> None:
        if wait:
            result = result.result()
        result = {
            **result,
            "name": event.name,
            "key": self.keys[event.name],
            "pos": self.positions[event.name],
            "shape": list(t.shape),
            "dtype": _dtype_name(t.dtype),
            "target": event.target,
            "bytes_before": int(t.nbytes),
        }
        row = compact(result)
        self.results[event.name] = row
        self.pending.append(row)
        if flush and len(self.pending) >= ROWS_PER_BATCH:
            self._flush()
        if self.on_tensor:
            self.on_tensor(TensorEvent(**{**event.__dict__, "result": row}))


_DTYPE_NAMES: dict[int, tuple] = {}


def _dtype_name(dtype) -> str:
    """``np.dtype(dtype).name``, remembered by the dtype object (a tensor's is one of a few
    shared ones; hashing a dtype, like naming it, costs microseconds, per tensor)."""
    known = _DTYPE_NAMES.get(id(dtype))
    if known is None or known[0] is not dtype:
        known = _DTYPE_NAMES[id(dtype)] = (dtype, np.dtype(dtype).name)
    return known[1]


def _fspath(target):
    return os.fspath(target) if isinstance(target, (str, os.PathLike)) else target


class Stopped(Exception):
    """A tensor's job stopped between blocks because the conversion is stopping."""


class _Stoppable:
    """A job's progress reporter that forwards to ``progress`` (if any) and raises
    :class:`Stopped` at the job's next block or pass once ``stop`` is set: the job then ends
    as a killed one would, resumable."""

    def __init__(self, progress, stop: threading.Event) -> None:
        self.progress = progress
        self.stop = stop

    def __call__(self, done: int, total: int) -> None:
        if self.stop.is_set():
            raise Stopped("the conversion is stopping")
        if self.progress is not None:
            self.progress(done, total)

    def stage(self, name: str, total: int, done: int) -> None:
        if self.stop.is_set():
            raise Stopped("the conversion is stopping")
        report_stage(self.progress, name, total, done)


def describe_target(spec) -> str:
    """A short label: ``int8/axis0/minmax``, ``int4/axis1:b32/dynamic``, ``int8/tensor/mse``."""
    where = "tensor" if spec.axis is None else f"axis{spec.axis}"
    if spec.block_size:
        where += f":b{spec.block_size}"
    method = "explicit" if spec.scale is not None else spec.method
    return f"{spec.dtype}/{where}/{method}"


def _same_job(meta: dict, ident: dict) -> bool:
    """Whether the root metadata ``meta`` is of the job ``ident`` (outputs made before the
    ``compression`` option were made with ``"auto"``)."""
    stored = {k: meta.get(k) for k in ident}
    if meta.get("layout") != ident.get("layout"):  # (packs, or one group per tensor)
        return False
    return {**stored, "compression": meta.get("compression", compressions.AUTO)} == ident


def tensor_keys(names) -> dict[str, str]:
    """The key (:func:`~qstream.io.names.tensor_key`) of every tensor name."""
    keys = {name: tensor_key(name) for name in names}
    if len(set(keys.values())) != len(keys):  # only cut keys of very long names can collide
        raise StoreError("two tensor names of the checkpoint map to one key; rename them")
    return keys


def _remove_own(path, storage_options: dict | None = None) -> None:
    """Remove what a killed run of this job left at a tensor's ``path`` (only a node qstream
    wrote: a kept or restored array, or a quantized group that its own job did not finish)."""
    existing = destination.inspect_destination(path, storage_options)
    if existing.kind in ("kept", "dequantized"):
        destination.remove_output(path, existing, storage_options)
    elif existing.kind == "empty":
        destination.clean_partials(path)
    elif existing.kind != "absent":
        raise StoreError(f"{path} holds something qstream did not write there; remove it")


def keep_tensor(
    t, path: str, compression: str, max_memory=None, as_dtype=None, *, storage_options=None
) -> dict:
    """Store the tensor ``t`` as it is (``as_dtype``: its values rounded to that float type
    first, to nearest even), in its own type (bfloat16 too: the ``bfloat16`` Zarr data type,
    registered by qstream; outputs of earlier versions hold it widened to float32, their
    attributes naming bfloat16, and read the same)."""
    import zarr

    from ..qtypes import float_dtype

    dtype = np.dtype(t.dtype)
    kept = float_dtype(as_dtype) if as_dtype else dtype
    stored = kept
    check_fits(max_memory, getattr(t, "chunks", None), dtype, 1, tuple(t.shape))
    _remove_own(path, storage_options)  # what a killed run left of this tensor
    register_zarr_types()  # (bfloat16)
    a = zarr.create_array(
        path,
        shape=t.shape,
        dtype=stored,
        compressors=compressions.compressors(compression),
        dimension_names=dimension_names(len(t.shape)),
        attributes={"qstream": {"kept": True, "dtype": kept.name}},
        storage_options=storage_options if destination.local_path(path) is None else None,
    )
    if math.prod(t.shape):
        rows = max(1, (16 << 20) // max(1, math.prod(t.shape[1:]) * dtype.itemsize))
        n = t.shape[0] if t.shape else 1
        for r in range(0, n, rows):
            key = (slice(r, min(n, r + rows)),) if t.shape else ()
            a[key] = read_rows(t, key, dtype).astype(kept).astype(stored)
    return {"kept": True, "error": None, "bytes_after": int(math.prod(t.shape) * stored.itemsize)}


def restore(
    src,
    dst,
    *,
    dtype: str = "float32",
    max_memory: int | None = None,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
    executor=None,
    compression: str | None = compressions.AUTO,
    on_tensor: Callable[[TensorEvent], None] | None = None,
) -> dict:
    """Dequantize every tensor of the converted checkpoint ``src`` into the group ``dst``
    (kept tensors are copied as stored); see :func:`qstream.dequantize_store`. A re-run
    resumes: finished tensors are skipped.

    ``on_tensor`` is called before (``result`` None) and after each tensor with a
    :class:`TensorEvent`: its ``dtype`` the stored type (the quantized type, or a kept
    tensor's), ``target`` the restored ``dtype`` or ``"keep"``, ``result`` its entry of the
    result's ``tensors`` (``kept``, ``bytes_written``)."""
    ck = qarray.open_quantized(src)
    src_loc = location(src) or str(src)
    destination.check_separate(src_loc, dst)
    destination.check_writable(dst)
    compression = compressions.canonical(compression)
    ident = {"from": src_loc, "dtype": dtype, "compression": compression}
    dest = Destination(
        dst, "restored", json.dumps(ident, sort_keys=True), same_job=lambda m: _same_job(m, ident)
    )
    t0 = time.perf_counter()
    with dest.claim(overwrite=overwrite) as (action, existing):
        if action is Action.COMPLETE:
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
    here, see :func:`~qstream.engine.small.dequantize_small`; else a job of its own) or, if
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
        results[name] = {"kept": True, "bytes_written": _copy_kept(t, path, compression)}
        return
    pack = t.meta.get("pack")
    if pack is not None:  # (named by its pack and slot)
        where = f"{src_loc}/{packs.PACKS}/{os.path.basename(pack['path'])}[{pack['slot']}]"
    else:
        where = location(destination.tensor_path(src, ck.key_of(name)))
    if local and one_chunk(t):
        kw = {"dtype": dtype, "compression": compression, "fresh": fresh}
        results[name] = dequantize_small(t, where, path, **kw)
        return
    from .job import dequantize

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


def _copy_kept(a, path: str, compression: str) -> int:
    """Copy the kept tensor ``a`` (a zarr array) to ``path``, slab by slab."""
    import zarr

    _remove_own(path)  # what a killed run left of this tensor
    out = zarr.create_array(
        path,
        shape=a.shape,
        chunks=a.chunks,
        dtype=a.dtype,
        compressors=compressions.compressors(compression, a.compressors),
        dimension_names=dimension_names(a.ndim),
        attributes=dict(a.attrs),
    )
    if a.size:
        rows = max(1, (16 << 20) // max(1, math.prod(a.shape[1:]) * a.dtype.itemsize))
        for r in range(0, a.shape[0] if a.shape else 1, rows):
            key = (slice(r, r + rows),) if a.shape else ()
            out[key] = a[key]
    return int(a.size * a.dtype.itemsize)
