"""Which blocks of a job have landed: the ``_progress`` array of a quantized group.

One byte per block (1 once the block's output is written), in uncompressed chunks of
``CHUNK`` blocks that are all written when the job starts. Marking a block then overwrites one
byte of an existing chunk file in place (``pwrite``), instead of creating a file per block:
on some file systems creating a file costs as much as writing a MiB. Stores without files
(zip, memory, fsspec) rewrite the chunk through zarr under a lock.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from .chunks import chunk_files

NAME = "_progress"
CHUNK = 1 << 16


class BlockProgress:
    """The landed-block flags of a job (see module docstring)."""

    def __init__(self, array) -> None:
        self.array = array
        self.files = chunk_files(array) if hasattr(os, "pwrite") else None
        self._lock = threading.Lock()

    @classmethod
    def create(cls, group, n_blocks: int) -> BlockProgress:
        """A new all-zero ``_progress`` array in ``group``, every chunk written."""
        arr = group.create_array(
            NAME,
            shape=(n_blocks,),
            chunks=(min(CHUNK, max(1, n_blocks)),),
            dtype=np.uint8,
            fill_value=0,
            compressors=None,
            config={"write_empty_chunks": True},
        )
        arr[...] = np.zeros(n_blocks, np.uint8)
        return cls(arr)

    @classmethod
    def open(cls, group) -> BlockProgress:
        return cls(group[NAME])

    def done(self) -> np.ndarray:
        """A bool per block: has it landed?"""
        return np.asarray(self.array[...]).astype(bool)

    def mark(self, index: int) -> None:
        """Record that block ``index`` has landed (safe from several threads)."""
        if self.files is not None:
            chunk = self.files.chunks[0]
            fd = os.open(self.files.path((index // chunk,)), os.O_WRONLY)
            try:
                os.pwrite(fd, b"\x01", index % chunk)
            finally:
                os.close(fd)
            return
        with self._lock:
            self.array[index : index + 1] = np.ones(1, np.uint8)
