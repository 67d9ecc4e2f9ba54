"""How a block's work opens what it reads and writes, once per process.

A work object carries references, not open things: :class:`SourceRef` names the source (a path
or URL with its storage options, or an in-process object), :class:`DestRef` the destination
group. Opening one caches the handle per process under the run's token
(:func:`worker_cached`), so every block of a run on a worker shares it; :func:`forget` drops
a run's handles when it ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...io.storage import ArrayWriter, Source

_OPEN: dict[tuple[str, ...], Any] = {}
_OPEN_LOCK = threading.RLock()  # handles open others (a writer its array)


def worker_cached(key: tuple[str, ...], make: Callable[[], Any]) -> Any:
    """``make()`` once per process and key (stores, arrays, chunk files); keys start with the
    run's token, so no run ever sees another run's handles."""
    with _OPEN_LOCK:
        if key not in _OPEN:
            _OPEN[key] = make()
        return _OPEN[key]


def forget(token: str) -> None:
    """Drop the cached handles of one run (when it ends)."""
    with _OPEN_LOCK:
        for key in [k for k in _OPEN if k[0] == token]:
            del _OPEN[key]


@dataclass(frozen=True, eq=False)
class SourceRef:
    """How a worker opens the source: a path or URL any process can open (with ``tensor``:
    the tensor of that checkpoint), or (``obj``) an in-process object (a NumPy array, a
    ``zarr.Array``, a checkpoint tensor), which cannot be sent to another process."""

    token: str  # the run's
    url: str | None
    storage_options: dict | None = None
    obj: Any = field(default=None, repr=False)
    tensor: str | None = None
    # how a process opens the checkpoint of ``tensor`` (a ``CheckpointSource``; None: ``url``)
    opener: Any = None

    @property
    def key(self) -> tuple[str, ...]:
        """The cache key of the run's source (a run reads one source)."""
        return (self.token, "source")

    def open(self) -> Source:
        """The source, opened once per process."""
        from ...io.storage import open_source

        if self.tensor is not None:
            return worker_cached(self.key, lambda: open_source(self._checkpoint()[self.tensor]))
        if self.url is None:
            return worker_cached(self.key, lambda: open_source(self.obj))
        return worker_cached(
            self.key, lambda: open_source(self.url, storage_options=self.storage_options)
        )

    def _checkpoint(self) -> Any:
        from ...io.checkpoints import open_checkpoint

        if self.opener is not None:
            return worker_cached((self.token, "checkpoint"), self.opener.open)
        url = self.url
        assert url is not None  # (a checkpoint's tensor is named with its checkpoint's URL)
        return worker_cached((self.token, "checkpoint"), lambda: open_checkpoint(url))

    def register(self, source: Source) -> None:
        """Use the already open ``source`` in this process."""
        worker_cached(self.key, lambda: source)

    def __getstate__(self) -> dict[str, Any]:
        if self.url is None:
            raise TypeError(
                "an in-memory source (NumPy array, in-process Zarr array or checkpoint tensor)"
                " cannot be sent to another process; store it where workers can read it"
            )
        return {**self.__dict__, "obj": None}


def _returning(value: Any) -> Callable[[], Any]:
    """A ``make`` for :func:`worker_cached` that gives the already open ``value``."""
    return lambda: value


@dataclass(frozen=True, eq=False)
class DestRef:
    """How a worker opens the arrays of the destination group."""

    token: str  # the run's
    url: str
    storage_options: dict | None = None

    def writer(self, name: str) -> ArrayWriter:
        """The writer of the member array ``name``, opened once per process."""
        from ...io.storage import ArrayWriter

        return worker_cached((self.token, "writer", name), lambda: ArrayWriter(self.array(name)))

    def register(self, group: Any, arrays: dict[str, Any] | None = None) -> None:
        """Use the already open destination ``group`` (and its open member ``arrays``) in
        this process."""
        worker_cached((self.token, "group"), lambda: group)
        for name, arr in (arrays or {}).items():
            worker_cached((self.token, "array", name), _returning(arr))

    def check(self, node: Any = None) -> None:
        """On an object store, refuse to write once another job has taken the output over
        (its metadata names another writer): a block of a job that lost its output never
        lands in the other job's (``node``: the output's node, default its group)."""
        from ...io.outputs import check_writer, is_local_node
        from ...io.storage import open_group

        if node is None:
            node = worker_cached(
                (self.token, "group"),
                lambda: open_group(self.url, mode="a", storage_options=self.storage_options),
            )
        if not is_local_node(node):
            check_writer(node, self.token, self.url)

    def array(self, name: str) -> Any:
        """The member array ``name`` (a ``zarr.Array``), opened once per process, writing
        every chunk (all-zero ones too, as a local run writes them: a reader refuses an
        absent chunk of a finished output)."""
        from ...io.storage import open_group

        def make() -> Any:
            group = worker_cached(
                (self.token, "group"),
                lambda: open_group(self.url, mode="a", storage_options=self.storage_options),
            )
            arr = group[name]
            return arr.with_config({"write_empty_chunks": True})

        return worker_cached((self.token, "array", name), make)
