"""The dialect interface and the SQL shared by every database."""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, overload

from django.db.backends.base.base import BaseDatabaseWrapper

#: Columns written when a message is stored, in statement order. ``seq`` comes from
#: AUTO_INCREMENT/identity and ``offset`` stays NULL until the sequencer numbers the row.
MESSAGE_COLUMNS = (
    "topic",
    "partition",
    "key",
    "id",
    "payload",
    "metadata",
    "deliver_at",
    "failed_at",
    "failure_count",
    "last_error",
    "original_topic",
    "created_at",
    "published_at",
)

#: Rows per multi-row INSERT, and the payload bytes after which a statement is cut
#: (well under the 16 MiB default ``max_allowed_packet``).
MAX_ROWS_PER_INSERT = 500
MAX_BYTES_PER_INSERT = 4 * 1024 * 1024


@dataclass(frozen=True)
class MessageRow:
    """One message to insert."""

    partition: int
    key: str
    id: str
    payload_json: str
    metadata_json: str
    #: Absolute delivery time, or None for "database now + delay_us".
    deliver_at: dt.datetime | None = None
    delay_us: int = 0
    # Dead-letter fields (see the DLQ move): failed_at is set to the database's now.
    failed: bool = False
    failure_count: int = 0
    last_error: str = ""
    original_topic: str = ""
    #: Creation time to keep (a dead letter keeps its original's), or None for now.
    created_at: dt.datetime | None = None

    @property
    def size(self) -> int:
        """Bytes of the row's text values, roughly what it adds to a statement."""
        return len(self.payload_json) + len(self.metadata_json) + len(self.last_error) + len(self.id) + len(self.key)


def in_list(values: Sequence[Any]) -> str:
    """Return ``%s, %s, ...``: the placeholders of an IN list of ``values``."""
    return ", ".join(["%s"] * len(values))


class InsertPlan(NamedTuple):
    """The statement shape shared by every chunk of one :meth:`Dialect.insert_messages` call.

    Built per call and handed to :meth:`Dialect.insert_chunk`: a dialect is cached per
    connection, so per-call state must not live on it. (A NamedTuple: built on every
    ``publish()``, it costs a fraction of a frozen dataclass.)
    """

    #: The ``(...)`` of one row of the VALUES list.
    row_sql: str
    #: Every row's metadata is ``{}``: a literal in ``row_sql``, no parameter.
    no_metadata: bool
    #: Rows carry ``deliver_at``/``delay_us`` parameters.
    scheduled: bool
    #: Rows carry the dead-letter parameters (failed, count, error, original topic, created).
    dead_letters: bool


def statements(rows: Sequence[MessageRow], max_bytes: int = MAX_BYTES_PER_INSERT) -> Iterator[Sequence[MessageRow]]:
    """Cut rows into statements of bounded row count and size."""
    start, size = 0, 0
    for index, row in enumerate(rows):
        size += row.size
        if index - start >= MAX_ROWS_PER_INSERT or (size > max_bytes and index > start):
            yield rows[start:index]
            start, size = index, row.size
    if start < len(rows):
        yield rows[start:]


class Dialect:
    """SQL for one database vendor.

    Subclasses set the SQL fragments below and override methods where the vendor has
    a better statement. Times always come from the database clock (``now_sql``).
    """

    #: The database's current UTC time, constant within one statement.
    now_sql = "CURRENT_TIMESTAMP"
    #: ``now_sql`` plus a number of microseconds given as one parameter.
    now_plus_us_sql = "CURRENT_TIMESTAMP"
    #: Starts a transaction explicitly while the connection is in autocommit mode.
    begin_sql = "BEGIN"
    #: Whether the engine's short transactions open with :attr:`begin_sql` on the autocommit
    #: connection instead of Django's ``atomic()`` (``StoreBase.transaction``): on MySQL
    #: ``atomic()`` costs two statements more.
    lean_transactions = False
    json_placeholder = "%s"
    #: An empty JSON object as a SQL literal.
    empty_json_sql = "'{}'"
    datetime_placeholder = "%s"
    bool_placeholder = "%s"
    #: Suffix of a SELECT that share-locks the rows it reads until the transaction ends.
    for_share = "FOR SHARE"
    #: Suffix of a SELECT that exclusively locks the rows it reads.
    for_update = "FOR UPDATE"
    #: Every topic present in ``queue_messages``, sorted, without a scan (the console's
    #: topic list; a plain read, no locks). PostgreSQL and SQLite have no loose index
    #: scan: a recursive CTE emulates it, each step one index probe for the smallest
    #: topic above the previous one. MySQL/MariaDB override it.
    distinct_topics_sql = (
        "WITH RECURSIVE t(topic) AS ("
        " SELECT MIN(topic) FROM queue_messages"
        " UNION ALL"
        " SELECT (SELECT MIN(m.topic) FROM queue_messages m WHERE m.topic > t.topic)"
        " FROM t WHERE t.topic IS NOT NULL"
        ") SELECT topic FROM t WHERE topic IS NOT NULL ORDER BY topic"
    )
    #: Two-argument maximum.
    greatest = "GREATEST"
    #: Whether reports find the unsequenced rows through the partitions' head rows (a join,
    #: one index range per partition) rather than by ``offset IS NULL`` alone. PostgreSQL and
    #: SQLite have a partial index of the unsequenced rows, so the plain condition reads only
    #: the backlog; MySQL/MariaDB's unique (topic, partition, offset) index holds the NULLs
    #: at the head of each partition's range, which only a known partition reaches.
    unsequenced_via_heads = False
    #: Whether the database delivers notifications on commit (PostgreSQL's NOTIFY/LISTEN):
    #: publishes then announce their topics and workers listen (``notifications.py``).
    supports_notify = False

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection
        self.qn = connection.ops.quote_name
        self._plans: dict[tuple[bool, bool, bool], InsertPlan] = {}

    def listen_sql(self, channel: str) -> str:
        """The statement that subscribes a connection to ``channel`` (:attr:`supports_notify`)."""
        raise NotImplementedError(f"{self.connection.vendor} has no notifications")

    def idle_transaction_timeout_sql(self, seconds: int | None) -> str | None:
        """The statement that makes the server end this session when a transaction of it
        stays idle (no statement running) for ``seconds`` (None: the server's default),
        rolling it back and so releasing its locks; None where the database has no such
        setting (SQLite, MySQL).

        Set on the worker's engine connections only (``engine_session.py``): a
        process frozen inside one of its short transactions (SIGSTOP, a VM pause, a
        debugger) would otherwise hold its lease rows' share locks, and so every lease
        steal, until it resumes."""
        return None

    def excluded(self, column: str) -> str:
        """The value an upsert tried to insert into ``column``."""
        return f"excluded.{column}"

    def on_conflict_update(self, conflict: Sequence[str]) -> str:
        """Start of an upsert's update clause (followed by ``col = expr, ...``)."""
        return f"ON CONFLICT ({', '.join(map(self.qn, conflict))}) DO UPDATE SET"

    def on_conflict_ignore(self, conflict: Sequence[str], noop: str) -> str:
        """Clause that turns a duplicate-key insert into a no-op.

        ``noop`` names a column of the target table only (MySQL assigns it to itself).
        """
        return f"ON CONFLICT ({', '.join(map(self.qn, conflict))}) DO NOTHING"

    def use_index(self, name: str) -> str:
        """An index hint after a table name (MySQL/MariaDB only; elsewhere nothing).

        For lookups of unsequenced messages (NULL offsets): PostgreSQL and SQLite have a
        partial index for them (migration 0003); MariaDB's optimizer, estimating from a
        ``topic`` prefix, would otherwise walk the topic's ``(topic, seq)`` entries.
        """
        return ""

    def unsequenced_rows(self, limit: int, *, read_ahead: bool = False) -> str:
        """SELECT partition, seq of one partition's first ``limit`` unsequenced messages by seq.

        Parameters: topic, partition. The sequencer's read, step (2) of ``sequencer.py``: a
        plain read, no lock. ``read_ahead``: the bulk sequencer's large read (see
        :meth:`PostgreSQLDialect.unsequenced_rows`).
        """
        p, o = self.qn("partition"), self.qn("offset")
        return (
            f"SELECT {p}, seq FROM queue_messages {self.use_index('queue_msg_offset')} "
            f"WHERE topic = %s AND {p} = %s AND {o} IS NULL ORDER BY seq LIMIT {int(limit)}"
        )

    def union_branch(self, select: str, index: int) -> str:
        """Wrap a SELECT with its own ORDER BY/LIMIT as one branch of a UNION ALL.

        Parentheses, where the database accepts them: a derived table
        (``SELECT * FROM (...) AS b``) makes MariaDB write an on-disk temporary table
        for every branch, because the rows carry LONGTEXT payloads.
        """
        return f"({select})"

    def now_minus(self, seconds: float) -> tuple[str, list[Any]]:
        """SQL (and its parameter) for the database's now minus ``seconds``."""
        return self.now_plus_us_sql, [-round(seconds * 1_000_000)]

    def now_plus(self, seconds: float) -> tuple[str, list[Any]]:
        """SQL (and its parameter) for the database's now plus ``seconds``."""
        return self.now_plus_us_sql, [round(seconds * 1_000_000)]

    @overload
    def to_datetime(self, value: None) -> None: ...

    @overload
    def to_datetime(self, value: dt.datetime | str) -> dt.datetime: ...

    @overload
    def to_datetime(self, value: dt.datetime | str | None) -> dt.datetime | None: ...

    def to_datetime(self, value: dt.datetime | str | None) -> dt.datetime | None:
        """Convert a datetime read by raw SQL to an aware UTC datetime (None stays None)."""
        if value is None:
            return None
        if isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)

    def literal(self, value: Any) -> str:
        """Return ``value`` as a SQL literal, escaped by the driver (for SQL text another
        client runs, e.g. Spark's JDBC reader; everything else binds parameters)."""
        raise NotImplementedError(f"SQL literals are built for MySQL/MariaDB only, not {self.connection.vendor}.")

    def load_json(self, value: Any) -> Any:
        """Decode a JSON column read by raw SQL (drivers return text or objects)."""
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = bytes(value).decode()
        if isinstance(value, str):
            return {} if value == "{}" else json.loads(value)
        return value

    def adapt_datetime(self, value: dt.datetime | None) -> Any:
        """Convert an aware datetime to the parameter Django would send."""
        return self.connection.ops.adapt_datetimefield_value(value)

    # -- publishing ---------------------------------------------------------------

    @functools.cached_property
    def message_columns(self) -> str:
        """The quoted column list of a message INSERT."""
        return ", ".join(self.qn(c) for c in MESSAGE_COLUMNS)

    def max_statement_bytes(self, cursor: Any) -> int | None:
        """The largest statement the server accepts, if it has a limit worth checking."""
        return None

    def connection_limits(self, cursor: Any) -> list[tuple[str, int, int]]:
        """The limits on this account's connections: ``(what, limit, in_use)`` each, e.g.
        ``("max_connections", 151, 42)``; none where the server has no such limit (SQLite)."""
        return []

    #: Ids per look-up statement of :meth:`existing_messages`.
    lookup_chunk = 500

    def existing_messages(self, cursor: Any, topic: str, ids: Sequence[str]) -> dict[str, tuple[str, int, Any]]:
        """Return ``{id: (key, partition, payload)}`` of the ids stored in ``topic``.

        A plain read on the caller's cursor, inside the caller's transaction: under READ
        COMMITTED (and PostgreSQL's default) it takes no lock and sees every id committed
        before the statement started.
        """
        found: dict[str, tuple[str, int, Any]] = {}
        k, p = self.qn("key"), self.qn("partition")
        for start in range(0, len(ids), self.lookup_chunk):
            chunk = list(ids[start : start + self.lookup_chunk])
            cursor.execute(
                f"SELECT id, {k}, {p}, payload FROM queue_messages WHERE topic = %s AND id IN ({in_list(chunk)})",
                [topic, *chunk],
            )
            for message_id, key, partition, payload in cursor.fetchall():
                found[message_id] = (key, int(partition), self.load_json(payload))
        return found

    def is_too_large(self, exc: BaseException) -> bool:
        """Return True when ``exc`` is the server refusing a statement or row as too large."""
        return False

    def is_duplicate_key(self, exc: BaseException) -> bool:
        """Return True when ``exc`` is a unique-key violation that failed one statement only.

        Only MySQL's plain INSERT (see ``MySQLDialect.insert_chunk``) meets it: elsewhere
        duplicates are skipped with ``ON CONFLICT DO NOTHING`` and never raise.
        """
        return False

    def insert_messages(
        self, cursor: Any, topic: str, rows: Sequence[MessageRow], *, skip_duplicates: bool, notify: str | None = None
    ) -> set[str]:
        """Insert messages with multi-row INSERTs; return the ids skipped as duplicates.

        Only INSERTs: no row another publisher could touch is read with a lock or
        updated, so publishers never wait for each other -- except on the unique index
        of (topic, id), when two transactions insert the same id and uniqueness has to
        wait for the first to end.

        With ``skip_duplicates`` a row whose id exists already is left out without an
        error (``ON CONFLICT DO NOTHING``): an error would abort the caller's transaction
        on PostgreSQL. Columns that are the same for every row of a plain publish are
        SQL literals, so the per-row parameters (escaped one by one by the driver) stay
        few.

        ``notify``: a channel to notify in the same statement, where the database has
        notifications (:attr:`supports_notify`; ignored elsewhere).
        """
        plan = self.insert_plan(rows)
        skipped: set[str] = set()
        for chunk in statements(rows, self.max_statement_bytes(cursor) or MAX_BYTES_PER_INSERT):
            skipped |= self.insert_chunk(cursor, topic, chunk, plan, skip_duplicates, notify)
        return skipped

    def insert_plan(self, rows: Sequence[MessageRow]) -> InsertPlan:
        """Return the statement shape of inserting ``rows`` (see :meth:`insert_messages`)."""
        dead_letters = any(r.failed or r.original_topic or r.created_at for r in rows)
        scheduled = dead_letters or any(r.deliver_at is not None or r.delay_us for r in rows)
        # Empty metadata (the common case) is a literal, one parameter fewer per row.
        no_metadata = all(r.metadata_json == "{}" for r in rows)
        key = (no_metadata, scheduled, dead_letters)
        plan = self._plans.get(key)
        if plan is None:
            # Eight shapes at most, immutable: cached on the (per-connection) dialect.
            plan = self._plans[key] = self._build_plan(no_metadata, scheduled, dead_letters)
        return plan

    def _build_plan(self, no_metadata: bool, scheduled: bool, dead_letters: bool) -> InsertPlan:
        ts, now, json_ph = self.datetime_placeholder, self.now_sql, self.json_placeholder
        deliver_sql = f"COALESCE({ts}, {self.now_plus_us_sql})" if scheduled else now
        metadata_sql = self.empty_json_sql if no_metadata else json_ph
        if dead_letters:
            row_sql = (
                f"(%s, %s, %s, %s, {json_ph}, {metadata_sql}, {deliver_sql}, CASE WHEN {self.bool_placeholder} "
                f"THEN {now} END, %s, %s, %s, COALESCE({ts}, {now}), {now})"
            )
        else:
            row_sql = f"(%s, %s, %s, %s, {json_ph}, {metadata_sql}, {deliver_sql}, NULL, 0, '', '', {now}, {now})"
        return InsertPlan(row_sql=row_sql, no_metadata=no_metadata, scheduled=scheduled, dead_letters=dead_letters)

    def insert_chunk(
        self,
        cursor: Any,
        topic: str,
        chunk: Sequence[MessageRow],
        plan: InsertPlan,
        skip_duplicates: bool,
        notify: str | None = None,
    ) -> set[str]:
        """One INSERT statement for ``chunk``, shaped by ``plan`` (see :meth:`insert_messages`)."""
        adapt = self.adapt_datetime
        params: list[Any] = []
        for r in chunk:
            if plan.no_metadata:
                params += (topic, r.partition, r.key, r.id, r.payload_json)
            else:
                params += (topic, r.partition, r.key, r.id, r.payload_json, r.metadata_json)
            if plan.scheduled:
                params += (adapt(r.deliver_at), r.delay_us)
            if plan.dead_letters:
                params += (r.failed, r.failure_count, r.last_error, r.original_topic, adapt(r.created_at))
        sql = f"INSERT INTO queue_messages ({self.message_columns}) VALUES {', '.join([plan.row_sql] * len(chunk))}"
        return self.execute_insert(cursor, sql, params, [r.id for r in chunk], skip_duplicates, notify)

    def execute_insert(
        self,
        cursor: Any,
        sql: str,
        params: Sequence[Any],
        ids: Sequence[str],
        skip_duplicates: bool,
        notify: str | None = None,
    ) -> set[str]:
        """Run one multi-row message INSERT; return the ids it skipped as duplicates.

        PostgreSQL and SQLite: ``ON CONFLICT (topic, id) DO NOTHING RETURNING id``. A
        concurrent transaction inserting the same id makes this one wait for its end,
        then skip the row (PostgreSQL), without an error.
        """
        if not skip_duplicates:
            cursor.execute(sql, params)
            return set()
        cursor.execute(f"{sql} ON CONFLICT (topic, id) DO NOTHING RETURNING id", params)
        inserted = {row[0] for row in cursor.fetchall()}
        return set(ids) - inserted

    # -- sequencing -----------------------------------------------------------------

    #: Rows per offset-assigning statement of the generic form (see :meth:`assign_offsets`).
    assign_chunk = 200

    def assign_offsets(self, cursor: Any, offsets: Sequence[tuple[int, int]]) -> int:
        """Set ``offset`` of the unsequenced messages with these (seq, offset) pairs; return the rows set.

        The sequencer's write. Only rows still without an offset are written, so the count
        tells the sequencer whether every row it read is still there and unsequenced (see
        ``sequencer.py``: it rolls back otherwise).

        Generic form: ``SET offset = CASE seq WHEN .. THEN .. END WHERE seq IN (..)``. A
        CASE is evaluated WHEN by WHEN for every row, so one statement of n rows costs
        n^2/2 comparisons: statements of ``assign_chunk`` rows keep it linear. MySQL and
        PostgreSQL override this with a join against the pairs, one statement.
        """
        o = self.qn("offset")
        written = 0
        for start in range(0, len(offsets), self.assign_chunk):
            chunk = offsets[start : start + self.assign_chunk]
            params: list[Any] = []
            for seq, offset in chunk:
                params += [seq, offset]
            params += [seq for seq, _ in chunk]
            cursor.execute(
                f"UPDATE queue_messages SET {o} = CASE seq {' '.join(['WHEN %s THEN %s'] * len(chunk))} END "
                f"WHERE seq IN ({', '.join(['%s'] * len(chunk))}) AND {o} IS NULL",
                params,
            )
            written += cursor.rowcount
        return written

    # -- per-hour counters ----------------------------------------------------------

    def hour_sql(self, column: str) -> str:
        """SQL of the start of the UTC hour of the datetime ``column`` (a ``%`` doubled)."""
        raise NotImplementedError

    def count_sequenced(self, cursor: Any, topic: str, ranges: Mapping[int, tuple[int, int]], slots: int) -> None:
        """Add the messages just numbered to ``queue_topic_hours`` (the sequencer's round).

        ``ranges`` maps each partition to the first and last offset the round assigned.
        One ``INSERT ... SELECT ... GROUP BY`` upsert: the rows are found by their offset
        ranges on the (topic, partition, offset) index (this transaction's own writes),
        counted per (hour of ``published_at``, ``partition % slots``) and added to the
        counters. Inside the sequencer's transaction, after its head locks: it commits or
        rolls back with the offsets, so each message is counted once. The rows are
        upserted in key order (ORDER BY), so two sequencers that share counter rows lock
        them in the same order and cannot deadlock on them.
        """
        qn = self.qn
        source, params = self.sequenced_rows(topic, ranges)
        hour = self.hour_sql(f"m.{qn('published_at')}")
        n = qn("messages")
        cursor.execute(
            f"INSERT INTO queue_topic_hours (topic, {qn('hour')}, slot, {n}) "
            f"SELECT m.topic, {hour} AS h, m.{qn('partition')} %% {int(slots)} AS s, COUNT(*) FROM {source} "
            f"GROUP BY m.topic, h, s ORDER BY h, s "
            f"{self.on_conflict_update(['topic', 'hour', 'slot'])} {n} = {self.counter_sum(n)}",
            params,
        )

    def sequenced_rows(self, topic: str, ranges: Mapping[int, tuple[int, int]]) -> tuple[str, list[Any]]:
        """FROM and WHERE of the messages of ``topic`` in the offset ``ranges``, as ``m``.

        Generic form: one ``topic = t AND partition = p AND offset BETWEEN first AND last``
        per partition, OR-ed: MySQL/MariaDB's range optimizer and SQLite's OR optimization
        read each as a range of the (topic, partition, offset) index (SQLite only when each
        term names the whole index prefix). PostgreSQL joins the ranges instead.
        """
        P, OFF = self.qn("partition"), self.qn("offset")
        where = " OR ".join([f"(m.topic = %s AND m.{P} = %s AND m.{OFF} BETWEEN %s AND %s)"] * len(ranges))
        params: list[Any] = []
        for partition, (first, last) in sorted(ranges.items()):
            params += [topic, partition, first, last]
        return f"queue_messages m WHERE {where}", params

    def counter_sum(self, column: str) -> str:
        """The update of an upsert that adds the inserted ``column`` to the stored one."""
        return f"queue_topic_hours.{column} + {self.excluded(column)}"
