"""What a model checkpoint holds, as stored, for ``qstream inspect``: its quantized format
named (compressed-tensors scheme, DeepSeek fp8 blocks, gpt-oss MXFP4, GPTQ/AWQ, GGUF file
type) and whether qstream decodes it. The public function is
:func:`qstream.describe_checkpoint`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .types import StorageOptions


def describe_checkpoint(
    path: str | os.PathLike[str],
    *,
    storage_options: StorageOptions | None = None,
    store: str | None = None,
) -> dict[str, Any]:
    """What the checkpoint ``path`` holds, from its headers and ``config.json`` alone (no
    tensor byte is read). A ``.gguf`` file:
    :func:`qstream.io.checkpoints.gguf_metadata.describe_gguf`
    (``quantization``: ``GGUF Q4_K_M``, its ``general.file_type``). A safetensors checkpoint (a
    model folder, a ``.safetensors`` file or its index): ``quantization`` names its format
    (e.g. ``compressed-tensors float-quantized (FP8, per channel)``, ``DeepSeek fp8 blocks
    128x128``, ``gpt-oss MXFP4 experts (*_blocks + *_scales)``, ``GPTQ 4-bit, groups of
    128``, ``not quantized``), ``decoded``: whether qstream reads it as values (``refused``:
    why not), ``written_by``: ``qstream`` for qstream's own exports (described further by
    :func:`qstream.describe_export`; None for a URL), the tensor count per stored dtype, the
    stored bytes and
    ``tensor_list`` (each tensor's name, stored dtype, shape and bytes). ``path`` may be a URL
    (``s3://``, ``http(s)://``, ...): its headers and ``config.json`` are read by ranges
    through ``store`` (``"fsspec"``, the default, or ``"obstore"``) with ``storage_options``
    (as :func:`qstream.open_checkpoint` reads them). Raises
    :class:`~qstream.errors.StoreError` for what is not such a checkpoint."""
    from ..io.checkpoints import describe_stored, export_metadata
    from ..io.checkpoints.gguf_metadata import describe_gguf

    p = os.fspath(path)
    opts = dict(storage_options) if storage_options else None
    if p.lower().endswith(".gguf"):
        return describe_gguf(p, storage_options=opts, store=store)
    out = describe_stored(p, storage_options=opts, store=store)
    if "://" in p and not p.startswith("file://"):
        return {**out, "written_by": None}  # (a URL's export metadata is not looked at)
    own = not os.path.isdir(p) and export_metadata(p) is not None
    return {**out, "written_by": "qstream" if own else "another tool"}
