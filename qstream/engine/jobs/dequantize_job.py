"""A store dequantization from start to end: one pass back to a plain Zarr array.

:func:`dequantize` plans the blocks of the quantized group's data chunks, claims the
destination, and runs the one pass (:class:`~qstream.engine.blocks.dequantize_work.DequantizeWork`
writes each block) on the executor; the driver alone writes the output's metadata,
``complete: true`` last. An interrupted run is made again (its blocks are not logged).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import uuid
from typing import Any

import numpy as np

from ...budget import Block, check_fits, fit_workers, plan_blocks
from ...core import dimension_names
from ...errors import StoreError
from ...io.outputs import Action, Destination, Lease, QuantizedArray, destination, qarray
from ...io.storage import compression as compressions
from ...io.storage import display, location
from ...kernels.numpy_twins import using_numpy_kernels
from ...qtypes import float_dtype
from ..blocks import DequantizeWork
from ..run import DestRef, check_shared, pipeline, resolve
from .kernel_choice import small_array
from .passes import Progress, counter, fspath, report_stage


def _prepared(
    src: Any,
    dst: Any,
    dtype: Any,
    storage_options: dict[str, Any] | None,
    max_memory: int | None,
    compression: str,
) -> tuple[QuantizedArray, np.dtype, Any, str, Destination]:
    """What a dequantization checks before it writes (the run's and the plan's alike): the
    source opened, the destination separate and writable, the blocks within the memory
    bound; the array, output dtype, source location, job fingerprint and destination."""
    arr = qarray.open_quantized(src, storage_options=storage_options, max_memory=max_memory)
    # (a checkpoint's root is restored tensor by tensor: qstream.engine.convert.restoring)
    assert isinstance(arr, QuantizedArray)
    out_dtype = float_dtype(dtype)
    src_loc = location(src)
    destination.check_separate(src_loc, dst)
    destination.check_writable(dst)
    check_fits(max_memory, arr.data.chunks, np.dtype(np.float32), 1, arr.shape)
    fp = dequantized_fingerprint(src_loc, arr, out_dtype, compression)
    return arr, out_dtype, src_loc, fp, Destination(dst, "dequantized", fp,
                                                    storage_options=storage_options)  # fmt: skip


def look_dequantize(
    src: Any,
    dst: Any,
    *,
    dtype: Any = "float32",
    max_memory: int | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    compression: str | None = compressions.AUTO,
) -> tuple[str, list[dict[str, Any]]]:
    """What :func:`dequantize` with these arguments would do, refusing what it refuses,
    writing nothing: its action on ``dst`` and the array's row (name, shape, stored type,
    target dtype, bytes before and after)."""
    compression = compressions.canonical(compression)
    arr, out_dtype, _, _, dest = _prepared(src, dst, dtype, storage_options, max_memory,
                                           compression)  # fmt: skip
    action, _ = dest.look(overwrite=overwrite)
    n = math.prod(arr.shape)
    row = {"name": display(src), "shape": list(arr.shape), "dtype": arr.spec.dtype,
           "target": out_dtype.name, "kept": False,
           "bytes_before": int(qarray.quantized_nbytes(arr.shape, arr.spec)),
           "bytes_after": int(n * out_dtype.itemsize)}  # fmt: skip
    return action.value, [row]


def dequantize(
    src: Any,
    dst: Any,
    *,
    dtype: Any = "float32",
    max_memory: int | None = None,
    progress: Progress | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    executor: Any = None,
    compression: str | None = compressions.AUTO,
) -> dict[str, Any]:
    """Dequantize the quantized group ``src`` into a plain Zarr array ``dst`` (see
    :func:`qstream.dequantize_store`)."""
    import zarr

    from ...io.outputs import carried_attrs, copy_coords_beside

    t0 = time.perf_counter()
    compression = compressions.canonical(compression)
    executor = resolve(executor)
    check_shared("source", src, executor=executor)
    check_shared("destination", dst, executor=executor)
    arr, out_dtype, src_loc, fp, dest = _prepared(
        src, dst, dtype, storage_options, max_memory, compression
    )
    result = {
        "source": display(src),
        "destination": display(dst),
        "dtype": out_dtype.name,
        "shape": list(arr.shape),
        "bytes_written": int(math.prod(arr.shape) * out_dtype.itemsize),
        "already_complete": False,
    }
    blocks = plan_blocks(arr.shape, arr.data.chunks)
    token = uuid.uuid4().hex
    meta = {"dequantized_from": src_loc, "dtype": out_dtype.name, "fingerprint": fp}
    action, _ = dest.look(overwrite=overwrite)
    # its own finished output, damaged: made again (if it is still this job's once locked)
    repair = action is Action.COMPLETE and gaps_at(dst, storage_options)
    with dest.claim(overwrite=overwrite, repair=repair) as (action, existing):
        if action is Action.COMPLETE:
            return {**result, "already_complete": True, "seconds": 0.0}
        if action is Action.RESUME:  # an unfinished run: made again (blocks are not logged)
            destination.remove_output(dst, existing, storage_options)
        from ...io.storage import open_store

        store = open_store(dst, mode="w", storage_options=storage_options)
        layout = dequantized_array(arr, out_dtype, compression)
        try:
            out = zarr.create_array(
                store,
                # (a plain dict of ArrayConfigParams' keys)
                config=qarray.WRITE_ALL_CHUNKS,  # type: ignore[arg-type]
                attributes={
                    **carried_attrs(dict(arr.data.attrs)),  # units, long_name, ...
                    "qstream": {**meta, **Lease.fields(dst, token), "complete": False},
                },
                **layout,
            )
        except zarr.errors.ContainsArrayError:
            raise StoreError(f"{dst} was created by another process meanwhile") from None
        except OSError as e:
            raise StoreError(f"cannot write {dst}: {e}") from None
        work = DequantizeWork(
            DestRef(token, fspath(src), storage_options),
            DestRef(token, fspath(dst), storage_options),
            out_dtype.name,
            max_memory,
        )
        # a small array's blocks are dequantized with NumPy, the kernel's bytes: no Numba (but
        # sub-byte codes, which a kernel unpacks)
        with using_numpy_kernels(small_array(arr.shape) and arr.qtype.bits >= 8):
            workers = fit_workers(max_memory, blocks, 4, pipeline.default_workers())
            report_stage(progress, "dequantize", len(blocks))
            lease = Lease(out, token, dst)
            tick = counter(progress, len(blocks))

            def landed(b: Block) -> None:
                lease.renew()
                if tick is not None:
                    tick(b)

            try:
                pipeline.run(blocks, work, workers=workers, progress=landed, executor=executor)
            except OSError as e:
                if isinstance(e, StoreError):
                    raise
                raise StoreError(f"cannot write {dst}: {e}") from None
            finally:
                executor.release(token)
        if not destination.is_local_node(out):  # (see qstream.engine.jobs.job_report.check_landed)
            qarray.check_writer(out, token, dst)
            missing = qarray.gaps(out)
            if missing:
                raise StoreError(
                    f"{dst}: {len(missing)} chunks are missing or damaged after the run:"
                    " something else deleted or changed them; re-run to write them again"
                )
        # (lat, lon, time, ...: beside the copy when it is a member of a group)
        coords = copy_coords_beside(
            arr.group,
            layout["dimension_names"],
            arr.shape,
            dst,
            storage_options,
        )
        try:
            out.attrs["qstream"] = {**meta, **Lease.fields(dst, token), "complete": True}
        except OSError as e:
            raise StoreError(f"cannot write {dst}: {e}") from None
        destination.clean_partials(dst)
    return {**result, "coordinates": coords, "seconds": time.perf_counter() - t0}


def dequantized_fingerprint(
    src_loc: Any, arr: QuantizedArray, out_dtype: np.dtype, compression: str
) -> str:
    """What makes two dequantizations the same job: the source, its job, the dtype and the
    compression."""
    ident = [src_loc, arr.meta.get("fingerprint"), out_dtype.name]
    if compression != compressions.AUTO:
        ident.append(compression)
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:32]


def dequantized_array(arr: QuantizedArray, out_dtype: np.dtype, compression: str) -> dict[str, Any]:
    """The ``create_array`` keywords of the array ``arr`` dequantizes into (bfloat16 as the
    ``bfloat16`` Zarr data type qstream registers; earlier versions stored its uint16 bits)."""
    from ...io.zarr_types.zarr_ext import register_zarr_types

    register_zarr_types()
    return {
        "shape": arr.shape,
        "chunks": arr.data.chunks,
        "dtype": out_dtype,
        "fill_value": 0,
        "compressors": compressions.compressors(compression, arr.data.compressors),
        "chunk_key_encoding": qarray.FLAT_KEYS,
        # the quantized output's (the source's, for outputs that carry them)
        "dimension_names": list(
            getattr(arr.data.metadata, "dimension_names", None) or dimension_names(arr.ndim)
        ),
    }


def gaps_at(dst: Any, storage_options: dict[str, Any] | None) -> bool:
    """Whether the array at ``dst`` lacks parts (see :func:`qstream.io.outputs.qarray.gaps`)."""
    import zarr

    from ...io.storage import open_store

    try:
        store = open_store(dst, mode="r", storage_options=storage_options)
        return bool(qarray.gaps(zarr.open_array(store=store, mode="r")))
    except (OSError, KeyError, ValueError):
        return True
