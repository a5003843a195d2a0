"""PostgreSQL 13+ (psycopg 3)."""

from __future__ import annotations

from .base import Dialect


class PostgreSQLDialect(Dialect):
    # statement_timestamp(), not now(): now() is frozen at the start of a transaction.
    now_sql = "statement_timestamp()"
    now_plus_us_sql = "(statement_timestamp() + %s::bigint * interval '1 microsecond')"
    json_placeholder = "%s::jsonb"
    datetime_placeholder = "%s::timestamptz"
    bool_placeholder = "%s::boolean"
