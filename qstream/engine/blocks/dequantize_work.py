"""The dequantize pass's block work: read a block of a quantized group, write it as floats."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...budget import Block
from ...core import scratch
from ..run import DestRef, worker_cached


@dataclass(frozen=True, eq=False)
class DequantizeWork:
    """The dequantize pass: read a block of a quantized group, write it as ``dtype``."""

    source: DestRef  # the quantized group
    dest: DestRef  # the plain output array (``url`` is the array itself)
    dtype: str
    max_memory: int | None = None  # the bound the source is opened under

    def __call__(self, b: Block) -> None:
        from ...io.storage import ArrayWriter

        token = self.dest.token
        arr = worker_cached((token, "qarray"), self._open_quantized)
        reader = worker_cached((token, "qreader"), lambda: _code_reader(arr))
        writer = worker_cached((token, "deq-writer"), self._open_writer(ArrayWriter))
        out_dtype = np.dtype(self.dtype) if self.dtype != "bfloat16" else _bf16()
        q = reader.view(b.key)  # a mapped uncompressed chunk, else read into a buffer
        if q is None or not q.flags.c_contiguous:
            q = reader.read(b.key, out=scratch("q", b.shape, reader.dtype))
        y = arr.dequantize_region(b.key, q, out_dtype, out=scratch("y", b.shape, out_dtype))
        self.dest.check(writer.array)
        writer[b.key] = y.view(writer.array.dtype)

    def _open_quantized(self) -> Any:
        from ...io.outputs import open_quantized

        return open_quantized(
            self.source.url,
            storage_options=self.source.storage_options,
            max_memory=self.max_memory,
        )

    def _open_writer(self, cls: Callable[[Any], Any]) -> Callable[[], Any]:
        def make() -> Any:
            import zarr

            from ...io.storage import open_store

            store = open_store(self.dest.url, mode="w", storage_options=self.dest.storage_options)
            return cls(zarr.open_array(store=store, mode="r+"))

        return make


def _code_reader(arr: Any) -> Any:
    """The reader of ``arr``'s codes: a chunk of a finished output's codes that is absent is
    refused (see :attr:`qstream.io.outputs.QuantizedArray.written_whole`)."""
    from ...io.storage import open_source

    reader = open_source(arr.data)
    if reader.files is not None:
        reader.files.required = arr.written_whole
    return reader


def _bf16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)
