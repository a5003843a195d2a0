"""SQLite 3.35+: the embedded default for demos and development.

SQLite has one writer at a time, so the head-row "lock" is the database write lock.
Configure ``"OPTIONS": {"transaction_mode": "IMMEDIATE"}`` (Django 5.1+) so a
transaction takes that lock at BEGIN instead of failing with "database is locked"
when it first writes, and WAL mode so readers do not block the writer.
"""

from __future__ import annotations

from .base import Dialect

# Django's text format for datetimes; SQLite's %f has milliseconds, padded to micro.
_NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f000', 'now')"


class SQLiteDialect(Dialect):
    # Take the write lock at once, as transaction_mode IMMEDIATE does for atomic().
    begin_sql = "BEGIN IMMEDIATE"
    # No row locks: a write transaction holds the database write lock (BEGIN IMMEDIATE).
    for_share = ""
    for_update = ""
    # The same write lock: a second connection's write waits for the first transaction.
    concurrent_writers = False

    def minute_sql(self, column: str) -> str:
        # strftime('%s') reads the stored UTC text (or the clock's) as seconds since the epoch.
        return f"(CAST(strftime('%%s', {column}) AS INTEGER) / 60)"

    def hour_sql(self, column: str) -> str:
        # Django stores datetimes as 'YYYY-MM-DD HH:MM:SS[.ffffff]' text (UTC).
        return f"strftime('%%Y-%%m-%%d %%H:00:00', {column})"

    def union_branch(self, select: str, index: int) -> str:
        # SQLite accepts ORDER BY/LIMIT in a UNION branch only inside a subquery.
        return f"SELECT * FROM ({select}) AS b{index}"

    now_sql = _NOW
    # julianday('now') has millisecond precision; 2440587.5 is the epoch's Julian day.
    epoch_sql = "((julianday('now') - 2440587.5) * 86400.0)"
    greatest_sql = "MAX"
    now_plus_us_sql = "strftime('%%Y-%%m-%%d %%H:%%M:%%f000', 'now', printf('%%+.6f seconds', %s / 1000000.0))"
