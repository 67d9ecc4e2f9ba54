"""A total deadline per S3 request for fsspec (s3fs, through aiobotocore's aiohttp session).

botocore's timeouts are per socket operation: an endpoint that sends a few bytes a second
(a dripping answer, headers or body) extends a request without end. :class:`DeadlineSession`
gives every attempt aiohttp's ``total`` timeout, which covers the whole exchange, connection,
upload, headers and the body read after botocore returns the response, and lets botocore retry
only within the first half of the deadline: a request ends within 1.5 deadlines, whatever the
endpoint does. obstore's requests are bounded alike by its client options
(:func:`qstream.io.storage.timeouts.store_timeout`). Imported only when s3fs opens an ``s3://`` URL.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
from aiobotocore.httpsession import AIOHTTPSession
from botocore.exceptions import BotoCoreError

from .timeouts import store_timeout

_STARTED = "qstream_started"  # the request's first attempt (botocore's context, per request)


class DeadlinePassed(BotoCoreError, TimeoutError):  # type: ignore[misc]
    """A retry refused: the request's deadline is half spent (botocore retries none of this
    class: its retryable errors are its ConnectionError and HTTPClientError). A
    ``TimeoutError`` too, so that every layer that names an ``OSError`` as a store failure
    names this one (a destination's first look had let it through as itself)."""

    fmt = "Read timeout on endpoint URL: {endpoint_url}: {error}"


class DeadlineSession(AIOHTTPSession):  # type: ignore[misc]
    """aiobotocore's session with a total deadline per attempt (:func:`store_timeout`
    seconds, read when the session is made) and retries only within half of it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = store_timeout()

    def _get_request_timeout(self, request: Any) -> aiohttp.ClientTimeout:
        context = getattr(request, "context", None) or {}
        sock_read = context.get("read_timeout") or self._timeout.sock_read
        return aiohttp.ClientTimeout(
            total=self.deadline, sock_connect=self._timeout.sock_connect, sock_read=sock_read
        )

    async def send(self, request: Any) -> Any:
        context = getattr(request, "context", None)
        now = time.monotonic()
        started = context.setdefault(_STARTED, now) if isinstance(context, dict) else now
        if now - started > self.deadline / 2:  # a retry after half of the deadline: none
            raise DeadlinePassed(  # type: ignore[call-arg]  # (botocore's keyword form)
                endpoint_url=request.url,
                error=f"no retry after {now - started:.1f} s, half the request's deadline",
            )
        return await super().send(request)
