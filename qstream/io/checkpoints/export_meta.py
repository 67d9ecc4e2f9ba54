"""What a qstream export says about itself: the metadata qstream writes into a safetensors
file's ``__metadata__``, an index's ``metadata`` or the ``config.json`` beside them.

Readers of exports (:mod:`qstream.io.checkpoints.exported`) and the exports themselves
(:mod:`qstream.exports.safetensors`: is a file there one of ours? a finished one?) read it here.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

from ...input_files import kind_of, open_regular

CONFIG = "config.json"


def read_json(path: str) -> dict[str, Any] | None:
    """The JSON object in the file ``path`` (at most 100 MB), or None."""
    try:
        with open_regular(path) as f:
            doc = json.loads(f.read(100 << 20))
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def export_metadata(path: str) -> dict[str, Any] | None:
    """qstream's metadata in a safetensors file or index, or None."""
    if path.endswith(".json"):
        doc = read_json(path)
        if doc is not None and os.path.basename(path) == CONFIG:
            return qstream_meta(doc)
        return qstream_meta(doc.get("metadata") if doc else None)
    try:
        with open_regular(path) as f:
            (n,) = struct.unpack("<Q", f.read(8))
            raw = f.read(min(n, 100 << 20))
        if b'"qstream' not in raw:  # (no need to parse a checkpoint's header of many tensors)
            return None
        header = json.loads(raw)
    except (OSError, ValueError, RecursionError, struct.error):
        return None
    return qstream_meta(header.get("__metadata__") if isinstance(header, dict) else None)


def qstream_meta(meta: Any) -> dict[str, Any] | None:
    """``meta`` (a header's, an index's or a config's) when qstream wrote it, else None; a
    ``config.json``'s own part is returned as ``{"qstream": "config", ...}``."""
    if isinstance(meta, dict) and "qstream_export" in meta:  # a config.json qstream wrote
        return {"qstream": "config", **meta["qstream_export"]}
    return meta if isinstance(meta, dict) and "qstream" in meta else None


def source_config(src: str | os.PathLike[str] | None) -> str | None:
    """The model's ``config.json`` that belongs to the checkpoint ``src`` the user named for
    a conversion (a local folder: the one inside it; a file or an index: the one beside it,
    as a Hugging Face model keeps it), or None. Pass it as ``config=`` to
    :func:`export_safetensors`; an export never looks for one where an output's metadata
    says its source was (that path is provenance, shown by ``inspect``, never opened)."""
    if src is None or not isinstance(src, str | os.PathLike):
        return None
    path = os.fspath(src)
    if "://" in path and not path.startswith("file://"):
        return None
    path = os.path.expanduser(path.removeprefix("file://"))
    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    found = os.path.join(folder, CONFIG)
    return found if kind_of(found) == "file" else None
