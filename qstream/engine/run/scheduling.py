"""The executor an ``executor=`` argument names.

The executors (:mod:`qstream.engine.run.executors`, :mod:`qstream.engine.run.dask`) are leaves that
run
what they are handed; a job resolves its ``executor=`` here, above them, so that none of them
imports the job (as rechunker resolves its executors by name).
"""

from __future__ import annotations

from typing import Any

from ...errors import InvalidParameterError
from .executors import Executor, LocalExecutor


def resolve(executor: Any) -> Executor:
    """The executor object ``executor`` (None, ``"local"``, ``"dask"`` or an executor)
    names."""
    if executor is None or executor == "local":
        return LocalExecutor()
    if executor == "dask":
        try:
            from .dask import DaskExecutor
        except ImportError as e:
            raise InvalidParameterError(
                f"executor='dask' needs Dask ({e.name} is missing):"
                " pip install 'qstream-zarr[dask]'"
            ) from None
        return DaskExecutor()
    if hasattr(executor, "map_ordered") and hasattr(executor, "distributed"):
        named: Executor = executor
        return named
    raise InvalidParameterError(
        f"executor must be None, 'local', 'dask' or an executor object"
        f" (qstream.DaskExecutor(...)), got {executor!r}"
    )
