"""The exports as the library offers them: :func:`export_safetensors` and
:func:`export_gguf` are :mod:`qstream.exports`' writers, with a line of the notebook cell
showing the bytes written when the caller passes no ``progress`` of its own (as every
library job shows its passes)."""

from __future__ import annotations

import functools
from typing import Any

from ..exports import export_safetensors as _export_safetensors
from ..exports.gguf import export_gguf as _export_gguf
from ..viz import reporting


@functools.wraps(_export_safetensors)
def export_safetensors(*args: Any, progress: Any = None, **kw: Any) -> dict[str, Any]:
    with reporting(progress, "export") as shown:
        return _export_safetensors(*args, progress=shown, **kw)


@functools.wraps(_export_gguf)
def export_gguf(*args: Any, progress: Any = None, **kw: Any) -> dict[str, Any]:
    with reporting(progress, "export") as shown:
        return _export_gguf(*args, progress=shown, **kw)
