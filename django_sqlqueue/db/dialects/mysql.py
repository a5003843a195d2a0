"""MySQL 8.0+ / MariaDB 10.6+.

Run queue connections at READ COMMITTED: under REPEATABLE READ, range scans take
next-key (gap) locks and concurrent claimers deadlock. Statements that can still take
gap locks (``INSERT ... ON DUPLICATE KEY UPDATE`` on new keys) touch keys in sorted
order, and callers retry error 1213.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError

from .base import Dialect
from .inserts import InsertPlan, MessageRow, in_list

#: Duplicate entry for a unique key.
ER_DUP_ENTRY = 1062
#: Packet too large (the server drops the connection), row size too large.
PACKET_ERRORS = frozenset({1153, 1301})
#: (seq, offset) pairs per offset-assigning statement.
ASSIGN_JSON_CHUNK = 10000


class MySQLDialect(Dialect):
    # UTC_TIMESTAMP does not depend on the session time zone (Django stores UTC).
    now_sql = "UTC_TIMESTAMP(6)"
    begin_sql = "START TRANSACTION"
    lean_transactions = True
    now_plus_us_sql = "TIMESTAMPADD(MICROSECOND, %s, UTC_TIMESTAMP(6))"
    # Arithmetic on the UTC clock: UNIX_TIMESTAMP() would go through the session time zone.
    epoch_sql = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0)"
    # MariaDB has no FOR SHARE; both understand the older spelling.
    for_share = "LOCK IN SHARE MODE"
    # No statement: ``log_topics`` steps from topic to topic with :attr:`next_topic_sql`, one
    # index dive each. Not ``SELECT DISTINCT topic``: its loose index scan depends on the
    # index's statistics, and right after a bulk load (n_diff 0) MariaDB read the whole index
    # instead, 2.2 s at 10,000,000 messages on every call (issue 32); nor the base class's
    # recursive CTE, whose correlated step MariaDB runs as a full index scan.
    distinct_topics_sql = None
    straight_join = "STRAIGHT_JOIN"
    next_topic_sql = (
        "SELECT topic FROM queue_messages FORCE INDEX (queue_msg_topic_seq) WHERE topic > %s ORDER BY topic LIMIT 1"
    )
    # ``topic IN (...) AND offset IS NULL`` alone reads the topics' whole index range (the
    # NULLs are at the head of each partition's range, not of the topic's); joined to the
    # head rows it is one short range per partition (issue 15: bench/scrape.py).
    unsequenced_via_heads = True

    def excluded(self, column: str) -> str:
        return f"VALUES({column})"

    def idle_transaction_timeout_sql(self, seconds: int | None) -> str | None:
        # MariaDB 10.3+ only: MySQL has no idle-in-transaction timeout (its wait_timeout
        # also ends sessions idle between transactions).
        if not getattr(self.connection, "mysql_is_mariadb", False):
            return None
        value = "DEFAULT" if seconds is None else int(seconds)
        return f"SET SESSION idle_transaction_timeout = {value}"

    def hour_sql(self, column: str) -> str:
        # DATETIME holds UTC already (Django's MySQL backend): no time zone conversion.
        return f"DATE_FORMAT({column}, '%%Y-%%m-%%d %%H:00:00')"

    def counter_sum(self, column: str) -> str:
        return f"{column} + VALUES({column})"

    def minute_sql(self, column: str) -> str:
        # Arithmetic on UTC DATETIMEs: UNIX_TIMESTAMP() would go through the session time zone.
        return f"TIMESTAMPDIFF(MINUTE, '1970-01-01 00:00:00', {column})"

    def use_index(self, name: str) -> str:
        return f"FORCE INDEX ({name})"

    def on_conflict_update(self, conflict: Sequence[str]) -> str:
        return "ON DUPLICATE KEY UPDATE"

    def on_conflict_ignore(self, conflict: Sequence[str], noop: str) -> str:
        # Not INSERT IGNORE, which would also turn other errors into warnings.
        return f"ON DUPLICATE KEY UPDATE {noop} = {noop}"

    def literal(self, value: Any) -> str:
        # The open connection's own escaping (it knows the connection's character set).
        self.connection.ensure_connection()
        return self.connection.connection.literal(value).decode()

    def max_statement_bytes(self, cursor: Any) -> int | None:
        """``max_allowed_packet``, read once per connection.

        A statement over it makes the server drop the connection (error 1153), which
        would also lose the caller's transaction: the publisher checks sizes first.
        """
        raw = self.connection.connection
        cached = getattr(self.connection, "_sqlqueue_max_packet", None)
        if cached is None or cached[0] is not raw:
            cursor.execute("SELECT @@max_allowed_packet")
            cached = (raw, int(cursor.fetchone()[0]))
            self.connection._sqlqueue_max_packet = cached  # type: ignore[attr-defined]
        # Leave room for the statement text around the values, and for escaping.
        return max(1024, cached[1] // 2 - 64 * 1024)

    def connection_limits(self, cursor: Any) -> list[tuple[str, int, int]]:
        """``max_connections`` against ``Threads_connected`` (every client connection), and
        ``max_user_connections`` (the account's limit, or the global one; 0: none) against
        this account's connections in the process list.

        Plain reads of variables, a status counter and the process list (without the
        PROCESS privilege it lists this account's own threads, all that is counted): no
        lock. An account with SUPER/CONNECTION_ADMIN may open one more than
        ``max_connections``, which is left out.
        """
        cursor.execute(
            "SELECT @@GLOBAL.max_connections, @@SESSION.max_user_connections, "
            "(SELECT COUNT(*) FROM information_schema.PROCESSLIST "
            "WHERE USER = SUBSTRING_INDEX(CURRENT_USER(), '@', 1))"
        )
        server_limit, user_limit, user_in_use = cursor.fetchone()
        cursor.execute("SHOW GLOBAL STATUS LIKE 'Threads_connected'")
        _, in_use = cursor.fetchone()
        limits = [("max_connections", int(server_limit), int(in_use))]
        if int(user_limit) > 0:
            limits.append(("max_user_connections", int(user_limit), int(user_in_use)))
        return limits

    def is_too_large(self, exc: BaseException) -> bool:
        return bool(exc.args) and exc.args[0] in PACKET_ERRORS

    def is_duplicate_key(self, exc: BaseException) -> bool:
        return isinstance(exc, IntegrityError) and bool(exc.args) and exc.args[0] == ER_DUP_ENTRY

    def insert_chunk(
        self,
        cursor: Any,
        topic: str,
        chunk: Sequence[MessageRow],
        plan: InsertPlan,
        skip_duplicates: bool,
        notify: str | None = None,
    ) -> set[str]:
        """A plain INSERT; a duplicate id is found after the fact.

        Not ``INSERT IGNORE`` (it turns every error, e.g. invalid JSON, into a warning
        and drops the row) and not ``ON DUPLICATE KEY UPDATE`` (it takes exclusive
        next-key locks on the unique index even under READ COMMITTED, which would make
        unrelated publishers wait). The publisher looks for existing ids before
        inserting, so a duplicate here means a concurrent publisher of the same id
        committed while we waited for it: error 1062 rolls back this statement only
        (the caller's transaction goes on); the ids found are left out and the rest is
        inserted again.
        """
        if not skip_duplicates:
            return super().insert_chunk(cursor, topic, chunk, plan, False)
        try:
            return super().insert_chunk(cursor, topic, chunk, plan, False)
        except IntegrityError as exc:
            if not self.is_duplicate_key(exc):
                raise
        ids = [r.id for r in chunk]
        cursor.execute(f"SELECT id FROM queue_messages WHERE topic = %s AND id IN ({in_list(ids)})", [topic, *ids])
        existing = {row[0] for row in cursor.fetchall()}
        if not existing:
            raise IntegrityError(f"duplicate key in queue_messages for topic {topic!r}, but no id of the batch exists")
        rest = [r for r in chunk if r.id not in existing]
        return existing | (self.insert_chunk(cursor, topic, rest, plan, True) if rest else set())

    def assign_offsets(self, cursor: Any, offsets: Sequence[tuple[int, int]]) -> int:
        """One UPDATE joined with the (seq, offset) pairs as a JSON_TABLE (MySQL 8, MariaDB 10.6).

        The pairs drive the join and each message is an ``eq_ref`` primary-key lookup: linear
        in the number of rows, where a CASE would be quadratic. The rows are committed
        messages that nobody else writes (the sequencer holds their partition's head row),
        so the UPDATE waits for no lock.
        """
        written = 0
        for start in range(0, len(offsets), ASSIGN_JSON_CHUNK):
            pairs = json.dumps([[seq, offset] for seq, offset in offsets[start : start + ASSIGN_JSON_CHUNK]])
            # The pairs drive the join (STRAIGHT_JOIN) and each message is found by primary
            # key (FORCE INDEX): on a small table the optimizer would rather scan it, and a
            # scanning join UPDATE waits for the row lock of every uncommitted publish it
            # meets -- the sequencer would wait for a publisher.
            cursor.execute(
                "UPDATE JSON_TABLE(%s, '$[*]' COLUMNS (s BIGINT PATH '$[0]', o BIGINT PATH '$[1]')) v "
                "STRAIGHT_JOIN queue_messages m FORCE INDEX (PRIMARY) ON m.seq = v.s AND m.`offset` IS NULL "
                "SET m.`offset` = v.o",
                [pairs],
            )
            # Rows matched (Django connects with CLIENT.FOUND_ROWS), each one NULL -> offset.
            written += cursor.rowcount
        return written
