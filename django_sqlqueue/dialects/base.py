"""The dialect interface and the SQL shared by every database."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

#: Columns written when a message is stored, in statement order.
MESSAGE_COLUMNS = (
    "topic",
    "partition_key",
    "offset",
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
    """One message to insert, with its offset already allocated."""

    partition_key: str
    offset: int
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


def _statements(rows: Sequence[MessageRow]) -> Iterator[Sequence[MessageRow]]:
    """Cut rows into statements of bounded row count and size."""
    start, size = 0, 0
    for index, row in enumerate(rows):
        size += len(row.payload_json) + len(row.metadata_json) + len(row.last_error)
        if index - start >= MAX_ROWS_PER_INSERT or (size > MAX_BYTES_PER_INSERT and index > start):
            yield rows[start:index]
            start, size = index, len(row.payload_json) + len(row.metadata_json) + len(row.last_error)
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
    json_placeholder = "%s"
    datetime_placeholder = "%s"
    bool_placeholder = "%s"

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection
        self.qn = connection.ops.quote_name

    #: Two-argument maximum.
    greatest = "GREATEST"

    def excluded(self, column: str) -> str:
        """The value an upsert tried to insert into ``column``."""
        return f"excluded.{column}"

    def on_conflict_update(self, conflict: Sequence[str]) -> str:
        """Start of an upsert's update clause (followed by ``col = expr, ...``)."""
        return f"ON CONFLICT ({', '.join(conflict)}) DO UPDATE SET"

    def on_conflict_ignore(self, conflict: Sequence[str], noop: str) -> str:
        """Clause that turns a duplicate-key insert into a no-op.

        ``noop`` names a column of the target table only (MySQL assigns it to itself).
        """
        return f"ON CONFLICT ({', '.join(conflict)}) DO NOTHING"

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

    def to_datetime(self, value: Any) -> dt.datetime | None:
        """Convert a datetime read by raw SQL to an aware UTC datetime."""
        if value is None:
            return None
        if isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc)

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

    # -- partition head rows ------------------------------------------------------

    def allocate(self, cursor: Any, topic: str, counts: Mapping[str, int]) -> dict[str, int]:
        """Lock the partitions' head rows and reserve ``counts[key]`` offsets in each.

        Returns each partition's new head offset: the reserved offsets of ``key`` are
        ``head - counts[key] + 1 .. head``. Missing head rows are created. The row locks
        are held until the caller's transaction ends, so a concurrent publisher of the
        same partition waits here: offsets are handed out, and become visible, in
        commit order. Rows are locked in sorted key order, so two publishers of
        overlapping partition sets cannot deadlock on them.

        This default is one upsert with RETURNING (PostgreSQL, SQLite >= 3.35): the
        conflict path locks the existing row, the insert path the new one.
        """
        items = sorted(counts.items())
        values = ", ".join([f"(%s, %s, %s, {self.now_sql})"] * len(items))
        params: list[Any] = []
        for key, count in items:
            params += [topic, key, count]
        cursor.execute(
            "INSERT INTO queue_partitions (topic, partition_key, head_offset, created_at) "
            f"VALUES {values} ON CONFLICT (topic, partition_key) DO UPDATE "
            "SET head_offset = queue_partitions.head_offset + excluded.head_offset "
            "RETURNING partition_key, head_offset",
            params,
        )
        return dict(cursor.fetchall())

    def release(self, cursor: Any, topic: str, unused: Mapping[str, int]) -> None:
        """Give back reserved offsets that were not used (the head rows are ours)."""
        for key, count in sorted(unused.items()):
            cursor.execute(
                "UPDATE queue_partitions SET head_offset = head_offset - %s WHERE topic = %s AND partition_key = %s",
                [count, topic, key],
            )

    # -- messages -----------------------------------------------------------------

    def insert_messages(self, cursor: Any, topic: str, rows: Sequence[MessageRow]) -> None:
        """Insert messages with multi-row INSERTs (offsets already allocated).

        Columns that are the same for every row of a plain publish are SQL literals, so
        the per-row parameters (escaped one by one by the driver) stay few.
        """
        columns = ", ".join(self.qn(c) for c in MESSAGE_COLUMNS)
        ts, now, json_ph = self.datetime_placeholder, self.now_sql, self.json_placeholder
        adapt = self.adapt_datetime
        dead_letters = any(r.failed or r.original_topic or r.created_at for r in rows)
        scheduled = dead_letters or any(r.deliver_at is not None or r.delay_us for r in rows)
        deliver_sql = f"COALESCE({ts}, {self.now_plus_us_sql})" if scheduled else now
        if dead_letters:
            row_sql = (
                f"(%s, %s, %s, %s, {json_ph}, {json_ph}, {deliver_sql}, CASE WHEN {self.bool_placeholder} "
                f"THEN {now} END, %s, %s, %s, COALESCE({ts}, {now}), {now})"
            )
        else:
            row_sql = f"(%s, %s, %s, %s, {json_ph}, {json_ph}, {deliver_sql}, NULL, 0, '', '', {now}, {now})"
        for chunk in _statements(rows):
            params: list[Any] = []
            for r in chunk:
                params += (topic, r.partition_key, r.offset, r.id, r.payload_json, r.metadata_json)
                if scheduled:
                    params += (adapt(r.deliver_at), r.delay_us)
                if dead_letters:
                    params += (r.failed, r.failure_count, r.last_error, r.original_topic, adapt(r.created_at))
            cursor.execute(f"INSERT INTO queue_messages ({columns}) VALUES {', '.join([row_sql] * len(chunk))}", params)
