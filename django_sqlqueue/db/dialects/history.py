"""The console's per-minute history: the sample that writes ``queue_history``.

A mixin of :class:`~django_sqlqueue.db.dialects.base.Dialect`, called by
``db/store/history.py`` (the table's owner). Minutes are whole minutes since the Unix epoch
on the database clock, so the workers' own clocks never matter.

Locking: a sample is one autocommit upsert of one row per (group, topic) of the current
minute, in key order, written by a worker's collector every few seconds, never on the
path of a message. Several workers' samples of one minute meet on the same rows; each
holds them for its one statement, and their order cannot deadlock (key order). The
running totals only grow, so a sample never lowers them (``GREATEST``): a sampler whose
read is older than another's write leaves the newer totals; the lag is the last sample's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .fragments import SqlFragments

#: The running totals a sample stores, in the order :meth:`History.store_sample` takes them.
TOTALS = ("published", "handled", "failed", "retried", "dead_lettered")
_KEY = ["consumer_group", "topic", "minute"]


class History(SqlFragments):
    """Statements of ``queue_history``."""

    def minute_sql(self, column: str) -> str:
        """Whole minutes since the epoch (UTC) of the datetime ``column``, or of the clock
        when ``column`` is ``now_sql`` (a ``%`` doubled: the statements take parameters)."""
        # PostgreSQL: EXTRACT(EPOCH) of a timestamptz is UTC seconds whatever the session zone.
        return f"CAST(FLOOR(EXTRACT(EPOCH FROM {column}) / 60) AS BIGINT)"

    def store_sample(self, cursor: Any, rows: Sequence[tuple[str, str, Sequence[int], int]]) -> None:
        """Store (group, topic, ``TOTALS``, lag) rows under the current minute: one upsert."""
        if not rows:
            return
        minute = self.minute_sql(self.now_sql)
        values, params = [], []
        for group, topic, totals, lag in sorted(rows, key=lambda r: (r[0], r[1])):
            values.append(f"(%s, %s, {minute}, {', '.join(['%s'] * len(TOTALS))}, %s)")
            params += [group, topic, *totals, lag]
        qn = self.qn
        updates = [f"{qn(c)} = {self.greatest_sql}(queue_history.{qn(c)}, {self.excluded(qn(c))})" for c in TOTALS]
        cursor.execute(
            f"INSERT INTO queue_history (consumer_group, topic, minute, {', '.join(map(qn, TOTALS))}, lag) "
            f"VALUES {', '.join(values)} {self.on_conflict_update(_KEY)} {', '.join(updates)}, "
            f"lag = {self.excluded('lag')}",
            params,
        )
