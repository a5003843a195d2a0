"""Engine connections: a worker frozen inside its own transaction must not hold its locks.

The poll loop and the lease keeper run only the engine's short transactions (milliseconds
between BEGIN and COMMIT). A worker frozen inside one of them -- SIGSTOP, a VM or container
pause, a debugger, swapping -- would keep that transaction's locks for as long as it is
frozen: the share locks on its lease rows that fence its writes (``StoreBase.lock_held``)
and the partitions' head rows the sequencer locks. Every other worker's steal of its
expired leases (an UPDATE of those rows) and every sequencing of those partitions would
wait until it resumes, so its partitions would stall for the whole pause although its
leases expired.

So those threads' connections ask the server to end the session when a transaction stays
idle for longer than a lease can outlive its holder's last renewal
(``LEASE_DURATION - LEASE_RENEW_INTERVAL``): PostgreSQL's
``idle_in_transaction_session_timeout``, MariaDB's ``idle_transaction_timeout``. The server
rolls the transaction back (nothing it wrote exists) and its locks go. The resumed worker
finds its connection closed; the statement fails like any lost connection (the outage
reporter logs it) and the next round reconnects. MySQL and SQLite have no such setting: a
frozen MySQL worker still holds its partitions until it resumes (documented).

Handler threads are left alone: a handler's own transactions may legitimately idle.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from .dialects import get_dialect

#: Per thread: (alias, seconds) once the thread's connections to ``alias`` are engine
#: connections.
_engine = threading.local()


@contextmanager
def engine_connections(using: str, idle_transaction_seconds: float) -> Iterator[None]:
    """While the block runs, this thread's connection to ``using`` (the one open now and
    every one it opens meanwhile) is an engine connection: the server ends it when a
    transaction of it stays idle for ``idle_transaction_seconds`` (rounded up to whole
    seconds, at least 1). On the way out the session gets the server's default back, so a
    thread that goes on to other work (a test, ``drain()``) is not left with the timeout."""
    seconds = max(1, math.ceil(idle_transaction_seconds))
    previous = getattr(_engine, "settings", None)
    _engine.settings = (using, seconds)
    connection = connections[using]
    if connection.connection is not None:
        _configure(connection, seconds)
    try:
        yield
    finally:
        _engine.settings = previous
        if connection.connection is not None and not connection.in_atomic_block:
            try:
                _configure(connection, None if previous is None else previous[1])
            except DatabaseError:  # a broken connection: closed, its next one is a fresh session
                connection.close()


def _configure(connection: BaseDatabaseWrapper, seconds: int | None) -> None:
    sql = get_dialect(connection).idle_transaction_timeout_sql(seconds)
    if sql is not None:
        with connection.cursor() as cursor:
            cursor.execute(sql)


def _on_connection_created(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    settings = getattr(_engine, "settings", None)
    if settings is not None and connection.alias == settings[0]:
        _configure(connection, settings[1])


connection_created.connect(_on_connection_created, dispatch_uid="django_sqlqueue.db.session")
