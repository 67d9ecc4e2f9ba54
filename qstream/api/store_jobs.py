"""Quantize, dequantize and calibrate Zarr stores out of core (the jobs are in
:mod:`qstream.engine.jobs.job`, the on-disk format in :mod:`qstream.io.outputs.qarray`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

from ..budget import check_max_memory
from ..engine.convert import look_restore, restore
from ..engine.jobs import QuantizeJob, look_dequantize
from ..engine.jobs import dequantize as dequantize_group
from ..io.outputs import is_checkpoint
from ..io.storage import display, store_errors, with_backend
from ..kernels.numpy_twins import using_numpy_kernels
from ..spec import Calibration, QuantReport, QuantSpec
from ..viz import reporting
from ..workflows import ConversionPlan, dequantize_files

if TYPE_CHECKING:
    from ..workflows import (
        ArraySource,
        ExecutorLike,
        Location,
        OnTensor,
        PathLike,
        Progress,
        StorageOptions,
    )


def calibrate(
    src: ArraySource,
    spec: QuantSpec | None = None,
    *,
    max_memory: int | None = None,
    progress: Progress | None = None,
    storage_options: StorageOptions | None = None,
    executor: ExecutorLike = None,
    store: str | None = None,
) -> Calibration:
    """Gather statistics from ``src`` and derive the scale/zero point ``spec`` asks for
    (writes nothing). ``executor`` and ``store``: see :func:`quantize_store`."""
    with store_errors(src):
        job = QuantizeJob(
            with_backend(src, store, storage_options, read_only=True),
            spec or QuantSpec(),
            max_memory=max_memory,
            storage_options=storage_options,
            executor=executor,
        )
        try:
            with reporting(progress, "calibrate") as shown, _kernels_of(job):
                return job.calibration(shown)
        finally:
            job.close()


def _kernels_of(job: QuantizeJob) -> Any:
    """The kernels ``job`` runs, as a context for its run: the NumPy twins for a small array
    (``job.numpy_kernels``: Numba is never loaded), else Numba's."""
    return using_numpy_kernels(job.numpy_kernels)


def quantize_store(
    src: ArraySource,
    dst: Location,
    spec: QuantSpec | None = None,
    *,
    max_memory: int | None = None,
    progress: Progress | None = None,
    overwrite: bool = False,
    resume: bool = True,
    storage_options: StorageOptions | None = None,
    executor: ExecutorLike = None,
    store: str | None = None,
    histogram: bool = False,
    compression: str | None = "auto",
    layout: str = "group",
    chunks: int | tuple[int, ...] | list[int] | None = None,
) -> QuantReport:
    """Quantize the array ``src`` into the quantized group ``dst``.

    ``src``: a path/URL of a Zarr array (v2 or v3), a ``zarr.Array`` or a NumPy array.
    ``dst``: a local directory, a ``.zip`` path, ``memory://name`` or an fsspec URL; it must
    be new, empty, or an output of qstream (see below); never the source or a place inside it.
    ``max_memory`` bounds the working memory (bytes, default 1 GiB): the blocks in flight and
    the calibration histograms. ``progress(done, total)`` is called as blocks land; when
    ``progress`` also has a ``stage(name, total, done)`` method, it is called as each pass
    starts ("ranges", "histograms", "search", "quantize"), with the pass's total.

    Re-running a job (same spec, same source however its path is spelled) on its unfinished
    output resumes it, and the result and report are bit-identical to an uninterrupted run
    (``resume=False`` refuses instead); on its finished output it returns the stored report
    with ``already_complete=True``. ``overwrite=True`` replaces another qstream job's
    output (only the files qstream wrote); anything else (files, a folder of other things, a
    Zarr node qstream did not write) is always refused. A local destination is locked while
    a job writes it; on object stores the output's writer holds a lease (see the README).

    ``executor``: where the blocks run: None or ``"local"`` (this process's threads),
    ``"dask"`` (the current ``distributed`` client) or ``qstream.DaskExecutor(client=...,
    kernel_threads=1, blocks_per_task=None)``. A cluster run writes the same bytes and the
    same report as a local one; its source and destination must be reachable from every
    worker (a shared filesystem or an object store; not ``memory://``, ``.zip`` or NumPy).

    ``store``: how URLs are opened: ``"fsspec"`` (default; ``storage_options`` are fsspec's,
    e.g. ``key``, ``secret``, ``client_kwargs``) or ``"obstore"`` (``storage_options`` are
    obstore's config, e.g. ``endpoint``, ``access_key_id``, ``region``). ``src``/``dst`` may
    also be ready ``zarr`` store objects.

    ``histogram``: a per-tensor ``minmax`` job makes one more pass, a histogram of the source
    kept in the output's metadata for its views (``qstream inspect OUT --show``,
    ``report.plot()``); histogram methods keep the histogram they searched anyway, and
    per-axis outputs keep per-channel summaries (see :mod:`qstream.spec.views`).

    ``compression``: how the output's chunks are compressed: ``"auto"`` (a Zarr v3 source's
    compressors for the codes, else zstd), ``"none"`` (raw: the fastest to write and read),
    ``"zstd[:LEVEL]"``, ``"gzip[:LEVEL]"`` or ``"blosc[:CNAME[:LEVEL]]"`` (see
    :mod:`qstream.io.storage.compression`). Values and report are the same whatever it is.

    ``layout``: ``"group"`` (default) or ``"codec"``: per tensor, ``data`` is written as a
    float32 Zarr v3 array whose ``scale_offset`` + ``cast_value`` codecs decode the codes, so
    zarr and xarray read floats without qstream (needs zarr >= 3.2 and cast-value-rs; see
    :mod:`qstream.io.outputs.codec`). ``chunks``: the output's chunks (one size per axis, -1 for a
    whole axis), e.g. for a reader's access pattern; default: multiples of the source's chunks
    of about 16 MiB. Either way one chunk is one block, held to ``max_memory``.
    """
    from ..io.storage import check_destination_suffix

    check_max_memory(max_memory)  # (a refused bound writes nothing)
    check_destination_suffix(dst, (), "a quantization")
    with store_errors(_remote(dst, src)):
        job = _quantize_job(src, spec, max_memory, storage_options, executor, store, histogram,
                            compression, layout, chunks)  # fmt: skip
        target = with_backend(dst, store, storage_options, read_only=False)
        with reporting(progress, "quantize") as shown, _kernels_of(job):
            return job.run(target, progress=shown, overwrite=overwrite, resume=resume)


def plan_quantize(
    src: ArraySource,
    dst: Location,
    spec: QuantSpec | None = None,
    *,
    max_memory: int | None = None,
    overwrite: bool = False,
    resume: bool = True,
    storage_options: StorageOptions | None = None,
    executor: ExecutorLike = None,
    store: str | None = None,
    histogram: bool = False,
    compression: str | None = "auto",
    layout: str = "group",
    chunks: int | tuple[int, ...] | list[int] | None = None,
) -> ConversionPlan:
    """What :func:`quantize_store` with these arguments would do, decided as it decides it
    and refusing what it refuses (the same exceptions and messages) before a value of
    ``src`` is read from its store (a NumPy array is hashed, as the run identifies it),
    writing nothing: what happens to ``dst`` (``create``, ``resume``,
    ``complete``, ``replace``), the array's row (shape, dtype, the type it is stored as,
    bytes before and after: codes and parameters, uncompressed) and the output's chunks.
    ``qstream quantize --dry-run`` prints it."""
    from ..engine.convert import describe_target
    from ..io.outputs import qarray
    from ..io.storage import check_destination_suffix
    from ..workflows import missing_parents

    check_max_memory(max_memory)
    check_destination_suffix(dst, (), "a quantization")
    with store_errors(_remote(dst, src)):
        job = _quantize_job(src, spec, max_memory, storage_options, executor, store, histogram,
                            compression, layout, chunks)  # fmt: skip
        target = with_backend(dst, store, storage_options, read_only=False)
        action = job.look(target, overwrite=overwrite, resume=resume)
    shape = [int(d) for d in job.source.shape]
    row = {"name": display(src), "shape": shape, "dtype": job.source.dtype.name,
           "target": describe_target(job.spec), "kept": False,
           "bytes_before": math.prod(shape) * job.source.dtype.itemsize,
           "bytes_after": qarray.quantized_nbytes(shape, job.spec)}  # fmt: skip
    blocks = len(job.blocks)
    notes = [f"{blocks} block{'s' * (blocks != 1)} of chunks {list(job.plan.chunks)}"]
    return ConversionPlan(
        checkpoint=display(src), destination=display(dst), kind="zarr", action=action,
        creates=missing_parents(cast("PathLike", dst)), rows=[row], notes=notes,
        prepared=job,  # (its kernels: ConversionPlan.loads_kernels)
    )  # fmt: skip


def _quantize_job(src: ArraySource, spec: QuantSpec | None, max_memory: int | None,
                  storage_options: StorageOptions | None, executor: ExecutorLike,
                  store: str | None, histogram: bool, compression: str | None, layout: str,
                  chunks: Any) -> QuantizeJob:  # fmt: skip
    return QuantizeJob(
        with_backend(src, store, storage_options, read_only=True),
        spec or QuantSpec(),
        max_memory=max_memory,
        storage_options=storage_options,
        executor=executor,
        view_histogram=histogram,
        compression=compression,
        layout=layout,
        chunks=chunks,
    )


def dequantize_store(
    src: Location,
    dst: Location,
    *,
    dtype: str = "float32",
    max_memory: int | None = None,
    progress: Progress | None = None,
    overwrite: bool = False,
    storage_options: StorageOptions | None = None,
    executor: ExecutorLike = None,
    store: str | None = None,
    compression: str | None = "auto",
    on_tensor: OnTensor | None = None,
) -> dict[str, Any]:
    """Dequantize the quantized group ``src`` into a plain Zarr array ``dst`` of ``dtype``
    (float32, float16 or bfloat16), under the same destination rules (and with the same
    ``executor`` and ``store`` choices) as :func:`quantize_store`. ``compression``: as for
    :func:`quantize_store`; ``"auto"`` takes the quantized codes' compressors. ``dst`` inside
    a Zarr group (``copy.zarr/t2m``) gets the output's coordinates beside it (``lat``,
    ``time``, ...: never replacing a member there), listed as the result's ``coordinates``.

    ``src`` may be a converted checkpoint's root: ``dst`` then becomes a group with every
    tensor restored (kept tensors copied as stored), and the result lists them;
    ``on_tensor`` is called before and after each tensor with a
    :class:`qstream.TensorEvent` (which one of how many, its name; see
    :func:`qstream.engine.convert.convert_checkpoint.restore`); only there (not for one array, nor a
    ``.safetensors`` ``src`` or ``dst``).

    ``dst`` ending in ``.safetensors``: the values are written as safetensors instead (one
    file, or shards with an index above 5 GB; see :func:`qstream.export_safetensors`,
    ``format="dequantized"``), streaming with bounded memory."""
    from ..io.storage import check_destination_suffix

    check_max_memory(max_memory)  # (a refused bound writes nothing)
    check_destination_suffix(dst, (".safetensors",), "a dequantization")
    with reporting(progress, "dequantize") as progress:
        # (both go through files: their source and destination are paths)
        paths = cast("PathLike", src), cast("PathLike", dst)
        urls: dict[str, Any] = {"storage_options": storage_options, "store": store}
        if str(src).endswith((".safetensors", ".safetensors.index.json")):  # one of its exports
            return dequantize_files.decoded(*paths, dtype, overwrite, max_memory, progress, **urls)
        # llama.cpp's file (decoded as gguf-py decodes it) or a model's safetensors folder
        # (quantized ones decoded as their format's decompressor decodes them)
        if str(src).lower().endswith(".gguf") or dequantize_files.model_folder(src):
            return dequantize_files.decoded_source(
                *paths, dtype, overwrite, max_memory, progress, **urls
            )
        if str(dst).endswith(".safetensors"):
            return dequantize_files.to_safetensors(
                *paths, dtype, overwrite, storage_options, max_memory, progress=progress
            )
        with store_errors(_remote(dst, src)):
            return _dequantize_any(
                with_backend(src, store, storage_options, read_only=True),
                dst,
                storage_options=storage_options,
                store=store,
                dtype=dtype,
                max_memory=max_memory,
                progress=progress,
                overwrite=overwrite,
                executor=executor,
                compression=compression,
                on_tensor=on_tensor,
            )


def plan_dequantize(
    src: Location,
    dst: Location,
    *,
    dtype: str = "float32",
    max_memory: int | None = None,
    overwrite: bool = False,
    storage_options: StorageOptions | None = None,
    store: str | None = None,
    compression: str | None = "auto",
) -> ConversionPlan:
    """What :func:`dequantize_store` with these arguments would do, decided as it decides
    it and refusing what it refuses (the same exceptions and messages), writing nothing:
    what happens to ``dst`` (``create``, ``resume``, ``complete``, ``replace``) and a row per
    tensor (its stored type, the target dtype or ``keep``, bytes before and after; a model
    folder's or GGUF file's decoding: the rows of its conversion plan). ``qstream dequantize
    --dry-run`` prints it."""
    from ..io.outputs import open_quantized as open_output
    from ..io.storage import check_destination_suffix
    from ..qtypes import float_dtype
    from ..workflows import missing_parents

    check_max_memory(max_memory)
    check_destination_suffix(dst, (".safetensors",), "a dequantization")
    float_dtype(dtype)  # (refused as the run refuses it)
    paths = cast("PathLike", src), cast("PathLike", dst)
    s = str(src)
    urls: dict[str, Any] = {"storage_options": storage_options, "store": store}
    if s.endswith((".safetensors", ".safetensors.index.json")):
        return cast(
            "ConversionPlan",
            dequantize_files.decoded_plan(*paths, dtype, overwrite, max_memory, **urls),
        )
    if s.lower().endswith(".gguf") or dequantize_files.model_folder(src):
        config, quantized = dequantize_files.config_for(*paths, dtype, **urls)
        where = dequantize_files.check_config(*paths, config)
        plan = dequantize_files.decoded_plan(
            *paths, dtype, overwrite, max_memory, config is not None and quantized, **urls
        )
        if config is not None:
            plan.notes.append(f"writes {where}: the model's config (no quantization_config)")
        return cast("ConversionPlan", plan)
    kind = "safetensors" if str(dst).endswith(".safetensors") else "zarr"
    with store_errors(_remote(dst, src)):
        if kind == "safetensors":
            out = dequantize_files.to_safetensors(
                *paths, dtype, overwrite, storage_options, max_memory, dry_run=True
            )
            action = "complete" if out.get("already_complete") else "create"
            opened = open_output(src, storage_options=storage_options, max_memory=max_memory)
            index = getattr(opened, "tensors", {})  # (a checkpoint's rows: what is stored)
            rows = []
            for e in out.get("entries", []):
                r = index.get(e["name"], {})
                kept = bool(r.get("kept", False))
                rows.append({"name": e["name"], "shape": e["shape"], "kept": kept,
                             "dtype": str(r.get("dtype" if kept else "target", e["dtype"])),
                             "target": "keep" if kept else dtype,
                             "bytes_before": int(r.get("bytes_after", e["bytes"])),
                             "bytes_after": e["bytes"]})  # fmt: skip
        else:
            source = with_backend(src, store, storage_options, read_only=True)
            target = with_backend(dst, store, storage_options, read_only=False)
            if is_checkpoint(source, storage_options):
                action, rows = look_restore(
                    source, target, dtype=dtype, max_memory=max_memory, overwrite=overwrite,
                    compression=compression,
                )  # fmt: skip
            else:
                action, rows = look_dequantize(
                    source, target, dtype=dtype, max_memory=max_memory, overwrite=overwrite,
                    storage_options=storage_options, compression=compression,
                )  # fmt: skip
    return ConversionPlan(
        checkpoint=str(src), destination=str(dst), kind=kind, action=action,
        creates=missing_parents(cast("PathLike", dst)), rows=rows,
    )  # fmt: skip


def _remote(*targets: ArraySource) -> ArraySource:
    """The first of ``targets`` that is a URL (how failures of the store are named), else
    the first."""
    for t in targets:
        if isinstance(t, str) and "://" in t and not t.startswith(("file://", "memory://")):
            return t
    return targets[0]


def _dequantize_any(
    src: Location,
    dst: Location,
    *,
    storage_options: StorageOptions | None,
    store: str | None,
    on_tensor: OnTensor | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """One quantized group dequantized into an array, or a converted checkpoint's root into a
    group of arrays."""
    if is_checkpoint(src, storage_options):
        return restore(src, dst, on_tensor=on_tensor, **kw)
    target = with_backend(dst, store, storage_options, read_only=False)
    return dequantize_group(src, target, storage_options=storage_options, **kw)
