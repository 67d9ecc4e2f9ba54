"""Local paths qstream reads, writes and deletes, checked where they are formed and where
they are used.

Nothing inside an output is followed through a link, whoever made it (an output copied or
downloaded from elsewhere, or a shared folder, can carry links): every path below an output's
root is walked from the root, component by component, without following links
(:func:`walk_below`), and a link or a special file met on the way is refused with a
:class:`~qstream.errors.StoreError` naming it. Paths are walked where they are formed (a
tensor's key joined to its root by :func:`child`), and at the lowest layer, where files are
written, read and removed (:func:`confined`: the metadata documents of
:mod:`qstream.io.storage.localmeta`, the nodes published by :mod:`qstream.io.outputs.publish`,
every removal of
:mod:`qstream.io.storage.removal`), below every root this process holds (:func:`held`, taken with a
destination's lock). A walk costs one ``lstat`` per component not walked before: the folders
of a held root found plain are remembered while it is held, and only qstream, which never
makes a link, writes there meanwhile (another writer is kept out by the lock).

The lowest layer is race-free where it writes (chunk files, metadata documents, published
nodes, removals): a path below a held root is opened from the root's descriptor, one component
at a time with ``O_NOFOLLOW`` relative to the one before (:func:`opened_dir`,
:func:`open_below`, :func:`opened`), and the file is made, renamed, linked or unlinked relative
to its folder's descriptor, so a folder swapped for a link between a check and a use is refused
too, never followed. Nothing is kept across calls: a few more system calls a file (measured
with ``strace -c``: ~4 more a chunk file or document written, openat and close of each
component, than the ``lstat`` walk), except by a node being built in a folder no reader sees
yet, which holds that folder's descriptor (:func:`made_folder`) and makes what it holds
relative to it.

Every deletion goes through :func:`remove_child`, which removes only a direct child of a
directory, never follows a link (a link is unlinked, never its target). Files qstream reads
are opened by :func:`~qstream.input_files.open_regular`, which refuses FIFOs, devices and
sockets without blocking on them (and, with ``follow=False``, links). Whether a destination
is a local directory at all (not a URL, a zip file or a store object) is :func:`local_path`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import threading
from collections.abc import Iterator

from .errors import StoreError


def _is_url(dst: object) -> bool:
    return isinstance(dst, str) and "://" in dst and not dst.startswith("file://")


def local_path(dst: object) -> str | None:
    """The local directory of ``dst``, or None (a URL, a zip file, a store object)."""
    if not isinstance(dst, str | os.PathLike) or _is_url(dst):
        return None
    p = os.fspath(dst).removeprefix("file://")
    return None if p.endswith(".zip") else p


def local_zip(dst: object) -> str | None:
    """The local ``.zip`` file of ``dst``, or None (a directory, a URL, a store object)."""
    if not isinstance(dst, str | os.PathLike) or _is_url(dst):
        return None
    p = os.fspath(dst)
    return p.removeprefix("file://") if p.endswith(".zip") else None


def is_inside(path: str, root: str) -> bool:
    """Whether ``path`` resolves (links followed) to ``root`` or a place inside it."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


# ---------------------------------------------------------------- no link inside an output


class _Held:
    """A root this process holds (:func:`held`): how many times, and the folders below it
    found plain (not links) while it is held."""

    __slots__ = ("depth", "plain", "top")

    def __init__(self, top: str) -> None:
        self.top = top
        self.depth = 0
        self.plain: set[str] = set()


_HELD: dict[str, _Held] = {}  # a held root, as given and as an absolute path -> its state
_ROOTS: tuple[tuple[str, _Held], ...] = ()  # the same, shortest first (read without a lock)
_HELD_LOCK = threading.Lock()


@contextlib.contextmanager
def held(root: str) -> Iterator[None]:
    """While the body runs, every path below the local directory ``root`` that qstream's
    lowest layer writes, reads or removes (:func:`confined`) is walked from ``root`` first:
    no link inside it is followed. Taken by a destination's lock
    (:func:`qstream.io.outputs.destination.locked`); nested and concurrent holds of a root
    share it."""
    global _ROOTS
    given = os.fspath(root).rstrip(os.sep) or os.sep
    absolute = os.path.abspath(given)
    with _HELD_LOCK:
        state = _HELD.get(absolute) or _Held(absolute)
        state.depth += 1
        _HELD[given] = _HELD[absolute] = state
        _ROOTS = tuple(sorted(_HELD.items(), key=lambda kv: len(kv[0])))
    try:
        yield
    finally:
        with _HELD_LOCK:
            state.depth -= 1
            if not state.depth:
                for name in [n for n, s in _HELD.items() if s is state]:
                    del _HELD[name]
            _ROOTS = tuple(sorted(_HELD.items(), key=lambda kv: len(kv[0])))


def _link_error(path: str, root: str, what: str) -> StoreError:
    return StoreError(
        f"{path} is a link inside {what} {root}; qstream never reads, writes or deletes"
        " through a link in its outputs: remove the link, or choose another destination"
    )


def walk_below(root: str, parts: list[str], what: str = "the output") -> str:
    """``root`` joined with ``parts`` (components below it), each component that exists
    checked without following links: a link, or a FIFO, device or socket, is refused (a
    :class:`~qstream.errors.StoreError` naming it), as is a file where a folder must be, or a
    component that leaves ``root`` (``..``). The walk stops at the first absent component.
    Folders already found plain below a held root are not looked at again."""
    state = _HELD.get(root)
    plain = state.plain if state is not None else None
    here = root.rstrip(os.sep) or os.sep
    last = len(parts) - 1
    walking = True
    for i, part in enumerate(parts):
        if part in ("", "."):
            continue
        if part == ".." or os.sep in part or "\x00" in part:
            raise StoreError(
                f"{root}: {os.sep.join(parts)!r} leads outside it; qstream will not read or"
                " write there"
            )
        here = os.path.join(here, part)
        if not walking or (plain is not None and here in plain):
            continue
        try:
            mode = os.lstat(here).st_mode
        except (FileNotFoundError, NotADirectoryError):
            walking = False  # (nothing below an absent component exists)
            continue
        except OSError as e:
            raise StoreError(f"cannot read {here}: {e.strerror or e}") from None
        if stat.S_ISDIR(mode):
            if plain is not None:
                plain.add(here)
        elif stat.S_ISLNK(mode):
            raise _link_error(here, root, what)
        elif not stat.S_ISREG(mode):
            raise StoreError(
                f"{here} in {what} {root} is not a regular file or folder (a FIFO, device or"
                " socket); qstream will not read or write it"
            )
        elif i != last:
            raise StoreError(
                f"{here} in {what} {root} is a file where qstream keeps a folder; remove it,"
                " or choose another destination"
            )
    return here


def confined(path: str, what: str = "the output") -> str:
    """``path``, once walked from the outermost root this process holds that it lies below
    (:func:`walk_below`; anything else is not looked at): qstream's lowest layer calls it for
    every path of an output it writes, reads or removes."""
    roots = _ROOTS
    if not roots:
        return path
    for name, _state in roots:
        if path.startswith(name) and path[len(name) : len(name) + 1] == os.sep:
            walk_below(name, path[len(name) + 1 :].split(os.sep), what)
            return path
    if not os.path.isabs(path) or os.path.normpath(path) != path:
        absolute = os.path.abspath(path)
        for name, state in roots:
            if name == state.top and absolute.startswith(name + os.sep):
                walk_below(name, absolute[len(name) + 1 :].split(os.sep), what)
                return path
    return path


# ------------------------------------------------ race-free: opened from the root's descriptor

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC
# descriptors relative to a folder's (openat, mkdirat, renameat, ...): POSIX
AT_SUPPORTED = os.open in os.supports_dir_fd and os.rename in os.supports_dir_fd


def _parts_of(root: str, parts: list[str]) -> list[str]:
    out = [p for p in parts if p not in ("", ".")]
    for part in out:
        if part == ".." or os.sep in part or "/" in part or "\x00" in part:
            raise StoreError(
                f"{root}: {'/'.join(parts)!r} leads outside it; qstream will not read or"
                " write there"
            )
    return out


def _not_a_folder(parent: int, name: str, here: str, root: str, what: str) -> StoreError:
    """The error for ``name`` of the folder ``parent`` (``here``), which is not a folder."""
    try:
        mode = os.lstat(name, dir_fd=parent).st_mode
    except OSError:
        mode = stat.S_IFLNK  # (gone again: it was swapped meanwhile)
    # (a folder now, though opening it as one without following links failed: a link was
    # swapped in and out meanwhile)
    if stat.S_ISLNK(mode) or stat.S_ISDIR(mode):
        return _link_error(here, root, what)
    if stat.S_ISREG(mode):
        return StoreError(
            f"{here} in {what} {root} is a file where qstream keeps a folder; remove it,"
            " or choose another destination"
        )
    return StoreError(
        f"{here} in {what} {root} is not a regular file or folder (a FIFO, device or"
        " socket); qstream will not read or write it"
    )


@contextlib.contextmanager
def opened_dir(
    root: str, parts: list[str], *, create: bool = False, what: str = "the output"
) -> Iterator[int]:
    """A descriptor of the folder ``root/parts...``: ``root`` opened as given, then each
    component opened relative to the one before with ``O_NOFOLLOW`` (made first if absent
    and ``create``), so no link inside ``root`` is followed, even one swapped in while the
    walk runs: a link, a file or a special file on the way is refused, naming it. Closed
    when the body ends; nothing is kept across calls. Absent components raise
    :class:`FileNotFoundError` unless ``create``."""
    names = _parts_of(root, parts)
    if create and not names:
        os.makedirs(root, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
    fd = _walk(fd, root, names, create, what)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def opened_in(
    dfd: int, folder: str, parts: list[str], *, create: bool = False, what: str = "the output"
) -> Iterator[int]:
    """:func:`opened_dir` from ``dfd``, a descriptor the caller holds of the folder ``folder``
    (named in errors), instead of from a path: its descriptor is not closed."""
    fd = _walk(os.dup(dfd), folder, _parts_of(folder, parts), create, what)
    try:
        yield fd
    finally:
        os.close(fd)


def _walk(
    fd: int, root: str, names: list[str], create: bool = False, what: str = "the output"
) -> int:
    """The descriptor of ``root/names...`` walked from ``fd`` (of ``root``, taken over: closed
    here) as :func:`opened_dir` walks."""
    try:
        here = root.rstrip(os.sep) or os.sep
        for name in names:
            here = os.path.join(here, name)
            try:
                nfd = os.open(name, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=fd)
                try:  # (a link swapped in since the mkdir is refused as any other)
                    nfd = os.open(name, _DIR, dir_fd=fd)
                except NotADirectoryError:
                    raise _not_a_folder(fd, name, here, root, what) from None
            except OSError as e:
                if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                raise _not_a_folder(fd, name, here, root, what) from None
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def made_folder(dfd: int, name: str, path: str) -> Iterator[int]:
    """Make the new folder ``name`` in the folder ``dfd`` (``path``: its path, named in errors)
    and hold its descriptor while the body runs: what is made in it is made relative to that
    descriptor, with no path walked again (a node built in a folder no reader sees yet,
    :mod:`qstream.io.outputs.publish`)."""
    os.mkdir(name, 0o777, dir_fd=dfd)
    try:
        fd = os.open(name, _DIR, dir_fd=dfd)
    except OSError as e:  # (a link swapped in since the mkdir)
        if e.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        raise _replaced(path) from None
    try:
        yield fd
        # still the folder held (not moved away and a link or another folder put in its
        # place while the body wrote into the one held): else what is published is not it
        held = os.fstat(fd)
        try:
            now = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            raise _replaced(path) from None
        if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            raise _replaced(path)
    finally:
        os.close(fd)


def _replaced(path: str) -> StoreError:
    return StoreError(
        f"{path} was replaced while qstream wrote it (a link or a folder put in its place);"
        " qstream never writes through a link in an output: remove it"
    )


def write_new_in(dfd: int, name: str, data: bytes | memoryview, path: str) -> None:
    """Write ``data`` to the new file ``name`` of the folder ``dfd`` (refused if anything is
    there, a link included; ``path``: its path, named in errors)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    try:
        fd = os.open(name, flags, 0o666, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StoreError(f"{path} is a link; qstream never writes through a link") from None
        raise
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of ``data`` to the open file ``fd``."""
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]


def open_below(
    root: str, parts: list[str], flags: int, mode: int = 0o666, *, what: str = "the output"
) -> int:
    """A descriptor of the file ``root/parts...`` opened with ``flags`` (plus ``O_NOFOLLOW``)
    relative to its folder's descriptor (:func:`opened_dir`; folders made if ``flags`` hold
    ``O_CREAT``): a link at the file or on its way is refused, naming it."""
    names = _parts_of(root, parts)
    with opened_dir(root, names[:-1], create=bool(flags & os.O_CREAT), what=what) as dfd:
        return _open_at(dfd, names[-1], flags, mode, os.path.join(root, *names), root, what)


def _open_at(dfd: int, name: str, flags: int, mode: int, path: str, root: str, what: str) -> int:
    try:
        return os.open(name, flags | _NOFOLLOW | _CLOEXEC, mode, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _link_error(path, root, what) from None
        raise


def below_held(path: str) -> tuple[str, list[str]] | None:
    """``(root, parts)``: the outermost root this process holds that ``path`` lies below, and
    the components of ``path`` below it; None when it lies below none."""
    roots = _ROOTS
    if not roots:
        return None
    for name, _state in roots:
        if path.startswith(name) and path[len(name) : len(name) + 1] == os.sep:
            return name, path[len(name) + 1 :].split(os.sep)
    if not os.path.isabs(path) or os.path.normpath(path) != path:
        absolute = os.path.abspath(path)
        for name, state in roots:
            if name == state.top and absolute.startswith(name + os.sep):
                return name, absolute[len(name) + 1 :].split(os.sep)
    return None


@contextlib.contextmanager
def opened(directory: str, *, create: bool = False, what: str = "the output") -> Iterator[int]:
    """A descriptor of the local folder ``directory`` (made if absent and ``create``): walked
    from the root this process holds that it lies below without following a link
    (:func:`opened_dir`), else opened as given (a folder outside every held root)."""
    split = below_held(directory) if AT_SUPPORTED else None
    if split is None:
        if create:
            os.makedirs(directory, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
        try:
            yield fd
        finally:
            os.close(fd)
        return
    with opened_dir(*split, create=create, what=what) as fd:
        yield fd


def open_file(path: str, flags: int, mode: int = 0o666, *, what: str = "the output") -> int:
    """A descriptor of the local file ``path`` opened with ``flags`` plus ``O_NOFOLLOW``:
    relative to its folder's descriptor walked from the held root it lies below
    (:func:`open_below`; folders made if ``flags`` hold ``O_CREAT``), else as given."""
    split = below_held(path) if AT_SUPPORTED else None
    if split is None:
        if flags & os.O_CREAT:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return os.open(path, flags | _NOFOLLOW | _CLOEXEC, mode)
    return open_below(*split, flags, mode, what=what)


def write_new(path: str, data: bytes | memoryview) -> None:
    """Write ``data`` to the new local file ``path`` (refused if anything is there, a link
    included), without following a link on its way (:func:`open_file`)."""
    fd = open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def rename_in(folder: str, src: str, dst: str) -> None:
    """``os.replace`` the entry ``src`` of the local ``folder`` by ``dst`` (both names in
    it), relative to the folder's descriptor (:func:`opened`)."""
    with opened(folder) as dfd:
        os.replace(src, dst, src_dir_fd=dfd, dst_dir_fd=dfd)


def child(root: str, key: str, where: object = None) -> str:
    """The path of ``key`` (a checked key, possibly ``/``-separated for outputs of earlier
    versions) below the local directory ``root``, refused if a component is empty, ``.`` or
    ``..``, or exists as a link (wherever it leads: qstream never writes one into an output)
    or a special file. One ``lstat`` a component (``realpath`` of a name in a folder the
    workers are filling waits for it: 2000 kept tensors, ~0.5 ms a walk)."""
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise StoreError(
            f"{where or root}: {key!r} leads outside it; qstream will not read or write there"
        )
    return walk_below(root, parts)


def remove_child(root: str, name: str) -> None:
    """Delete ``root/name`` (a file, a link, or a directory tree whose links are removed, not
    followed) if it exists; refused unless ``name`` is one plain component, and unless
    ``root`` is walked below a held root without meeting a link. The entry is removed
    relative to ``root``'s descriptor (:func:`opened`), so a folder on the way swapped for a
    link meanwhile is refused, never followed."""
    if not name or name in (".", "..") or "/" in name or os.sep in name or "\x00" in name:
        raise StoreError(f"{root}: refusing to delete {name!r}: not an entry of this directory")
    try:
        with opened(root) as dfd:
            try:  # (the entry itself is not followed: a link is unlinked)
                mode = os.lstat(name, dir_fd=dfd).st_mode
            except (FileNotFoundError, NotADirectoryError):
                return
            if stat.S_ISDIR(mode):
                shutil.rmtree(name, dir_fd=dfd)  # (never follows links inside the tree)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=dfd)
    except (FileNotFoundError, NotADirectoryError):
        return  # (no such folder: nothing to delete)
