"""The root of a converted checkpoint: its identity, and an index of its finished tensors that
grows by appending.

::

    DST/zarr.json            attrs["qstream_checkpoint"] = {"version": 2, "source", "recipe",
                             "compression", "tensors_total", "index": "_index", "complete"}
    DST/_index/              a Zarr group; each batch of finished tensors is a subgroup whose
      b000000/zarr.json      attributes hold {"rows": [row, ...]} (or the same rows as
                             {"columns": {key: [value, ...]}}, a column of the error
      b000001/zarr.json      figures' floats as float64 bytes), written once, never again
                             (new batches are linked into place; a resumed run, before it
                             marks the root complete, rewrites the batches as its
                             uninterrupted run writes them: :meth:`RootIndex.settle`)
    DST/<key>/               each tensor's own group (quantized, with its full report) or
                             array (kept)
    DST/_packs/<pack>/       or, for runs of small alike tensors, their pack (its row names
                             the pack and the slot; see qstream.io.outputs.pack_layout)

A row is one tensor's compact entry (:data:`ROW_KEYS`, a few hundred bytes): its name, key,
position in the checkpoint, shape, dtype, target, byte counts and the scalar figures of its
error report. The root's document is written when the conversion begins and when it ends,
never per tensor; ``inspect`` and :class:`~qstream.io.outputs.reader.QuantizedCheckpoint` read the
index's batches, not the tensors. Every document of a local root is walked from the root
(:func:`~qstream.paths.walk_below`): a link in ``_index``, or at it, is refused, naming it,
never followed. Outputs of version 1 (every tensor's whole report in
``attrs["qstream_checkpoint"]["tensors"]``, rewritten as tensors finished) still read.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from ...errors import StoreError
from ...input_files import open_regular
from ...paths import local_path, walk_below
from ..storage import check_key, float_values, group_doc, listed_floats, write_doc

INDEX = "_index"
WHAT = "the converted checkpoint"  # (as errors name a local root)
KEY = "qstream_checkpoint"
VERSION = 2
# what a row keeps of a tensor's result (the error report's scalar figures only)
ROW_KEYS = (
    "name",
    "key",
    "pos",
    "shape",
    "dtype",
    "target",
    "kept",
    "bytes_before",
    "bytes_after",
    "params",
    "error",
    "pack",
    "slot",
)
ERROR_KEYS = ("sqnr_db", "mse", "max_abs", "cosine", "clipped", "clip_fraction", "nonfinite")


def compact(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with only :data:`ROW_KEYS` and the scalar figures of its error report."""
    out = {k: row[k] for k in ROW_KEYS if k in row}
    if isinstance(out.get("error"), dict):
        out["error"] = {k: out["error"][k] for k in ERROR_KEYS if k in out["error"]}
    return out


def _put(root: object, store: Any, rel: str, attrs: dict[str, Any], *, new: bool) -> None:
    """Write the group document ``rel/zarr.json`` (``rel`` "" for the root) with ``attrs``."""
    local = local_path(root)
    if local is not None:
        parts = [*rel.split("/"), "zarr.json"] if rel else ["zarr.json"]
        write_doc(os.path.dirname(walk_below(local, parts, WHAT)), group_doc(attrs), new=new)
        return
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    key = f"{rel}/zarr.json".lstrip("/")
    buf = default_buffer_prototype().buffer.from_bytes(group_doc(attrs))
    if new and sync(store.get(key, default_buffer_prototype())) is not None:
        raise FileExistsError(key)
    sync(store.set(key, buf))


class RootIndex:
    """The root of a converted checkpoint at ``root`` (a local directory or a store URL;
    ``store``: the zarr store of a non-local root)."""

    def __init__(self, root: object, meta: dict[str, Any], store: Any = None) -> None:
        self.root = root
        self.meta = meta
        self.store = store
        self._batches: int | None = None

    # ---- writing

    @classmethod
    def create(cls, root: object, meta: dict[str, Any], store: Any = None) -> RootIndex:
        """A new root with ``meta`` (``complete: false``) and an empty index; the root's
        document is written first, with ``new`` semantics (never replacing one)."""
        meta = {**meta, "version": VERSION, "index": INDEX, "complete": False}
        try:
            _put(root, store, "", {KEY: meta}, new=True)
            _put(root, store, INDEX, {}, new=True)
        except FileExistsError:
            raise StoreError(f"{root} was created by another process meanwhile") from None
        except OSError as e:
            raise StoreError(f"cannot write {root}: {e}") from None
        index = cls(root, meta, store)
        index._batches = 0
        return index

    def append(self, rows: list[dict[str, Any]]) -> None:
        """Add the compact rows of newly finished tensors, as one new batch."""
        if rows:
            self._append(_batch(rows))

    def append_columns(self, columns: dict[str, list[Any]], errors: dict[str, list[Any]]) -> None:
        """Add the rows of newly finished tensors given as columns, as one new batch:
        ``columns`` a list per key (:data:`ROW_KEYS` but ``error``, in their order),
        ``errors`` a list per error figure (what :meth:`append` of those rows writes)."""
        self._append(_column_batch(columns, errors))

    def _append(self, attrs: dict[str, Any]) -> None:
        if self._batches is None:
            self._batches = len(self._batch_names())
        try:
            _put(self.root, self.store, f"{INDEX}/b{self._batches:06d}", attrs, new=True)
        except OSError as e:
            raise StoreError(f"cannot write the index of {self.root}: {e}") from None
        self._batches += 1

    def set_meta(self, **changes: Any) -> None:
        """Rewrite the root's own (small) document with ``changes`` (its start and end)."""
        self.meta = {**self.meta, **changes}
        try:
            _put(self.root, self.store, "", {KEY: self.meta}, new=False)
        except OSError as e:
            raise StoreError(f"cannot write the metadata of {self.root}: {e}") from None

    def upgrade(self) -> None:
        """Carry an unfinished root of version 1 over to the index (its listed tensors become
        the first batch), so that this run appends to it; make the index's own document if a
        killed run did not get to write it."""
        if self.meta.get("version", 1) >= VERSION:
            with contextlib.suppress(FileExistsError):
                _put(self.root, self.store, INDEX, {}, new=True)
            return
        rows = [compact({**r, "pos": i}) for i, r in enumerate(self.rows().values())]
        with contextlib.suppress(FileExistsError):  # (made by an interrupted upgrade)
            _put(self.root, self.store, INDEX, {}, new=True)
        if not self._batch_names():
            self._batches = 0
            self.append(rows)
        meta = {k: v for k, v in self.meta.items() if k != "tensors"}
        self.meta = {}
        self.set_meta(**meta, version=VERSION, index=INDEX)

    def settle(self, rows: list[dict[str, Any]], per_batch: int) -> None:
        """Rewrite the index as an uninterrupted run writes it, so that a resumed run's output
        has the same bytes: ``rows``, every tensor's row, listed in checkpoint order (a pack's
        rows together, where its first one is, as the run converts them), in batches of
        ``per_batch`` rows, a pack's rows a batch of their own. A batch that already holds
        exactly a wanted batch's rows keeps its bytes (moved to its number); each document is
        replaced atomically, in order, then the batches past the last are removed: a reader
        (or a run killed meanwhile) always finds every row in some batch (at worst twice:
        rows are read by name)."""
        existing = {}  # the names a batch lists -> its document's bytes
        for name in self._batch_names():
            raw = self._raw(name)
            if raw is not None:
                names = tuple(r.get("name") for r in self._read_batch(name))
                existing[names] = raw
        wanted = [
            existing.get(tuple(r["name"] for r in batch)) or group_doc(_batch(batch, pack))
            for batch, pack in _settled(_listed_order(rows), per_batch)
        ]
        try:
            for i, doc in enumerate(wanted):
                if self._raw(f"b{i:06d}") != doc:
                    self._put_raw(f"{INDEX}/b{i:06d}", doc)
            for name in reversed(self._batch_folders()):
                if int(name[1:]) >= len(wanted):
                    self._remove(name)
        except OSError as e:
            raise StoreError(f"cannot write the index of {self.root}: {e}") from None
        self._batches = len(wanted)

    def _raw(self, name: str) -> bytes | None:
        """The bytes of batch ``name``'s document (None: none)."""
        local = local_path(self.root)
        if local is not None:
            try:
                path = walk_below(local, [INDEX, name, "zarr.json"], WHAT)
                with open_regular(path, "index document", follow=False) as f:
                    return bytes(f.read(64 << 20))
            except FileNotFoundError:
                return None
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        raw = sync(self.store.get(f"{INDEX}/{name}/zarr.json", default_buffer_prototype()))
        return None if raw is None else bytes(raw.to_bytes())

    def _put_raw(self, rel: str, doc: bytes) -> None:
        local = local_path(self.root)
        if local is not None:
            write_doc(
                os.path.dirname(walk_below(local, [*rel.split("/"), "zarr.json"], WHAT)),
                doc,
                new=False,
            )
            return
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        sync(self.store.set(f"{rel}/zarr.json", default_buffer_prototype().buffer.from_bytes(doc)))

    def _batch_folders(self) -> list[str]:
        """Every batch's name, its document written or not (a local root's folders)."""
        local = local_path(self.root)
        if local is None:
            return self._batch_names()
        try:
            entries = os.scandir(walk_below(local, [INDEX], WHAT))
        except (FileNotFoundError, NotADirectoryError):
            return []
        with entries:
            names = [
                e.name for e in entries if not e.is_symlink() and e.is_dir(follow_symlinks=False)
            ]
        return sorted(n for n in names if n.startswith("b") and n[1:].isdigit())

    def _remove(self, name: str) -> None:
        """Remove batch ``name`` (its document first, then its folder and what a killed
        writer left in it)."""
        local = local_path(self.root)
        if local is None:
            from zarr.core.sync import sync

            sync(self.store.delete(f"{INDEX}/{name}/zarr.json"))
            return
        folder = walk_below(local, [INDEX, name], WHAT)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, "zarr.json"))
        with contextlib.suppress(FileNotFoundError):
            for e in os.scandir(folder):
                if e.name.endswith(".partial") and e.is_file(follow_symlinks=False):
                    os.unlink(e.path)
            os.rmdir(folder)

    # ---- reading

    def _batch_names(self) -> list[str]:
        local = local_path(self.root)
        if local is not None:
            folder = walk_below(local, [INDEX], WHAT)  # (a link there: refused)
            try:
                entries = list(os.scandir(folder))
            except (FileNotFoundError, NotADirectoryError):
                return []
            for e in entries:
                if e.name.startswith("b") and e.is_symlink():
                    raise StoreError(
                        f"{e.path} is a link inside {WHAT} {local}; qstream never reads,"
                        " writes or deletes through a link in its outputs: remove the link"
                    )
            # (a folder without its document is a batch a killed run did not finish: its
            # number is the next batch's)
            names = [e.name for e in entries if os.path.lexists(os.path.join(e.path, "zarr.json"))]
        else:
            from zarr.core.sync import sync

            async def listing() -> list[str]:
                return [n async for n in self.store.list_dir(INDEX)]

            names = sync(listing())
        return sorted(n for n in names if n.startswith("b") and n[1:].isdigit())

    def _read_batch(self, name: str) -> list[dict[str, Any]]:
        local = local_path(self.root)
        try:
            if local is not None:
                path = walk_below(local, [INDEX, name, "zarr.json"], WHAT)
                with open_regular(path, "index document", follow=False) as f:
                    doc = json.loads(f.read(64 << 20))
            else:
                from zarr.core.buffer import default_buffer_prototype
                from zarr.core.sync import sync

                raw = sync(self.store.get(f"{INDEX}/{name}/zarr.json", default_buffer_prototype()))
                doc = json.loads(raw.to_bytes()) if raw is not None else {}
            attrs = doc["attributes"]
            rows = attrs["rows"] if "rows" in attrs else _rows(attrs["columns"], name)
        except FileNotFoundError:
            return []  # a batch being linked into place
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
            if isinstance(e, StoreError):
                raise
            raise StoreError(f"{self.root}: index batch {name} is damaged ({e})") from None
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise StoreError(f"{self.root}: index batch {name} is damaged")
        return rows

    def rows(self, *, whole: bool = False) -> dict[str, dict[str, Any]]:
        """Every listed tensor's row by name, in checkpoint order, keys checked (an output of
        version 1 gives its ``tensors`` entries, their keys defaulting to their names).
        ``whole``: a finished root must list every tensor it converted (``tensors_total``),
        else it is refused as damaged (a batch of its index removed), never read as a
        checkpoint of fewer tensors."""
        if self.meta.get("version", 1) < VERSION:
            tensors = self.meta.get("tensors", {})
            if not isinstance(tensors, dict) or not all(
                isinstance(t, dict) for t in tensors.values()
            ):
                raise StoreError(f"{self.root}: its metadata lists no tensors; it is damaged")
            out = {n: {**t, "name": n, "key": t.get("key", n)} for n, t in tensors.items()}
        else:
            found = [r for b in self._batch_names() for r in self._read_batch(b)]
            out = {}
            for r in sorted(found, key=lambda r: _position(r, self.root)):
                name = r.get("name")
                if not isinstance(name, str):
                    raise StoreError(f"{self.root}: an index row has no name; it is damaged")
                out[name] = r
        for name, r in out.items():
            check_key(r.get("key", name), self.root)
        total = self.meta.get("tensors_total")
        if whole and self.meta.get("complete") and type(total) is int and len(out) != total:
            raise StoreError(
                f"{self.root} is damaged: its index ({INDEX}) lists {len(out)} of the {total}"
                " tensors it converted; convert the checkpoint again with overwrite=True"
            )
        return out

    @classmethod
    def open(cls, root: object, meta: dict[str, Any] | None, store: Any = None) -> RootIndex:
        """The root at ``root`` whose ``qstream_checkpoint`` metadata is ``meta`` (refused if
        it is not an object with an integer version)."""
        version = meta.get("version", 1) if isinstance(meta, dict) else None
        if not isinstance(meta, dict) or isinstance(version, bool) or not isinstance(version, int):
            raise StoreError(f"{root}: its metadata is damaged or crafted")
        return cls(root, meta, store)


def _listed_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (compacted) by position, each pack's rows moved to its first one's place."""
    ordered = sorted((compact(r) for r in rows), key=lambda r: (r.get("pos", 0), r.get("slot", 0)))
    packs: dict[Any, list[dict[str, Any]]] = {}
    for r in ordered:
        if r.get("pack") is not None:
            packs.setdefault(r["pack"], []).append(r)
    out: list[dict[str, Any]] = []
    for r in ordered:
        if r.get("pack") is None:
            out.append(r)
        elif r["pack"] in packs:
            out.extend(sorted(packs.pop(r["pack"]), key=lambda r: r.get("slot", 0)))
    return out


def _settled(rows: list[dict[str, Any]], per_batch: int) -> list[tuple[list[dict], bool]]:
    """``rows`` cut into batches as a run lists them (with whether each is a pack's): a
    pack's rows a batch of their own, the others ``per_batch`` at a time between packs."""
    out: list[tuple[list[dict], bool]] = []
    pending: list[dict[str, Any]] = []
    for row in rows:
        pack = row.get("pack")
        if pack is None:
            pending.append(row)
            if len(pending) >= per_batch:
                out.append((pending, False))
                pending = []
            continue
        if pending:
            out.append((pending, False))
            pending = []
        if out and out[-1][1] and out[-1][0][-1].get("pack") == pack:
            out[-1][0].append(row)
        else:
            out.append(([row], True))
    if pending:
        out.append((pending, False))
    return out


def _batch(rows: list[dict[str, Any]], pack: bool = False) -> dict[str, Any]:
    """A batch document's attributes: ``{"columns": {key: [value per row]}}`` when every row
    has the same keys (a pack's tensors, always, ``pack``: a few times smaller and faster to
    write than a list of objects), ``error`` split into ``error.<figure>`` columns when every
    row's has the same figures (a column of floats as float64 bytes,
    :func:`~qstream.io.storage.columns.listed_floats`); else ``{"rows": rows}``."""
    keys = list(rows[0])
    if (len(rows) < 2 and not pack) or any(list(r) != keys for r in rows):
        return {"rows": rows}
    columns: dict[str, Any] = {k: [r[k] for r in rows] for k in keys}
    errors = columns.get("error")
    if errors and isinstance(errors[0], dict):
        figures = list(errors[0])
        if all(isinstance(e, dict) and list(e) == figures for e in errors):
            del columns["error"]
            return _column_batch(columns, {f: [e[f] for e in errors] for f in figures})
    return {"columns": columns}


def _column_batch(columns: dict[str, list[Any]], errors: dict[str, list[Any]]) -> dict[str, Any]:
    """The attributes of a batch of ``columns`` and the ``error`` figures' columns."""
    figures = {f"error.{f}": listed_floats(f, values) for f, values in errors.items()}
    return {"columns": {**columns, **figures}}


def _rows(columns: object, name: str) -> list[dict[str, Any]]:
    """The rows of a batch written as :func:`_batch` columns."""
    if not isinstance(columns, dict) or not columns:
        raise ValueError(f"batch {name} has no columns")
    columns = {
        k: float_values(v, k.removeprefix("error.")) if isinstance(v, dict) else v
        for k, v in columns.items()
    }
    lists = list(columns.values())
    n = len(lists[0]) if isinstance(lists[0], list) else -1
    if not all(isinstance(v, list) and len(v) == n for v in lists):
        raise ValueError(f"batch {name}: its columns differ in length")
    plain = [k for k in columns if not k.startswith("error.")]
    figures = [k for k in columns if k.startswith("error.")]
    values = zip(*(columns[k] for k in plain), strict=True)
    rows = [dict(zip(plain, vals, strict=True)) for vals in values]
    if figures:
        names = [k.removeprefix("error.") for k in figures]
        values = zip(*(columns[k] for k in figures), strict=True)
        for r, vals in zip(rows, values, strict=True):
            r["error"] = dict(zip(names, vals, strict=True))
    return rows


def _position(row: dict[str, Any], root: object) -> int:
    pos = row.get("pos", 0)
    if isinstance(pos, bool) or not isinstance(pos, int):
        raise StoreError(f"{root}: an index row has no position; it is damaged")
    return pos
