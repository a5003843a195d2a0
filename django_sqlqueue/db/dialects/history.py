"""The console's per-minute history: the statements that write ``queue_history``.

A mixin of :class:`~django_sqlqueue.db.dialects.base.Dialect`, called by
``db/store/history.py`` (the table's owner) and by the sequencer. Minutes are whole minutes
since the Unix epoch on the database clock (or of a message's ``published_at``), so the
workers' own clocks never matter.

Locking: a count is an upsert of a few counter rows inside a transaction that already
runs (an ack, a nack, a dead letter, a sequencer round), issued last, just before COMMIT,
with its rows in key order. So a counter row is locked for one statement and a commit, two
transactions that share rows lock them in the same order (no deadlock), and the rows are
striped by ``partition % HISTORY_SLOTS`` so that workers holding different partitions
seldom share one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .fragments import SqlFragments

#: The counter columns, in the order :meth:`History.count_history` takes them.
COUNTERS = ("handled", "failed", "retried", "dead_lettered")
_KEY = ["consumer_group", "topic", "minute", "slot"]


class History(SqlFragments):
    """Statements of ``queue_history``."""

    def minute_sql(self, column: str) -> str:
        """Whole minutes since the epoch (UTC) of the datetime ``column``, or of the clock
        when ``column`` is ``now_sql`` (a ``%`` doubled: the statements take parameters)."""
        # PostgreSQL: EXTRACT(EPOCH) of a timestamptz is UTC seconds whatever the session zone.
        return f"CAST(FLOOR(EXTRACT(EPOCH FROM {column}) / 60) AS BIGINT)"

    def history_sum(self, column: str) -> str:
        """The update of an upsert that adds the inserted ``column`` to the stored one."""
        return f"queue_history.{column} + {self.excluded(column)}"

    def count_history(self, cursor: Any, rows: Mapping[tuple[str, str, int], Sequence[int]]) -> None:
        """Add counts for this minute: ``rows`` maps (group, topic, slot) to the ``COUNTERS``.

        One multi-row upsert, rows in key order (see the module docstring for the locks).
        """
        if not rows:
            return
        minute = self.minute_sql(self.now_sql)
        values, params = [], []
        for (group, topic, slot), counts in sorted(rows.items()):
            values.append(f"(%s, %s, {minute}, %s, 0, %s, %s, %s, %s)")
            params += [group, topic, slot, *counts]
        updates = ", ".join(f"{self.qn(c)} = {self.history_sum(self.qn(c))}" for c in COUNTERS)
        cursor.execute(
            "INSERT INTO queue_history (consumer_group, topic, minute, slot, published, "
            f"{', '.join(map(self.qn, COUNTERS))}) VALUES {', '.join(values)} "
            f"{self.on_conflict_update(_KEY)} {updates}",
            params,
        )

    def count_published(self, cursor: Any, source: str, params: Sequence[Any], slots: int) -> None:
        """Add the messages just numbered (``source``: FROM and WHERE of them, as ``m``) to
        their topic's rows, per minute of ``published_at`` (the sequencer's round, after its
        head locks: it commits or rolls back with the offsets, so each counts once)."""
        qn = self.qn
        minute = self.minute_sql(f"m.{qn('published_at')}")
        n = qn("published")
        counters, zeros = ", ".join(map(qn, COUNTERS)), ", ".join(["0"] * len(COUNTERS))
        cursor.execute(
            f"INSERT INTO queue_history (consumer_group, topic, minute, slot, published, {counters}) "
            f"SELECT '', m.topic, {minute} AS mi, m.{qn('partition')} %% {int(slots)} AS s, COUNT(*), {zeros} "
            f"FROM {source} "
            f"GROUP BY m.topic, mi, s ORDER BY mi, s "
            f"{self.on_conflict_update(_KEY)} {n} = {self.history_sum(n)}",
            list(params),
        )

    def sample_lag(self, cursor: Any, lags: Sequence[tuple[str, str, int]]) -> None:
        """Set this minute's lag of each (group, topic, lag): the minute's last sample wins.

        Slot 0 of the minute, in key order. The lags are read beforehand by a plain read (no
        ``INSERT ... SELECT``: on MySQL that would share-lock the watermark rows the acks
        update).
        """
        if not lags:
            return
        minute = self.minute_sql(self.now_sql)
        counters, zeros = ", ".join(map(self.qn, COUNTERS)), ", ".join(["0"] * len(COUNTERS))
        values, params = [], []
        for group, topic, lag in sorted(lags):
            values.append(f"(%s, %s, {minute}, 0, 0, {zeros}, %s)")
            params += [group, topic, lag]
        cursor.execute(
            f"INSERT INTO queue_history (consumer_group, topic, minute, slot, published, {counters}, lag) "
            f"VALUES {', '.join(values)} "
            f"{self.on_conflict_update(_KEY)} lag = {self.excluded('lag')}",
            params,
        )
