"""PostgreSQL 13+ (psycopg 3 or psycopg2)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from .base import Dialect


class PostgreSQLDialect(Dialect):
    # statement_timestamp(), not now(): now() is frozen at the start of a transaction.
    now_sql = "statement_timestamp()"
    json_placeholder = "%s::jsonb"

    def _insert_missing_heads(self, cursor: Any, topic: str, keys: Sequence[str], now: dt.datetime) -> None:
        # ON CONFLICT DO NOTHING waits for a concurrent inserter of the same key to end.
        values = ", ".join(["(%s, %s, 0, %s)"] * len(keys))
        params: list[Any] = []
        for key in keys:
            params += [topic, key, now]
        cursor.execute(
            "INSERT INTO queue_partitions (topic, partition_key, head_offset, created_at) "
            f"VALUES {values} ON CONFLICT (topic, partition_key) DO NOTHING",
            params,
        )

    def _insert_one(self, cursor: Any, sql: str, row: Sequence[Any]) -> int:
        cursor.execute(f"{sql} RETURNING {self.qn('offset')}", row)
        return cursor.fetchone()[0]
