"""Destinations: what a job may write over, and the life of an output location.

Rules: a destination is qstream's only if qstream's own metadata says so (a ``zarr.json``
whose attributes carry a qstream output of a known kind, :mod:`qstream.io.outputs.existing`);
qstream
replaces only such an output, only with ``overwrite`` (or when it is an unfinished run of the
same job), and only the files it writes, node by node
(:func:`~qstream.io.outputs.cleanup.remove_output`). Anything else, whether a file, a folder of the
user's, or a Zarr array or group qstream did not write, is refused whatever ``overwrite``
says, and nothing is written into it. Local destinations are locked (``flock``) while a job
writes them, so two processes never write one output at once; outputs in object stores are
held by a :class:`Lease`.

:class:`Destination` is that life in one object: a read-only look and a decision (refusals
happen before anything is written), then the lock, the decision again under it (another
process may have written meanwhile), and the removal of what is replaced; callers then create
or resume their output, and write ``complete`` last.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from ... import paths
from ...errors import DestinationBusyError, StoreError
from ...input_files import check_tree
from ...paths import child, local_path
from ..storage import inside, location
from .cleanup import clean_partials, remove_output
from .existing import Existing, inspect_destination
from .ondisk import LOCK, check_writer, set_meta

# with the names callers take from here: LOCK (io.ondisk), Existing and inspect_destination
# (io.existing), clean_partials and remove_output (io.cleanup), local_path (io.paths)
__all__ = [
    "LEASE",
    "LOCK",
    "Action",
    "Destination",
    "Existing",
    "Lease",
    "check_separate",
    "check_writable",
    "clean_partials",
    "decide",
    "inspect_destination",
    "is_local_node",
    "local_path",
    "locked",
    "remove_output",
    "tensor_path",
]


class Action(enum.Enum):
    """What a job does with its destination (see :func:`decide`)."""

    CREATE = "create"  # absent or empty: a new output
    RESUME = "resume"  # an unfinished run of this job
    COMPLETE = "complete"  # this job, finished: nothing to do
    REPLACE = "replace"  # qstream's own output (another job, or ``overwrite``): removed first


def decide(
    existing: Existing, fingerprint: str, *, overwrite: bool, what: str, dst: object
) -> Action:
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
        if kind == "foreign":
            thing += _first_entry(dst)
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


def _first_entry(dst: object) -> str:
    """`` (it holds X)``: what a local folder that is not qstream's holds, a link first (a
    link qstream's removal left in a member's place), else its first entry; "" elsewhere."""
    local = local_path(dst)
    if local is None or not os.path.isdir(local):
        return ""
    first = None
    for here, dirs, files in os.walk(local):  # (links are listed, never followed)
        for name in sorted(dirs + files):
            entry = os.path.join(here, name)
            if os.path.islink(entry):
                return f" (it holds {os.path.relpath(entry, local)}, a link)"
            if first is None and name != LOCK:
                first = os.path.relpath(entry, local)
    return f" (it holds {first})" if first else ""


@contextlib.contextmanager
def locked(dst: object) -> Iterator[None]:
    """Hold the write lock of a local destination (made if absent) while the body runs; a
    second process gets a clear error instead of writing the same output at once. The lock
    is a file in ``dst`` (``flock``, so it goes with the process: a killed job leaves nothing
    that blocks the next run), removed when the body ends. Callers decide what to do with
    ``dst`` before taking the lock (nothing is written into a destination that is refused),
    and again once they hold it. A thread that holds the lock already takes it again at once
    (a conversion into a ``.safetensors`` file holds its working group's lock while the
    conversion inside it claims the group). The lock file itself is never followed if it is a
    link; while the lock is held, no path below ``dst`` that qstream writes, reads or removes
    is followed through a link (:func:`qstream.paths.held`)."""
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
                raise DestinationBusyError(
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
        with paths.held(local):  # (no link inside it is followed while the lock is held)
            yield
    finally:
        with _HELD_LOCK:
            del _HELD[held]
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


_HELD: dict[tuple[str, int], int] = {}  # (destination, thread) -> depth of its lock
_HELD_LOCK = threading.Lock()


def check_writable(dst: object) -> None:
    """Refuse, before any work, a local destination that cannot be made: its nearest existing
    ancestor is a file, a directory this process may not write, or a directory of a kernel's
    file system where no files are made (``/proc``, ``/sys``: :data:`NO_FILES`)."""
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
    real = _nearest_existing(os.path.realpath(local))  # (links and ".." resolved as the OS does)
    kind = file_system(real)
    if kind in NO_FILES:
        raise StoreError(
            f"cannot write {dst}: {real} is on the kernel's {kind} file system, where no"
            " files can be made; write the output somewhere else"
        )


#: the kernel's file systems where a program makes no files or folders of its own (a
#: folder made in a cgroup or configfs file system is a new kernel object)
NO_FILES = frozenset(
    {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "securityfs", "debugfs", "tracefs",
     "pstore", "bpf", "fusectl", "efivarfs", "binfmt_misc", "mqueue", "configfs",
     "selinuxfs", "nsfs", "hugetlbfs"}
)  # fmt: skip


def _nearest_existing(path: str) -> str:
    """``path`` or its nearest ancestor that exists."""
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def file_system(path: str) -> str | None:
    """The type of the file system that holds the existing ``path``, from Linux's mount
    table: the mount of its device (a mount hidden under a later one no longer holds it),
    else the mount with the longest mount point above it; None where the table cannot be
    read."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            lines = f.read().splitlines()
        st = os.stat(path)
    except OSError:
        return None
    device = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}".encode()
    where = os.path.realpath(path)
    best, by_point, by_device = "", None, None
    for line in lines:
        fields, _, rest = line.partition(b" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest:
            continue
        kind = os.fsdecode(rest.split()[0])
        if parts[2] == device:
            by_device = kind
        # (mount points are escaped octal in the table, bytes as the file system has them)
        point = os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), parts[4]))
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):  # (a later mount over the same point wins)
            best, by_point = point, kind
    return by_device or by_point


def check_separate(
    src_location: str | list[str] | None, dst: object, what: str = "destination"
) -> None:
    """Refuse a destination equal to, inside, or containing the source (a location, or the
    list of every location a source is read from)."""
    dst_location = location(dst)
    sources = src_location if isinstance(src_location, list) else [src_location]
    for src in sources:
        if inside(dst_location, src) or inside(src, dst_location):
            raise StoreError(
                f"the {what} {dst} overlaps the source {src} (the same location, inside it,"
                " or containing it); write the output somewhere else"
            )


LEASE = float(os.environ.get("QSTREAM_LEASE", "30"))  # seconds (object stores)


def is_local_node(node: Any) -> bool:
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

    def __init__(self, node: Any, token: str, dst: object, key: str = "qstream") -> None:
        self.node, self.token, self.dst, self.key = node, token, dst, key
        self.remote = not is_local_node(node)
        self._last = time.monotonic()

    @staticmethod
    def fields(dst: object, token: str) -> dict[str, Any]:
        """The writer's entries of a new output's metadata (object stores only: a local
        output is locked instead, and its metadata stays the same whatever the run)."""
        if local_path(dst) is not None:
            return {}
        return {"writer": token, "active": time.time()}

    def take(self) -> None:
        """Name this job the writer (a new output, or a resumed run of the same job)."""
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
        check_writer(self.node, self.token, self.dst)
        self.take()

    @staticmethod
    def refuse_if_held(existing: Existing, dst: object) -> None:
        """Refuse to replace an unfinished output whose writer was active within ``LEASE``."""
        meta = existing.meta if isinstance(existing.meta, dict) else {}
        active = meta.get("active")
        if meta.get("complete") or not isinstance(active, (int, float)):
            return
        idle = time.time() - active
        if idle < LEASE:
            raise DestinationBusyError(
                f"{dst} is being written by another job (active {max(0.0, idle):.0f} s ago);"
                f" wait for it to finish, or if it died, run again after {LEASE - idle:.0f} s"
            )


def tensor_path(root: str | os.PathLike[str], key: str) -> str:
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
        target: Any,
        what: str,
        fingerprint: str,
        *,
        storage_options: dict[str, Any] | None = None,
        same_job: Callable[[dict[str, Any]], bool] | None = None,
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
        judged = existing
        if self.same_job is not None and existing.kind == self.what:
            # (decided as if it carried this job's fingerprint when it is this job; the
            # metadata handed on stays as found: a resumed root is rewritten from it)
            meta = existing.meta or {}  # (always a dict: the kind comes from it)
            same = self.same_job(meta)
            judged = replace(
                existing, meta={**meta, "fingerprint": self.fingerprint if same else None}
            )
        action = decide(
            judged, self.fingerprint, overwrite=overwrite, what=self.what, dst=self.target
        )
        if action is Action.REPLACE and self.local is None:
            Lease.refuse_if_held(existing, self.target)
        if action is Action.COMPLETE and self.local is not None:
            # a finished output holding a link (made by someone else) anywhere is refused,
            # naming it, not reported finished: its whole tree, listed without following
            # links (the cost: see input_files.check_tree)
            check_tree(self.local, "the finished output")
        return action, existing

    @contextlib.contextmanager
    def claim(self, *, overwrite: bool, repair: bool = False) -> Iterator[tuple[Action, Existing]]:
        """Decide (refusing before anything is written), lock, decide again under the lock
        and remove what is replaced; the body then writes the output. A finished run of this
        job is yielded (COMPLETE) without the lock, unless ``repair``: then, if it is still
        this job's finished output once locked, it is replaced (made again)."""
        action, existing = self.look(overwrite=overwrite)
        if action is Action.COMPLETE and not repair:
            self.clear_stale_lock()
            yield action, existing
            return
        with locked(self.target):
            action, existing = self.look(overwrite=overwrite)
            if action is Action.COMPLETE and repair:
                action = Action.REPLACE
            if action is Action.REPLACE:
                remove_output(self.target, existing, self.storage_options)
            yield action, existing

    def clear_stale_lock(self) -> None:
        """Called where a job finds its output finished: a lock file left by a run killed
        after ``complete`` was written (the file goes with the lock's release, which never
        came) is taken and let go, which removes it, and a quantized output's ``_progress``
        left the same way is dropped, so the output's files are an uninterrupted run's. A run
        holding the lock now keeps it."""
        local = self.local
        if local is None:
            return
        if os.path.lexists(os.path.join(local, LOCK)):
            with contextlib.suppress(DestinationBusyError), locked(self.target):
                pass
        if self.what == "quantized":  # its resume snapshot, if a kill came before its removal
            from .scientific import drop_progress

            drop_progress(local, None)

    def child(self, key: str) -> str:
        """Where the tensor stored under ``key`` lives in this destination (see
        :func:`tensor_path`)."""
        return tensor_path(self.target, key)

    def __repr__(self) -> str:
        return f"Destination({self.target!r}, {self.what!r})"
