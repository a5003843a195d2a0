"""Sequencing: the sequencer's read, its offset-assigning write and the per-hour counters.

A mixin of :class:`~django_sqlqueue.db.dialects.base.Dialect`, called by ``db/sequencer.py``
inside its transaction, after it locked the partitions' head rows (the order of locks
and writes is described there). The generic statements here suit SQLite; MySQL and
PostgreSQL override :meth:`~Sequencing.assign_offsets` (a join, linear) and PostgreSQL
also :meth:`~Sequencing.unsequenced_rows` and :meth:`~Sequencing.sequenced_rows`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .fragments import SqlFragments


class Sequencing(SqlFragments):
    """The statements of one sequencer round."""

    #: Rows per offset-assigning statement of the generic form (see :meth:`assign_offsets`).
    assign_chunk = 200
    #: A worker's whole round (1)-(5) as one statement, where the database has it
    #: (PostgreSQL: ``sqlqueue_sequence_round``, migration 0011). Parameters: topic,
    #: partitions (a list), limit, counter slots; rows: (partition, new head). None: the
    #: round is the separate statements below.
    sequence_round_sql: str | None = None
    #: The same round as a set-returning function of a query (its FROM), with the partitions
    #: as ``{partitions}`` (an array expression); parameters: topic, limit, counter slots.
    #: A worker's poll state and round in one statement (``PollStore.poll_and_sequence``,
    #: given ``Sequencer.round_fragment``).
    sequence_round_from: str | None = None
    #: The SQLSTATE that statement raises when a row it was to number is gone.
    sequence_round_stale = "SQ001"
    #: Whether :meth:`assign_offsets_counted` writes the offsets and the per-hour counters
    #: in one statement (PostgreSQL); otherwise they are (3) and (5) of ``sequencer.py``.
    counts_on_assign = False

    def unsequenced_rows(self, limit: int, *, read_ahead: bool = False) -> str:
        """SELECT partition, seq of one partition's first ``limit`` unsequenced messages by seq.

        Parameters: topic, partition. The sequencer's read, step (2) of ``sequencer.py``: a
        plain read, no lock. ``read_ahead``: the bulk sequencer's large read (see
        :meth:`PostgreSQLDialect.unsequenced_rows`).
        """
        p, o = self.qn("partition"), self.qn("offset")
        return (
            f"SELECT {p}, seq FROM queue_messages {self.use_index('queue_msg_offset')} "
            f"WHERE topic = %s AND {p} = %s AND {o} IS NULL ORDER BY seq LIMIT {int(limit)}"
        )

    def assign_offsets(self, cursor: Any, offsets: Sequence[tuple[int, int]]) -> int:
        """Set ``offset`` of the unsequenced messages with these (seq, offset) pairs; return the rows set.

        The sequencer's write. Only rows still without an offset are written, so the count
        tells the sequencer whether every row it read is still there and unsequenced (see
        ``sequencer.py``: it rolls back otherwise).

        Generic form: ``SET offset = CASE seq WHEN .. THEN .. END WHERE seq IN (..)``. A
        CASE is evaluated WHEN by WHEN for every row, so one statement of n rows costs
        n^2/2 comparisons: statements of ``assign_chunk`` rows keep it linear. MySQL and
        PostgreSQL override this with a join against the pairs, one statement.
        """
        o = self.qn("offset")
        written = 0
        for start in range(0, len(offsets), self.assign_chunk):
            chunk = offsets[start : start + self.assign_chunk]
            params: list[Any] = []
            for seq, offset in chunk:
                params += [seq, offset]
            params += [seq for seq, _ in chunk]
            cursor.execute(
                f"UPDATE queue_messages SET {o} = CASE seq {' '.join(['WHEN %s THEN %s'] * len(chunk))} END "
                f"WHERE seq IN ({', '.join(['%s'] * len(chunk))}) AND {o} IS NULL",
                params,
            )
            written += cursor.rowcount
        return written

    def assign_offsets_counted(self, cursor: Any, topic: str, offsets: Sequence[tuple[int, int]], slots: int) -> int:
        """:meth:`assign_offsets` and :meth:`count_sequenced` of the rows it wrote, in one
        statement; only where :attr:`counts_on_assign`."""
        raise NotImplementedError(f"{type(self).__name__} numbers and counts in two statements")

    # -- per-hour counters ----------------------------------------------------------

    def hour_sql(self, column: str) -> str:
        """SQL of the start of the UTC hour of the datetime ``column`` (a ``%`` doubled)."""
        raise NotImplementedError

    def count_sequenced(self, cursor: Any, topic: str, ranges: Mapping[int, tuple[int, int]], slots: int) -> None:
        """Add the messages just numbered to ``queue_topic_hours`` (the sequencer's round).

        ``ranges`` maps each partition to the first and last offset the round assigned.
        One ``INSERT ... SELECT ... GROUP BY`` upsert: the rows are found by their offset
        ranges on the (topic, partition, offset) index (this transaction's own writes),
        counted per (hour of ``published_at``, ``partition % slots``) and added to the
        counters. Inside the sequencer's transaction, after its head locks: it commits or
        rolls back with the offsets, so each message is counted once. The rows are
        upserted in key order (ORDER BY), so two sequencers that share counter rows lock
        them in the same order and cannot deadlock on them.
        """
        qn = self.qn
        source, params = self.sequenced_rows(topic, ranges)
        hour = self.hour_sql(f"m.{qn('published_at')}")
        n = qn("messages")
        cursor.execute(
            f"INSERT INTO queue_topic_hours (topic, {qn('hour')}, slot, {n}) "
            f"SELECT m.topic, {hour} AS h, m.{qn('partition')} %% {int(slots)} AS s, COUNT(*) FROM {source} "
            f"GROUP BY m.topic, h, s ORDER BY h, s "
            f"{self.on_conflict_update(['topic', 'hour', 'slot'])} {n} = {self.counter_sum(n)}",
            params,
        )

    def sequenced_rows(self, topic: str, ranges: Mapping[int, tuple[int, int]]) -> tuple[str, list[Any]]:
        """FROM and WHERE of the messages of ``topic`` in the offset ``ranges``, as ``m``.

        Generic form: one ``topic = t AND partition = p AND offset BETWEEN first AND last``
        per partition, OR-ed: MySQL/MariaDB's range optimizer and SQLite's OR optimization
        read each as a range of the (topic, partition, offset) index (SQLite only when each
        term names the whole index prefix). PostgreSQL joins the ranges instead.
        """
        P, OFF = self.qn("partition"), self.qn("offset")
        where = " OR ".join([f"(m.topic = %s AND m.{P} = %s AND m.{OFF} BETWEEN %s AND %s)"] * len(ranges))
        params: list[Any] = []
        for partition, (first, last) in sorted(ranges.items()):
            params += [topic, partition, first, last]
        return f"queue_messages m WHERE {where}", params

    def counter_sum(self, column: str) -> str:
        """The update of an upsert that adds the inserted ``column`` to the stored one."""
        return f"queue_topic_hours.{column} + {self.excluded(column)}"
