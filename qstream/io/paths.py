"""Local paths qstream reads, writes and deletes, checked where they are formed.

Every path below a destination is formed by :func:`child` (a key of
:mod:`qstream.io.names` joined to the destination, then resolved: no link inside the
destination may lead out of it), and every deletion goes through :func:`remove_child`, which
removes only a direct child of a directory, never follows a link, and refuses anything whose
resolved path is not inside that directory. Files qstream reads are opened by
:func:`open_regular`, which refuses FIFOs, devices and sockets without blocking on them.
Whether a destination is a local directory at all (not a URL, a zip file or a store object)
is :func:`local_path`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from typing import IO

from ..errors import StoreError


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


def child(root: str, key: str, where: object = None) -> str:
    """The path of ``key`` (a checked key, possibly ``/``-separated for outputs of earlier
    versions) below the local directory ``root``, refused if it resolves outside ``root``."""
    parts = key.split("/")
    path = os.path.join(root, *parts)
    if len(parts) == 1 and key not in ("", ".", ".."):
        # one plain name: it resolves below ``root`` unless it is a link. One lookup, not a
        # walk of every component: while the workers make entries in ``root``, each lookup
        # of a name there waits for the directory (2000 kept tensors: ~0.5 ms a walk)
        try:
            linked = stat.S_ISLNK(os.lstat(path).st_mode)
        except FileNotFoundError:
            linked = False
        except OSError:
            linked = True  # (checked the slow way below, which raises what it meets)
        if not linked:
            return path
    real, top = os.path.realpath(path), os.path.realpath(root)
    if real == top or not real.startswith(top.rstrip(os.sep) + os.sep):
        raise StoreError(
            f"{where or root}: {key!r} leads outside it (through a link); qstream will not read"
            " or write there"
        )
    return path


def remove_child(root: str, name: str) -> None:
    """Delete ``root/name`` (a file, a link, or a directory tree whose links are removed, not
    followed) if it exists; refused unless ``name`` is one plain component and the entry lies
    inside ``root``."""
    if not name or name in (".", "..") or "/" in name or os.sep in name or "\x00" in name:
        raise StoreError(f"{root}: refusing to delete {name!r}: not an entry of this directory")
    full = os.path.join(root, name)
    if not os.path.lexists(full):
        return
    # the entry itself is not followed: a link is unlinked, whatever it points to
    parent = os.path.realpath(os.path.dirname(full))
    if parent != os.path.realpath(root):
        raise StoreError(f"{root}: refusing to delete {name!r}: it lies outside this directory")
    if os.path.isdir(full) and not os.path.islink(full):
        shutil.rmtree(full)  # (rmtree never follows links inside the tree)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(full)


def check_tree(root: str, what: str, *, links: str = "refuse") -> None:
    """Refuse a local tree that holds a FIFO, device or socket (reading one could block
    forever), or a link: any link (``links="refuse"``: qstream never writes one into an
    output), or one that resolves outside ``root`` (``"inside"``: a source's own links stay
    in it). Walked without following links, the entries' kinds from the listing."""
    stack = [root]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.is_symlink():
                if links == "refuse" or not is_inside(entry.path, root):
                    where = "a link" if links == "refuse" else "a link to a place outside it"
                    raise StoreError(
                        f"{what} {root} holds {where} ({os.path.relpath(entry.path, root)});"
                        " qstream will not read or write through it"
                    )
                if kind_of(entry.path) == "special":
                    raise StoreError(
                        f"{what} {root}: {os.path.relpath(entry.path, root)} is not a regular"
                        " file (a FIFO, device or socket)"
                    )
            elif entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            elif not entry.is_file(follow_symlinks=False):
                raise StoreError(
                    f"{what} {root}: {os.path.relpath(entry.path, root)} is not a regular file"
                    " (a FIFO, device or socket)"
                )


def kind_of(path: str) -> str | None:
    """``file``, ``dir``, ``special`` (FIFO, device, socket) or None (absent), links
    followed, without opening the path."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise StoreError(f"cannot read {path}: {e.strerror or e}") from None
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "special"


def refuse_special(path: str, what: str = "input") -> None:
    """Refuse ``path`` if it is a FIFO, a device or a socket (reading one could block
    forever or never end)."""
    if kind_of(path) == "special":
        raise StoreError(
            f"{what} {path} is not a regular file (a FIFO, device or socket); qstream reads"
            " only files and directories"
        )


def open_regular(path: str, what: str = "file") -> IO[bytes]:
    """``open(path, "rb", buffering=0)``, refused (without blocking) unless ``path`` is a
    regular file: the open does not wait for a FIFO's writer, and the opened file is checked,
    so a file swapped for a FIFO between a check and the open is refused too."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StoreError(
                f"{what} {path} is not a regular file (a FIFO, device, socket or directory);"
                " qstream reads only files"
            )
        if hasattr(os, "O_NONBLOCK"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise
