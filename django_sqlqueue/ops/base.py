"""What the operator services share: their errors, the queue database, the store on it.

No SQL here: every statement against the queue tables is a method of the store
(:class:`~django_sqlqueue.db.store.QueueStore`).
"""

from __future__ import annotations

from ..conf import get_settings
from ..db.store import QueueStore
from ..exceptions import SQLQueueError


class OperationError(SQLQueueError, ValueError):
    """An operator action was refused (bad input, or unsafe in the current state); nothing was written."""


class NotFound(OperationError):
    """The group, topic, partition or dead letter named by an operator does not exist."""


def alias(using: str | None = None) -> str:
    """Return the database alias to run on: ``using``, or ``SQLQUEUE["DATABASE"]``."""
    return using or get_settings().DATABASE


def store(using: str | None = None) -> QueueStore:
    """Return the store on the queue database (``using``, or ``SQLQUEUE["DATABASE"]``)."""
    return QueueStore(alias(using))


def first_line(error: str | None) -> str:
    """Return the headline of a stored error ("module.Class: message"), without the traceback."""
    return (error or "").split("\n", 1)[0]
