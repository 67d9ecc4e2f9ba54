"""Writing an export's files: safetensors files streamed in slabs, JSON documents, each
written to ``<file>.<pid>.partial`` and renamed into place (a reader never sees half a file;
:func:`remove_stale_partials` removes what a killed export left)."""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import re
import struct
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..errors import StoreError

SLAB = 16 << 20

#: read(row0, row1) -> the C-contiguous values of those rows (or all of them for 0-d)
ReadRows = Callable[[int, int], np.ndarray]


class Entry:
    """One tensor of the export: its safetensors dtype tag, shape and a slab reader."""

    def __init__(
        self, name: str, tag: str, shape: Iterable[int], itemsize: int, read: ReadRows
    ) -> None:
        self.name, self.tag, self.shape = name, tag, tuple(int(d) for d in shape)
        self.nbytes = math.prod(self.shape) * itemsize
        self.read = read


def split_shards(entries: list[Entry], limit: int) -> list[list[Entry]]:
    """``entries`` in order, cut into shards of at most ``limit`` bytes (a larger entry
    alone in its shard)."""
    shards: list[list[Entry]] = [[]]
    size = 0
    for e in entries:
        if shards[-1] and size + e.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    return shards


#: called with the bytes of each slab a writer has written
Tick = Callable[[int], None]


def byte_ticks(progress: Any, total: int) -> Tick | None:
    """A writer's :data:`Tick` that reports an export's ``write`` pass to ``progress`` (a
    ``(done, total)`` reporter, with ``stage`` where it has one): bytes written of ``total``.
    None without a reporter."""
    if progress is None:
        return None
    stage = getattr(progress, "stage", None)
    if stage is not None:
        stage("write", total, 0)
    done = [0]

    def tick(n: int) -> None:
        done[0] += n
        progress(done[0], total)

    return tick


def write_safetensors(
    path: str, entries: list[Entry], metadata: dict[str, str], tick: Tick | None = None
) -> None:
    """Write ``entries`` as the safetensors file ``path``, each read and written in slabs
    of about :data:`SLAB` bytes (``tick``: told each slab's bytes)."""
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for e in entries:
        header[e.name] = {"dtype": e.tag, "shape": list(e.shape), "data_offsets": [offset, 0]}
        offset += e.nbytes
        header[e.name]["data_offsets"][1] = offset
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = f"{path}.{os.getpid()}.partial"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            for e in entries:
                rows = e.shape[0] if e.shape else 1
                per_row = max(1, e.nbytes // max(1, rows))
                step = max(1, SLAB // per_row)
                written = 0
                for r0 in range(0, rows, step):
                    chunk = e.read(r0, min(rows, r0 + step))
                    f.write(np.ascontiguousarray(chunk).reshape(-1).view(np.uint8).data)
                    written += chunk.nbytes
                    if tick is not None:
                        tick(chunk.nbytes)
                if written != e.nbytes:
                    raise StoreError(f"{e.name}: wrote {written} bytes, expected {e.nbytes}")
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError) and not isinstance(e, StoreError):  # (a read's: as raised)
            raise StoreError(f"cannot write {path}: {e}") from None
        raise


def write_json(path: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` as the JSON file ``path`` (indented)."""
    tmp = f"{path}.{os.getpid()}.partial"
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=2)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise StoreError(f"cannot write {path}: {e}") from None


def remove_stale_partials(target: str) -> None:
    """Remove ``target.<pid>.partial`` files that a killed export (a dead process) left."""
    for tmp in glob.glob(glob.escape(target) + ".*.partial"):
        m = re.fullmatch(re.escape(target) + r"\.(\d+)\.partial", tmp)
        if m is None or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        except OSError:  # alive (another user's process): not ours to touch
            continue
