"""PostgreSQL 13+ (psycopg 3)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import Dialect


class PostgreSQLDialect(Dialect):
    # statement_timestamp(), not now(): now() is frozen at the start of a transaction.
    now_sql = "statement_timestamp()"
    now_plus_us_sql = "(statement_timestamp() + %s::bigint * interval '1 microsecond')"
    json_placeholder = "%s::jsonb"
    empty_json_sql = "'{}'::jsonb"
    datetime_placeholder = "%s::timestamptz"
    bool_placeholder = "%s::boolean"

    def assign_offsets(self, cursor: Any, offsets: Sequence[tuple[int, int]]) -> None:
        """One UPDATE joined with the (seq, offset) pairs as two unnested arrays: linear."""
        cursor.execute(
            'UPDATE queue_messages m SET "offset" = v.o FROM unnest(%s::bigint[], %s::bigint[]) AS v(s, o) '
            "WHERE m.seq = v.s",
            [[seq for seq, _ in offsets], [offset for _, offset in offsets]],
        )
