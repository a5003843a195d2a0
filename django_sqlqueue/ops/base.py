"""What the operator services share: their errors, the queue database, the store on it.

No SQL here: every statement against the queue tables is a method of the store
(:class:`~django_sqlqueue.db.store.QueueStore`).
"""

from __future__ import annotations

from typing import Any

from ..conf import get_settings
from ..db.store import QueueStore
from ..exceptions import SQLQueueError


class OperationError(SQLQueueError, ValueError):
    """An operator action was refused (bad input, or unsafe in the current state); nothing was written."""


class NotFound(OperationError):
    """The group, topic, partition or dead letter named by an operator does not exist."""


def check_count(value: Any, what: str, maximum: int) -> int:
    """Return ``value`` if it is an int from 1 to ``maximum``; raise :class:`OperationError` otherwise.

    Run before anything is written: a size of 0 would make a bulk action do nothing while
    reporting success (or loop), a negative one is "no limit" to SQLite and an error
    elsewhere, and a huge one overflows the SQL ``LIMIT``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise OperationError(f"{what} must be an integer from 1 to {maximum}, got {brief_repr(value)}.")
    return value


def brief_repr(value: Any) -> str:
    """``repr(value)``, cut to 40 characters (an int of over 4300 digits has none: Python refuses)."""
    try:
        text = repr(value)
    except ValueError:
        return "a number too large to show"
    return text if len(text) <= 40 else text[:40] + "..."


def alias(using: str | None = None) -> str:
    """Return the database alias to run on: ``using``, or ``SQLQUEUE["DATABASE"]``."""
    return using or get_settings().DATABASE


def store(using: str | None = None) -> QueueStore:
    """Return the store on the queue database (``using``, or ``SQLQUEUE["DATABASE"]``)."""
    return QueueStore(alias(using))


def first_line(error: str | None) -> str:
    """Return the headline of a stored error ("module.Class: message"), without the traceback."""
    return (error or "").split("\n", 1)[0]
