"""SQL fragments: the pieces of statement text every other part of a dialect builds on.

:class:`SqlFragments` is the root of the dialect mixins (``conversions``, ``inserts``,
``sequencing``, ``sessions``), which :class:`~django_sqlqueue.db.dialects.base.Dialect`
combines: it holds the connection, the quoting function and the vendor's spellings of
the database clock, placeholders, row-lock suffixes and upsert clauses. Vendor subclasses
(``mysql.py``, ``postgresql.py``, ``sqlite.py``) override the attributes and methods by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper


class SqlFragments:
    """The connection, quoting and the vendor's fragments of SQL text.

    Times always come from the database clock (``now_sql``).
    """

    #: The database's current UTC time, constant within one statement.
    now_sql = "CURRENT_TIMESTAMP"
    #: ``now_sql`` plus a number of microseconds given as one parameter.
    now_plus_us_sql = "CURRENT_TIMESTAMP"
    #: The database's current time as seconds since the epoch (a float), for the rate
    #: limits' arithmetic (``db/store/limits.py``); constant within one statement.
    epoch_sql = "CAST(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) AS DOUBLE PRECISION)"
    #: The larger of two values (SQLite's scalar ``MAX``).
    greatest_sql = "GREATEST"
    #: Starts a transaction explicitly while the connection is in autocommit mode.
    begin_sql = "BEGIN"
    #: Whether the engine's short transactions open with :attr:`begin_sql` on the autocommit
    #: connection instead of Django's ``atomic()`` (``StoreBase.transaction``): on MySQL
    #: ``atomic()`` costs two statements more.
    lean_transactions = False
    #: Whether a WITH clause may hold INSERT/UPDATE and locking reads (PostgreSQL): a fenced
    #: write in one statement (``DeliveryStore._mark_fresh``).
    writable_ctes = False
    #: Whether :meth:`preparing_cursor` may give a cursor (PostgreSQL with psycopg 3).
    prepares_statements = False
    #: A select-list expression that makes the transaction of the statement holding it commit
    #: without waiting for its WAL to reach the disk (``SQLQUEUE["SYNCHRONOUS_ACKS"]``); None
    #: where the engine has no such per-transaction choice.
    relaxed_commit_sql: str | None = None
    json_placeholder = "%s"
    #: An empty JSON object as a SQL literal.
    empty_json_sql = "'{}'"
    datetime_placeholder = "%s"
    bool_placeholder = "%s"
    #: Suffix of a SELECT that share-locks the rows it reads until the transaction ends.
    for_share = "FOR SHARE"
    #: Suffix of a SELECT that exclusively locks the rows it reads.
    for_update = "FOR UPDATE"
    #: Every topic present in ``queue_messages``, sorted, without a scan (the console's
    #: topic list; a plain read, no locks). PostgreSQL and SQLite have no loose index
    #: scan: a recursive CTE emulates it, each step one index probe for the smallest
    #: topic above the previous one. MySQL/MariaDB override it.
    distinct_topics_sql: str | None = (
        "WITH RECURSIVE t(topic) AS ("
        " SELECT MIN(topic) FROM queue_messages"
        " UNION ALL"
        " SELECT (SELECT MIN(m.topic) FROM queue_messages m WHERE m.topic > t.topic)"
        " FROM t WHERE t.topic IS NOT NULL"
        ") SELECT topic FROM t WHERE topic IS NOT NULL ORDER BY topic"
    )
    #: Where ``distinct_topics_sql`` is None: the smallest topic after ``%s`` (one index dive).
    next_topic_sql = "SELECT topic FROM queue_messages WHERE topic > %s ORDER BY topic LIMIT 1"
    #: A join that keeps the written order of its tables (MySQL's STRAIGHT_JOIN), where the
    #: optimizer could pick another one without statistics.
    straight_join = "JOIN"
    #: Whether reports find the unsequenced rows through the partitions' head rows (a join,
    #: one index range per partition) rather than by ``offset IS NULL`` alone. PostgreSQL and
    #: SQLite have a partial index of the unsequenced rows, so the plain condition reads only
    #: the backlog; MySQL/MariaDB's unique (topic, partition, offset) index holds the NULLs
    #: at the head of each partition's range, which only a known partition reaches.
    unsequenced_via_heads = False
    #: The statements, run just before and just after a read in the same transaction, that
    #: keep the planner off a scan of the whole table where no index hint exists
    #: (PostgreSQL: ``SET LOCAL enable_seqscan``); None where ``use_index`` does it.
    no_table_scan_sql: tuple[str, str] | None = None
    #: Whether an entry of a secondary index of ``queue_messages`` holds the row's ``seq``, so
    #: a read through the index tests ``seq`` without reading the row: InnoDB's entries end
    #: in the primary key, SQLite's in the rowid (``seq`` is it); PostgreSQL's do not.
    index_entries_hold_seq = True

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection
        self.qn: Callable[[str], str] = connection.ops.quote_name

    def excluded(self, column: str) -> str:
        """The value an upsert tried to insert into ``column``."""
        return f"excluded.{column}"

    def on_conflict_update(self, conflict: Sequence[str]) -> str:
        """Start of an upsert's update clause (followed by ``col = expr, ...``)."""
        return f"ON CONFLICT ({', '.join(map(self.qn, conflict))}) DO UPDATE SET"

    def on_conflict_ignore(self, conflict: Sequence[str], noop: str) -> str:
        """Clause that turns a duplicate-key insert into a no-op.

        ``noop`` names a column of the target table only (MySQL assigns it to itself).
        """
        return f"ON CONFLICT ({', '.join(map(self.qn, conflict))}) DO NOTHING"

    def preparing_cursor(self, raw: Any) -> Any | None:
        """A cursor of the driver's connection ``raw`` whose statements the server prepares
        once and reuses (``StoreBase._fetchall_hot``); None where the engine does not."""
        return None

    def use_index(self, name: str) -> str:
        """An index hint after a table name (MySQL/MariaDB only; elsewhere nothing).

        For lookups of unsequenced messages (NULL offsets): PostgreSQL and SQLite have a
        partial index for them (migration 0003); MariaDB's optimizer, estimating from a
        ``topic`` prefix, would otherwise walk the topic's ``(topic, seq)`` entries.
        """
        return ""

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
