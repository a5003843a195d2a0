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

A thread that runs handlers as well -- a handler thread, whose batch's outcomes (acks,
nacks, dead letters) are fenced writes too, or the poll loop of an inline worker -- cannot
carry the bound for its whole session: a handler's own transaction may legitimately idle.
There (:func:`handler_thread_connections`) the bound covers the engine's transactions only:

- every fenced transaction (:func:`bound_engine_transaction`, called by ``lock_held``
  for the statement that takes the share locks) and every sequencing transaction is
  bounded -- PostgreSQL by that very statement (``set_config(..., true)``, i.e. ``SET
  LOCAL``, in its WHERE: that transaction only, back to the session's value at commit or
  rollback, and no statement of its own), MariaDB, whose setting has no transaction scope,
  by setting the session's value when it is not set already;
- handler calls run in :func:`handler_section`: nothing is bounded from inside one (an
  atomic consumer's ack is written in its handler's own transaction), and on MariaDB the
  session's value is put back to the server's default just before the first statement
  the handler sends (an execute wrapper), so a handler that does not use the database
  costs no statement at all, and one that does costs two per batch (back to the default
  on its first statement, set again at the outcome's fence).
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

#: Per thread: ``settings`` = (alias, seconds) once the thread's connections to ``alias``
#: are engine connections; ``shared`` = (alias, seconds) on a thread that runs handlers
#: too (only its engine transactions are bounded); ``in_handler``: in a handler call.
_engine = threading.local()

#: Set on a Django connection (its DatabaseWrapper, one per thread and alias) of a thread
#: that runs handlers, on MariaDB: whether its session carries the bound right now.
_BOUND = "_sqlqueue_idle_bound"


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
        try:
            _configure(connection, seconds)
        except DatabaseError:
            # A connection the server dropped meanwhile (a restart while the worker waited for
            # its leases): closed; the next one is configured as it opens (connection_created).
            connection.close()
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
    # A new session starts with the server's default (a handler may close and reopen).
    setattr(connection, _BOUND, False)


@contextmanager
def handler_thread_connections(using: str, idle_transaction_seconds: float) -> Iterator[None]:
    """While the block runs, this thread -- which runs handlers as well as the engine's
    fenced writes -- bounds the idle time of the engine's transactions on ``using`` only
    (see the module docstring); on the way out its session gets the server's default back."""
    seconds = max(1, math.ceil(idle_transaction_seconds))
    previous = getattr(_engine, "shared", None)
    _engine.shared = (using, seconds)
    try:
        yield
    finally:
        _engine.shared = previous
        connection = connections[using]
        if getattr(connection, _BOUND, False) and connection.connection is not None and not connection.in_atomic_block:
            try:
                _configure(connection, None)
                setattr(connection, _BOUND, False)
            except DatabaseError:
                connection.close()


def bound_engine_transaction(connection: BaseDatabaseWrapper, cursor: Any) -> str:
    """Bound the idle time of the engine transaction open on ``cursor``, on a thread of
    :func:`handler_thread_connections`, before its first lock; return what to append to the
    WHERE of the statement that takes that lock (``""`` or ``" AND <condition>"``).

    PostgreSQL: the condition (``Dialect.idle_transaction_bound_filter``, SET LOCAL as a side
    effect: no statement of its own). MariaDB: the session's setting, set here when it is not
    set already. Nothing elsewhere (engine connections are bounded for the whole session
    already), nor inside a handler call (its transaction is the handler's)."""
    shared = getattr(_engine, "shared", None)
    if shared is None or shared[0] != connection.alias or getattr(_engine, "in_handler", False):
        return ""
    dialect = get_dialect(connection)
    condition = dialect.idle_transaction_bound_filter(shared[1])
    if condition is not None:
        return f" AND {condition}"
    if not getattr(connection, _BOUND, False):
        sql = dialect.idle_transaction_timeout_sql(shared[1])
        if sql is not None:
            # MariaDB: a session setting, not transactional; it applies from the next wait
            # for a statement on, i.e. to this transaction's idle time after this point.
            cursor.execute(sql)
            setattr(connection, _BOUND, True)
    return ""


@contextmanager
def handler_section() -> Iterator[None]:
    """Around a handler call on a thread of :func:`handler_thread_connections`: the handler's
    own transactions are never bounded (see the module docstring). Costs a thread-local
    read where the thread is not such a thread (tests' in-process drain)."""
    shared = getattr(_engine, "shared", None)
    if shared is None:
        yield
        return
    connection = connections[shared[0]]
    _engine.in_handler = True
    try:
        if getattr(connection, _BOUND, False):
            with connection.execute_wrapper(_Unbinder(connection)):
                yield
        else:
            yield
    finally:
        _engine.in_handler = False


class _Unbinder:
    """An execute wrapper: before the first statement a handler sends on a bounded session,
    put the server's default back (once; then it only passes statements through)."""

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        if getattr(self.connection, _BOUND, False):
            reset = get_dialect(self.connection).idle_transaction_timeout_sql(None)
            if reset is not None:
                execute(reset, None, False, context)
            setattr(self.connection, _BOUND, False)
        return execute(sql, params, many, context)


connection_created.connect(_on_connection_created, dispatch_uid="django_sqlqueue.db.session")
