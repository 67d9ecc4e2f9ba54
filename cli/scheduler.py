"""``--scheduler``: where the blocks of a command run (this process's threads, local Dask
worker processes, or a Dask cluster)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

import qstream as qs


@contextmanager
def open_executor(scheduler: str | None) -> Iterator[qs.DaskExecutor | None]:
    """The executor ``--scheduler`` names (None: this process's threads), closed on exit."""
    if not scheduler:
        yield None
        return
    try:
        import distributed
    except ImportError:
        raise typer.BadParameter(
            "--scheduler needs Dask: pip install 'qstream-zarr[dask]'"
        ) from None

    if scheduler.startswith("local:"):
        try:
            n = int(scheduler.removeprefix("local:"))
            if n < 1:
                raise ValueError
        except ValueError:
            raise typer.BadParameter(
                f"--scheduler local:N needs a number of workers >= 1, not {scheduler!r}"
            ) from None
        with qs.DaskExecutor.local(n) as ex:
            yield ex
        return
    try:
        client = distributed.Client(scheduler, timeout="10s")
    except OSError as e:
        raise qs.StoreError(f"cannot reach the Dask scheduler at {scheduler}: {e}") from None
    with client:
        yield qs.DaskExecutor(client)
