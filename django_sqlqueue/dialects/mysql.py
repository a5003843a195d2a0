"""MySQL 8.0+ / MariaDB 10.6+.

Run queue connections at READ COMMITTED: under REPEATABLE READ, range scans take
next-key (gap) locks and concurrent claimers deadlock. Statements that can still take
gap locks (``INSERT ... ON DUPLICATE KEY UPDATE`` on new keys) touch keys in sorted
order, and callers retry error 1213.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .base import Dialect


class MySQLDialect(Dialect):
    # UTC_TIMESTAMP does not depend on the session time zone (Django stores UTC).
    now_sql = "UTC_TIMESTAMP(6)"
    begin_sql = "START TRANSACTION"
    now_plus_us_sql = "TIMESTAMPADD(MICROSECOND, %s, UTC_TIMESTAMP(6))"

    def excluded(self, column: str) -> str:
        return f"VALUES({column})"

    def on_conflict_update(self, conflict: Sequence[str]) -> str:
        return "ON DUPLICATE KEY UPDATE"

    def on_conflict_ignore(self, conflict: Sequence[str], noop: str) -> str:
        # Not INSERT IGNORE, which would also turn other errors into warnings.
        return f"ON DUPLICATE KEY UPDATE {noop} = {noop}"

    def allocate(self, cursor: Any, topic: str, counts: Mapping[str, int]) -> dict[str, int]:
        if len(counts) == 1:
            # The common case, one statement: an UPDATE by primary key takes an exclusive
            # record lock on the head row (no gap lock) and LAST_INSERT_ID(expr) hands the
            # new head back through the protocol's insert-id field, without a SELECT.
            ((key, count),) = counts.items()
            cursor.execute(
                "UPDATE queue_partitions SET head_offset = LAST_INSERT_ID(head_offset + %s) "
                "WHERE topic = %s AND partition_key = %s",
                [count, topic, key],
            )
            if cursor.rowcount == 0:
                # A new partition. If another publisher inserts it concurrently, the
                # duplicate-key path waits for its row lock, then increments.
                cursor.execute(
                    "INSERT INTO queue_partitions (topic, partition_key, head_offset, created_at) "
                    "VALUES (%s, %s, LAST_INSERT_ID(%s), UTC_TIMESTAMP(6)) "
                    "ON DUPLICATE KEY UPDATE head_offset = LAST_INSERT_ID(head_offset + %s)",
                    [topic, key, count, count],
                )
            return {key: cursor.lastrowid}
        # Several partitions: one upsert in sorted key order locks and increments them
        # all, then a plain read returns the heads (rows we hold locked, so ours).
        items = sorted(counts.items())
        params: list[Any] = []
        for key, count in items:
            params += [topic, key, count]
        cursor.execute(
            "INSERT INTO queue_partitions (topic, partition_key, head_offset, created_at) VALUES "
            + ", ".join(["(%s, %s, %s, UTC_TIMESTAMP(6))"] * len(items))
            + " ON DUPLICATE KEY UPDATE head_offset = head_offset + VALUES(head_offset)",
            params,
        )
        cursor.execute(
            "SELECT partition_key, head_offset FROM queue_partitions WHERE topic = %s AND partition_key IN ("
            + ", ".join(["%s"] * len(items))
            + ")",
            [topic, *(key for key, _ in items)],
        )
        return dict(cursor.fetchall())
