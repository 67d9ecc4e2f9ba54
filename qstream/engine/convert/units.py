"""The units of a checkpoint's conversion: which tensors go as packs, which as small tensors
(a unit of work each) and which as jobs of their own, and the items the executor is handed.

Packs are planned over every tensor of the checkpoint (finished ones too), so that a re-run
makes the same packs; a pack's tensors are converted together where its first one is
(:func:`gathered`), and a run of consecutive units goes to the executor as one pipeline
(:class:`UnitWork` converts a pack or a small tensor).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...io.outputs import pack_layout as packs
from ...spec import QuantSpec
from .events import TensorEvent
from .one_block import SmallTensorWork, TensorItem, is_small
from .pack_plan import PackItem, pack_mode, plan_packs, source_bytes

if TYPE_CHECKING:
    from .pack_writer import PackWork

#: how a tensor is converted: ``("pack", its pack's number)``, ``("small",)`` or ``("job",)``
Kind = tuple[Any, ...]
#: a tensor to convert: its event, the tensor, its spec (None: kept) and its kind
Todo = tuple[TensorEvent, Any, QuantSpec | None, Kind]


def pack_runs(
    tensors: Sequence[Any], specs: Sequence[QuantSpec | None], max_memory: int | None
) -> dict[int, int]:
    """The pack of every packed tensor: its index -> its pack's number."""
    entries = [None if spec is None else (t, spec) for t, spec in zip(tensors, specs, strict=True)]
    return {i: seq for seq, members in enumerate(plan_packs(entries, max_memory)) for i in members}


def clear_of_listed(
    pack_of: dict[int, int], names: list[str], listed: dict[str, dict]
) -> dict[int, int]:
    """``pack_of`` with every pack that holds tensors still to convert renumbered past every
    number in use when its name is one the ``listed`` tensors' rows name. A re-run plans
    the same packs as its first run unless the memory bound changed; then a pack of the new
    plan must not replace (under the same name) one whose tensors are listed."""
    numbers = (packs.pack_number(r.get("pack")) for r in listed.values())
    taken = {n for n in numbers if n is not None}
    todo = {pack_of[i] for i in pack_of if names[i] not in listed}
    clash = todo & taken
    if not clash:
        return pack_of
    past = max(taken | set(pack_of.values())) + 1
    return {i: (seq + past if seq in clash else seq) for i, seq in pack_of.items()}


def gathered(todo: list[Todo]) -> list[Todo]:
    """``todo`` with each pack's tensors moved together to the place of its first one (a
    pack's tensors need not lie side by side in the checkpoint), the rest in order."""
    members: dict[Kind, list[Todo]] = {}
    for item in todo:
        if item[3][0] == "pack":
            members.setdefault(item[3], []).append(item)
    out: list[Todo] = []
    for item in todo:
        if item[3][0] != "pack":
            out.append(item)
        elif item[3] in members:
            out.extend(members.pop(item[3]))
    return out


def unit_kind(
    i: int,
    t: Any,
    spec: QuantSpec | None,
    pack_of: dict[int, int],
    small: bool,
    max_memory: int | None,
) -> Kind:
    """How the ``i``-th tensor ``t`` is converted (``small``: whether small tensors are
    units of work of their own in this conversion)."""
    if i in pack_of:
        return ("pack", pack_of[i])
    if small and (spec is None or is_small(t, spec, max_memory)):
        return ("small",)
    return ("job",)


def unit_items(
    run: list[Todo],
    keys: dict[str, str],
    positions: dict[str, int],
    keep_dtypes: dict[str, str | None],
) -> tuple[list[PackItem | TensorItem], dict[str, tuple[TensorEvent, Any, QuantSpec | None]]]:
    """The items of a run of packs and small tensors, in order, and each tensor's
    ``(event, tensor, spec)`` by name."""
    items: list[PackItem | TensorItem] = []
    rows: dict[str, tuple[TensorEvent, Any, QuantSpec | None]] = {}
    for kind, grouped in itertools.groupby(run, key=lambda item: item[3]):
        group = list(grouped)
        for ev, t, spec, _ in group:
            rows[ev.name] = (ev, t, spec)
        if kind[0] == "pack":
            spec = group[0][2]
            assert spec is not None  # (kept tensors are never packed)
            mode = pack_mode(group[0][1], spec)
            assert mode is not None  # (planned as packable)
            items.append(
                PackItem(
                    kind[1],
                    tuple(ev.name for ev, *_ in group),
                    tuple(keys[ev.name] for ev, *_ in group),
                    tuple(positions[ev.name] for ev, *_ in group),
                    spec.to_dict(),
                    mode,
                    (sum(max(1, source_bytes(t) // 4) for _, t, *_ in group),),
                )
            )
            continue
        items.extend(
            TensorItem(
                ev.index,
                ev.name,
                keys[ev.name],
                None if spec is None else spec.to_dict(),
                (max(1, source_bytes(t) // 4),),
                keep_dtypes.get(ev.name),
            )
            for ev, t, spec, _ in group
        )
    return items, rows


@dataclass(frozen=True, eq=False)
class UnitWork:
    """A conversion's unit of work: a pack (:class:`~qstream.engine.convert.pack_writer.PackWork`)
    or a
    small tensor (:class:`~qstream.engine.convert.one_block.SmallTensorWork`), so that both share
    one
    pipeline."""

    small: SmallTensorWork | None
    pack: PackWork | None

    def __call__(self, item: PackItem | TensorItem) -> Any:
        if isinstance(item, PackItem):
            assert self.pack is not None  # (packs are planned only with their work)
            return self.pack(item)
        assert self.small is not None  # (small tensors likewise)
        return self.small(item)
