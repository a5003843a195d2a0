"""Garbage collection of the message log: short transactions in the order the rows are stored.

What may go: for each partition the *floor* is the minimum ``offset_acked`` over every
group that consumes the topic (a group without a watermark row counts as 0). A message goes
when its offset is at or below its partition's floor and, with a retention, it is older
than the retention. Nothing above any group's watermark, and nothing unsequenced (NULL
offset), is ever deleted; a topic nobody consumes keeps all.

How it goes (docs/design.md, "Garbage collection at the speed of the log"):

- **Clustered order.** The log is stored in ``seq`` order (InnoDB clusters on the primary
  key; PostgreSQL's heap is filled in insert order). One DELETE per partition through the
  ``(topic, partition, offset)`` index visits every page of the topic once per partition:
  8 partitions, 8 walks over pages that no longer fit in memory (8,283 msgs/s at 3,000,000
  rows). Here a pass walks the topic once, in ``seq`` order along the ``(topic, seq)``
  index, and each statement deletes the eligible rows of a range of it, whatever their
  partition: ``offset <= CASE partition WHEN p THEN floor_p END``.
- **Short transactions.** Each statement is its own transaction (autocommit) over at most
  ``span`` rows of the topic, and the span adapts so that a statement takes about
  :data:`TARGET_SECONDS`: no long transaction holds undo, purge or a replica back, and
  publishers (who only insert at the log's end) never wait for a row GC locks: GC locks
  only rows every group is done with.
- **Bounded passes.** A worker's pass stops after its time budget (it runs between
  polls) and reports that more is left, so the worker comes back at once rather than after
  ``GC_INTERVAL`` (``worker/threads/collector.py``).

Topics with more than :data:`MAX_CASE_PARTITIONS` partitions to collect (one partition per
key) are collected partition by partition in offset windows instead: each key's rows are
few and spread over the whole log, so one walk per CASE chunk would rescan the log.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from .base import StoreBase, in_list

#: Seconds one GC statement (one transaction) aims to take; the span adapts towards it.
TARGET_SECONDS = 0.1
#: Rows of the topic the first statement of a pass covers, and the bounds of the span.
FIRST_SPAN = 5_000
MIN_SPAN = 500
MAX_SPAN = 100_000
#: Above this many partitions to collect, a topic is collected partition by partition.
MAX_CASE_PARTITIONS = 256
#: How far below a floor a pass looks for rows numbered before the floor's row but stored
#: after it (a transaction that committed after a later one): see :meth:`GCStore._stragglers`.
STRAGGLER_WINDOW = 10_000


class GCPass(NamedTuple):
    """What one pass did: messages deleted, whether it finished (False: its budget ran out),
    and the seq to resume the walk from (``start`` of the next pass; 0 once it finished)."""

    deleted: int
    done: bool
    resume: int = 0


class GCStore(StoreBase):
    def consuming_groups(self, topic: str) -> set[str]:
        """Groups that consume ``topic``: with a watermark row or a subscriber heartbeat."""
        rows = self._fetchall(
            "SELECT consumer_group FROM queue_offsets WHERE topic = %s UNION "
            "SELECT consumer_group FROM queue_subscriber_heartbeats WHERE topic = %s",
            [topic, topic],
        )
        return {r[0] for r in rows}

    def gc_floors(self, topic: str, partitions: Sequence[int] | None) -> dict[int, int]:
        """Return ``{partition: floor}`` for the partitions of ``topic`` (all, or ``partitions``)
        whose floor is above 0: the lowest watermark over every consuming group."""
        groups = self.consuming_groups(topic)
        if not groups or (partitions is not None and not partitions):
            return {}
        P = self.P
        params: list[Any] = [topic]
        sql = f"SELECT {P}, consumer_group, offset_acked FROM queue_offsets WHERE topic = %s"
        if partitions is not None:
            sql += f" AND {P} IN ({in_list(partitions)})"
            params += list(partitions)
        marks: dict[int, dict[str, int]] = {}
        for partition, group, acked in self._fetchall(sql, params):
            marks.setdefault(int(partition), {})[group] = int(acked)
        floors = {p: min(marks[p].get(group, 0) for group in groups) for p in sorted(marks)}
        return {p: floor for p, floor in floors.items() if floor > 0}

    def collect_garbage(
        self, topic: str, partitions: Sequence[int] | None, retention: float, *, pace: float = 0.0
    ) -> int:
        """Delete what every consuming group has acked (and older than ``retention``); return
        the messages deleted. Runs to the end, in short transactions (see the module), with
        ``pace`` times each statement's time slept after it."""
        return self.garbage_pass(topic, partitions, retention, pace=pace).deleted

    def garbage_pass(
        self,
        topic: str,
        partitions: Sequence[int] | None,
        retention: float,
        *,
        budget: float | None = None,
        start: int = 0,
        pace: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> GCPass:
        """One pass over ``topic`` (its ``partitions``, or all): stop when nothing is left to
        delete, or once ``budget`` seconds are spent (``done`` is then False, and ``resume``
        says where the next pass may ``start``: what lies below it was walked already, so a
        pass cut short does not walk it again)."""
        floors = self.gc_floors(topic, partitions)
        if not floors:
            return GCPass(0, True)
        deadline = None if budget is None else clock() + budget
        if len(floors) > MAX_CASE_PARTITIONS:
            return self._by_partition(topic, floors, retention, deadline, clock, pace)
        return self._walk(topic, floors, retention, deadline, clock, pace, start)

    # -- the walk in seq order ------------------------------------------------------------

    def _walk(
        self,
        topic: str,
        floors: dict[int, int],
        retention: float,
        deadline: float | None,
        clock: Callable[[], float],
        pace: float,
        start: int,
    ) -> GCPass:
        """Delete the eligible rows of ``topic`` in ranges of the ``(topic, seq)`` index."""
        P, OFF = self.P, self.OFF
        end = self._last_floor_seq(topic, floors)
        if end is None:
            return GCPass(0, True)
        cases = " ".join(["WHEN %s THEN %s"] * len(floors))
        case_params = [v for p, floor in floors.items() for v in (p, floor)]
        age_sql, age_params = self._age_filter(retention)
        # Only the seq range is a range an index can serve (the CASE depends on the row's
        # partition): the plan is the primary key's or (topic, seq)'s range, never a walk of
        # the offset index. A partition not in the CASE compares with NULL: never deleted.
        delete = (
            f"DELETE FROM queue_messages WHERE topic = %s AND seq > %s AND seq <= %s "
            f"AND {OFF} <= CASE {P} {cases} END{age_sql}"
        )
        low, span, deleted = start, FIRST_SPAN, 0
        while low < end:
            # The budget is looked at after a statement, never before the first: every pass
            # makes progress, however little time it was given.
            if low > start and deadline is not None and clock() >= deadline:
                return GCPass(deleted, False, low)
            high = min(self._seq_after(topic, low, span) or end, end)
            started = clock()
            deleted += self._execute(delete, [topic, low, high, *case_params, *age_params])
            span = _next_span(span, _paced(clock() - started, pace))
            low = high
            if retention > 0 and self._younger_than_retention(topic, high, retention):
                return GCPass(deleted, True)  # the rest is younger than the retention
        return GCPass(deleted + self._stragglers(topic, floors, end, age_sql, age_params), True)

    def _age_filter(self, retention: float) -> tuple[str, list[Any]]:
        """`` AND published_at <= <now - retention>`` and its parameters ("" without a retention)."""
        if retention <= 0:
            return "", []
        cutoff, params = self.dialect.now_minus(retention)
        return f" AND published_at <= {cutoff}", list(params)

    def _last_floor_seq(self, topic: str, floors: dict[int, int]) -> int | None:
        """The highest seq among the rows at the floors: where the walk ends."""
        P, OFF = self.P, self.OFF
        where = " OR ".join([f"({P} = %s AND {OFF} = %s)"] * len(floors))
        params = [v for p, floor in floors.items() for v in (p, floor)]
        (row,) = self._fetchall(f"SELECT MAX(seq) FROM queue_messages WHERE topic = %s AND ({where})", [topic, *params])
        return None if row[0] is None else int(row[0])

    def _seq_after(self, topic: str, low: int, span: int) -> int | None:
        """The seq ``span`` rows of ``topic`` after ``low`` (None: fewer are left)."""
        # Pinned: the primary key gives the same order, but walks every topic's rows.
        rows = self._fetchall(
            f"SELECT seq FROM queue_messages {self.dialect.use_index('queue_msg_topic_seq')} "
            "WHERE topic = %s AND seq > %s ORDER BY seq LIMIT 1 OFFSET %s",
            [topic, low, span - 1],
        )
        return int(rows[0][0]) if rows else None

    def _younger_than_retention(self, topic: str, after: int, retention: float) -> bool:
        """Whether the next row of ``topic`` after seq ``after`` is younger than the retention
        (rows are written in about seq order, so the rest of the log is younger too)."""
        cutoff, params = self.dialect.now_minus(retention)
        rows = self._fetchall(
            f"SELECT CASE WHEN published_at > {cutoff} THEN 1 ELSE 0 END FROM queue_messages "
            "WHERE topic = %s AND seq > %s ORDER BY seq LIMIT 1",
            [*params, topic, after],
        )
        return bool(rows and rows[0][0])

    def _stragglers(self, topic: str, floors: dict[int, int], end: int, age_sql: str, age_params: list[Any]) -> int:
        """Delete the eligible rows stored after the walk's end: a message numbered before a
        floor's row whose publishing transaction committed after it was inserted.

        Such a row has a higher seq than the floor's row but a lower offset; it sits at most
        as far below the floor as messages were numbered while its transaction was open.
        The window of :data:`STRAGGLER_WINDOW` offsets below each floor keeps this read
        short; a row further back goes in a later pass, once the floor passed its seq.
        """
        P, OFF = self.P, self.OFF
        deleted = 0
        for partition, floor in floors.items():
            deleted += self._execute(
                # seq + 0: not a range the primary key could serve (everything after the walk's
                # end, the slowest group's whole backlog): the offset window is the plan.
                f"DELETE FROM queue_messages WHERE topic = %s AND {P} = %s AND {OFF} > %s AND {OFF} <= %s "
                f"AND seq + 0 > %s{age_sql}",
                [topic, partition, max(0, floor - STRAGGLER_WINDOW), floor, end, *age_params],
            )
        return deleted

    # -- one partition at a time (topics with one partition per key) ------------------------

    def _by_partition(
        self,
        topic: str,
        floors: dict[int, int],
        retention: float,
        deadline: float | None,
        clock: Callable[[], float],
        pace: float,
    ) -> GCPass:
        """Delete each partition's eligible rows in windows of at most ``span`` offsets."""
        P, OFF = self.P, self.OFF
        age_sql, age_params = self._age_filter(retention)
        delete = f"DELETE FROM queue_messages WHERE topic = %s AND {P} = %s AND {OFF} > %s AND {OFF} <= %s{age_sql}"
        deleted, span, statements = 0, FIRST_SPAN, 0
        for partition, floor in floors.items():
            rows = self._fetchall(
                f"SELECT MIN({OFF}) FROM queue_messages WHERE topic = %s AND {P} = %s AND {OFF} <= %s",
                [topic, partition, floor],
            )
            if rows[0][0] is None:
                continue
            low = int(rows[0][0]) - 1
            while low < floor:
                if statements and deadline is not None and clock() >= deadline:
                    return GCPass(deleted, False)
                statements += 1
                high = min(low + span, floor)
                started = clock()
                deleted += self._execute(delete, [topic, partition, low, high, *age_params])
                span = _next_span(span, _paced(clock() - started, pace))
                low = high
        return GCPass(deleted, True)

    def prune_topic_hours(self, retention: float) -> int:
        """Delete the per-hour counters (``queue_topic_hours``) of hours that started more
        than ``retention`` seconds ago (the database clock); return the rows deleted.

        A range of the ``hour`` index, usually empty: the sequencer's upserts touch the
        current hours, never these, so the two do not wait for each other.
        """
        cutoff, params = self.dialect.now_minus(retention)
        return self._execute(f"DELETE FROM queue_topic_hours WHERE {self.dialect.qn('hour')} < {cutoff}", params)


def _paced(took: float, pace: float) -> float:
    """Sleep ``pace`` times ``took`` (the statement's time); return ``took``."""
    if pace > 0:
        time.sleep(took * pace)
    return took


def _next_span(span: int, took: float) -> int:
    """The next statement's span: halved after a slow statement, doubled after a fast one."""
    if took > TARGET_SECONDS:
        return max(MIN_SPAN, span // 2)
    if took < TARGET_SECONDS / 2:
        return min(MAX_SPAN, span * 2)
    return span
