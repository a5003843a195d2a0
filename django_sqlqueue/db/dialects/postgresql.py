"""PostgreSQL 13+ (psycopg 3)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from .base import Dialect


class PostgreSQLDialect(Dialect):
    # statement_timestamp(), not now(): now() is frozen at the start of a transaction.
    now_sql = "statement_timestamp()"
    now_plus_us_sql = "(statement_timestamp() + %s::bigint * interval '1 microsecond')"
    epoch_sql = "CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION)"
    json_placeholder = "%s::jsonb"
    empty_json_sql = "'{}'::jsonb"
    datetime_placeholder = "%s::timestamptz"
    bool_placeholder = "%s::boolean"
    supports_notify = True
    writable_ctes = True
    prepares_statements = True
    # synchronous_commit for this transaction only (is_local): read when it commits.
    relaxed_commit_sql = "set_config('synchronous_commit', 'off', true)"
    # jsonb is stored parsed and printed in its own form ({"n": 5}, its own key order).
    json_text_is_compact = False
    # A count of a partition's offset range (a seek's preview) that covers one partition of
    # eight is cheaper as a scan of the table than through the index, by the statistics --
    # until the table holds 10,000,000 messages (issue 32: seen after an ANALYZE at 1M).
    no_table_scan_sql = ("SET LOCAL enable_seqscan = off", "SET LOCAL enable_seqscan TO DEFAULT")
    # Index entries point at heap tuples: a seek by time gains nothing by a bound on seq.
    index_entries_hold_seq = False
    # One round trip for a worker's sequencing round instead of seven (migration 0011).
    sequence_round_sql = (
        "SELECT moved_partition, moved_head FROM sqlqueue_sequence_round(%s, %s::bigint[], %s::integer, %s::integer)"
    )
    sequence_round_from = "sqlqueue_sequence_round(%s, {partitions}, %s::integer, %s::integer)"

    def execute_insert(
        self,
        cursor: Any,
        sql: str,
        params: Sequence[Any],
        ids: Sequence[str],
        skip_duplicates: bool,
        notify: str | None = None,
    ) -> set[str]:
        """The INSERT, and with ``notify`` a ``pg_notify`` of that channel in the same
        statement (no extra round trip), its payload the message's partition. PostgreSQL
        queues a notification with the transaction and delivers it only if the transaction
        commits; the copies that several rows of a partition (or several publishes of one
        transaction) send are folded into one."""
        if notify is None:
            return super().execute_insert(cursor, sql, params, ids, skip_duplicates)
        conflict = " ON CONFLICT (topic, id) DO NOTHING" if skip_duplicates else ""
        # The payload is the message's partition: a listener wakes its worker only for the
        # partitions it leases (PostgreSQL folds the copies of one partition into one).
        cursor.execute(
            f'WITH ins AS ({sql}{conflict} RETURNING id, "partition") '
            'SELECT ins.id, pg_notify(%s, ins."partition"::text) FROM ins',
            [*params, notify],
        )
        if not skip_duplicates:
            # Every row was inserted (a duplicate id would have raised): the result need not be
            # read. Converting its row took 7% of a publish's client CPU (py-spy,
            # docs/benchmarks.md, stop 43).
            return set()
        inserted = {row[0] for row in cursor.fetchall()}
        return set(ids) - inserted

    def preparing_cursor(self, raw: Any) -> Any | None:
        """A server-side-binding cursor of Django's psycopg 3 connection ``raw`` that prepares
        every statement it runs (psycopg names each one and keeps up to ``prepared_max`` per
        connection). Django itself prepares nothing by default, for the sake of poolers.
        None with psycopg2."""
        cursor_class = _preparing_cursor_class()
        if cursor_class is None:
            return None
        if raw.prepare_threshold is None:
            # Django turns psycopg's preparing off (None), which also ignores prepare=True.
            # A threshold no statement reaches prepares only what asks for it: ours. (Django's
            # own cursors bind on the client side and are never prepared.)
            raw.prepare_threshold = sys.maxsize
        return cursor_class(raw)

    def hour_sql(self, column: str) -> str:
        # date_trunc of a timestamptz truncates in the session's time zone: truncate in UTC.
        return f"(date_trunc('hour', {column} AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')"

    def sequenced_rows(self, topic: str, ranges: Mapping[int, tuple[int, int]]) -> tuple[str, list[Any]]:
        """The ranges as three unnested arrays, joined to the log: one index range scan per
        partition, and one statement text whatever the number of partitions. (OR-ed ranges
        that happen to be equal are folded by the planner into one offset range over every
        partition of the topic, filtered.)"""
        parts = sorted(ranges)
        source = (
            "unnest(%s::bigint[], %s::bigint[], %s::bigint[]) AS r(p, lo, hi) JOIN queue_messages m "
            'ON m.topic = %s AND m."partition" = r.p AND m."offset" BETWEEN r.lo AND r.hi'
        )
        return source, [parts, [ranges[p][0] for p in parts], [ranges[p][1] for p in parts], topic]

    def idle_transaction_timeout_sql(self, seconds: int | None) -> str | None:
        value = "DEFAULT" if seconds is None else int(seconds) * 1000
        return f"SET idle_in_transaction_session_timeout = {value}"

    def idle_transaction_bound_filter(self, seconds: int) -> str | None:
        # set_config(..., is_local => true) is SET LOCAL: this transaction only. It is
        # volatile, so it runs for the rows the rest of the WHERE selects: where none is
        # selected, the statement locked nothing and the transaction ends without writing.
        return f"set_config('idle_in_transaction_session_timeout', '{int(seconds) * 1000}', true) IS NOT NULL"

    def listen_sql(self, channel: str) -> str:
        """``LISTEN "<channel>"`` (a quoted identifier: the channel is a topic's name)."""
        return f"LISTEN {self.qn(channel)}"

    def start_listening(self, raw: Any, application_name: str, channels: Sequence[str]) -> None:
        """``application_name`` (``pg_stat_activity``; cut to 63 characters, PostgreSQL's identifier length), then
        one ``LISTEN`` per channel, each its own autocommitted statement on ``raw`` (a psycopg
        connection): LISTEN takes effect when its transaction commits, which is at once."""
        raw.execute("SELECT set_config('application_name', %s, false)", [application_name[:63]])
        for channel in channels:
            raw.execute(self.listen_sql(channel))

    def unsequenced_rows(self, limit: int, *, read_ahead: bool = False) -> str:
        """For a read-ahead, all of the partition's unsequenced rows first, then the first ``limit``.

        Over a large backlog whose statistics still say "most offsets are NULL" (a
        backfill), the planner walks the primary key in ``seq`` order, filtering: every
        read then steps over every message already sequenced, and sequencing a backlog is
        quadratic. ``OFFSET 0`` fences the subquery so the rows come from the offset
        indexes (a bitmap scan of the unsequenced entries) and a top-N sort orders them:
        one pass over the backlog per read, which the read-ahead makes rare.
        """
        if not read_ahead:
            return super().unsequenced_rows(limit)
        return (
            'SELECT p, seq FROM (SELECT "partition" AS p, seq FROM queue_messages '
            'WHERE topic = %s AND "partition" = %s AND "offset" IS NULL OFFSET 0) AS u '
            f"ORDER BY seq LIMIT {int(limit)}"
        )

    def assign_offsets(self, cursor: Any, offsets: Sequence[tuple[int, int]]) -> int:
        """One UPDATE joined with the (seq, offset) pairs as two unnested arrays: linear."""
        cursor.execute(
            'UPDATE queue_messages m SET "offset" = v.o FROM unnest(%s::bigint[], %s::bigint[]) AS v(s, o) '
            'WHERE m.seq = v.s AND m."offset" IS NULL',
            [[seq for seq, _ in offsets], [offset for _, offset in offsets]],
        )
        return int(cursor.rowcount)

    counts_on_assign = True

    def assign_offsets_counted(self, cursor: Any, topic: str, offsets: Sequence[tuple[int, int]], slots: int) -> int:
        """The offsets' UPDATE and the per-hour counters' upsert in one statement: the counts
        come from the rows the UPDATE returns, where :meth:`count_sequenced` reads them back
        through the offset index (a sixth of a bulk sequencing's time at 1,000,000)."""
        hour = self.hour_sql("n.published_at")
        cursor.execute(
            'WITH numbered AS (UPDATE queue_messages m SET "offset" = v.o '
            'FROM unnest(%s::bigint[], %s::bigint[]) AS v(s, o) WHERE m.seq = v.s AND m."offset" IS NULL '
            'RETURNING m."partition", m.published_at), '
            'counted AS (INSERT INTO queue_topic_hours (topic, "hour", slot, "messages") '
            f'SELECT %s, {hour} AS h, n."partition" %% %s AS sl, COUNT(*) FROM numbered n '
            'GROUP BY h, sl ORDER BY h, sl ON CONFLICT (topic, "hour", slot) '
            'DO UPDATE SET "messages" = queue_topic_hours."messages" + excluded."messages") '
            "SELECT COUNT(*) FROM numbered",
            [[seq for seq, _ in offsets], [offset for _, offset in offsets], topic, int(slots)],
        )
        return int(cursor.fetchone()[0])

    def connection_limits(self, cursor: Any) -> list[tuple[str, int, int]]:
        """``max_connections`` (less the slots reserved for superusers and, on PostgreSQL
        16+, for ``pg_use_reserved_connections``, unless this role is a superuser) against
        the client backends open now; and, for a role that is not a superuser, its own
        ``CONNECTION LIMIT`` and its database's (-1: none), against their connections.

        A read of settings, catalogs and ``pg_stat_activity`` (every role may count its
        rows): no lock.
        """
        cursor.execute(
            "SELECT r.rolsuper, "
            "current_setting('max_connections')::int - CASE WHEN r.rolsuper THEN 0 ELSE "
            "current_setting('superuser_reserved_connections')::int "
            "+ coalesce(current_setting('reserved_connections', true), '0')::int END, "
            "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'), "
            "r.rolconnlimit, "
            "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND usename = current_user), "
            "d.datconnlimit, "
            "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
            "AND datname = current_database()) "
            "FROM pg_roles r, pg_database d WHERE r.rolname = current_user AND d.datname = current_database()"
        )
        superuser, limit, in_use, role_limit, role_in_use, db_limit, db_in_use = cursor.fetchone()
        limits = [("max_connections", int(limit), int(in_use))]
        if not superuser and role_limit >= 0:
            limits.append(("the role's CONNECTION LIMIT", int(role_limit), int(role_in_use)))
        if not superuser and db_limit >= 0:
            limits.append(("the database's CONNECTION LIMIT", int(db_limit), int(db_in_use)))
        return limits


@functools.cache
def _preparing_cursor_class() -> Any:
    """Django's psycopg 3 server-binding cursor, preparing each statement; None with psycopg2."""
    try:
        from django.db.backends.postgresql.base import ServerBindingCursor
    except ImportError:  # psycopg2: Django defines that class only for psycopg 3
        return None
    base: Any = ServerBindingCursor

    class PreparingCursor(base):
        def execute(
            self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None
        ) -> Any:
            result = super().execute(query, params, prepare=True, binary=binary)
            if getattr(self, "_query", None) is None and isinstance(query, str):
                # psycopg keeps no query of a prepared execution; Django's query log (DEBUG,
                # CaptureQueriesContext) reads it from here, and would show None.
                self._query = _Shown(self.connection, query, params)
            return result

    return PreparingCursor


class _Shown:
    """What Django's ``last_executed_query`` reads of a cursor's last query: the statement
    with its parameters as literals, composed only if something reads it."""

    def __init__(self, raw: Any, query: str, params: Any) -> None:
        self._raw, self._query, self._params = raw, query, params

    @property
    def query(self) -> bytes:
        import psycopg

        return psycopg.ClientCursor(self._raw).mogrify(self._query, self._params).encode()
