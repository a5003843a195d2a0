"""Plumbing shared by the consumer-side stores: connection, dialect, quoting, helpers."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ...conf import get_settings
from ...models import DeliveryState
from ..dialects import Dialect, get_dialect
from ..dialects.base import in_list
from ..session import bound_engine_transaction

IN_FLIGHT = DeliveryState.Status.IN_FLIGHT.value
RETRY = DeliveryState.Status.RETRY.value
SCHEDULED = DeliveryState.Status.SCHEDULED.value


@contextmanager
def preparing_cursor(connection: BaseDatabaseWrapper, dialect: Dialect) -> Iterator[Any]:
    """A cursor of ``connection`` whose statements the server prepares (PostgreSQL with psycopg 3
    and ``SQLQUEUE["PREPARED_STATEMENTS"]``): each statement text is parsed and planned once per
    connection. Anywhere else Django's usual cursor. Either way wrapped as Django wraps its own
    (error translation, ``execute_wrapper``s, the query log). For statements of a fixed shape:
    each distinct text is one more prepared statement of the connection (psycopg keeps 100)."""
    if dialect.prepares_statements and get_settings().PREPARED_STATEMENTS:
        connection.ensure_connection()
        raw = dialect.preparing_cursor(connection.connection)
        if raw is not None:
            # What connection.cursor() does with the driver's cursor; Django has no public
            # way to choose the cursor class of one statement (nor do its type stubs list it).
            with cast(Any, connection)._prepare_cursor(raw) as cursor:
                yield cursor
            return
    with connection.cursor() as cursor:
        yield cursor


class StoreBase:
    """Consumer-side SQL on one database alias: what every store module needs.

    ``partition``, ``key`` and ``offset`` are reserved words in MySQL or PostgreSQL:
    raw SQL quotes them with :attr:`P` and :attr:`OFF` (and ``dialect.qn("key")``).
    """

    def __init__(self, using: str) -> None:
        self.using = using

    @property
    def connection(self) -> Any:
        return connections[self.using]

    @property
    def dialect(self) -> Dialect:
        return get_dialect(self.connection)

    @property
    def P(self) -> str:
        return self.dialect.qn("partition")

    @property
    def OFF(self) -> str:
        return self.dialect.qn("offset")

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A short transaction of the engine's own; yields a cursor.

        On MySQL/MariaDB Django's ``atomic()`` wraps a transaction in two more statements
        (mysqlclient's ``SET autocommit=0`` before it and ``SET autocommit=1`` after its
        COMMIT): on the worker's hot path -- sequencing, recording deliveries, acks, three
        transactions per batch -- that is a sixth of a batch's statements. There, on a
        connection in autocommit mode and outside any ``atomic()`` block, the transaction
        is ``START TRANSACTION`` ... ``COMMIT`` (``ROLLBACK`` on an error) instead. Anything
        else (PostgreSQL and SQLite, whose ``atomic()`` costs nothing extra, or a caller's
        transaction to join, as an atomic consumer's ack does) gets ``atomic()``.

        Nothing inside may open ``atomic()`` itself: Django, unaware of the transaction,
        would commit it on its way out.
        """
        connection = self.connection
        dialect = self.dialect
        if not dialect.lean_transactions or connection.in_atomic_block or not connection.get_autocommit():
            with transaction.atomic(using=self.using), connection.cursor() as cursor:
                yield cursor
            return
        with connection.cursor() as cursor:
            cursor.execute(dialect.begin_sql)
            try:
                yield cursor
            except BaseException:
                try:
                    cursor.execute("ROLLBACK")
                except Exception:  # noqa: BLE001 - the connection is broken: the server rolls back
                    connection.close()
                raise
            cursor.execute("COMMIT")

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.rowcount

    def _fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    def _fetchall_hot(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """:meth:`_fetchall` for the statements on the path from a commit to a handler (the
        poll state, the fetch, sequencing, recording deliveries and acks).

        On PostgreSQL with ``SQLQUEUE["PREPARED_STATEMENTS"]`` (the default) it is a
        server-side prepared statement, planned once per connection and statement shape
        instead of at every call: the poll state query takes 0.27 ms prepared against
        1.0 ms planned each time (issue 33). Django's cursor wrapper still wraps it: its
        error translation, ``execute_wrapper``s and query log see it as any other.
        """
        with preparing_cursor(self.connection, self.dialect) as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    def now(self) -> dt.datetime:
        """Return the database's current time."""
        d = self.dialect
        (row,) = self._fetchall(f"SELECT {d.now_sql}")
        return d.to_datetime(row[0])

    def connection_limits(self) -> list[tuple[str, int, int]]:
        """Return the server's limits on this account's connections: ``(what, limit, in_use)``
        each (see ``Dialect.connection_limits``); none on SQLite."""
        with self.connection.cursor() as cursor:
            return self.dialect.connection_limits(cursor)

    def match_offsets(self, keys: Sequence[tuple[int, int]]) -> tuple[str, list[Any]]:
        """``(partition = ? AND message_offset IN (...)) OR ...`` for (partition, offset) pairs.

        Not a row-constructor ``(partition, message_offset) IN ((..), ..)``: MariaDB
        plans that one quadratically (1,000 pairs took 1.2 s); this form is index ranges.
        """
        by_partition: dict[int, list[int]] = {}
        for partition, offset in sorted(keys):
            by_partition.setdefault(partition, []).append(offset)
        parts, params = [], []
        for partition, offsets in by_partition.items():
            parts.append(f"({self.P} = %s AND message_offset IN ({in_list(offsets)}))")
            params += [partition, *offsets]
        return f"({' OR '.join(parts)})", params

    def lock_held(self, cursor: Any, group: str, topic: str, name: str, partitions: Sequence[int]) -> set[int]:
        """Share-lock ``name``'s lease rows of ``partitions``; return those it still holds.

        The fence of every write a worker makes to a partition's delivery state and
        watermark: the write runs in the same transaction, after this read, and only for
        the partitions returned. An operator (or a thief of an expired lease) changes a
        lease row with an exclusive lock, so it waits for this short transaction, and the
        holder's next write finds the lease gone: a worker that lost a partition can no
        longer write anything of it. (SQLite: the database write lock serializes anyway.)
        """
        if not partitions:
            return set()
        # On a thread that runs handlers too, a freeze from here to COMMIT must not keep
        # these share locks: the statement bounds the transaction's idle time (db/session.py).
        bound = bound_engine_transaction(self.connection, cursor)
        sql, params = self.held_leases(group, topic, name, partitions, bound=bound)
        cursor.execute(sql, params)
        return {int(row[0]) for row in cursor.fetchall()}

    def relaxed_commit(self) -> str:
        """``", <expression>"`` for the select list of a one-statement delivery record or ack
        on PostgreSQL: its transaction commits without waiting for the WAL flush
        (``SQLQUEUE["SYNCHRONOUS_ACKS"]`` False, the default); ``""`` otherwise.

        At-least-once holds either way. Every commit is visible to others at once, flushed
        or not, and the server writes the log in order, so a crash of the server can only
        forget a suffix of these commits: deliveries and acks, never a message nor an offset
        (publishing and sequencing keep waiting for their flush). A forgotten ack means its
        message is delivered again; a forgotten delivery record, that its attempt did not
        count. Any later waiting commit -- a handler's own write, the next sequencing round --
        flushes them too. This takes one flush off the path from a message's commit to its
        handler (issue 33: 5.3 WAL flushes per job to 3.4 in the peer harness).
        """
        sql = self.dialect.relaxed_commit_sql
        if sql is None or get_settings().SYNCHRONOUS_ACKS:
            return ""
        return f", {sql}"

    def held_leases(
        self, group: str, topic: str, name: str, partitions: Sequence[int], *, bound: str = "", as_array: bool = False
    ) -> tuple[str, list[Any]]:
        """The fence's statement and its parameters: the share-locking read of ``name``'s
        lease rows of ``partitions`` (see :meth:`lock_held`), in partition order so that two
        fences never wait on each other crosswise. The one-statement writes of PostgreSQL
        (``_mark_fresh``, ``_ack_contiguous_fused``) put it in a ``WITH`` as ``held``, with
        ``as_array``: the partitions as one array parameter, so that every partition count
        is the same prepared statement."""
        P, wanted = self.P, sorted(set(partitions))
        values: list[Any]
        if as_array:
            match, values = "= ANY(%s::bigint[])", [wanted]
        else:
            match, values = f"IN ({in_list(wanted)})", wanted
        sql = (
            f"SELECT {P} FROM queue_partition_leases WHERE consumer_group = %s AND topic = %s "
            f"AND leased_by = %s AND {P} {match}{bound} ORDER BY {P} {self.dialect.for_share}"
        )
        return sql, [group, topic, name, *values]
