"""What the operator services share: their errors, the queue database, the store on it.

No SQL here: every statement against the queue tables is a method of the store
(:class:`~django_sqlqueue.db.store.QueueStore`).

Which database a service runs on (``SQLQUEUE["TOPIC_DATABASES"]``): ``using=`` when given,
else the alias chosen with :func:`on_database` (the console's database switcher), else
the topic's own database (:func:`topic_alias`: operations on one topic) or
``SQLQUEUE["DATABASE"]`` (:func:`alias`: operations on a seq or the whole queue).
Listings that take no topic read every database (:func:`listing_aliases`) and name each
row's database.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
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


#: The alias :func:`on_database` chose for the services called in its block (None: none chosen).
_CHOSEN: ContextVar[str | None] = ContextVar("sqlqueue_ops_database", default=None)


def known_database(using: str) -> str:
    """Return ``using`` if it is a database of the queue; raise :class:`NotFound` naming the known ones."""
    known = get_settings().databases
    if using not in known:
        raise NotFound(
            f"{brief_repr(using)} is not a database of the queue (known: {', '.join(known)}; "
            "SQLQUEUE['DATABASE'] and the aliases of SQLQUEUE['TOPIC_DATABASES'])."
        )
    return using


@contextmanager
def on_database(using: str | None) -> Iterator[None]:
    """Run the services called in this block on database ``using`` (None: the defaults).

    The console wraps each request in it with the database its switcher chose, so every
    page and action of the request reads and writes that database. An alias that is not
    one of the queue's raises :class:`NotFound`.
    """
    token = _CHOSEN.set(None if using is None else known_database(using))
    try:
        yield
    finally:
        _CHOSEN.reset(token)


def chosen_database() -> str | None:
    """The alias an enclosing :func:`on_database` chose, or None."""
    return _CHOSEN.get()


def alias(using: str | None = None) -> str:
    """Return the database alias to run on: ``using``, the chosen one, or ``SQLQUEUE["DATABASE"]``."""
    return using or _CHOSEN.get() or get_settings().DATABASE


def topic_alias(topic: str | None, using: str | None = None) -> str:
    """Return the database of an operation on ``topic``: ``using``, the chosen one, or the topic's own.

    A dead-letter topic lives with its topic (``SQLQUEUE["TOPIC_DATABASES"]``).
    """
    if not isinstance(topic, str):  # None; or bad input, which the service's validation refuses
        return alias(using)
    return using or _CHOSEN.get() or get_settings().database_for(topic)


def listing_aliases(topic: str | None = None, using: str | None = None) -> list[str]:
    """Return the databases a listing reads: the one of :func:`topic_alias`, else every database."""
    if topic is not None or using or _CHOSEN.get():
        return [topic_alias(topic, using)]
    return get_settings().databases


def store(using: str | None = None) -> QueueStore:
    """Return the store on the queue database (:func:`alias`)."""
    return QueueStore(alias(using))


def first_line(error: str | None) -> str:
    """Return the headline of a stored error ("module.Class: message"), without the traceback."""
    return (error or "").split("\n", 1)[0]
