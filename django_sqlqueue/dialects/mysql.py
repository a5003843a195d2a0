"""MySQL 8.0+ / MariaDB 10.6+.

Run queue connections at READ COMMITTED: under REPEATABLE READ, range scans take
next-key (gap) locks and concurrent claimers deadlock. Statements that can still take
gap locks (``INSERT ... ON DUPLICATE KEY UPDATE`` on a unique key) touch keys in sorted
order, and callers retry error 1213.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from .base import Dialect


class MySQLDialect(Dialect):
    # UTC_TIMESTAMP does not depend on the session time zone (Django stores UTC).
    now_sql = "UTC_TIMESTAMP(6)"

    def _insert_missing_heads(self, cursor: Any, topic: str, keys: Sequence[str], now: dt.datetime) -> None:
        # A new partition: insert its head row. If a concurrent publisher inserted the
        # same row first, the duplicate-key path waits for its lock (an exclusive record
        # lock on the primary key) and changes nothing. Not INSERT IGNORE, which would
        # turn unrelated errors into warnings.
        ts = self.adapt_datetime(now)
        values = ", ".join(["(%s, %s, 0, %s)"] * len(keys))
        params: list[Any] = []
        for key in keys:
            params += [topic, key, ts]
        cursor.execute(
            "INSERT INTO queue_partitions (topic, partition_key, head_offset, created_at) "
            f"VALUES {values} ON DUPLICATE KEY UPDATE head_offset = head_offset",
            params,
        )

    def set_heads(self, cursor: Any, topic: str, heads: dict[str, int]) -> None:
        # One statement for every partition of a batch. All rows exist and are locked by
        # this transaction already, so the duplicate-key path only updates them.
        items = sorted(heads.items())
        values = ", ".join(["(%s, %s, %s, UTC_TIMESTAMP(6))"] * len(items))
        params: list[Any] = []
        for key, head in items:
            params += [topic, key, head]
        cursor.execute(
            "INSERT INTO queue_partitions (topic, partition_key, head_offset, created_at) "
            f"VALUES {values} ON DUPLICATE KEY UPDATE head_offset = VALUES(head_offset)",
            params,
        )
