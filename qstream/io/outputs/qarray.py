"""Reading qstream's outputs: :func:`open_quantized`, the one door to every kind of output.

A quantized group opens as a :class:`~qstream.io.outputs.quantized.QuantizedArray`, the root of a
converted checkpoint as a :class:`~qstream.io.outputs.reader.QuantizedCheckpoint`, and a
``.safetensors`` file (or index) that qstream exported as a dict of its tensors
(:mod:`qstream.io.checkpoints.exported`), which the public :func:`qstream.open_quantized`
(:mod:`qstream.api.readers`) gives as a ``QuantizedCheckpoint`` too (:func:`exported_checkpoint`).
This module sits above the checkpoint readers for that last case; whoever reads Zarr outputs
only takes :func:`~qstream.io.outputs.reader.open_output`.

The pieces live in their own modules: the on-disk format in :mod:`qstream.io.outputs.ondisk` (whole
nodes: :mod:`qstream.io.outputs.publish`), the destination rules in
:mod:`qstream.io.outputs.destination`,
the reader in :mod:`qstream.io.outputs.quantized` and :mod:`qstream.io.outputs.reader`. Their names
used
from here are re-exported.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ...errors import StoreError
from ..checkpoints import DequantizedTensor, open_checkpoint
from ..storage import read_all
from .existing import is_checkpoint
from .ondisk import (
    FLAT_KEYS,
    FORMAT_VERSION,
    WRITE_ALL_CHUNKS,
    check_writer,
    create_arrays,
    create_group,
    data_encoding,
    gaps,
    missing_members,
    quantized_nbytes,
    set_meta,
    storage_of,
    stored_nbytes,
)
from .publish import write_array, write_group
from .quantized import MAX_PARAMS, QuantizedArray
from .reader import QuantizedCheckpoint, open_output

__all__ = [  # (and, for the callers that take them here, the names of the modules above)
    "FLAT_KEYS",
    "FORMAT_VERSION",
    "MAX_PARAMS",
    "WRITE_ALL_CHUNKS",
    "QuantizedArray",
    "QuantizedCheckpoint",
    "check_writer",
    "create_arrays",
    "create_group",
    "data_encoding",
    "exported_checkpoint",
    "gaps",
    "is_checkpoint",
    "missing_members",
    "open_output",
    "open_quantized",
    "quantized_nbytes",
    "read_all",
    "set_meta",
    "storage_of",
    "stored_nbytes",
    "write_array",
    "write_group",
]


def open_quantized(
    path: Any,
    *,
    allow_incomplete: bool = False,
    storage_options: dict[str, Any] | None = None,
    max_memory: int | None = None,
) -> QuantizedArray | QuantizedCheckpoint | dict[str, Any]:
    """Open a quantized group lazily; ``arr[0:128]`` reads and dequantizes only that slab.
    The root of a converted checkpoint opens as a :class:`QuantizedCheckpoint`, a mapping of
    tensor names to lazy arrays. A ``.safetensors`` file (or index) that qstream exported
    opens as a dict of name -> lazy array of its values (see
    :mod:`qstream.io.checkpoints.exported`), which the public :func:`qstream.open_quantized`
    gives as a :class:`QuantizedCheckpoint` (:func:`exported_checkpoint`); the exporters take
    the dict to refuse an export as a source.

    ``max_memory``: the reader's memory bound in bytes (None: the default, 1 GiB, as for
    every command). A quantized array's parameters are read whole when it is opened (a
    checkpoint's tensors: each when it is taken): parameters that need more than half of
    the bound, and packs read whole of more than half of it, are refused before a byte of
    them is read."""
    if isinstance(path, str | os.PathLike) and os.fspath(path).endswith(
        (".safetensors", ".safetensors.index.json")
    ):
        return _open_export(os.fspath(path))
    if isinstance(path, str | os.PathLike) and os.fspath(path).lower().endswith(".gguf"):
        from ..checkpoints import gguf_source  # (loaded for GGUF files only)

        return gguf_source.open_gguf(os.fspath(path), warn_unnamed=False)
    return open_output(
        path,
        allow_incomplete=allow_incomplete,
        storage_options=storage_options,
        max_memory=max_memory,
    )


def _open_export(path: str) -> dict[str, Any]:
    tensors: dict[str, Any] = open_checkpoint(path)
    if not any(isinstance(t, DequantizedTensor) for t in tensors.values()):
        raise StoreError(f"{path} is not a qstream export (no quantized tensors described)")
    return tensors


def exported_checkpoint(
    path: Any, tensors: dict[str, Any], errors: dict[str, dict[str, Any]] | None = None
) -> QuantizedCheckpoint:
    """The export ``path`` (its tensors as :func:`open_quantized` gives them: quantized ones
    read dequantized) as a :class:`QuantizedCheckpoint` of ``layout`` ``export``, each
    tensor's row from the file's entries: its shape, the type its values read as, its target
    (``int8/axis0``, ``int4/axis1:b32``, a GGUF tensor's GGML type ``Q8_0``, ``Q4_K``...,
    ``keep``) and the bytes its entries (codes and parameters; a GGUF tensor's blocks) take;
    its ``error``: what the file records of it (``errors``: qstream's safetensors exports
    record the SQNR its conversion measured), else None."""
    from ..checkpoints.gguf_source import GGUF_FLOATS, gguf_type

    rows: dict[str, dict[str, Any]] = {}
    formats = set()
    for pos, (name, t) in enumerate(tensors.items()):
        row: dict[str, Any] = {"name": name, "pos": pos, "shape": [int(d) for d in t.shape]}
        ggml = gguf_type(t)
        if ggml is not None:  # a GGUF tensor: its GGML type, stored as it is or in blocks
            formats.add("gguf")
            kept = ggml in GGUF_FLOATS
            target = "keep" if kept else ggml
            row.update(key=name, dtype="float32", target=target, kept=kept)
            row["bytes_after"] = int(t.nbytes)
            if kept:
                row["bytes_before"] = int(t.nbytes)
        elif isinstance(t, DequantizedTensor):
            formats.add(t.fmt)
            where = "tensor" if t.axis is None else f"axis{t.axis}"
            where += f":b{t.block}" if t.block else ""
            parts = [p for p in (t.codes, t.scale_t, t.zp_t) if p is not None]
            row.update(
                key=getattr(t.codes, "name", name),
                dtype=np.dtype(t.dtype).name,
                target=f"{t.qtype.name}/{where}",
                kept=False,
                bytes_after=sum(int(p.nbytes) for p in parts),
            )
        else:
            row.update(key=name, dtype=np.dtype(t.dtype).name, target="keep", kept=True)
            row.update(bytes_before=int(t.nbytes), bytes_after=int(t.nbytes))
        rows[name] = {**row, "error": (errors or {}).get(name)}
    meta = {"layout": "export", "format": "/".join(sorted(formats)), "source": None}
    return QuantizedCheckpoint.from_tensors(path, meta, rows, tensors)
