"""Which tensors of a conversion are written as packs (:mod:`.pack_writer`), planned from
their shapes, dtypes and specs alone: the pack modes, and the packs themselves.

Kept apart from the writer so that a conversion with no pack never loads it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...budget import block_budget
from ...core import normalize_axis
from ...io.outputs import pack_layout as packs
from ...spec import QuantSpec

MAX_PER_PACK = 4096  # tensors of one pack (its document lists each)


def pack_mode(t: Any, spec: QuantSpec) -> str | None:
    """How the tensor ``t`` joins a pack under ``spec`` (the modes: :mod:`.pack_writer`), or
    None."""
    if spec.scale is not None or spec.float_offset or not len(t.shape) or not math.prod(t.shape):
        return None
    if spec.block_size:
        if spec.method not in ("minmax", "dynamic") or spec.axis is None:
            return None
        if spec.qtype.is_float:
            return None
        return "blocks"
    if spec.method != "minmax":
        return None
    if spec.axis is None:
        return "flat"
    return "rows" if normalize_axis(spec.axis, len(t.shape)) == 0 else None


def source_bytes(t: Any) -> int:
    """The tensor's size as its job counts it (float32 or wider values)."""
    return math.prod(t.shape) * max(4, np.dtype(t.dtype).itemsize)


@dataclass(frozen=True)
class PackItem:
    """One pack of a conversion as a unit of work (``shape``: its size as float32, which
    executors use to size their tasks)."""

    seq: int
    names: tuple[str, ...]
    keys: tuple[str, ...]
    positions: tuple[int, ...]
    spec: dict
    mode: str
    shape: tuple[int, ...]

    @property
    def name(self) -> str:
        """The pack's name (:func:`qstream.io.outputs.pack_layout.pack_name`)."""
        return packs.pack_name(self.seq)


def plan_packs(
    entries: Sequence[tuple[Any, QuantSpec] | None], max_memory: int | None
) -> list[list[int]]:
    """The packs of ``entries`` (``(t, spec)`` of the checkpoint's tensors in order, None
    where a tensor is not packable): the indices of each pack's tensors, packs in the order
    of their first tensor; each within one block budget of source values and
    :data:`MAX_PER_PACK` tensors, and of at least two alike tensors (same pack mode, spec,
    dtype and shape).

    Runs of consecutive alike tensors (the experts of a layer) are packed as they lie, read
    in place from the file. The alike tensors left alone between them (a model's router
    gates, one a layer) are then gathered in checkpoint order into packs of their own."""
    budget = block_budget(max_memory)
    keys = _pack_keys(entries, budget)
    out: list[list[int]] = []
    alone: list[int] = []
    start, size = 0, 0
    for i, k in enumerate([*keys, None]):
        nbytes = 0 if k is None else k[-1]
        if k is None or k != keys[start] or size + nbytes > budget or i - start >= MAX_PER_PACK:
            if i - start >= 2 and keys[start] is not None:
                out.append(list(range(start, i)))
            elif i - start == 1 and keys[start] is not None:
                alone.append(start)
            start, size = i, 0
        size += nbytes
    gathering: dict[tuple, tuple[list[int], int]] = {}  # key -> (its tensors, their bytes)
    for i in alone:
        k = keys[i]
        assert k is not None  # (alone: packable)
        members, size = gathering.get(k, ([], 0))
        if members and (size + k[-1] > budget or len(members) >= MAX_PER_PACK):
            out.append(members)
            members, size = [], 0
        members.append(i)
        gathering[k] = (members, size + k[-1])
    out.extend(members for members, _ in gathering.values())
    return sorted((m for m in out if len(m) >= 2), key=lambda m: m[0])


def _pack_keys(entries: Sequence[tuple[Any, QuantSpec] | None], budget: int) -> list[tuple | None]:
    """Each tensor's pack key (alike tensors share it; its last item: the tensor's source
    bytes), or None where the tensor is not packed (no pack mode, or more than half a block
    ``budget``)."""
    keys: list[tuple | None] = []
    # id(spec) -> (spec, its JSON, its pack mode by rank and emptiness): recipes share specs
    spec_keys: dict[int, tuple[QuantSpec, str, dict]] = {}
    for entry in entries:
        k = None
        if entry is not None:
            t, spec = entry
            known = spec_keys.get(id(spec))
            if known is None or known[0] is not spec:
                spec_json = json.dumps(spec.to_dict(), sort_keys=True)
                known = spec_keys[id(spec)] = (spec, spec_json, {})
            shape = tuple(t.shape)
            modes, form = known[2], (len(shape), 0 in shape)
            mode = modes[form] if form in modes else modes.setdefault(form, pack_mode(t, spec))
            if mode is not None and (nbytes := source_bytes(t)) <= budget // 2:
                k = (mode, known[1], t.dtype, shape, nbytes)
        keys.append(k)
    return keys
