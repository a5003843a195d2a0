"""SQLite 3.35+: the embedded default for demos and development.

SQLite has one writer at a time, so the head-row "lock" is the database write lock.
Configure ``"OPTIONS": {"transaction_mode": "IMMEDIATE"}`` (Django 5.1+) so a
transaction takes that lock at BEGIN instead of failing with "database is locked"
when it first writes, and WAL mode so readers do not block the writer.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from .base import Dialect


class SQLiteDialect(Dialect):
    now_sql = None  # SQLite's clock is the process clock.
    for_update = ""

    def _insert_missing_heads(self, cursor: Any, topic: str, keys: Sequence[str], now: dt.datetime) -> None:
        values = ", ".join(["(%s, %s, 0, %s)"] * len(keys))
        params: list[Any] = []
        for key in keys:
            params += [topic, key, self.adapt_datetime(now)]
        cursor.execute(
            "INSERT INTO queue_partitions (topic, partition_key, head_offset, created_at) "
            f"VALUES {values} ON CONFLICT (topic, partition_key) DO NOTHING",
            params,
        )
