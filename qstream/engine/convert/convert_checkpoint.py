"""Convert a whole checkpoint: one quantized group (or kept array) per tensor.

``dst`` (a local directory) becomes a Zarr group; each tensor is stored at its name: a
quantized group (see ``qstream.io.outputs.qarray``) or, for kept tensors, a plain array of the
original values (in their own dtype, bfloat16 included; the original dtype in its attributes).
Tensors are converted in order, each with the bounded memory of one store job (two at a time
on the local executor, each within half the bound); the root's ``attrs["qstream_checkpoint"]``
lists the finished tensors, so a re-run resumes, and ``complete`` is written last.

This module claims the root and opens its index; the tensors are converted by
:class:`~qstream.engine.convert.conversion.Conversion`. The way back, :func:`restore`, is in
:mod:`qstream.engine.convert.restoring`.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ... import budget
from ...errors import InvalidParameterError, QStreamWarning
from ...io.checkpoints import CheckpointSource
from ...io.outputs import Action, Destination, RootIndex, destination
from ...io.storage import compression as compressions
from ...io.storage import location, open_store
from ...kernels.numpy_twins import using_numpy_kernels
from ...spec import Recipe
from ..jobs import twins_cover
from ..run import LocalExecutor, executors, resolve
from .conversion import Conversion, path_of
from .events import TensorEvent, describe_target
from .restoring import restore
from .rootjob import same_job, tensor_keys

if TYPE_CHECKING:
    from ..run import Executor

# (TensorEvent, describe_target and restore are named here too: the API imports them from here)
__all__ = [
    "AUTO_PACK_TENSORS",
    "TENSORS_IN_FLIGHT",
    "Prepared",
    "TensorEvent",
    "convert",
    "describe_target",
    "prepare",
    "restore",
]


@dataclass
class Prepared:
    """A conversion decided, nothing written: what :func:`prepare` found and checked."""

    opener: CheckpointSource
    tensors: dict[str, Any]  # FP8 weights paired with their block scales
    source: str
    sources: list[str]  # every location the checkpoint is read from
    keys: dict[str, str]
    ident: dict[str, Any]
    packed: bool
    dest: Destination
    action: Action  # what the destination's claim will do, as it looks now
    compression: str
    runner: Any
    warnings: list[str]
    executor: Any = None  # the executor argument ``runner`` was resolved from
    numpy_kernels: bool = False  # a small job: the NumPy twins, no Numba (small_job)


def prepare(
    checkpoint: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    recipe: Recipe,
    *,
    overwrite: bool = False,
    executor: str | Executor | None = None,
    compression: str | None = compressions.AUTO,
    storage_options: dict | None = None,
    store: str | None = None,
    packs: bool | None = None,
) -> Prepared:
    """Everything a conversion into the group ``dst`` can refuse, decided before a tensor
    byte is read or anything written: the checkpoint's headers, the recipe against its
    tensors, the tensors' names, the destination (writable, apart from the source, and what
    its claim will do with what is there: a foreign node is refused here)."""
    from ...io.checkpoints import is_url, source_locations

    compression = compressions.canonical(compression)
    if str(dst).lower().endswith(".zip"):
        raise InvalidParameterError(
            f"cannot convert into {dst}: a converted checkpoint is a directory (a Zarr group)"
            " or a .safetensors file, not a .zip; convert into a directory, then zip it"
            " (zip -r0) if a single file is needed"
        )
    runner = resolve(executor)
    executors.check_shared("checkpoint", checkpoint, executor=runner)
    executors.check_shared("destination", dst, executor=runner)
    opener = CheckpointSource(
        path_of(checkpoint),
        storage_options if is_url(checkpoint) else None,
        store if is_url(checkpoint) else None,
        None if recipe.scales.is_default() else recipe.scales.to_dict(),
    )
    raw = opener.open_raw()
    tensors = opener.pair(raw)  # FP8 weights with their block scales, as float32
    source = location(checkpoint) or str(checkpoint)
    sources = source_locations(checkpoint, raw)
    destination.check_separate(sources, dst)
    # a URL destination is written through fsspec: with store="obstore", storage_options are
    # obstore's and the destination takes fsspec's own configuration (the environment)
    dst_options = storage_options if store in (None, "fsspec") else None
    destination.check_writable(dst)
    keys = tensor_keys(tensors)  # (refuses names no tensor may have before anything is written)
    found = recipe.check(tensors)  # (an axis a tensor lacks: refused here, too)
    ident = {"source": source, "recipe": recipe.to_dict(), "compression": compression}
    packed = _use_packs(packs, tensors, dst)
    if packs is None and not overwrite:  # an earlier run of this job keeps its layout
        packed = _earlier_layout(dst, ident, packed)
    if packed:  # (outputs without packs keep their identity)
        ident["layout"] = "packed"
    dest = Destination(
        dst,
        "checkpoint",
        json.dumps(ident, sort_keys=True),
        storage_options=dst_options,
        same_job=lambda meta: same_job(meta, ident),
    )
    action, _ = dest.look(overwrite=overwrite)  # (a foreign node: refused here)
    small = small_job(tensors, recipe)
    return Prepared(
        opener,
        tensors,
        source,
        sources,
        keys,
        ident,
        packed,
        dest,
        action,
        compression,
        runner,
        found,
        executor,
        small,
    )


def convert(
    checkpoint: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    recipe: Recipe,
    *,
    max_memory: int | None = None,
    overwrite: bool = False,
    on_tensor: Callable[[TensorEvent], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    executor: str | Executor | None = None,
    compression: str | None = compressions.AUTO,
    storage_options: dict | None = None,
    store: str | None = None,
    packs: bool | None = None,
    prepared: Prepared | None = None,
) -> dict[str, Any]:
    """Quantize every tensor of ``checkpoint`` the recipe selects into the group ``dst``
    (see :func:`qstream.convert_checkpoint`). ``packs``: store runs of small, alike tensors
    as packs (:mod:`qstream.io.outputs.pack_layout`); None: when the checkpoint holds at least
    :data:`AUTO_PACK_TENSORS` tensors and ``dst`` is a local directory. ``prepared``: what
    :func:`prepare` gave for these arguments (else it is called here)."""
    if prepared is None:
        prepared = prepare(
            checkpoint,
            dst,
            recipe,
            overwrite=overwrite,
            executor=executor,
            compression=compression,
            storage_options=storage_options,
            store=store,
            packs=packs,
        )
    p = prepared
    runner = p.runner
    numpy = p.numpy_kernels
    if executor is not None and executor is not p.executor:
        # a plan made before the executor was opened (the CLI's --scheduler): it runs
        # where it is told, once the executor can reach what it needs
        runner = resolve(executor)
        executors.check_shared("checkpoint", checkpoint, executor=runner)
        executors.check_shared("destination", dst, executor=runner)
    for warning in p.warnings:
        warnings.warn(warning, QStreamWarning, stacklevel=3)
    root_store = (
        None
        if destination.local_path(dst)
        else open_store(dst, mode="w", storage_options=p.dest.storage_options)
    )
    with p.dest.claim(overwrite=overwrite) as (action, existing):
        if action in (Action.RESUME, Action.COMPLETE):
            assert existing.meta is not None  # (a root qstream wrote has its metadata)
            index = RootIndex.open(dst, existing.meta, root_store)
            if action is Action.RESUME:
                index.upgrade()
        else:
            index = RootIndex.create(dst, {**p.ident, "tensors_total": len(p.tensors)}, root_store)
        t0 = time.perf_counter()
        conversion = Conversion(
            p.tensors,
            p.keys,
            index,
            p.dest,
            p.source,
            on_tensor,
            progress,
            runner,
            max_memory=max_memory,
            overwrite=overwrite,
            compression=p.compression,
            checkpoint=p.opener,
            in_flight=1 if runner.distributed else TENSORS_IN_FLIGHT,
            packed=p.packed,
        )
        with using_numpy_kernels(numpy):
            return _convert(conversion, action is Action.COMPLETE, recipe, t0)


AUTO_PACK_TENSORS = 64  # checkpoints of at least this many tensors are packed by default


def small_job(tensors: dict[str, Any], recipe: Recipe) -> bool:
    """Whether a conversion runs the NumPy twins of the kernels (``qstream.kernels.
    numpy_twins``) and never loads Numba: at most :data:`~qstream.budget.NUMPY_JOB` elements
    to quantize in all, each tensor's spec and type ones the twins cover
    (:func:`~qstream.engine.jobs.kernel_choice.twins_cover`). Importing Numba and loading its
    cached kernels takes ~0.3 s, more than such a job computes.

    Decided from the job alone (its tensors and recipe), not from how it runs: a re-run
    resumes on the same kernels, and a run on Dask or with packs writes what a local run
    writes, byte for byte. The twins give the kernels' codes and parameters bit for bit,
    their error sums to float64 rounding (the twins' module): the same job converted with
    more elements than the bound may differ from it in the last bits of those figures."""
    elements = 0
    for name, t in tensors.items():
        spec = recipe.spec_for(name, t.shape, t.dtype)
        if spec is None:
            continue
        if not twins_cover(spec, getattr(t, "source_dtype", t.dtype)):
            return False
        elements += math.prod(t.shape)
        if elements > budget.NUMPY_JOB:  # (a checkpoint of 16,384 tensors: known at once)
            return False
    return True


def _use_packs(packs: bool | None, tensors: dict[str, Any], dst: Any) -> bool:
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


def _earlier_layout(dst: Any, ident: dict[str, Any], packed: bool) -> bool:
    """Whether to write packs at ``dst`` under the default, without ``overwrite``: as an
    earlier run of this job there did (resumed or found complete as it was made, whatever the
    default was then; a version before 2026-11-26 packed only from 512 tensors), else
    ``packed``."""
    if destination.local_path(dst) is None:  # (packs are written to local directories only)
        return packed
    existing = destination.inspect_destination(dst)
    if existing.kind != "checkpoint" or not existing.meta:
        return packed
    other = ident if packed else {**ident, "layout": "packed"}  # (the other layout's job)
    return not packed if same_job(existing.meta, other) else packed


TENSORS_IN_FLIGHT = 2  # local runs: one tensor's setup and last blocks overlap the next's


def _convert(conversion: Conversion, complete: bool, recipe: Recipe, t0: float) -> dict[str, Any]:
    """Run ``conversion`` (unless the root is ``complete`` already), mark the root complete
    and return the conversion's result (``t0``: when it started)."""
    tensors, executor, index = conversion.tensors, conversion.executor, conversion.index
    dst, compression = conversion.dest.target, conversion.compression
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
        "checkpoint": str(getattr(conversion.checkpoint, "path", conversion.checkpoint)),
        "destination": str(dst),
        "tensors": results,
        "bytes_before": before,
        "bytes_after": after,
        "seconds": 0.0 if complete else time.perf_counter() - t0,
        "recipe": recipe.to_dict(),
        "compression": compression,
        "already_complete": complete,
    }
