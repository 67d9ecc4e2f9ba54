"""Reading qstream's outputs back: :func:`open_quantized`, one door and one checkpoint type for
every layout (the readers are in :mod:`qstream.io.outputs`)."""

from __future__ import annotations

import collections
import os
from typing import Any

from ..budget import check_max_memory
from ..errors import StoreError
from ..io.outputs import QuantizedArray, QuantizedCheckpoint, exported_checkpoint
from ..io.outputs import open_quantized as open_output_or_export


def open_quantized(
    path: Any,
    *,
    allow_incomplete: bool = False,
    storage_options: dict[str, Any] | None = None,
    max_memory: int | None = None,
) -> QuantizedArray | QuantizedCheckpoint:
    """Open a qstream output lazily; ``arr[0:128]`` reads and dequantizes only that slab.

    A quantized group opens as a :class:`~qstream.QuantizedArray`. A converted checkpoint
    opens as a :class:`~qstream.QuantizedCheckpoint` whatever its layout (``ck.layout``):
    its Zarr root (one group per tensor, or packs of alike tensors), a ``.safetensors``
    file or index that qstream exported, or a ``.gguf`` file (qstream's export or another
    tool's: its tensors under Hugging Face names for the architectures qstream knows, else
    their GGUF names) (quantized tensors read as their dequantized float32 values, a GGUF
    tensor as gguf-py's ``dequantize`` gives it). Each is a mapping of tensor names to lazy
    arrays, in order, with
    ``ck.tensors`` (name -> shape, dtype, target, bytes, error where recorded),
    ``ck.summary()`` (what ``qstream inspect --json`` prints) and ``ck.view``.

    ``max_memory``: the reader's memory bound in bytes (None: the default, 1 GiB, as for
    every command). A quantized array's parameters are read whole when it is opened (a
    checkpoint's tensors: each when it is taken): parameters that need more than half of
    the bound, and packs read whole of more than half of it, are refused before a byte of
    them is read."""
    check_max_memory(max_memory)
    opened = open_output_or_export(
        path,
        allow_incomplete=allow_incomplete,
        storage_options=storage_options,
        max_memory=max_memory,
    )
    if isinstance(opened, dict):  # an export: its tensors by name
        return exported_checkpoint(path, opened, _recorded_errors(path, opened))
    return opened


def _recorded_errors(path: Any, opened: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The error figures a qstream export records for its quantized tensors (the SQNR its
    conversion measured), by the names ``opened`` gives them; none for another file (nor
    for the experts a GGUF file's 3-D tensor is split into: its SQNR is the whole one's)."""
    from ..exports import describe_export, recorded_db  # (loaded when an export is opened)

    if str(os.fspath(path)).lower().endswith(".gguf"):
        if "://" in str(os.fspath(path)):  # (a URL's header: read by open_quantized alone)
            return {}
        try:
            listed = describe_export(path).get("tensor_list") or []
        except (StoreError, OSError, ValueError):
            return {}
        measured = {t["name"]: t["sqnr_db"] for t in listed if "sqnr_db" in t}
        gguf = [getattr(t, "gguf_name", None) for t in opened.values()]
        split = {g for g, n in collections.Counter(gguf).items() if n > 1}
        return {
            n: {"sqnr_db": measured[g]}
            for n, g in zip(opened, gguf, strict=True)
            if g in measured and g not in split
        }
    if not str(os.fspath(path)).endswith((".safetensors", ".safetensors.index.json")):
        return {}
    try:
        said = describe_export(path).get("quantized") or {}
    except (StoreError, OSError, ValueError):
        return {}
    out = {}
    for n, q in said.items():
        db = recorded_db(q.get("sqnr_db")) if isinstance(q, dict) else None
        if db is not None:
            out[n] = {"sqnr_db": db}
    return out
