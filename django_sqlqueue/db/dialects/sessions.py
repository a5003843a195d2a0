"""Sessions: what a vendor's connections can do beside the queue's statements.

A mixin of :class:`~django_sqlqueue.db.dialects.base.Dialect`: notifications (a
listener connection's setup, ``worker/threads/listener.py``), the idle-in-transaction
timeout of engine connections (``db/session.py``), whether writes on several connections
can run at once, and the server's connection limits (checked at worker start).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .fragments import SqlFragments


class Sessions(SqlFragments):
    """Per-connection settings, notifications and connection limits."""

    #: Whether the database delivers notifications on commit (PostgreSQL's NOTIFY/LISTEN):
    #: publishes then announce their topics and workers listen (``worker/threads/listener.py``).
    supports_notify = False
    #: Whether transactions on several connections can write at the same time (row locks).
    #: False on SQLite: a write transaction holds the database's write lock, so a write on a
    #: second connection waits until the first transaction ends. An atomic consumer's
    #: ``extend_visibility()`` writes on a connection of its own only where this is True.
    concurrent_writers = True

    def listen_sql(self, channel: str) -> str:
        """The statement that subscribes a connection to ``channel`` (:attr:`supports_notify`)."""
        raise NotImplementedError(f"{self.connection.vendor} has no notifications")

    def start_listening(self, raw: Any, application_name: str, channels: Sequence[str]) -> None:
        """Prepare ``raw``, a driver connection in autocommit mode that is not Django's (the
        listener's), to receive the notifications of ``channels``: name the session for
        operators (``application_name``, cut to what the server keeps) and LISTEN on each
        channel. Only where :attr:`supports_notify`."""
        raise NotImplementedError(f"{self.connection.vendor} has no notifications")

    def idle_transaction_timeout_sql(self, seconds: int | None) -> str | None:
        """The statement that makes the server end this session when a transaction of it
        stays idle (no statement running) for ``seconds`` (None: the server's default),
        rolling it back and so releasing its locks; None where the database has no such
        setting (SQLite, MySQL).

        Set on the worker's engine connections only (``db/session.py``): a process frozen
        inside one of its short transactions (SIGSTOP, a VM pause, a debugger) would
        otherwise hold its lease rows' share locks, and so every lease steal, until it
        resumes."""
        return None

    def idle_transaction_bound_filter(self, seconds: int) -> str | None:
        """A condition, true for every row, whose evaluation bounds the idle time of the
        *current transaction only* as :meth:`idle_transaction_timeout_sql` does for the
        session (back to the session's value at commit or rollback); appended with AND to
        the WHERE of the statement that takes the transaction's first locks, so the bound
        costs no statement of its own. None where only the session can be bounded (MariaDB)
        or nothing can (SQLite, MySQL).

        Used on threads that run handlers as well as fenced writes (``db/session.py``):
        there the bound must cover the engine's transactions and never the handlers'."""
        return None

    def connection_limits(self, cursor: Any) -> list[tuple[str, int, int]]:
        """The limits on this account's connections: ``(what, limit, in_use)`` each, e.g.
        ``("max_connections", 151, 42)``; none where the server has no such limit (SQLite)."""
        return []
