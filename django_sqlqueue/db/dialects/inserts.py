"""The insert path: how messages become multi-row INSERT statements.

A mixin of :class:`~django_sqlqueue.db.dialects.base.Dialect`, with the row type and the
statement shapes it uses. The publisher (``db/store/messages.py``) builds
:class:`MessageRow` objects and calls :meth:`Inserts.insert_messages`; the vendor dialects
override :meth:`~Inserts.insert_chunk` (MySQL: duplicates found after the fact) and
:meth:`~Inserts.execute_insert` (PostgreSQL: NOTIFY in the same statement).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.db.backends.base.base import BaseDatabaseWrapper

from .conversions import Conversions

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
    """The statement shape shared by every chunk of one :meth:`Inserts.insert_messages` call.

    Built per call and handed to :meth:`Inserts.insert_chunk`: a dialect is cached per
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


class Inserts(Conversions):
    """Message INSERTs: look-ups of existing ids, statement plans and the INSERT itself."""

    #: Ids per look-up statement of :meth:`existing_messages`.
    lookup_chunk = 500

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        super().__init__(connection)
        self._plans: dict[tuple[bool, bool, bool], InsertPlan] = {}

    @functools.cached_property
    def message_columns(self) -> str:
        """The quoted column list of a message INSERT."""
        return ", ".join(self.qn(c) for c in MESSAGE_COLUMNS)

    def max_statement_bytes(self, cursor: Any) -> int | None:
        """The largest statement the server accepts, if it has a limit worth checking."""
        return None

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
        notifications (``supports_notify``; ignored elsewhere).
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
