"""The exports as the library offers them: :func:`export_safetensors` and
:func:`export_gguf` are :mod:`qstream.exports`' writers, with a line of the notebook cell
showing the bytes written when the caller passes no ``progress`` of its own (as every
library job shows its passes), and each error raised before the first byte is written
marked a refusal of the export's plan (``error.refused``: the command line exits 2 for it,
as for every plan's refusal; an error while writing exits 1)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..budget import check_max_memory
from ..errors import QStreamError
from ..exports import export_safetensors as _export_safetensors
from ..exports.gguf import export_gguf as _export_gguf
from ..viz import reporting


class _Phase:
    """The reporter an export is handed: the caller's calls passed on, and whether the
    writing has begun (its ``write`` stage)."""

    def __init__(self, shown: Any) -> None:
        self.shown, self.writing = shown, False

    def stage(self, name: str, total: int, done: int = 0) -> None:
        self.writing = self.writing or name == "write"
        stage = getattr(self.shown, "stage", None)
        if stage is not None:
            stage(name, total, done)

    def __call__(self, done: int, total: int) -> None:
        if self.shown is not None:
            self.shown(done, total)


def _export(write: Callable[..., dict[str, Any]], progress: Any, *args: Any, **kw: Any) -> Any:
    check_max_memory(kw.get("max_memory"))  # (a refused bound writes nothing)
    with reporting(progress, "export") as shown:
        phase = _Phase(shown)
        try:
            return write(*args, progress=phase, **kw)
        except QStreamError as e:
            if not phase.writing:  # (refused by the plan: nothing was written)
                e.refused = True  # type: ignore[attr-defined]
            raise


@functools.wraps(_export_safetensors)
def export_safetensors(*args: Any, progress: Any = None, **kw: Any) -> dict[str, Any]:
    return _export(_export_safetensors, progress, *args, **kw)  # type: ignore[no-any-return]


@functools.wraps(_export_gguf)
def export_gguf(*args: Any, progress: Any = None, **kw: Any) -> dict[str, Any]:
    return _export(_export_gguf, progress, *args, **kw)  # type: ignore[no-any-return]
