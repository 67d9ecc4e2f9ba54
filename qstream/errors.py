"""Exception types; each also derives from a builtin (ValueError, TypeError, OSError)."""

from __future__ import annotations


class QStreamError(Exception):
    """Base class of every error qstream raises on purpose."""


class InvalidParameterError(QStreamError, ValueError):
    """A scale, zero point, axis, block size, round mode or other argument is not acceptable."""


class InvalidDTypeError(QStreamError, TypeError):
    """An array has a dtype the operation does not accept."""


class NonFiniteInputError(QStreamError, ValueError):
    """The input holds NaN or infinite values and the NaN policy is ``error``."""


class StoreError(QStreamError, OSError):
    """A store is missing, corrupt, incomplete, or cannot be written."""


class DestinationBusyError(StoreError):
    """The destination is held by another qstream process (its lock, or a recent lease): a
    temporary condition, not a fault; the same call succeeds once that process ends (the
    command line exits with 75, ``EX_TEMPFAIL``)."""


class QStreamWarning(UserWarning):
    """Something worth knowing that does not stop the work (a recipe rule that matched no
    tensor); the command line prints it as one ``warning:`` line."""
