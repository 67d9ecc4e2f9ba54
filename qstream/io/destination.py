"""Destinations: what a job may write over, and the life of an output location.

Rules: a destination is qstream's only if qstream's own metadata says so (a ``zarr.json``
whose attributes carry a qstream output of a known kind); qstream replaces only such an
output, only with ``overwrite`` (or when it is an unfinished run of the same job), and only
the files it writes, node by node (:func:`remove_output`). Anything else, whether a file, a
folder of the user's, or a Zarr array or group qstream did not write, is refused whatever
``overwrite`` says, and nothing is written into it. Local destinations are locked (``flock``)
while a job writes them, so two processes never write one output at once.

:class:`Destination` is that life in one object: a read-only look and a decision (refusals
happen before anything is written), then the lock, the decision again under it (another
process may have written meanwhile), and the removal of what is replaced; callers then create
or resume their output, and write ``complete`` last.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from ..errors import StoreError
from .chunks import PARTIAL
from .names import check_key
from .paths import child
from .stores import open_store

LOCK = ".qstream-lock"
INDEX = "_index"  # a converted checkpoint's index (qstream.io.rootindex)
TMP_PREFIX = ".qstream-tmp-"  # a tensor's group being built beside its place (qarray.write_group)
MEMBERS = ("data", "scale", "zero_point", "_progress")  # of a quantized group
OPTIONAL_MEMBERS = ("offset",)  # of some quantized groups (float offsets)


class Action(enum.Enum):
    """What a job does with its destination (see :func:`decide`)."""

    CREATE = "create"  # absent or empty: a new output
    RESUME = "resume"  # an unfinished run of this job
    COMPLETE = "complete"  # this job, finished: nothing to do
    REPLACE = "replace"  # qstream's own output (another job, or ``overwrite``): removed first


@dataclass(frozen=True)
class Existing:
    """What a destination holds now.

    ``kind``: ``absent``, ``empty``, ``quantized`` (a qstream quantized group),
    ``checkpoint`` (a converted checkpoint), ``dequantized`` (a qstream dequantize output),
    ``restored`` (a dequantized checkpoint),
    ``zarr`` (any other Zarr array or group), ``file`` or ``foreign`` (a directory or store
    holding other things).
    """

    kind: str
    meta: dict | None = None


def _is_url(dst) -> bool:
    return isinstance(dst, str) and "://" in dst and not dst.startswith("file://")


def local_path(dst) -> str | None:
    """The local directory of ``dst``, or None (a URL, a zip file, a store object)."""
    if not isinstance(dst, (str, os.PathLike)) or _is_url(dst):
        return None
    p = os.fspath(dst).removeprefix("file://")
    return None if p.endswith(".zip") else p


def _classify_meta(doc: dict) -> Existing:
    attrs = doc.get("attributes") or {}
    if not isinstance(attrs, dict):
        return Existing("zarr")
    node = doc.get("node_type")
    if node == "group" and isinstance(attrs.get("qstream"), dict):
        return Existing("quantized", attrs["qstream"])
    if node == "group" and isinstance(attrs.get("qstream_checkpoint"), dict):
        return Existing("checkpoint", attrs["qstream_checkpoint"])
    if node == "group" and isinstance(attrs.get("qstream_restored"), dict):
        return Existing("restored", attrs["qstream_restored"])
    q = attrs.get("qstream")
    if node == "array" and isinstance(q, dict) and "dequantized_from" in q:
        return Existing("dequantized", q)
    if node == "array" and isinstance(q, dict) and q.get("kept") is True:
        return Existing("kept", q)
    return Existing("zarr")


def read_local_doc(path: str) -> dict | None:
    """The JSON object in the local file ``path`` (a ``zarr.json``), or None: absent,
    unreadable, not JSON, not an object, or nested too deeply to be a Zarr document."""
    from .paths import open_regular

    try:
        with open_regular(path, "Zarr metadata") as f:
            raw = f.read(_MAX_DOC + 1)
        if len(raw) > _MAX_DOC:
            return None
        doc = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


_MAX_DOC = 256 << 20  # bytes of a metadata document qstream reads (a root of 100k tensors)


def inspect_destination(dst, storage_options: dict | None = None) -> Existing:
    """Look at ``dst`` without changing it (see :class:`Existing`)."""
    local = local_path(dst)
    if local is not None:
        if not os.path.lexists(local):
            return Existing("absent")
        if not os.path.isdir(local):
            return Existing("file")
        names = [n for n in os.listdir(local) if n != LOCK and not n.endswith(PARTIAL)]
        if not names:
            return Existing("empty")
        if "zarr.json" in names:
            doc = read_local_doc(os.path.join(local, "zarr.json"))
            return Existing("foreign") if doc is None else _classify_meta(doc)
        if ".zarray" in names or ".zgroup" in names:
            return Existing("zarr")
        return Existing("foreign")
    if isinstance(dst, (str, os.PathLike)) and os.fspath(dst).endswith(".zip") and not _is_url(dst):
        path = os.fspath(dst).removeprefix("file://")
        if not os.path.lexists(path):
            return Existing("absent")
        import zipfile

        try:
            with zipfile.ZipFile(path) as zf:
                doc = json.loads(zf.read("zarr.json"))
        except (OSError, KeyError, ValueError, RecursionError, zipfile.BadZipFile):
            return Existing("file")
        return _classify_meta(doc) if isinstance(doc, dict) else Existing("file")
    # memory:// and object stores
    from zarr.core.sync import sync

    store = open_store(dst, mode="w", storage_options=storage_options)
    try:
        raw = sync(store.get("zarr.json", buffer_prototype()))
        if raw is not None:
            doc = json.loads(raw.to_bytes())
            return _classify_meta(doc) if isinstance(doc, dict) else Existing("foreign")
        return Existing("empty") if sync(store.is_empty("")) else Existing("foreign")
    except (OSError, ValueError, RecursionError) as e:
        raise StoreError(f"cannot read {dst}: {type(e).__name__}: {e}") from None


def buffer_prototype():
    from zarr.core.buffer import default_buffer_prototype

    return default_buffer_prototype()


def decide(existing: Existing, fingerprint: str, *, overwrite: bool, what: str, dst) -> Action:
    """What a job does with a destination (an :class:`Action`): create, resume (an
    unfinished output of this job), complete (this job, finished) or replace (qstream's own
    output of another job, with ``overwrite``: its members are removed). Anything else is
    refused with an error naming the destination and the flag: a destination is qstream's
    only if qstream's own metadata says so, and ``overwrite`` never removes anything else."""
    kind = existing.kind
    if kind in ("absent", "empty"):
        return Action.CREATE
    if kind in ("file", "foreign", "zarr", "kept"):
        thing = {
            "file": "a file",
            "foreign": "not empty and is not a Zarr store",
            "zarr": "a Zarr array or group that qstream did not write",
            "kept": "a tensor inside a converted checkpoint",
        }[kind]
        raise StoreError(
            f"{dst} is {thing}; qstream writes only to a new or empty location or over its own"
            " outputs, and will not delete it (even with overwrite=True): remove it yourself"
            " or choose another destination"
        )
    meta = existing.meta or {}
    ours = kind == what
    if ours and meta.get("fingerprint") == fingerprint:
        if overwrite:
            return Action.REPLACE
        return Action.COMPLETE if meta.get("complete") else Action.RESUME
    if overwrite:
        return Action.REPLACE
    if ours:
        raise StoreError(
            f"{dst} holds a different job (other spec, source, compression or format version);"
            " pass overwrite=True to replace it"
        )
    label = {
        "quantized": "a qstream quantized array",
        "checkpoint": "a qstream converted checkpoint",
        "restored": "a qstream restored checkpoint",
        "dequantized": "a qstream dequantized array",
    }[kind]
    raise StoreError(f"{dst} exists and is {label}; pass overwrite=True to replace it")


_CHUNK_KEY = re.compile(r"c(?:[./]\d+)*")  # an array's chunk keys (flat "c.0.1" or "c/0/1")
ARRAY_KEY = re.compile(r"zarr\.json|c(?:[./]\d+)*")  # an array's own keys, below its prefix
_INDEX_KEY = re.compile(r"zarr\.json|b\d+/zarr\.json")  # a converted checkpoint's index


def remove_output(dst, existing: Existing, storage_options: dict | None = None) -> None:
    """Remove qstream's own output at ``dst`` (what :func:`decide` said to replace), file
    by file: of every node, only the metadata and member arrays qstream writes, and only where
    the node's own metadata says qstream wrote it; anything else stays. Keys of a converted or
    restored checkpoint's tensors are checked (:func:`~qstream.io.names.check_key`) and
    never lead outside ``dst``."""
    if existing.kind not in ("quantized", "checkpoint", "restored", "dequantized", "kept"):
        raise StoreError(f"{dst}: not qstream's output; nothing is removed")
    if isinstance(dst, (str, os.PathLike)) and os.fspath(dst).endswith(".zip"):
        return  # a zip output is replaced whole when the new one is packed
    local = local_path(dst)
    if local is not None:
        _remove_local(local, existing, dst)
        clean_partials(dst)
        return
    from zarr.core.sync import sync

    store = open_store(dst, mode="w", storage_options=storage_options)
    try:
        _remove_stored(store, "", existing, dst, sync)
    except (OSError, ValueError) as e:
        if isinstance(e, StoreError):
            raise
        raise StoreError(f"cannot remove the old output {dst}: {type(e).__name__}: {e}") from None


def _tensor_keys(existing: Existing, dst, store=None) -> list[str]:
    """The checked keys of a converted or restored checkpoint's tensors (a converted
    checkpoint's from its index, see :mod:`qstream.io.rootindex`)."""
    if existing.kind == "checkpoint":
        from .rootindex import RootIndex

        rows = RootIndex.open(dst, existing.meta, store).rows()
        return [r.get("key", n) for n, r in rows.items()]
    tensors = existing.meta.get("tensors", {}) if isinstance(existing.meta, dict) else None
    if not isinstance(tensors, dict):
        raise StoreError(f"{dst}: its metadata lists no tensors; the output is damaged")
    return [
        check_key(e.get("key", n) if isinstance(e, dict) else n, dst) for n, e in tensors.items()
    ]


def _remove_stored(store, prefix: str, existing: Existing, dst, sync) -> None:
    """:func:`remove_output` on a store (object store, memory): the node at ``prefix``."""
    if existing.kind in ("checkpoint", "restored"):
        for key in _tensor_keys(existing, dst, store):
            raw = sync(store.get(f"{prefix}{key}/zarr.json", buffer_prototype()))
            try:
                doc = json.loads(raw.to_bytes()) if raw is not None else None
            except (ValueError, RecursionError):
                doc = None
            node = _classify_meta(doc) if isinstance(doc, dict) else Existing("foreign")
            if node.kind in ("quantized", "dequantized", "kept"):
                _remove_stored(store, f"{prefix}{key}/", node, dst, sync)
        delete_keys(store, f"{prefix}{INDEX}/", _INDEX_KEY, sync)
    elif existing.kind == "quantized":
        for m in (*MEMBERS, *OPTIONAL_MEMBERS):
            raw = sync(store.get(f"{prefix}{m}/zarr.json", buffer_prototype()))
            if raw is not None and is_array_doc(raw.to_bytes()):  # its own metadata says so
                delete_keys(store, f"{prefix}{m}/", ARRAY_KEY, sync)
    else:  # an array: its chunk keys
        delete_keys(store, prefix, ARRAY_KEY, sync)
    sync(store.delete(f"{prefix}zarr.json"))


def delete_keys(store, prefix: str, pattern, sync) -> None:
    """Delete the keys below ``prefix`` (relative to it) that ``pattern`` matches in full."""

    async def keys():
        return [k async for k in store.list_prefix(prefix)]

    for key in sync(keys()):
        if pattern.fullmatch(key[len(prefix) :]):
            sync(store.delete(key))


def is_array_doc(raw: bytes) -> bool:
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and doc.get("node_type") == "array"


def _remove_local(local: str, existing: Existing, dst) -> None:
    """Remove a local node qstream wrote (see :func:`remove_output`)."""
    from .paths import child, remove_child

    if existing.kind in ("checkpoint", "restored"):
        keys = _tensor_keys(existing, dst)
        for key in keys:
            path = child(local, key, dst)
            if os.path.isdir(path) and not os.path.islink(path):
                node = _node_at(path)
                if node.kind in ("quantized", "dequantized", "kept"):
                    _remove_local(path, node, path)
                    remove_child(path, LOCK)  # (no job runs on it: the root is locked)
                    remove_if_empty(path)
        for key in keys:  # the folders of an earlier version's nested names, if left empty
            parts = key.split("/")
            for i in range(len(parts) - 1, 0, -1):
                remove_if_empty(os.path.join(local, *parts[:i]))
        if existing.kind == "checkpoint":
            from .packs import remove_packs

            remove_packs(local)
        _remove_index(local)
        remove_child(local, "zarr.json")
        return
    if existing.kind == "quantized":
        for m in (*MEMBERS, *OPTIONAL_MEMBERS):
            path = os.path.join(local, m)
            if os.path.islink(path):  # never qstream's: the link goes, not what it points to
                remove_child(local, m)
            elif os.path.isdir(path) and is_array_doc_at(path):  # its own metadata says so
                remove_array_files(path)
                remove_if_empty(path)
        remove_child(local, "zarr.json")
        return
    remove_array_files(local)  # a dequantized or kept array


def is_array_doc_at(path: str) -> bool:
    doc = read_local_doc(os.path.join(path, "zarr.json"))
    return doc is not None and doc.get("node_type") == "array"


def _remove_index(local: str) -> None:
    """Remove a converted checkpoint's index (its batch documents and its own)."""
    from .paths import remove_child

    index = os.path.join(local, INDEX)
    if not os.path.isdir(index) or os.path.islink(index):
        return
    for entry in os.scandir(index):
        if entry.is_dir(follow_symlinks=False) and entry.name.startswith("b"):
            _remove_partials(entry.path, recurse=False)
            remove_child(entry.path, "zarr.json")
            remove_if_empty(entry.path)
    _remove_partials(index, recurse=False)
    remove_child(index, "zarr.json")
    remove_if_empty(index)


def remove_array_files(directory: str) -> None:
    """Remove a Zarr array's own files from ``directory``: its chunk files (flat ``c.0.1``, or
    nested ``c/0/1``: only files whose path is chunk coordinates, and the folders they leave
    empty) and temporary files, then its ``zarr.json``. Nothing else is touched."""
    from .paths import remove_child

    for entry in os.scandir(directory):
        if entry.name == "c" and entry.is_dir(follow_symlinks=False):
            _remove_chunk_folder(entry.path)
        elif (_CHUNK_KEY.fullmatch(entry.name) or entry.name.endswith(PARTIAL)) and (
            entry.is_file(follow_symlinks=False) or entry.is_symlink()
        ):
            remove_child(directory, entry.name)
    remove_child(directory, "zarr.json")


def _remove_chunk_folder(folder: str) -> None:
    """Remove the nested chunk files below ``folder`` (``c``): entries named by a number (or
    temporary files), recursively, and the folders left empty; links only unlinked."""
    from .paths import remove_child

    for entry in os.scandir(folder):
        if entry.name.isdigit() and entry.is_dir(follow_symlinks=False):
            _remove_chunk_folder(entry.path)
        elif (entry.name.isdigit() or entry.name.endswith(PARTIAL)) and (
            entry.is_file(follow_symlinks=False) or entry.is_symlink()
        ):
            remove_child(folder, entry.name)
    remove_if_empty(folder)


def remove_if_empty(directory: str) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(directory)


def _node_at(path: str) -> Existing:
    """What the local Zarr node at ``path`` is (by its ``zarr.json``)."""
    doc = read_local_doc(os.path.join(path, "zarr.json"))
    return Existing("foreign") if doc is None else _classify_meta(doc)


def clean_partials(dst) -> None:
    """Remove the temporary files of killed writers from a local output (its root and its
    member arrays): they are never part of a finished output."""
    local = local_path(dst)
    if local is None or not os.path.isdir(local):
        return
    _remove_partials(local, recurse=False)
    for name in (*MEMBERS, *OPTIONAL_MEMBERS, INDEX):
        if os.path.isdir(os.path.join(local, name)):
            _remove_partials(os.path.join(local, name), recurse=True)
    for entry in os.scandir(local):  # groups a killed writer was building (never published)
        if entry.name.startswith(TMP_PREFIX) and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
    from .packs import clean_partial_packs

    clean_partial_packs(local)


def _remove_partials(directory: str, *, recurse: bool) -> None:
    for entry in os.scandir(directory):
        if entry.name.endswith(PARTIAL) and entry.is_file(follow_symlinks=False):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
        elif recurse and entry.is_dir(follow_symlinks=False):
            _remove_partials(entry.path, recurse=True)


@contextlib.contextmanager
def locked(dst):
    """Hold the write lock of a local destination (made if absent) while the body runs; a
    second process gets a clear error instead of writing the same output at once. The lock
    is a file in ``dst`` (``flock``, so it goes with the process: a killed job leaves nothing
    that blocks the next run), removed when the body ends. Callers decide what to do with
    ``dst`` before taking the lock (nothing is written into a destination that is refused),
    and again once they hold it. A thread that holds the lock already takes it again at once
    (a conversion into a ``.safetensors`` file holds its working group's lock while the
    conversion inside it claims the group). The lock file itself is never followed if it is a
    link."""
    local = local_path(dst)
    if local is None or os.name != "posix":
        yield
        return
    import fcntl

    held = (os.path.realpath(local), threading.get_ident())
    with _HELD_LOCK:
        nested = held in _HELD
        if nested:
            _HELD[held] += 1
    if nested:
        try:
            yield
        finally:
            with _HELD_LOCK:
                _HELD[held] -= 1
        return
    path = os.path.join(local, LOCK)
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        os.makedirs(local, exist_ok=True)
        while True:
            try:
                fd = os.open(path, flags, 0o644)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise StoreError(
                        f"{path} is a link; qstream's lock file never is: remove it"
                    ) from None
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise StoreError(
                    f"{dst} is being written by another qstream process; wait for it to finish,"
                    " then run again (the job resumes or reports it complete)"
                ) from None
            # the holder before us removes the file as it ends: a lock taken on a removed
            # file is no lock at all, so take the one at the path now
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
    except OSError as e:
        if isinstance(e, StoreError):
            raise
        raise StoreError(f"cannot write {dst}: {e.strerror or e}") from None
    with _HELD_LOCK:
        _HELD[held] = 1
    try:
        yield
    finally:
        with _HELD_LOCK:
            del _HELD[held]
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


_HELD: dict[tuple[str, int], int] = {}  # (destination, thread) -> depth of its lock
_HELD_LOCK = threading.Lock()


def check_writable(dst) -> None:
    """Refuse, before any work, a local destination that cannot be made: its nearest existing
    ancestor is a file, or a directory this process may not write."""
    local = local_path(dst)
    if local is None:
        return
    path = os.path.abspath(local)
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent
    if path != os.path.abspath(local) and not os.path.isdir(path):
        raise StoreError(f"cannot write {dst}: {path} is a file, not a directory")
    if os.path.isdir(path) and not os.access(path, os.W_OK | os.X_OK):
        raise StoreError(f"cannot write {dst}: permission denied on {path}")


def check_separate(src_location, dst, what: str = "destination") -> None:
    """Refuse a destination equal to, inside, or containing the source (a location, or the
    list of every location a source is read from)."""
    from .stores import inside, location

    dst_location = location(dst)
    sources = src_location if isinstance(src_location, list) else [src_location]
    for src in sources:
        if inside(dst_location, src) or inside(src, dst_location):
            raise StoreError(
                f"the {what} {dst} overlaps the source {src} (the same location, inside it,"
                " or containing it); write the output somewhere else"
            )


LEASE = float(os.environ.get("QSTREAM_LEASE", "30"))  # seconds (object stores)


def is_local_node(node) -> bool:
    """Whether the Zarr node ``node`` lives in a local store (or in memory: one process)."""
    import zarr

    store = node.store_path.store
    return isinstance(store, (zarr.storage.LocalStore, zarr.storage.MemoryStore))


class Lease:
    """A writer's hold on an output in an object store, where no lock can be taken.

    The output's metadata names its writer (``writer``: the job's token) and, renewed every
    ``LEASE / 3`` seconds while the job writes, when it was last active (``active``, seconds
    since the epoch). Another job replaces an unfinished output only once it has been idle
    for ``LEASE`` seconds (a killed writer's output waits that long), and a writer that finds
    another job named in the metadata stops without marking the output complete. A re-run of
    the same job resumes at once: it writes the same bytes. Local outputs are locked instead
    (:func:`locked`), and their lease is never renewed."""

    def __init__(self, node, token: str, dst, key: str = "qstream") -> None:
        self.node, self.token, self.dst, self.key = node, token, dst, key
        self.remote = not is_local_node(node)
        self._last = time.monotonic()

    @staticmethod
    def fields(dst, token: str) -> dict:
        """The writer's entries of a new output's metadata (object stores only: a local
        output is locked instead, and its metadata stays the same whatever the run)."""
        if local_path(dst) is not None:
            return {}
        return {"writer": token, "active": time.time()}

    def take(self) -> None:
        """Name this job the writer (a new output, or a resumed run of the same job)."""
        from .qarray import set_meta

        if not self.remote:
            return
        meta = dict(self.node.attrs[self.key])
        set_meta(self.node, {**meta, "writer": self.token, "active": time.time()}, self.key)
        self._last = time.monotonic()

    def renew(self, *, force: bool = False) -> None:
        """Check that the output is still this job's and record that it is active (at most
        every ``LEASE / 3`` seconds unless ``force``)."""
        if not self.remote or (not force and time.monotonic() - self._last < LEASE / 3):
            return
        from .qarray import check_writer

        check_writer(self.node, self.token, self.dst)
        self.take()

    @staticmethod
    def refuse_if_held(existing: Existing, dst) -> None:
        """Refuse to replace an unfinished output whose writer was active within ``LEASE``."""
        meta = existing.meta if isinstance(existing.meta, dict) else {}
        active = meta.get("active")
        if meta.get("complete") or not isinstance(active, (int, float)):
            return
        idle = time.time() - active
        if idle < LEASE:
            raise StoreError(
                f"{dst} is being written by another job (active {max(0.0, idle):.0f} s ago);"
                f" wait for it to finish, or if it died, run again after {LEASE - idle:.0f} s"
            )


def tensor_path(root, key: str):
    """Where the tensor stored under ``key`` (a checked key) lives in the output ``root``: a
    local path that resolves inside ``root``, or a URL below it."""
    local = local_path(root)
    if local is not None:
        return child(local, key, root)
    return f"{os.fspath(root).rstrip('/')}/{key}"


class Destination:
    """The output location of one job (``what``: the kind of output it writes, see
    :class:`Existing`) and its life (see the module docstring).

    ``fingerprint`` names the job; ``same_job(meta)``, when given, says instead whether an
    existing output's metadata is of this job (outputs whose identity is a set of fields)."""

    def __init__(
        self,
        target,
        what: str,
        fingerprint: str,
        *,
        storage_options: dict | None = None,
        same_job: Callable[[dict], bool] | None = None,
    ) -> None:
        self.target = target
        self.what = what
        self.fingerprint = fingerprint
        self.storage_options = storage_options
        self.same_job = same_job

    @property
    def local(self) -> str | None:
        """The local directory, or None (a URL, a zip file, a store object)."""
        return local_path(self.target)

    def look(self, *, overwrite: bool) -> tuple[Action, Existing]:
        """What is there now, and what this job does with it (read-only; a destination this
        job may not write is refused here)."""
        existing = inspect_destination(self.target, self.storage_options)
        if self.same_job is not None and existing.kind == self.what:
            same = self.same_job(existing.meta)
            meta = {**existing.meta, "fingerprint": self.fingerprint if same else None}
            existing = replace(existing, meta=meta)
        action = decide(
            existing, self.fingerprint, overwrite=overwrite, what=self.what, dst=self.target
        )
        if action is Action.REPLACE and self.local is None:
            Lease.refuse_if_held(existing, self.target)
        return action, existing

    @contextlib.contextmanager
    def claim(self, *, overwrite: bool, repair: bool = False) -> Iterator[tuple[Action, Existing]]:
        """Decide (refusing before anything is written), lock, decide again under the lock
        and remove what is replaced; the body then writes the output. A finished run of this
        job is yielded (COMPLETE) without the lock, unless ``repair``: then, if it is still
        this job's finished output once locked, it is replaced (made again)."""
        action, existing = self.look(overwrite=overwrite)
        if action is Action.COMPLETE and not repair:
            yield action, existing
            return
        with locked(self.target):
            action, existing = self.look(overwrite=overwrite)
            if action is Action.COMPLETE and repair:
                action = Action.REPLACE
            if action is Action.REPLACE:
                remove_output(self.target, existing, self.storage_options)
            yield action, existing

    def child(self, key: str):
        """Where the tensor stored under ``key`` lives in this destination (see
        :func:`tensor_path`)."""
        return tensor_path(self.target, key)

    def __repr__(self) -> str:
        return f"Destination({self.target!r}, {self.what!r})"
