"""A quantized array on disk, read lazily: :class:`QuantizedArray`.

Indexing reads only the chunks of the region asked for and dequantizes them with the
parameters that region uses (float32, the same values as ``qstream.dequantize``). The arrays'
metadata is checked against the stored arrays first: a damaged or crafted output is refused,
never read past its parameters. The format itself: :mod:`qstream.io.outputs.ondisk`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ...core import affine_dequantize, blocked_param_shape, param_region, plan_layout, step1_slices
from ...errors import InvalidParameterError, StoreError
from ...qtypes import qtype
from ...spec import QuantSpec
from ..storage import chunk_files, compression, read_all, require_chunks
from .ondisk import data_encoding, gaps, quantized_nbytes

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ...spec.views import ReportView

MAX_PARAMS = 1 << 27  # parameters of one output read at once (0.5 GiB of float32 scales)
# the parameters (read whole when an output is opened) may take 1/PARAM_SHARE of the memory
# bound: with the blocks in flight (held to the bound) a reader stays within ~1.5x of it
PARAM_SHARE = 2

# A quantized group as zarr opens it (``zarr.Group``), or a stand-in with the same members
# (``group["data"]``...), ``attrs`` and ``store_path``: a local group opened from its
# documents, or a packed tensor's slot.
Group = Any


@contextmanager
def _damaged(where: str) -> Iterator[None]:
    """Metadata that fails to parse or to match its arrays, as one :class:`StoreError`
    naming ``where`` (qstream's own errors pass as raised)."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, StoreError):
            raise
        raise StoreError(
            f"{where}: its metadata is damaged or crafted ({type(e).__name__}: {e})"
        ) from None


def _through_zarr(group: Group) -> bool:
    """Whether the group's arrays are read through zarr's stores, not local chunk files: an
    object, memory or zip store (a packed tensor's slot is neither: its pack is local)."""
    import zarr

    store = getattr(getattr(group, "store_path", None), "store", None)
    return store is not None and not isinstance(store, zarr.storage.LocalStore)


class QuantizedArray:
    """A quantized array on disk, dequantized on indexing (float32)."""

    def __init__(
        self,
        group: Group,
        meta: dict[str, Any],
        *,
        spec: QuantSpec | None = None,
        max_memory: int | None = None,
    ) -> None:
        """``spec``: ``meta["spec"]`` already parsed (a pack's tensors share one);
        ``max_memory``: the memory bound of whoever reads it (bytes; None: the default,
        1 GiB). The parameters are read whole here: parameters that need more than half of
        the bound are refused (:class:`~qstream.errors.InvalidParameterError`) before a byte
        of them is read, as are more than :data:`MAX_PARAMS` under any bound."""
        self.group = group
        self.meta = meta
        self.max_memory = max_memory
        where = str(group.store_path).removeprefix("file://")
        with _damaged(where):
            if meta.get("layout") == "codec":  # its codes, through data's plain form
                from .codec import open_plain

                self.data: Any = open_plain(group)  # the stored codes (a zarr.Array)
            else:
                self.data = group["data"]
            self.spec = spec if spec is not None else QuantSpec.from_dict(meta["spec"])
            self.qtype = qtype(self.spec.dtype)
            scale, zero_point = group["scale"], group["zero_point"]
            if self.written_whole and _through_zarr(group):  # (an absent chunk refused)
                self.data, scale = require_chunks(self.data), require_chunks(scale)
            self.scale_dtype = np.dtype(scale.dtype)
            self.axis: int | None = meta.get("axis")
            # (the declared shapes first: a crafted output could declare billions)
            self._check(where, tuple(scale.shape), tuple(zero_point.shape))
            members = [scale, zero_point]
            if self.spec.float_offset:
                members.append(group["offset"])
                self._check(where, tuple(scale.shape), tuple(members[2].shape))
            n, dtypes = math.prod(scale.shape), [np.dtype(m.dtype) for m in members]
        self._check_bound(where, n, dtypes)  # (before a byte of them is read)
        with _damaged(where):
            self.scale = np.asarray(read_all(scale, required=self.written_whole), np.float32)
            self.zero_point = np.asarray(read_all(zero_point))
            #: float offsets (spec.offset), float64
            self.offset: npt.NDArray[np.float64] | None = None
            if self.spec.float_offset:
                self.offset = np.asarray(read_all(members[2]), np.float64)
            #: the codec layout's decode constants (qstream.io.outputs.codec)
            self.codec: tuple[float, float, float] | None = None
            if meta.get("layout") == "codec":
                from .codec import constants

                self.codec = constants(meta["codec"])

    def _check(
        self, where: str, scale_shape: tuple[int, ...], zero_point_shape: tuple[int, ...]
    ) -> None:
        """Refuse metadata that does not describe the stored arrays (the kernels index the
        parameters by the data's shape)."""
        shape, axis, bs = self.shape, self.axis, self.spec.block_size
        want: tuple[int, ...] | None
        if axis is None:
            want = ()
        elif isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis < len(shape):
            want = None
        elif bs:
            want = tuple(blocked_param_shape(shape, axis, bs))
        else:
            want = (shape[axis],)
        if want is not None and math.prod(want) > MAX_PARAMS:
            raise StoreError(
                f"{where}: declares {math.prod(want):,} parameters, more than qstream reads at"
                f" once ({MAX_PARAMS:,}); the output is damaged or crafted"
            )
        # (format 2 stored sub-byte types one per byte, in their widened container)
        stored = {np.dtype(data_encoding(self.qtype)[0]), np.dtype(self.qtype.widened)}
        if (
            want is None
            or scale_shape != want
            or zero_point_shape != want
            or np.dtype(self.data.dtype) not in stored
        ):
            raise StoreError(
                f"{where}: its metadata ({self.spec.dtype}, axis {axis!r}, block size {bs}) does"
                f" not describe its arrays (data {list(shape)} {self.data.dtype}, scale"
                f" {list(scale_shape)}, zero_point {list(zero_point_shape)}); the output is"
                " damaged or crafted"
            )

    def _check_bound(self, where: str, n: int, dtypes: list[np.dtype[Any]]) -> None:
        """Refuse ``n`` parameters (``dtypes``: the stored scale, zero point and offset
        arrays', their declared shapes checked already) that need more than
        1/:data:`PARAM_SHARE` of the memory bound when read whole: float32 scales (their
        stored form too, while widened), zero points as stored, float64 offsets. A crafted
        output can declare any count; a conversion writes a few bytes per block of values."""
        from ...budget import memory_limit, mib

        widened = 4 + (dtypes[0].itemsize if dtypes[0] != np.float32 else 0)
        held = n * (widened + dtypes[1].itemsize + (8 if len(dtypes) > 2 else 0))
        limit = memory_limit(self.max_memory)
        if PARAM_SHARE * held > limit:
            names = ", ".join(("scale", "zero_point", "offset")[: len(dtypes)])
            raise InvalidParameterError(
                f"{where}: declares {n:,} parameters ({names}: {mib(held)}), read whole when"
                f" it is opened: the memory bound max_memory ({mib(limit)}) must be at least"
                f" {mib(PARAM_SHARE * held)}; the output is damaged or crafted, or raise"
                " max_memory"
            )

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape (its stored ``data``'s)."""
        return tuple(self.data.shape)

    @property
    def complete(self) -> bool:
        """Whether the job that wrote it finished."""
        return bool(self.meta.get("complete"))

    @property
    def written_whole(self) -> bool:
        """Whether every chunk of its codes and scales was written (a finished output, but
        the codec layout's, whose codes go through zarr's codecs, which may leave an all-fill
        chunk out): then a chunk that is absent is refused as damage, never read as zeros."""
        return self.complete and self.meta.get("layout") != "codec"

    def damaged(self) -> list[str]:
        """What a finished output lacks, from one listing of its store: member documents,
        and chunks of its codes and scales absent or of the wrong size (an uncompressed
        chunk must have its exact size), as keys below the group (``data/c.0.0``). Empty
        for an unfinished output (its chunks come as its job runs) and for a tensor of a
        pack (published whole). Garbage of the right size shows only when read."""
        if not self.complete or getattr(self.group, "store_path", None) is None:
            return []
        return gaps(self.group, strict=False)

    @property
    def dtype(self) -> np.dtype[np.float32]:
        """float32: what indexing returns."""
        return np.dtype(np.float32)

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def report(self) -> dict[str, Any]:
        """The source, calibration, error and report entries of the output's metadata."""
        return {k: self.meta.get(k) for k in ("source", "calibration", "error", "report")}

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return (
            f"QuantizedArray(shape={self.shape}, dtype={self.spec.dtype},"
            f" granularity={self.spec.granularity})"
        )

    def summary(self) -> dict[str, Any]:
        """Spec, parameter summary, calibration and error report (JSON-ready)."""

        def stats(a: npt.ArrayLike) -> dict[str, Any]:
            a = np.asarray(a, np.float64).reshape(-1)
            return {
                "shape": list(np.shape(a)),
                "min": float(a.min()) if a.size else 0.0,
                "max": float(a.max()) if a.size else 0.0,
            }

        return {
            "shape": list(self.shape),
            "dtype": self.spec.dtype,
            "granularity": self.spec.granularity,
            "axis": self.axis,
            "block_size": self.spec.block_size,
            "method": self.spec.method if self.spec.scale is None else "explicit",
            "symmetric": self.spec.symmetric,
            "round_mode": self.spec.round_mode,
            "complete": self.complete,
            "damaged": self.damaged(),
            # (every byte the output holds for the tensor: codes and parameters, as the
            # dry run and the job's report count them)
            "bytes_after": quantized_nbytes(self.shape, self.spec),
            "compression": compression.describe(self.data.compressors),
            "scale": {**stats(self.scale), "shape": list(self.scale.shape)},
            "zero_point": {**stats(self.zero_point), "shape": list(self.zero_point.shape)},
            "calibration": self.meta.get("calibration"),
            "error": self.meta.get("error"),
            "source": self.meta.get("source"),
        }

    # ---- views (qstream.viz): what was kept in the metadata, drawn without the source

    @property
    def view(self) -> ReportView:
        """The :class:`~qstream.spec.views.ReportView` of this output's metadata: the
        calibration histogram and thresholds (per tensor), the per-channel SQNR summary, for
        group-wise outputs the per-group SQNR distribution and worst groups, the error
        report."""
        from ...spec.views import ReportView

        where = str(self.group.store_path).removeprefix("file://")
        if where.startswith("memory://"):  # (a store's id, not a name): what was quantized
            where = "from " + source_label(self.meta.get("source"), where)
        title = f"{self.spec.dtype} {list(self.shape)} ({where})"
        return ReportView.from_meta(self.meta, title=title)

    def _repr_html_(self) -> str:
        from ...spec.views import display

        return display.html(self.view)

    def plot(self, ax: Axes | None = None) -> Figure:
        """Draw the stored calibration histogram with its thresholds (per tensor), the
        per-channel SQNR (per channel) or the per-group SQNR (group-wise) on ``ax`` (a new
        figure when None) with matplotlib (``pip install 'qstream-zarr[plot]'``); returns the
        figure."""
        from ...spec.views import display

        figure: Figure = display.plot(self.view, ax=ax)
        return figure

    def quantized(self, key: Any = ...) -> np.ndarray[Any, Any]:
        """The stored values of ``key`` as the quantized dtype (ml_dtypes for sub-byte/float)."""
        region, squeeze = step1_slices(key, self.shape) if self.shape else (None, [])
        files = chunk_files(self.data, required=self.written_whole) if region else None
        raw: np.ndarray[Any, Any]
        if files is not None and region is not None:  # straight from the chunk files
            raw = np.empty(tuple(k.stop - k.start for k in region), files.dtype)
            if files.bits:
                raw = raw.view(self.qtype.dtype)
            files.read(region, raw)
            raw = raw.reshape([d for d, sq in zip(raw.shape, squeeze, strict=True) if not sq])
        else:
            raw = np.asarray(self.data[key])
        return raw.view(self.qtype.dtype) if raw.dtype != self.qtype.dtype else raw

    def __array__(
        self, dtype: npt.DTypeLike | None = None, copy: bool | None = None
    ) -> np.ndarray[Any, Any]:
        y = self[...]
        return y if dtype is None else y.astype(dtype)

    def __getitem__(self, key: Any) -> np.ndarray[Any, Any]:
        region, squeeze = step1_slices(key, self.shape)
        y = self.dequantize_region(region, self.quantized(region))
        return y.reshape([d for d, sq in zip(y.shape, squeeze, strict=True) if not sq])

    def dequantize_region(
        self,
        key: tuple[slice, ...],
        q: np.ndarray[Any, Any],
        dtype: npt.DTypeLike = np.float32,
        out: np.ndarray[Any, Any] | None = None,
    ) -> np.ndarray[Any, Any]:
        """Dequantize ``q``, the stored values of the region ``key`` (a tuple of step-1
        slices), with the parameters that region uses; ``out`` optionally receives it."""
        q = q.view(self.qtype.dtype) if q.dtype != self.qtype.dtype else q
        if self.codec is not None or self.offset is not None:
            from .scientific_read import dequantize_scientific

            return self._missing(q, dequantize_scientific(self, key, q, dtype, out))
        if self.axis is None:
            s, z = self.scale.reshape(()), self.zero_point.reshape(()).astype(np.float64)
            layout = plan_layout(q.shape, (), None, None)
        else:
            bs = self.spec.block_size
            k = self.axis
            if bs and key[k].start % bs == 0:  # the region starts on a parameter block
                pk = param_region(key, k, bs)
                s, z = self.scale[pk], self.zero_point[pk].astype(np.float64)
                layout = plan_layout(q.shape, s.shape, k, bs)
            elif bs:  # an arbitrary slice: the parameters element by element (slow path)
                idx = np.arange(key[k].start, key[k].stop)
                pk = tuple(slice(None) if d == k else key[d] for d in range(self.ndim))
                s = np.take(self.scale[pk], idx // bs, axis=k)
                z = np.take(self.zero_point[pk], idx // bs, axis=k)
                y = (q.astype(np.float32) - z.astype(np.float32)) * s
                if out is None:
                    return self._missing(q, y.astype(dtype, copy=False))
                out[...] = y
                return self._missing(q, out)
            else:
                idx_ = slice(key[k].start, key[k].stop)
                s, z = self.scale[idx_], self.zero_point[idx_].astype(np.float64)
                layout = plan_layout(q.shape, s.shape, k, None)
        y = affine_dequantize(q, s, z, layout, self.qtype, np.dtype(dtype), out=out)
        return self._missing(q, y)

    def _missing(self, q: np.ndarray[Any, Any], y: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """``y`` with NaN where ``q`` holds the code the ``fill`` NaN policy reserves."""
        if self.spec.nan_policy == "fill":
            y[q == self.qtype.dtype.type(self.qtype.qmin)] = np.nan
        return y


def source_label(source: object, otherwise: str) -> str:
    """What an output's recorded ``source`` was, as a title says it: ``numpy array [64, 32]
    float32``, a store's path; ``otherwise`` where it records none."""
    if not isinstance(source, dict):
        return otherwise
    shape = source.get("shape")
    what = f"{list(shape)} {source.get('dtype')}" if isinstance(shape, list) else ""
    if source.get("kind") == "numpy":
        return f"numpy array {what}".rstrip()
    path = source.get("path")
    return str(path) if isinstance(path, str) and path else otherwise
