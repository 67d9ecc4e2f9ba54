"""Quantize, dequantize and calibrate Zarr stores out of core; read quantized arrays lazily.

Layout of a quantized array (a Zarr v3 group)::

    dst/            attrs["qstream"] = {"version", "spec", "source", "calibration", "error",
      data                             "complete", "fingerprint", ...}
      scale         float32, the parameter shape ([] per tensor, [C] per axis, blocked shape)
      zero_point    the type's integer container (float types: float32 zeros)
      _progress     uint8 [n_blocks]: 1 once a block (one data chunk) has landed (resume)

Sub-byte integers (int4/uint4/int2/uint2) are stored one element per byte in int8/uint8;
float8/float4 as their uint8 bit patterns. Per-tensor arrays also carry CF ``scale_factor``/
``add_offset`` on ``data`` so xarray decodes them without qstream. ``complete`` is written last.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..engine import pipeline
from ..engine.blockmath import (
    block_errors,
    block_errors_fused,
    block_ranges,
    block_slot_ranges,
)
from ..engine.plan import Block, default_chunks, plan_blocks
from ..errors import InvalidDTypeError, InvalidParameterError, NonFiniteInputError, StoreError
from ..io.progress import BlockProgress
from ..io.stores import ArrayWriter, open_group, open_source
from ..layout import normalize_axis, param_region, plan_layout
from ..qtypes import QType, float_dtype, is_float_dtype
from ..rounding import round_code
from ..scratch import scratch
from ..spec import (
    HISTOGRAM_METHODS,
    Calibration,
    ErrorStats,
    QuantParams,
    QuantReport,
    QuantSpec,
    RangeStats,
    merge_into,
)
from .arrays import affine_dequantize, affine_quantize, check_scale
from .quantized import open_quantized

FORMAT_VERSION = 1
# Every output chunk is written: skipping zarr's "is this chunk all fill value?" scan saves a
# full pass over the data, and quantized/dequantized chunks are almost never empty.
_WRITE_ALL_CHUNKS = {"write_empty_chunks": True}
# Chunk files side by side ("c.0.0"), not one directory per chunk row ("c/0/0"): creating a
# directory costs as much as a file, and a block writes one chunk.
_FLAT_KEYS = {"name": "default", "separator": "."}
_PARAM_CHUNK = 1 << 18  # parameters per chunk of a per-axis scale/zero_point (at least)
DEFAULT_BLOCK_BYTES = 16 << 20
DEFAULT_MAX_MEMORY = 1 << 30  # working-memory bound when max_memory is not given
# bytes of working memory per float32 byte of a block held by one worker (the source block,
# its float32 widening, the quantized block, a chunk's compressed bytes), used to turn
# max_memory into a block size
_WORK_FACTOR = 4
_BUDGET_WORKERS = 4  # max_memory is shared by up to this many blocks in flight


# --------------------------------------------------------------------------- public API


def calibrate(
    src,
    spec: QuantSpec | None = None,
    *,
    max_memory: int | None = None,
    progress: Callable | None = None,
    storage_options: dict | None = None,
) -> Calibration:
    """Gather statistics from ``src`` and derive the scale/zero point ``spec`` asks for."""
    spec = spec or QuantSpec()
    job = _Job(src, spec, max_memory, storage_options)
    return job.calibration(progress)


def quantize_store(
    src,
    dst,
    spec: QuantSpec | None = None,
    *,
    max_memory: int | None = None,
    progress: Callable | None = None,
    overwrite: bool = False,
    resume: bool = True,
    storage_options: dict | None = None,
) -> QuantReport:
    """Quantize the array ``src`` into the quantized group ``dst`` (see module docstring).

    ``src``: a path/URL of a Zarr array (v2 or v3), a ``zarr.Array`` or a NumPy array.
    ``dst``: a local directory, a ``.zip`` path, ``memory://name`` or an fsspec URL.
    ``max_memory`` bounds the working memory (bytes); ``progress(done, total)`` is called as
    blocks land. An interrupted job re-run with the same spec and source resumes (unless
    ``resume=False``); a different job refuses an existing ``dst`` unless ``overwrite=True``.
    """
    spec = spec or QuantSpec()
    job = _Job(src, spec, max_memory, storage_options)
    return job.quantize(dst, progress=progress, overwrite=overwrite, resume=resume)


def dequantize_store(
    src,
    dst,
    *,
    dtype="float32",
    max_memory: int | None = None,
    progress: Callable | None = None,
    overwrite: bool = False,
    storage_options: dict | None = None,
) -> dict:
    """Dequantize the quantized group ``src`` into a plain Zarr array ``dst`` of ``dtype``."""
    t0 = time.perf_counter()
    arr = open_quantized(src, storage_options=storage_options)
    out_dtype = float_dtype(dtype)
    blocks = plan_blocks(arr.shape, arr.data.chunks)
    # Zarr has no bfloat16 data type yet: bfloat16 results are stored as their uint16 bits,
    # the logical dtype recorded in attrs["qstream"]["dtype"].
    stored = np.dtype(np.uint16) if out_dtype.name == "bfloat16" else out_dtype
    out = _create_plain_array(
        dst,
        arr.shape,
        arr.data.chunks,
        stored,
        overwrite,
        storage_options,
        compressors=arr.data.compressors,
    )
    reader = open_source(arr.data)
    writer = ArrayWriter(out)

    def work(b: Block) -> None:
        q = reader.view(b.key)  # a mapped uncompressed chunk, else read into a buffer
        if q is None or not q.flags.c_contiguous:
            q = reader.read(b.key, out=scratch("q", b.shape, reader.dtype))
        y = arr.dequantize_region(b.key, q, out_dtype, out=scratch("y", b.shape, out_dtype))
        writer[b.key] = y.view(stored)

    pipeline.run(
        blocks,
        work,
        workers=_workers(max_memory, blocks, 4),
        progress=_counter(progress, len(blocks)),
    )
    out.attrs["qstream"] = {"dequantized_from": str(src), "dtype": out_dtype.name, "complete": True}
    return {
        "source": str(src),
        "destination": str(dst),
        "dtype": out_dtype.name,
        "shape": list(arr.shape),
        "seconds": time.perf_counter() - t0,
        "bytes_written": int(math.prod(arr.shape) * out_dtype.itemsize),
    }


# --------------------------------------------------------------------------- the job


class _Job:
    """One conversion: source, spec, plan, parameters."""

    def __init__(self, src, spec: QuantSpec, max_memory, storage_options):
        self.spec = spec
        self.source = open_source(src, storage_options=storage_options)
        self.storage_options = storage_options  # for the destination too
        self.name = str(self.source.description.get("path", "array"))
        if not is_float_dtype(self.source.dtype):
            raise InvalidDTypeError(
                f"{self.name}: source dtype {self.source.dtype} is not floating point"
                " (float16, bfloat16, float32, float64)"
            )
        self.shape = self.source.shape
        self.qt: QType = spec.qtype
        self.axis = None if spec.axis is None else normalize_axis(spec.axis, len(self.shape))
        self.block_size = spec.block_size
        if self.axis is None:
            self.param_shape: tuple[int, ...] = ()
        elif not self.block_size:
            self.param_shape = (self.shape[self.axis],)
        else:
            ps = list(self.shape)
            ps[self.axis] = -(-ps[self.axis] // self.block_size)
            self.param_shape = tuple(ps)
        # statistics are per channel along a per-axis spec's axis, else one set for the tensor
        # (a blocked spec reports per tensor: its parameter blocks are too many to list)
        self.stat_axis = None if self.block_size else self.axis
        self.channels = 1 if self.stat_axis is None else self.shape[self.stat_axis]
        self.chunks = default_chunks(
            self.shape,
            max(4, self.source.dtype.itemsize),
            self.source.chunks,
            axis=self.axis,
            block_size=self.block_size,
            budget=_block_budget(max_memory),
        )
        self.blocks = plan_blocks(self.shape, self.chunks)
        self.max_memory = max_memory
        self.dynamic = self.spec.scale is None and (
            spec.method == "dynamic" or (self.block_size is not None)
        )
        if self.block_size and spec.scale is None and spec.method not in ("minmax", "dynamic"):
            raise InvalidParameterError(
                f"method {spec.method!r} is not available for blocked quantization; blocks take"
                " their own range (method 'dynamic' or 'minmax')"
            )
        self.bytes_read = 0
        self.passes = 0

    # ---- statistics and parameters

    def _read(self, key: tuple[slice, ...]) -> np.ndarray:
        """The region ``key`` of the source as a C-contiguous float32/float64 array: a view of
        the mapped chunk file where possible, else a buffer of the calling thread."""
        x = self.source.view(key)
        if x is None or not x.flags.c_contiguous:
            shape = tuple(k.stop - k.start for k in key)
            x = self.source.read(key, out=scratch("source", shape, self.source.dtype))
        if x.dtype.itemsize < 4:  # float16 / bfloat16: widen exactly for the kernels
            wide = scratch("source-f32", x.shape, np.float32)
            wide[...] = x
            return wide
        return x

    def _pieces(self, b: Block):
        """``(region, x)`` for the pieces of block ``b`` that lie in one stored source chunk
        each, in order: a block is processed piece by piece, so a piece is read (or mapped)
        once and stays in the CPU's cache between the kernels that use it."""
        for region in self.source.pieces(b.key):
            yield region, self._read(region)

    def _scan(self, work, merge, progress) -> None:
        """One read-only pass over every block: ``work`` on the workers, ``merge`` in order."""
        pipeline.run(
            self.blocks,
            work,
            merge,
            workers=self._workers(),
            progress=_counter(progress, len(self.blocks)),
        )
        self._count_pass(self.blocks)

    def _count_pass(self, blocks) -> None:
        self.passes += 1
        self.bytes_read += sum(math.prod(b.shape) for b in blocks) * self.source.dtype.itemsize

    def _workers(self) -> int:
        return _workers(self.max_memory, self.blocks, max(4, self.source.dtype.itemsize))

    def _block_channels(self, b: Block) -> int:
        return 1 if self.stat_axis is None else b.shape[self.stat_axis]

    def _offset(self, key: tuple[slice, ...]) -> int:
        """The first channel of the region ``key``."""
        return key[self.stat_axis].start if self.stat_axis is not None else 0

    def stats(self, progress=None) -> RangeStats:
        """Pass 1: exact per-channel ranges, merged in block order (min/max and counts are
        exact, so the result never depends on how the work was cut)."""
        total = RangeStats.empty(self.channels)
        first = []

        def work(b: Block) -> RangeStats:
            st = RangeStats.empty(self._block_channels(b))
            first = -1
            for region, x in self._pieces(b):
                part = block_ranges(x, self.stat_axis)
                merge_into(st, part, self._offset(region) - self._offset(b.key))
                if part.first_nonfinite >= 0:  # as an index into the whole array
                    local = np.unravel_index(part.first_nonfinite, x.shape)
                    flat = int(
                        np.ravel_multi_index(
                            tuple(k.start + i for k, i in zip(region, local, strict=True)),
                            self.shape,
                        )
                    )
                    first = flat if first < 0 else min(first, flat)
            return replace(st, first_nonfinite=first)

        def merge(b: Block, st: RangeStats) -> None:
            merge_into(total, st, self._offset(b.key))
            if st.first_nonfinite >= 0:
                first.append(st.first_nonfinite)

        self._scan(work, merge, progress)
        return replace(total, first_nonfinite=min(first) if first else -1)

    def _check_nonfinite(self, st: RangeStats) -> None:
        if self.spec.nan_policy == "error" and st.nonfinite:
            idx = (
                np.unravel_index(st.first_nonfinite, self.shape) if st.first_nonfinite >= 0 else "?"
            )
            raise NonFiniteInputError(
                f"{self.name}: {st.nonfinite} non-finite values ({int(st.nan.sum())} NaN,"
                f" {int(st.posinf.sum())} +inf, {int(st.neginf.sum())} -inf); first at index"
                f" {tuple(int(i) for i in idx) if idx != '?' else idx}. Use nan_policy="
                "'zero_point' or 'min' to quantize them anyway"
            )

    def calibration(self, progress=None) -> Calibration:
        spec = self.spec
        if spec.scale is not None:
            return Calibration(spec, None, {}, self._explicit_params())
        if self.dynamic:  # one pass: each block takes its own range while quantizing
            return Calibration(spec, None, {"method": "per-block ranges"}, None)
        st = self.stats(progress)
        self._check_nonfinite(st)
        lo, hi = np.where(st.count > 0, st.min, 0.0), np.where(st.count > 0, st.max, 0.0)
        thresholds = {"min": lo, "max": hi}
        if spec.method in HISTOGRAM_METHODS:
            from ..calibration.histogram import percentile_range, search_range

            use_abs = spec.method in ("entropy", "mse") or (
                spec.method == "percentile" and spec.symmetric
            )
            hist = self._histograms(st, use_abs, progress)
            if spec.method == "percentile":
                lo, hi = percentile_range(hist, lo, hi, spec.percentile, symmetric=spec.symmetric)
            else:
                lo, hi = search_range(
                    hist, lo, hi, spec.method, self.qt.bits, symmetric=spec.symmetric
                )
            thresholds = {"min": lo, "max": hi, "num_bins": spec.num_bins}
        from ..calibration.params import params_from_range

        scale, zp = params_from_range(
            lo, hi, self.qt, symmetric=spec.symmetric, narrow_range=spec.narrow_range
        )
        params = QuantParams(
            scale.reshape(self.param_shape), zp.reshape(self.param_shape), self.axis, None
        )
        return Calibration(spec, st, thresholds, params)

    def _histograms(self, st: RangeStats, sym: bool, progress):
        """Pass 2: fixed-edge histograms per channel, edges from the exact pass-1 range
        (``|x|`` over ``[0, absmax]`` when ``sym``, else ``x`` over ``[min, max]``)."""
        from ..engine.blockmath import channel_view
        from ..kernels.runtime import run
        from ..kernels.stats import channel_histograms

        lo = np.where(st.count > 0, st.min, 0.0)
        hi = np.where(st.count > 0, st.max, 0.0)
        edges_lo = np.zeros(self.channels) if sym else lo
        edges_hi = np.maximum(-lo, hi) if sym else hi
        nbins = self.spec.num_bins
        hist = np.zeros((self.channels, nbins), np.int64)

        def work(b: Block) -> np.ndarray:
            h = np.zeros((self._block_channels(b), nbins), np.int64)
            for region, x in self._pieces(b):
                v = channel_view(x, self.stat_axis)
                rel = self._offset(region) - self._offset(b.key)
                sl = slice(self._offset(region), self._offset(region) + v.shape[1])
                run(
                    channel_histograms,
                    v,
                    np.ascontiguousarray(edges_lo[sl]),
                    np.ascontiguousarray(edges_hi[sl]),
                    sym,
                    h[rel : rel + v.shape[1]],
                )
            return h

        def merge(b: Block, h: np.ndarray) -> None:
            hist[self._offset(b.key) : self._offset(b.key) + h.shape[0]] += h

        self._scan(work, merge, progress)
        return {"counts": hist, "lo": edges_lo, "hi": edges_hi, "abs": sym}

    def _explicit_params(self) -> QuantParams:
        s = np.asarray(self.spec.scale, np.float32)
        z = np.asarray(0 if self.spec.zero_point is None else self.spec.zero_point, np.float64)
        try:
            s = np.broadcast_to(s, self.param_shape).copy()
            z = np.broadcast_to(z, self.param_shape).copy()
        except ValueError:
            raise InvalidParameterError(
                f"scale/zero_point shapes {s.shape}/{z.shape} do not fit the parameter shape"
                f" {self.param_shape} of {self.spec.granularity} quantization"
            ) from None
        check_scale(s)
        if not self.qt.is_float and z.size and (z.min() < self.qt.qmin or z.max() > self.qt.qmax):
            raise InvalidParameterError(f"zero_point is outside the {self.qt.name} range")
        return QuantParams(s, z, self.axis, self.block_size)

    # ---- the quantize pass

    def fingerprint(self, cal: Calibration) -> str:
        h = hashlib.sha256()
        h.update(json.dumps(self.spec.to_dict(), sort_keys=True).encode())
        h.update(json.dumps(self.source.description, sort_keys=True, default=str).encode())
        if cal.params is not None:
            h.update(np.ascontiguousarray(cal.params.scale).tobytes())
            h.update(np.ascontiguousarray(cal.params.zero_point).tobytes())
        return h.hexdigest()[:32]

    def quantize(self, dst, *, progress=None, overwrite=False, resume=True) -> QuantReport:
        t0 = time.perf_counter()
        cal = self.calibration(progress)
        fp = self.fingerprint(cal)
        zip_target = isinstance(dst, (str, os.PathLike)) and os.fspath(dst).endswith(".zip")
        work = tempfile.mkdtemp(prefix="qstream-", suffix=".zarr") if zip_target else dst
        try:
            group, todo, resumed = self._open_destination(work, fp, cal, overwrite, resume)
            if group is None:  # already complete with this fingerprint
                return QuantReport.from_dict(todo)
            errors = self._quantize_pass(group, cal, todo, progress)
            report = self._finish(group, cal, errors, dst, t0, resumed)
            if zip_target:
                _pack_zip(work, os.fspath(dst), overwrite=True)
            return report
        finally:
            if zip_target:
                shutil.rmtree(work, ignore_errors=True)

    def _open_destination(self, dst, fp, cal, overwrite, resume):
        try:
            existing = open_group(dst, mode="r", storage_options=self.storage_options)
            meta = existing.attrs.get("qstream")
        except StoreError:
            existing, meta = None, None
        if existing is not None and not overwrite:
            if meta is None:
                raise StoreError(f"{dst} exists and is not a qstream array; pass overwrite=True")
            if meta.get("fingerprint") != fp:
                raise StoreError(
                    f"{dst} holds a different job (other spec, source or parameters);"
                    " pass overwrite=True to replace it"
                )
            if meta.get("complete"):
                return None, meta["report"], len(self.blocks)
            if resume:
                group = open_group(dst, mode="a", storage_options=self.storage_options)
                # the interrupted job's chunks (another max_memory may plan others)
                self.chunks = tuple(group["data"].chunks)
                self.blocks = plan_blocks(self.shape, self.chunks)
                done = BlockProgress.open(group).done()
                todo = [b for b in self.blocks if not done[b.index]]
                return group, todo, len(self.blocks) - len(todo)
        group = open_group(dst, mode="w", storage_options=self.storage_options)
        self._create_arrays(group, cal, fp)
        return group, self.blocks, 0

    def _create_arrays(self, group, cal, fp):
        qt = self.qt
        store_dtype = qt.widened if not qt.is_float else np.dtype(np.uint8)
        zp_dtype = qt.widened if not qt.is_float else np.dtype(np.float32)
        group.create_array(
            "data",
            shape=self.shape,
            chunks=self.chunks,
            dtype=store_dtype,
            fill_value=0,
            compressors=self.source.compressors,
            config=_WRITE_ALL_CHUNKS,
            chunk_key_encoding=_FLAT_KEYS,
        )
        if self.axis is None:
            pchunks: tuple[int, ...] = ()
        elif not self.block_size:  # whole data chunks along the axis, ~1 MiB or more each
            c = self.chunks[self.axis]
            pchunks = (min(self.param_shape[0], c * max(1, _PARAM_CHUNK // c)),)
        else:  # one parameter chunk per block: dynamic blocks write their own
            pc = list(self.chunks)
            pc[self.axis] = max(1, pc[self.axis] // self.block_size)
            pchunks = tuple(pc)
        kw = {
            "shape": self.param_shape,
            "chunks": pchunks or None,
            "fill_value": 0,
            "chunk_key_encoding": _FLAT_KEYS,
        }
        if not pchunks:
            kw.pop("chunks")
        group.create_array("scale", dtype=np.float32, **kw)
        group.create_array("zero_point", dtype=zp_dtype, **kw)
        if cal.params is not None:
            group["scale"][...] = cal.params.scale
            group["zero_point"][...] = cal.params.zero_point.astype(zp_dtype)
        BlockProgress.create(group, len(self.blocks))
        group.attrs["qstream"] = {
            "version": FORMAT_VERSION,
            "complete": False,
            "fingerprint": fp,
            "spec": self.spec.to_dict(),
            "source": self.source.description,
            "dtype": qt.name,
            "axis": self.axis,
            "storage": "one element per byte"
            if qt.bits < 8
            else ("uint8 bit patterns" if qt.is_float else "native"),
        }

    def _params(self, key: tuple[slice, ...], x: np.ndarray, cal: Calibration):
        """(scale, zero_point, layout) for the region ``key`` holding ``x``."""
        if self.dynamic:  # blocked, each parameter block its own range
            lo, hi = block_slot_ranges(x, self.axis, self.block_size)
            lo, hi = np.nan_to_num(lo, nan=0.0), np.nan_to_num(hi, nan=0.0)
            from ..calibration.params import params_from_range

            s, z = params_from_range(
                lo, hi, self.qt, symmetric=self.spec.symmetric, narrow_range=self.spec.narrow_range
            )
            return s, z, plan_layout(x.shape, s.shape, self.axis, self.block_size)
        p = cal.params
        if self.axis is None:
            return (
                p.scale.reshape(()),
                p.zero_point.reshape(()),
                plan_layout(x.shape, (), None, None),
            )
        if self.block_size:
            pk = param_region(key, self.axis, self.block_size)
            s, z = p.scale[pk], p.zero_point[pk]
            return s, z, plan_layout(x.shape, s.shape, self.axis, self.block_size)
        sl = key[self.axis]
        s, z = p.scale[sl], p.zero_point[sl]
        return s, z, plan_layout(x.shape, s.shape, self.axis, None)

    def _quantize_pass(self, group, cal, todo, progress):
        data, prog = ArrayWriter(group["data"]), BlockProgress.open(group)
        scale_out, zp_out = ArrayWriter(group["scale"]), ArrayWriter(group["zero_point"])
        stored = group["data"].dtype
        zp_stored = group["zero_point"].dtype
        errors = ErrorStats.empty(self.channels)
        done = [len(self.blocks) - len(todo)]

        def work(b: Block) -> ErrorStats:
            q = scratch("quantized", b.shape, self.qt.dtype)
            errs = ErrorStats.empty(self._block_channels(b))
            # a dynamic block takes its ranges from all of it; else piece by piece
            pieces = [(b.key, self._read(b.key))] if self.dynamic else self._pieces(b)
            for region, x in pieces:
                rel = tuple(
                    slice(r.start - k.start, r.stop - k.start)
                    for r, k in zip(region, b.key, strict=True)
                )
                s, z, layout = self._params(region, x, cal)
                qp = q[rel]
                copy_back = not qp.flags.c_contiguous  # the piece is not a run of the block
                if copy_back:
                    qp = scratch("quantized-piece", x.shape, self.qt.dtype)
                err = self._quantize_piece(x, s, z, layout, qp)
                if err.nonfinite.any() and self.spec.nan_policy == "error":
                    raise _NonFiniteBlock(b)  # before anything of this block is written
                if copy_back:
                    q[rel] = qp
                merge_into(errs, err, self._offset(region) - self._offset(b.key))
                if self.dynamic:
                    pk = param_region(region, self.axis, self.block_size)
                    scale_out[pk] = np.asarray(s, np.float32)
                    zp_out[pk] = z.astype(zp_stored)
            data[b.key] = q.view(stored) if q.dtype != stored else q
            prog.mark(b.index)
            return errs

        def merge(b: Block, err: ErrorStats) -> None:
            merge_into(errors, err, self._offset(b.key))  # in block order: deterministic
            done[0] += 1
            if progress:
                progress(done[0], len(self.blocks))

        try:
            pipeline.run(todo, work, merge, workers=self._workers())
        except _NonFiniteBlock:
            self._check_nonfinite(self.stats())  # the whole array's count and first index
            raise
        self._count_pass(todo)
        return errors

    def _quantize_piece(self, x, s, z, layout, out) -> ErrorStats:
        """Quantize ``x`` into ``out`` and return its error statistics; NaN follows the
        spec's ``nan_policy`` (``zero_point``: the zero point; ``min``: the kernel's minimum)."""
        qt = self.qt
        lo_q = qt.qmin + (1 if self.spec.narrow_range and not qt.is_float else 0)
        affine_quantize(
            x,
            s,
            z,
            layout,
            qt,
            code=round_code(self.spec.round_mode),
            narrow_range=self.spec.narrow_range,
            out=out,
        )
        if qt.is_float:
            xhat = affine_dequantize(out, s, None, layout, qt)
            s_e = layout.expand(s).astype(np.float64)
            z_e = layout.expand(z).astype(np.float64)
            err = block_errors(x, xhat, s_e, z_e, qt, lo_q, qt.qmax, self.stat_axis)
        else:
            err = block_errors_fused(x, out, s, z, layout, qt, lo_q, self.stat_axis)
        if err.nonfinite.any() and self.spec.nan_policy == "zero_point" and not qt.is_float:
            nan = np.isnan(x)
            zp_e = np.broadcast_to(layout.expand(z), x.shape)
            out[nan] = zp_e[nan].astype(qt.widened).astype(qt.dtype)
        return err

    def _finish(self, group, cal, errors, dst, t0, resumed) -> QuantReport:
        qt = self.qt
        meta = dict(group.attrs["qstream"])
        err = errors.summary()
        report = QuantReport(
            spec=self.spec,
            source=self.source.description,
            destination=str(dst),
            calibration=cal.summary(),
            error=err,
            passes=self.passes,
            seconds=time.perf_counter() - t0,
            bytes_read=self.bytes_read,
            bytes_written=int(math.prod(self.shape) * max(1, qt.dtype.itemsize)),
            resumed_blocks=resumed,
        )
        if self.axis is None and not qt.is_float:
            s = float(group["scale"][...])
            z = float(group["zero_point"][...])
            group["data"].attrs.update({"scale_factor": s, "add_offset": -z * s})
        meta.update({"calibration": report.calibration, "error": err, "report": report.to_dict()})
        group.attrs["qstream"] = meta
        meta["complete"] = True
        group.attrs["qstream"] = meta  # written last
        return report


# --------------------------------------------------------------------------- helpers


def _block_budget(max_memory: int | None) -> int:
    """Source bytes of one block. It does not depend on the number of workers, so neither do
    the blocks, nor the order in which float error sums are merged."""
    if max_memory is None:
        return DEFAULT_BLOCK_BYTES
    if max_memory < 1 << 20:
        raise InvalidParameterError(f"max_memory must be at least 1 MiB, got {max_memory}")
    return max(1 << 16, int(max_memory) // (_WORK_FACTOR * _BUDGET_WORKERS))


def _workers(max_memory: int | None, blocks: list[Block], itemsize: int) -> int:
    """Workers that fit in ``max_memory`` (default ``DEFAULT_MAX_MEMORY``), one block each,
    at most the default number (a source with huge chunks gets fewer workers)."""
    workers = pipeline.default_workers()
    if blocks:
        limit = DEFAULT_MAX_MEMORY if max_memory is None else int(max_memory)
        block = max(math.prod(b.shape) for b in blocks) * itemsize
        workers = min(workers, max(1, limit // (_WORK_FACTOR * max(block, 1))))
    return workers


class _NonFiniteBlock(Exception):
    """A block held NaN/inf under nan_policy='error' (the job then names the whole count)."""


def _counter(progress, total):
    if progress is None:
        return None
    n = [0]

    def tick(_b):
        n[0] += 1
        progress(n[0], total)

    return tick


def _create_plain_array(dst, shape, chunks, dtype, overwrite, storage_options, compressors="auto"):
    import zarr

    from ..io.stores import _store

    store = _store(dst, mode="w", storage_options=storage_options)
    try:
        return zarr.create_array(
            store,
            shape=shape,
            chunks=chunks,
            dtype=dtype,
            overwrite=overwrite,
            fill_value=0,
            compressors=compressors,
            config=_WRITE_ALL_CHUNKS,
            chunk_key_encoding=_FLAT_KEYS,
        )
    except zarr.errors.ContainsArrayError:
        raise StoreError(f"{dst} already exists; pass overwrite=True") from None
    except (PermissionError, OSError) as e:
        raise StoreError(f"cannot write {dst}: {e}") from None


def _pack_zip(directory: str, target: str, *, overwrite: bool) -> None:
    import zipfile

    tmp = target + ".partial"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
        for root, _, files in os.walk(directory):
            for f in files:
                full = os.path.join(root, f)
                zf.write(full, os.path.relpath(full, directory))
    os.replace(tmp, target)
