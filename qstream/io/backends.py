"""Object-store backends: how URLs are opened, their timeouts and retries, their errors.

A URL (``s3://``, ``gs://``, ...) is opened by fsspec (the default) or obstore
(:func:`with_backend`), with qstream's timeouts and retries where the caller set none
(:func:`store_timeout`): a dead endpoint ends a job with an error, not a hang. Failures of the
store libraries become one-line :class:`~qstream.errors.StoreError` naming the location
(:func:`store_errors`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from ..errors import InvalidParameterError, StoreError
from .locations import display

BACKENDS = ("fsspec", "obstore")  # how URLs (s3://, gs://, ...) are opened

_STORE_LIBRARIES = ("obstore", "botocore", "aiobotocore", "s3fs", "fsspec", "aiohttp", "urllib3")


def one_line(e: BaseException) -> str:
    """An exception's message on one line (its first line that says something)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0][:300] if lines else type(e).__name__


def store_failure(e: BaseException, where: object) -> StoreError | None:
    """A one-line :class:`StoreError` naming ``where`` (a URL) and the cause, for a failure
    raised by a store library (obstore, fsspec, s3fs, botocore, aiohttp) or the network;
    None for anything else."""
    import asyncio

    top = type(e).__module__.split(".")[0]
    network = isinstance(e, (TimeoutError, asyncio.TimeoutError, ConnectionError))
    if (top not in _STORE_LIBRARIES and not network) or isinstance(e, StoreError):
        return None
    text = one_line(e)
    lower = str(e).lower()
    if "timed out" in lower or "timeout" in lower or isinstance(e, TimeoutError):
        cause = f"no answer from the store within its timeout ({text})"
    elif "connect" in lower and ("refused" in lower or "error" in lower):
        cause = f"cannot connect ({text})"
    else:
        cause = text
    return StoreError(f"{display(where)}: {type(e).__name__}: {cause}")


@contextlib.contextmanager
def store_errors(where: object) -> Iterator[None]:
    """Failures of store libraries inside the body as one-line :class:`StoreError` naming
    ``where`` (see :func:`store_failure`)."""
    try:
        yield
    except Exception as e:
        err = store_failure(e, where)
        if err is None:
            raise
        raise err from None


def store_timeout() -> float:
    """Seconds after which a request to an object store that makes no progress fails, its
    retries included (``QSTREAM_STORE_TIMEOUT``, default 60): a dead endpoint ends a job
    with an error, not a hang."""
    raw = os.environ.get("QSTREAM_STORE_TIMEOUT", "60")
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise InvalidParameterError(f"QSTREAM_STORE_TIMEOUT must be seconds > 0, got {raw!r}")
    return value


def _obstore_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """obstore's options with qstream's timeouts and retries where the caller set none: a
    stalled connection fails after a third of :func:`store_timeout`, and retries stop once
    it has passed."""
    import datetime

    t = store_timeout()
    out = dict(options or {})
    client = {
        "connect_timeout": datetime.timedelta(seconds=min(10.0, t / 4)),
        "read_timeout": datetime.timedelta(seconds=t / 3),
        "timeout": datetime.timedelta(seconds=max(300.0, 5 * t)),  # big chunks on slow links
        **dict(out.get("client_options") or {}),
    }
    retry = {
        "max_retries": 2,
        "retry_timeout": datetime.timedelta(seconds=t),
        **dict(out.get("retry_config") or {}),
    }
    return {**out, "client_options": client, "retry_config": retry}


def fsspec_options(url: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """fsspec's options with qstream's timeouts and retries (S3: botocore's connect/read
    timeouts and attempts) where the caller set none."""
    out = dict(options or {})
    if url.split("://", 1)[0] in ("s3", "s3a"):
        t = store_timeout()
        config = {
            "connect_timeout": min(10.0, t / 4),
            "read_timeout": t / 3,
            "retries": {"total_max_attempts": 2, "mode": "standard"},
            **dict(out.get("config_kwargs") or {}),
        }
        out["config_kwargs"] = config
    return out


def with_backend(
    target: Any, backend: str | None, storage_options: dict[str, Any] | None, *, read_only: bool
) -> Any:
    """``target`` as the object its backend opens: a URL with ``backend="obstore"`` becomes a
    ``zarr.storage.ObjectStore`` (``storage_options`` are obstore's config, e.g. ``endpoint``,
    ``access_key_id``, ``region``, ``client_options``); anything else is returned as is (fsspec
    opens URLs later, with ``storage_options`` as fsspec's)."""
    if backend not in (None, *BACKENDS):
        raise InvalidParameterError(f"store must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend != "obstore" or not isinstance(target, (str, os.PathLike)):
        return target
    url = os.fspath(target)
    if "://" not in url or url.startswith("memory://"):
        return target  # local paths and in-memory stores need no object store
    try:
        import obstore.store
        import zarr
    except ImportError:
        raise InvalidParameterError(
            "store='obstore' needs the obstore package: pip install 'qstream-zarr[s3]'"
        ) from None
    try:
        inner = obstore.store.from_url(url, **_obstore_options(storage_options))
    except Exception as e:
        raise StoreError(f"cannot open {url} with obstore: {type(e).__name__}: {e}") from None
    return zarr.storage.ObjectStore(inner, read_only=read_only)
