"""Opening qstream's Zarr outputs: a quantized array, or a converted checkpoint's root.

:func:`open_output` opens a quantized group as a
:class:`~qstream.io.outputs.quantized.QuantizedArray`
and the root of a converted checkpoint as a :class:`QuantizedCheckpoint`, a mapping of tensor
names to lazy arrays read from the root's index (:mod:`qstream.io.outputs.rootindex`): its own
tensors' groups, packed tensors (:mod:`qstream.io.outputs.packreader`) and kept tensors alike. The
public :func:`qstream.open_quantized` (:mod:`qstream.io.outputs.qarray`) opens exported
``.safetensors`` files too.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ...errors import StoreError
from ...input_files import check_tree
from ...paths import child, local_path
from ..storage import (
    LocalGroup,
    all_chunks,
    entry_kind,
    open_group,
    open_local,
    require_chunks,
    tensor_key,
)
from .ondisk import gaps
from .pack_layout import (
    PACK_NAME,
    PACKS,
    check_pack_name,
    finished_unlisted,
    read_pack_doc,
    unlisted_tensors,
)
from .packreader import PackReader
from .quantized import QuantizedArray
from .rootindex import RootIndex

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ...spec.views import CheckpointView


def open_output(
    path: Any,
    *,
    allow_incomplete: bool = False,
    storage_options: dict[str, Any] | None = None,
    max_memory: int | None = None,
) -> QuantizedArray | QuantizedCheckpoint:
    """Open a quantized group lazily (``arr[0:128]`` reads and dequantizes only that slab),
    or the root of a converted checkpoint as a :class:`QuantizedCheckpoint`. An incomplete
    output is refused unless ``allow_incomplete``. ``max_memory``: the reader's memory bound
    (None: the default), which parameters and packs read whole are held to."""
    group = open_local(path) or open_group(path, mode="r", storage_options=storage_options)
    if "qstream_checkpoint" in group.attrs:
        ck = QuantizedCheckpoint(path, group, allow_incomplete, storage_options)
        ck.max_memory = max_memory
        return ck
    if isinstance(group, LocalGroup):  # read through nothing that leads elsewhere
        check_tree(group.path, "the quantized output")
    meta = group.attrs.get("qstream")
    if isinstance(meta, dict) and "dequantized_from" in meta:
        raise StoreError(
            f"{path} is a dequantized array (plain {meta.get('dtype', 'float')} values, from"
            f" {meta['dequantized_from']}), not a quantized one: read it with zarr"
            " (zarr.open_array)"
        )
    if not isinstance(meta, dict) or not meta:
        raise StoreError(f"{path} is not a qstream quantized array (no 'qstream' attributes)")
    if not meta.get("complete") and not allow_incomplete:
        raise StoreError(
            f"{path} is incomplete (an interrupted or failed job); re-run the job to resume it,"
            " or pass allow_incomplete=True to read it anyway"
        )
    if not meta.get("ready", True):
        raise StoreError(f"{path} was interrupted while it was being created; re-run the job")
    return QuantizedArray(group, meta, max_memory=max_memory)


class QuantizedCheckpoint(Mapping[str, Any]):
    """A converted checkpoint on disk: tensor name -> :class:`QuantizedArray` (quantized
    tensors) or ``zarr.Array`` (kept tensors, their original values; bfloat16 widened to
    float32, the original dtype in ``attrs["qstream"]["dtype"]``), in conversion order.

    The one type :func:`qstream.open_quantized` returns for a checkpoint of any
    :attr:`layout`: Zarr groups, packs, or a safetensors or GGUF export (:meth:`from_tensors`;
    its tensors read as their dequantized float32 values). All have :attr:`tensors` (name -> row),
    iteration and ``ck[name]``, :meth:`summary`, :attr:`view`."""

    def __init__(
        self,
        path: Any,
        group: Any,
        allow_incomplete: bool,
        storage_options: dict[str, Any] | None,
    ) -> None:
        meta = group.attrs["qstream_checkpoint"]
        if not isinstance(meta, dict):
            raise StoreError(f"{path}: its metadata is damaged or crafted (not an object)")
        if not meta.get("complete") and not allow_incomplete:
            raise StoreError(
                f"{path} is an incomplete checkpoint conversion; re-run the conversion to"
                " resume it, or pass allow_incomplete=True to read the finished tensors"
            )
        store = group.store_path.store if local_path(path) is None else None
        rows = RootIndex.open(path, dict(meta), store).rows(whole=True)
        self._setup(path, group, dict(meta), rows, storage_options, None)

    def _setup(
        self,
        path: Any,
        group: Any,
        meta: dict[str, Any],
        rows: dict[str, dict[str, Any]],
        storage_options: dict[str, Any] | None,
        opened: Mapping[str, Any] | None,
    ) -> None:
        self.path = path
        #: the root Zarr group (None: a checkpoint read through another reader, an export)
        self.group = group
        self.meta: dict[str, Any] = meta
        #: each tensor's row (see :mod:`qstream.io.outputs.rootindex`), keys checked, in order
        self.tensors: dict[str, dict[str, Any]] = rows
        self._keys = {n: t.get("key", n) for n, t in rows.items()}
        self._storage_options = storage_options
        self._packs: dict[str, PackReader] = {}
        self._opened = opened
        #: the memory bound of whoever reads it (None: the default), which packs are held to
        self.max_memory: int | None = None

    @classmethod
    def from_tensors(
        cls, path: Any, meta: dict[str, Any], rows: dict[str, dict[str, Any]], tensors: Any
    ) -> QuantizedCheckpoint:
        """A checkpoint that another reader opened (an export qstream wrote: ``tensors``,
        name -> lazy array), described by ``rows`` (name -> the row ``tensors`` has for a
        Zarr checkpoint: shape, dtype, target, kept, bytes...) and ``meta`` (its
        ``layout``, ``format``...)."""
        ck = cls.__new__(cls)
        ck._setup(path, None, {"complete": True, **meta}, rows, None, tensors)
        return ck

    @property
    def layout(self) -> str:
        """How it is stored: ``groups`` (a Zarr group per tensor), ``packed`` (runs of alike
        tensors stacked, :mod:`qstream.io.outputs.pack_layout`) or ``export`` (a safetensors
        file or index qstream exported, or a GGUF file)."""
        return str(self.meta.get("layout") or "groups")

    def key_of(self, name: str) -> str:
        """The key (path component below the root) the tensor ``name`` is stored under."""
        key: str = self._keys[name]
        return key

    def __getitem__(self, name: str) -> Any:
        if name not in self.tensors:
            raise KeyError(name)
        if self._opened is not None:
            return self._opened[name]
        key = self._keys[name]
        local = local_path(self.path)
        row = self.tensors[name]
        if row.get("pack") is not None:
            return self._pack(row["pack"]).tensor(row.get("slot"), name)
        if local is not None:  # never a link out of the checkpoint, nor a link or FIFO in it
            check_tree(child(local, key, self.path), "the converted tensor")
        if self.tensors[name].get("kept"):
            kept = self.group[key]
            if not (self.meta.get("complete") and all_chunks(kept)):
                return kept
            if local is None:  # (read through zarr: an absent chunk refused when read)
                return require_chunks(kept)
            if missing := gaps(kept):  # (its folder listed: its chunk files read as they are)
                raise StoreError(
                    f"{self.path}: the kept tensor {name!r} is damaged ({key}/{missing[0]}"
                    " absent or of the wrong size, and every chunk of it was written);"
                    " convert the checkpoint again with overwrite=True"
                )
            return kept
        return open_output(
            f"{os.fspath(self.path).rstrip('/')}/{key}",
            storage_options=self._storage_options,
            max_memory=self.max_memory,
        )

    def _pack(self, name: object) -> PackReader:
        """The pack ``name`` (see :mod:`qstream.io.outputs.pack_layout`), the last few kept open
        (tensors
        are mostly read in order, a pack's one after another)."""
        name = check_pack_name(name, self.path)
        reader = self._packs.pop(name, None)
        if reader is None:
            local = local_path(self.path)
            if local is None:
                raise StoreError(f"{self.path}: packed tensors are read from a local directory")
            folder = child(child(local, PACKS, self.path), name, self.path)
            check_tree(folder, "the pack")
            reader = PackReader(folder, self.max_memory)
        self._packs[name] = reader
        while len(self._packs) > 2:
            self._packs.pop(next(iter(self._packs)))
        return reader

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def __repr__(self) -> str:
        return f"QuantizedCheckpoint({self.path!r}, {len(self)} tensors)"

    def summary(self) -> dict[str, Any]:
        """Per tensor: shape, dtype, target, bytes and error summary (JSON-ready), with the
        checkpoint it came from, its :attr:`layout` and compression; an unfinished one also
        names the tensors it finished but had not listed yet (``unlisted``, see
        :meth:`unlisted`)."""
        complete = bool(self.meta.get("complete"))
        # (finished by an interrupted run, not listed yet: one read of each folder's document)
        unlisted = [] if complete else self.unlisted()
        compression = self.meta.get("compression")
        if compression == "auto":  # (the source's codecs, else zstd: what was written)
            compression = self._written_compression(unlisted) or compression
        out = {
            "checkpoint": self.meta.get("source"),
            "complete": complete,
            "layout": self.layout,
            "compression": compression,
            "tensors": self.tensors,
        }
        if not complete:
            out["unlisted"] = unlisted
        return out

    def damaged(self) -> list[str]:
        """What a finished checkpoint on a local disk lacks, as paths below its root: of
        each quantized tensor's group and each pack, member documents and chunks of codes
        and scales absent or of the wrong size (:func:`~qstream.io.outputs.ondisk.gaps`);
        of each kept tensor written whole (:func:`~qstream.io.storage.all_chunks`), its
        chunks; a pack or tensor that is gone. One walk of the root (a link or FIFO in it
        refused, naming it), then each tensor's and pack's array documents: 10,000 tensors
        (half of them kept norms) 0.24 s in packs, 0.9 s each in a group of its own (the
        walk of 25,000 folders 0.4 s of it). Empty for an unfinished one, an export, or one
        in an object store (whose listing costs requests; its reads refuse what they miss
        all the same, see :attr:`QuantizedArray.written_whole`)."""
        local = local_path(self.path)
        if local is None or self.layout == "export" or not self.meta.get("complete"):
            return []
        wheres: dict[str, dict[str, Any]] = {}  # tensor folder or pack -> its (first) row
        for name, row in self.tensors.items():
            pack = row.get("pack")
            where = self._keys[name]
            if pack is not None:
                where = f"{PACKS}/{check_pack_name(pack, self.path)}"
            wheres.setdefault(where, row)
        sizes: dict[str, int] = {}
        check_tree(local, "the converted checkpoint", sizes=sizes)
        below: dict[str, dict[str, int]] = {w: {} for w in wheres}  # its files' sizes
        for key, size in sizes.items():
            parts = key.split("/")
            for i in range(len(parts) - 1, 0, -1):  # (the nearest folder that is a tensor's)
                top = "/".join(parts[:i])
                if top in below:
                    below[top]["/".join(parts[i:])] = size
                    break
        out: list[str] = []
        for where, row in wheres.items():
            pack = row.get("pack")
            files = below[where]
            kept = bool(row.get("kept")) and pack is None
            if not files:
                out.append(f"{where}/")
                continue
            try:  # (a group's own document, its report, is not read: gaps lists it if absent)
                node = self.group[where] if kept else LocalGroup(os.path.join(local, where), {})
            except (StoreError, OSError, ValueError, KeyError, TypeError):
                node = None
            if node is None:
                out.append(f"{where}/zarr.json")
            elif not kept or all_chunks(node):
                out += [f"{where}/{m}" for m in gaps(node, files, strict=False)]
        return out

    def finished_unlisted(self, names: Iterable[str]) -> set[str]:
        """The tensors of ``names`` this (local, interrupted) conversion finished but had not
        listed in its index yet when it was stopped (a kill between two batches of rows):
        their groups or packs say they are complete; a re-run reuses them. Empty for a
        checkpoint not on a local disk."""
        local = local_path(self.path)
        if local is None or self.layout == "export":
            return set()
        return finished_unlisted(local, names, self.tensors)

    def _written_compression(self, unlisted: list[str]) -> str | None:
        """How the codes of this (local) checkpoint's first quantized tensor are compressed,
        from its codes' document, in ``--compression``'s spelling (``unlisted``: its
        :meth:`unlisted` tensors, looked at when none is listed); None where it cannot say."""
        from ..storage import read_local_doc
        from ..storage.compression import describe_docs

        local = local_path(self.path)
        if local is None or self.layout == "export":
            return None
        row = next((r for r in self.tensors.values() if not r.get("kept")), None)
        if row is not None:
            pack = row.get("pack")
            where = f"{PACKS}/{check_pack_name(pack, self.path)}" if pack else row.get("key")
        else:  # (an interrupted conversion that listed none yet: a tensor it finished)
            where = self._first_unlisted(local, unlisted)
        if not isinstance(where, str):
            return None
        doc = read_local_doc(os.path.join(local, where, "data", "zarr.json")) or {}
        codecs = [c for c in doc.get("codecs") or () if isinstance(c, dict)]
        if not codecs:
            return None
        # (the codecs but the serializer: what --compression names)
        return describe_docs([c for c in codecs if c.get("name") not in ("bytes", "transpose")])

    def _first_unlisted(self, local: str, unlisted: list[str]) -> str | None:
        """The folder (below ``local``) of a pack, else of a tensor (of ``unlisted``), that
        this interrupted conversion finished without listing it; None when there is none."""
        packs = os.path.join(local, PACKS)
        if entry_kind(packs) == "dir":  # (a link there, or to a pack: never followed)
            for name in sorted(os.listdir(packs)):
                pack = os.path.join(packs, name)
                if not (PACK_NAME.fullmatch(name) and entry_kind(pack) == "dir"):
                    continue
                with contextlib.suppress(StoreError):  # (a link or a FIFO in it: not qstream's)
                    if (read_pack_doc(pack) or {}).get("complete") is True:
                        return f"{PACKS}/{name}"
        return tensor_key(unlisted[0]) if unlisted else None

    def unlisted(self) -> list[str]:
        """The tensors this (local, interrupted) conversion finished but had not listed in
        its index yet (:meth:`finished_unlisted`), found without the source checkpoint:
        what ``inspect`` adds to the listed ones, and a re-run reuses. Empty for a finished
        checkpoint, an export, or one not on a local disk."""
        local = local_path(self.path)
        if local is None or self.layout == "export" or self.meta.get("complete"):
            return []
        return sorted(unlisted_tensors(local, self.tensors))

    # ---- views (qstream.viz): from the root's index rows, no tensor opened; bounded

    @property
    def view(self) -> CheckpointView:
        """The :class:`~qstream.spec.views.CheckpointView` of this checkpoint: the
        SQNR over its quantized tensors (a histogram, the worst ones), its bytes before and
        after (totals, per target, the largest tensors, a histogram of sizes); bounded
        whatever the number of tensors."""
        from ...spec.views import CheckpointView

        return CheckpointView.from_rows(self.tensors.values(), title=str(self.path))

    def _repr_html_(self) -> str:
        from ...spec.views import display

        return display.html(self.view)

    def plot(self, ax: Axes | None = None) -> Figure:
        """Draw the SQNR over the quantized tensors (one count per tensor, log scale above 20
        a bin, the median and the worst marked) on ``ax`` (a new figure when None) with matplotlib
        (``pip install 'qstream-zarr[plot]'``); returns the figure. The whole page (the worst
        tensors and the sizes too) as a file: ``qstream.save_plot(ck, "page.png")``."""
        from ...spec.views import display

        figure: Figure = display.plot(self.view, ax=ax)
        return figure
