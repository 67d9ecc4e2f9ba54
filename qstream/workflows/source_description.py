"""What a model checkpoint holds, as stored, for ``qstream inspect``: its quantized format
named (compressed-tensors scheme, DeepSeek fp8 blocks, gpt-oss MXFP4, GPTQ/AWQ, GGUF file
type) and whether qstream decodes it. The public function is
:func:`qstream.describe_checkpoint`."""

from __future__ import annotations

import os
from typing import Any


def describe_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What the checkpoint ``path`` holds, from its headers and ``config.json`` alone (no
    tensor byte is read). A ``.gguf`` file: :func:`qstream.io.checkpoints.describe_gguf`
    (``quantization``: ``GGUF Q4_K_M``, its ``general.file_type``). A safetensors checkpoint (a
    model folder, a ``.safetensors`` file or its index): ``quantization`` names its format
    (e.g. ``compressed-tensors float-quantized (FP8, per channel)``, ``DeepSeek fp8 blocks
    128x128``, ``gpt-oss MXFP4 experts (*_blocks + *_scales)``, ``GPTQ 4-bit, groups of
    128``, ``not quantized``), ``decoded``: whether qstream reads it as values (``refused``:
    why not), ``written_by``: ``qstream`` for qstream's own exports (described further by
    :func:`qstream.describe_export`), the tensor count per stored dtype, the stored bytes and
    ``tensor_list`` (each tensor's name, stored dtype, shape and bytes). Raises
    :class:`~qstream.errors.StoreError` for what is not such a checkpoint."""
    from ..io.checkpoints import describe_gguf, describe_stored, export_metadata

    p = os.fspath(path)
    if p.lower().endswith(".gguf"):
        return describe_gguf(p)
    out = describe_stored(p)
    own = not os.path.isdir(p) and export_metadata(p) is not None
    return {**out, "written_by": "qstream" if own else "another tool"}
