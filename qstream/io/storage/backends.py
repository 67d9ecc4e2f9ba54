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
import re
from collections.abc import Iterator
from typing import Any

from ...errors import InvalidParameterError, StoreError
from .locations import display
from .timeouts import store_timeout as store_timeout

BACKENDS = ("fsspec", "obstore")  # how URLs (s3://, gs://, ...) are opened

_STORE_LIBRARIES = ("obstore", "botocore", "aiobotocore", "s3fs", "fsspec", "aiohttp", "urllib3")


def one_line(e: BaseException) -> str:
    """An exception's message on one line (its first line that says something)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0][:300] if lines else type(e).__name__


def _root_cause(text: str) -> str | None:
    """The innermost cause in obstore's ``Debug source:`` dump (``BadScheme``, ``TimedOut``,
    an OS error's message), or None."""
    detail = text.split("Debug source:", 1)[1] if "Debug source:" in text else ""
    messages = re.findall(r'message: "([^"]+)"', detail)
    if messages:
        return messages[-1]
    bare = re.findall(r"source: ([A-Za-z_][A-Za-z0-9_]*),?\s*$", detail, flags=re.M)
    return bare[-1] if bare else None


def _is_store_failure(e: BaseException) -> bool:
    """Whether ``e`` was raised by a store library or the network (not qstream's own)."""
    import asyncio

    tops = {c.__module__.split(".")[0] for c in type(e).__mro__}  # (a library's own, too)
    network = isinstance(e, (TimeoutError, asyncio.TimeoutError, ConnectionError))
    return (bool(tops & set(_STORE_LIBRARIES)) or network) and not isinstance(e, StoreError)


def store_cause(e: BaseException) -> str:
    """``"ErrorType: cause"`` on one line for a failure of a store library: its own message
    (the first line, with the innermost cause of obstore's dump, e.g. ``builder error
    (BadScheme)``), called a timeout only when it is one; other errors as they are."""
    import asyncio

    if not _is_store_failure(e):
        return f"{type(e).__name__}: {e}"
    full = str(e)
    text = one_line(e)
    root = _root_cause(full)
    if root and root.lower() not in text.lower():
        text = f"{text} ({root})"
    detail = full.split("Debug source:", 1)[1] if "Debug source:" in full else ""
    said = re.sub(r"retry_timeout: \S+", "", text).lower()  # (obstore's budget, not a cause)
    timed_out = (
        isinstance(e, (TimeoutError, asyncio.TimeoutError))
        or "timed out" in said
        or "timeout" in said
        or "kind: Timeout" in detail
        or "TimedOut" in detail
    )
    if "builder error" in said and "BadScheme" in detail:
        cause = (
            f"{text}; plain http:// is not allowed for this endpoint (AWS_ALLOW_HTTP=true or"
            " client_options={'allow_http': True} allows it)"
        )
    elif timed_out:
        cause = (
            "no complete answer from the store within its deadline"
            f" (QSTREAM_STORE_TIMEOUT={_timeout_text()}; {text})"
        )
    elif "connect" in said and ("refused" in said or "error" in said):
        cause = f"cannot connect ({text})"
    else:
        cause = text
    return f"{type(e).__name__}: {cause}"


def _timeout_text() -> str:
    try:
        return f"{store_timeout():g} s"
    except InvalidParameterError:
        return repr(os.environ.get("QSTREAM_STORE_TIMEOUT"))


def store_failure(e: BaseException, where: object) -> StoreError | None:
    """A one-line :class:`StoreError` naming ``where`` (a URL) and the cause
    (:func:`store_cause`), for a failure raised by a store library (obstore, fsspec, s3fs,
    botocore, aiohttp) or the network; None for anything else."""
    if not _is_store_failure(e):
        return None
    return StoreError(f"{display(where)}: {store_cause(e)}")


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


# Environment variables of the object stores (obstore reads ``{PREFIX}*``, fsspec's backends
# their own): the prefix of each URL scheme, and where an endpoint is named.
_ENV_PREFIX = {
    "s3": "AWS_",
    "s3a": "AWS_",
    "gs": "GOOGLE_",
    "gcs": "GOOGLE_",
    "az": "AZURE_",
    "azure": "AZURE_",
    "abfs": "AZURE_",
    "abfss": "AZURE_",
    "adl": "AZURE_",
}
_ENDPOINT_ENV = {
    "AWS_": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"),
    "AZURE_": ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT"),
}
_ENDPOINT_KEYS = (  # obstore's config keys (and s3fs's endpoint_url), most specific first
    "aws_endpoint_url_s3",
    "endpoint",
    "aws_endpoint",
    "aws_endpoint_url",
    "endpoint_url",
    "azure_storage_endpoint",
    "azure_endpoint",
)
# obstore's HTTP client options (``ClientConfig``); ``{PREFIX}{KEY}`` in the environment sets
# one, as obstore itself reads it when no client options are passed
_CLIENT_KEYS = (
    "allow_http",
    "allow_invalid_certificates",
    "connect_timeout",
    "default_content_type",
    "http1_only",
    "http2_keep_alive_interval",
    "http2_keep_alive_timeout",
    "http2_keep_alive_while_idle",
    "http2_only",
    "pool_idle_timeout",
    "pool_max_idle_per_host",
    "proxy_url",
    "proxy_ca_certificate",
    "proxy_excludes",
    "randomize_addresses",
    "read_timeout",
    "timeout",
    "user_agent",
)
_TRUE = ("1", "true", "yes", "on", "y")
_FALSE = ("0", "false", "no", "off", "n", "")


def _flag(name: str, raw: str) -> bool:
    """An environment variable's yes/no value (as obstore reads it), refused if neither."""
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise InvalidParameterError(f"{name} must be true or false, got {raw!r}")


def _prefix(url: str) -> str | None:
    return _ENV_PREFIX.get(url.split("://", 1)[0].lower()) if "://" in url else None


def _endpoint(url: str, options: dict[str, Any] | None) -> str | None:
    """The endpoint ``url`` is reached at: from ``options`` (obstore's config keys, also inside
    ``config``; fsspec's ``endpoint_url`` and ``client_kwargs.endpoint_url``), else from the
    environment (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT``, ...)."""
    opts = dict(options or {})
    for part in (opts, opts.get("config"), opts.get("client_kwargs")):
        if isinstance(part, dict):
            lowered = {str(k).lower(): v for k, v in part.items()}
            for key in _ENDPOINT_KEYS:
                if lowered.get(key):
                    return str(lowered[key])
    for name in _ENDPOINT_ENV.get(_prefix(url) or "", ()):
        if os.environ.get(name):
            return os.environ[name]
    return None


def _allow_http(url: str, endpoint: str | None, given: object) -> tuple[bool | None, str]:
    """Whether plain http is allowed for ``url`` and what says so: ``given`` (the caller's
    ``allow_http``), else ``{PREFIX}ALLOW_HTTP`` in the environment, else an ``http://``
    endpoint (a user who names one means it); None when nothing says."""
    if given is not None:
        value = _flag("allow_http", given) if isinstance(given, str) else bool(given)
        return value, f"allow_http={value}"
    name = f"{_prefix(url) or ''}ALLOW_HTTP"
    if _prefix(url) and name in os.environ:
        return _flag(name, os.environ[name]), f"{name}={os.environ[name]}"
    if endpoint and endpoint.lower().startswith("http://"):
        return True, "an http:// endpoint"
    return None, ""


def _refuse_plain_http(url: str, endpoint: str | None, allowed: bool | None, why: str) -> None:
    """Refuse an ``http://`` endpoint that ``why`` forbids (both backends alike)."""
    if allowed is False and endpoint and endpoint.lower().startswith("http://"):
        raise StoreError(
            f"{url}: the endpoint {endpoint} is plain http, which {why} forbids; set"
            " AWS_ALLOW_HTTP=true (or allow_http in client_options) to allow it, or use https://"
        )


def _obstore_options(url: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """obstore's options for ``url``: the caller's, then the environment's client options
    (obstore ignores them once client options are passed: ``AWS_ALLOW_HTTP``, ``AWS_TIMEOUT``,
    ``AWS_PROXY_URL``, ...), then qstream's deadline and retries where neither set one
    (:func:`store_timeout`: each attempt whole within it, a stall within a third of it,
    retries within its first half). Plain http is allowed when ``AWS_ALLOW_HTTP`` says so,
    or, when nothing says, for an ``http://`` endpoint (MinIO, moto, an on-prem store)."""
    import datetime

    t = store_timeout()
    out = dict(options or {})
    given = dict(out.get("client_options") or {})
    prefix = _prefix(url)
    env: dict[str, Any] = {}
    if prefix:
        for key in _CLIENT_KEYS:
            raw = os.environ.get(f"{prefix}{key.upper()}")
            if raw is not None and key != "allow_http":
                env[key] = raw
    endpoint = _endpoint(url, out)
    allowed, why = _allow_http(url, endpoint, given.get("allow_http"))
    _refuse_plain_http(url, endpoint, allowed, why)
    client = {
        "connect_timeout": datetime.timedelta(seconds=min(10.0, t / 4)),
        "read_timeout": datetime.timedelta(seconds=t / 3),
        "timeout": datetime.timedelta(seconds=t),  # each attempt, whole: a drip ends too
        **env,
        **given,
    }
    if allowed is not None:
        client["allow_http"] = allowed
    retry = {
        "max_retries": 2,
        "retry_timeout": datetime.timedelta(seconds=t / 2),  # no attempt starts later
        **dict(out.get("retry_config") or {}),
    }
    return {**out, "client_options": client, "retry_config": retry}


def fsspec_options(url: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """fsspec's options with qstream's deadline and retries where the caller set none (S3:
    botocore's connect/read timeouts and attempts, and
    :class:`~qstream.io.storage.s3_deadline.DeadlineSession` for :func:`store_timeout` per request).
    S3 takes the environment as obstore does: botocore reads ``AWS_ENDPOINT_URL(_S3)``, the
    keys and ``AWS_DEFAULT_REGION``; ``AWS_ENDPOINT`` and ``AWS_REGION`` are passed on here,
    and an ``http://`` endpoint that ``AWS_ALLOW_HTTP=false`` forbids is refused."""
    out = dict(options or {})
    if url.split("://", 1)[0] in ("s3", "s3a"):
        t = store_timeout()
        from .s3_deadline import DeadlineSession

        config = {
            "connect_timeout": min(10.0, t / 4),
            "read_timeout": t / 3,
            "retries": {"total_max_attempts": 2, "mode": "standard"},
            "http_session_cls": DeadlineSession,  # each request whole within t, retries too
            **dict(out.get("config_kwargs") or {}),
        }
        out["config_kwargs"] = config
        client = dict(out.get("client_kwargs") or {})
        named = out.get("endpoint_url") or client.get("endpoint_url")
        botocore_reads = any(os.environ.get(n) for n in _ENDPOINT_ENV["AWS_"][:2])
        if os.environ.get("AWS_ENDPOINT") and not named and not botocore_reads:
            client["endpoint_url"] = os.environ["AWS_ENDPOINT"]  # obstore's name only
        region = os.environ.get("AWS_REGION")  # obstore's name only (botocore: DEFAULT)
        if region and not client.get("region_name") and not os.environ.get("AWS_DEFAULT_REGION"):
            client["region_name"] = region
        if client:
            out["client_kwargs"] = client
        endpoint = _endpoint(url, out)
        allowed, why = _allow_http(url, endpoint, None)
        _refuse_plain_http(url, endpoint, allowed, why)
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
    options = _obstore_options(url, storage_options)
    try:
        inner = obstore.store.from_url(url, **options)
    except Exception as e:
        raise StoreError(
            f"cannot open {url} with obstore: {type(e).__name__}: {one_line(e)}"
        ) from None
    return zarr.storage.ObjectStore(inner, read_only=read_only)
