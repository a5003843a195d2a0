"""The dialect interface and the SQL that is the same on every database."""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

#: Columns written by ``publish()``, in the order of :meth:`Dialect.insert_messages` rows.
MESSAGE_INSERT_COLUMNS = (
    "topic",
    "partition_key",
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

#: Keep one IN (...) / OR list within reasonable statement sizes.
MAX_KEYS_PER_STATEMENT = 500


def chunks(items: Sequence[Any], size: int = MAX_KEYS_PER_STATEMENT) -> list[Sequence[Any]]:
    """Split ``items`` into consecutive slices of at most ``size``."""
    return [items[i : i + size] for i in range(0, len(items), size)]


class Dialect(ABC):
    """SQL for one database vendor.

    Subclasses override the class attributes (SQL fragments) and, where a vendor has a
    better statement, the methods.
    """

    #: Expression for the database's current UTC time, or None to use Python's clock
    #: (SQLite, whose clock *is* the process clock).
    now_sql: str | None = None
    #: Suffix that turns a SELECT into a locking read ("" where the database locks whole).
    for_update = " FOR UPDATE"
    #: Placeholder for a JSON parameter passed as text.
    json_placeholder = "%s"

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection
        self.qn = connection.ops.quote_name

    # -- values -------------------------------------------------------------------

    def adapt_datetime(self, value: dt.datetime | None) -> Any:
        """Convert an aware datetime to the driver parameter Django would send."""
        return self.connection.ops.adapt_datetimefield_value(value)

    def parse_datetime(self, value: Any) -> dt.datetime:
        """Convert a datetime read by raw SQL to an aware UTC datetime."""
        if isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return value

    # -- partition head rows ------------------------------------------------------

    def _select_heads(self, cursor: Any, topic: str, keys: Sequence[str]) -> tuple[dict[str, int], Any]:
        now = self.now_sql or "NULL"
        placeholders = ", ".join(["%s"] * len(keys))
        cursor.execute(
            f"SELECT partition_key, head_offset, {now} FROM queue_partitions "
            f"WHERE topic = %s AND partition_key IN ({placeholders}) "
            f"ORDER BY partition_key{self.for_update}",
            [topic, *keys],
        )
        heads: dict[str, int] = {}
        clock = None
        for key, head, clock in cursor.fetchall():
            heads[key] = head
        return heads, clock

    @abstractmethod
    def _insert_missing_heads(self, cursor: Any, topic: str, keys: Sequence[str], now: dt.datetime) -> None:
        """Insert head rows (head_offset 0) for ``keys``; do nothing for existing ones."""

    def lock_partitions(self, cursor: Any, topic: str, keys: Sequence[str]) -> tuple[dict[str, int], dt.datetime]:
        """Lock the head rows of ``keys`` (sorted), creating missing ones.

        Returns each partition's head offset before this publish and the database's
        current time. The row locks are held until the caller's transaction ends: a
        concurrent publisher of the same partition waits here, so offsets within a
        partition are handed out, and become visible, in commit order.

        Existing rows are locked first, by one locking read over the primary key in
        sorted order (record locks only under READ COMMITTED); missing rows are then
        inserted in sorted order. Two publishers locking overlapping sets in this order
        cannot deadlock on head rows.
        """
        heads: dict[str, int] = {}
        clock: Any = None
        for part in chunks(sorted(keys)):
            found, clock = self._select_heads(cursor, topic, part)
            heads.update(found)
        missing = [key for key in sorted(keys) if key not in heads]
        if missing:
            now = self.now(cursor) if clock is None else self.parse_datetime(clock)
            for part in chunks(missing):
                self._insert_missing_heads(cursor, topic, part, now)
                found, clock = self._select_heads(cursor, topic, part)
                heads.update(found)
        return heads, (self.now(cursor) if clock is None else self.parse_datetime(clock))

    def set_heads(self, cursor: Any, topic: str, heads: dict[str, int]) -> None:
        """Record the new head offset of each partition (rows already locked by us)."""
        cursor.executemany(
            "UPDATE queue_partitions SET head_offset = %s WHERE topic = %s AND partition_key = %s",
            [(head, topic, key) for key, head in sorted(heads.items())],
        )

    # -- messages -----------------------------------------------------------------

    def now(self, cursor: Any) -> dt.datetime:
        """Return the database's current time as an aware UTC datetime."""
        if self.now_sql is None:
            return dt.datetime.now(dt.timezone.utc)
        cursor.execute(f"SELECT {self.now_sql}")
        return self.parse_datetime(cursor.fetchone()[0])

    def insert_messages(self, cursor: Any, rows: Sequence[Sequence[Any]]) -> int | None:
        """Insert message rows (columns as ``MESSAGE_INSERT_COLUMNS``).

        Returns the offset of the row when exactly one was inserted, else None (the
        caller reads the offsets back).
        """
        columns = ", ".join(self.qn(c) for c in MESSAGE_INSERT_COLUMNS)
        placeholders = ", ".join(
            self.json_placeholder if c in ("payload", "metadata") else "%s" for c in MESSAGE_INSERT_COLUMNS
        )
        sql = f"INSERT INTO queue_messages ({columns}) VALUES ({placeholders})"
        if len(rows) == 1:
            return self._insert_one(cursor, sql, rows[0])
        cursor.executemany(sql, rows)
        return None

    def _insert_one(self, cursor: Any, sql: str, row: Sequence[Any]) -> int:
        cursor.execute(sql, row)
        return cursor.lastrowid

    def read_new_offsets(self, cursor: Any, topic: str, after: dict[str, int]) -> dict[str, list[int]]:
        """Return, per partition, the offsets above ``after[key]`` in ascending order.

        Only valid while we hold the partitions' head locks: then every such row is one
        this transaction inserted. Served by the (topic, partition_key, offset) index.
        """
        offset = self.qn("offset")
        result: dict[str, list[int]] = {key: [] for key in after}
        for part in chunks(sorted(after)):
            where = " OR ".join(f"(partition_key = %s AND {offset} > %s)" for _ in part)
            params: list[Any] = [topic]
            for key in part:
                params += [key, after[key]]
            cursor.execute(
                f"SELECT partition_key, {offset} FROM queue_messages WHERE topic = %s AND ({where}) "
                f"ORDER BY partition_key, {offset}",
                params,
            )
            for key, off in cursor.fetchall():
                result[key].append(off)
        return result
