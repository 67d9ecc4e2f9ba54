"""Where blocks run: block plans, executors (local threads, Dask), pipelines."""

from .executors import Executor, InlineExecutor, LocalExecutor, check_shared
from .handles import DestRef, SourceRef, forget, worker_cached
from .scheduling import resolve
from .worker_imports import ready_for_workers

# the names the folders above may use; the submodules named here are loaded on demand
__all__ = [
    "DestRef",
    "Executor",
    "InlineExecutor",
    "LocalExecutor",
    "SourceRef",
    "check_shared",
    "executors",
    "forget",
    "pipeline",
    "ready_for_workers",
    "resolve",
    "worker_cached",
]
