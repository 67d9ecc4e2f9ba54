"""How long one request to an object store may take (``QSTREAM_STORE_TIMEOUT``): read by
the store backends (:mod:`qstream.io.storage.backends`) and fsspec's S3 session
(:mod:`qstream.io.storage.s3_deadline`)."""

from __future__ import annotations

import os

from ...errors import InvalidParameterError


def store_timeout() -> float:
    """The deadline of one request to an object store, in seconds (``QSTREAM_STORE_TIMEOUT``,
    default 60): each attempt ends within it, whole (connection, upload, answer and body: an
    endpoint that drips a few bytes at a time cannot extend it), a stalled one sooner (no
    byte for a third of it), and retries start only within its first half, so a request ends
    within 1.5 deadlines whatever the endpoint does (obstore: its client options; fsspec's
    S3: :class:`~qstream.io.storage.s3_deadline.DeadlineSession`). A dead or dripping endpoint ends
    a
    job with an error naming the URL, not a hang."""
    raw = os.environ.get("QSTREAM_STORE_TIMEOUT", "60")
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise InvalidParameterError(f"QSTREAM_STORE_TIMEOUT must be seconds > 0, got {raw!r}")
    return value
