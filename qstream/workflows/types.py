"""The types of the store functions' arguments, for annotations (the aliases are strings: the
names they use are imported for type checkers only, so that importing this costs nothing)."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    import os
    from collections.abc import Callable
    from typing import Any

    import zarr
    from numpy.typing import NDArray
    from zarr.abc.store import Store

    from ..engine.convert import TensorEvent
    from ..engine.run import Executor

#: a Zarr array to read: its path or URL, an open ``zarr.Array``, a zarr store holding it, or
#: a NumPy array
ArraySource: TypeAlias = "str | os.PathLike[str] | zarr.Array[Any] | Store | NDArray[Any]"
#: where a Zarr group is (or goes): a directory, a ``.zip`` path, ``memory://name``, an fsspec
#: URL, or a zarr store
Location: TypeAlias = "str | os.PathLike[str] | Store"
#: a path or URL of a file or directory
PathLike: TypeAlias = "str | os.PathLike[str]"
#: where blocks run: None or ``"local"``, ``"dask"``, or an executor object
ExecutorLike: TypeAlias = "str | Executor | None"
#: ``progress(done, total)``, called as blocks land
Progress: TypeAlias = "Callable[[int, int], None]"
#: ``on_tensor(event)``, called before and after each tensor of a checkpoint
OnTensor: TypeAlias = "Callable[[TensorEvent], None]"
#: a store library's options (fsspec's or obstore's)
StorageOptions: TypeAlias = "dict[str, Any]"
