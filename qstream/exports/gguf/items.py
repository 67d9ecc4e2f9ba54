"""GGUF metadata items: one key with its GGUF value type, as the writer emits them, and the
JSON reading the tokenizer and config readers share."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InvalidParameterError

# GGUF value types
UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
# llama.cpp's token types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class MetaItem:
    """One GGUF key: its ``key``, GGUF value ``type`` (``ARRAY`` for lists, then ``element``
    is the type of its items) and ``value``."""

    key: str
    type: int
    value: Any
    element: int | None = None


def read_json(path: Path) -> Any:
    """The JSON document ``path`` (an :class:`InvalidParameterError` naming it when broken)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        raise InvalidParameterError(f"{path}: cannot read it as JSON ({e})") from None
