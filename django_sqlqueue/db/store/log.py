"""Reads of the message log for export and streaming (the Spark data source and pipelines).

These reads take no lock and write nothing: they see committed, sequenced messages only
(``offset IS NOT NULL``), which the sequencer numbered after their publishing transaction
committed, so a read never sees a message that a later commit could slot in below it.

- :meth:`LogStore.offset_ranges`: per partition, the lowest and highest offset in a
  range (a read is then cut into splits of the ``queue_msg_offset (topic, partition,
  offset)`` index);
- :meth:`LogStore.read_range`: one partition's messages between two offsets, in offset
  order, a page per query (keyset pagination on the offset);
- :meth:`LogStore.head_offsets`: the partitions' head offsets (a stream's latest offset);
- :meth:`LogStore.seq_bounds`: the ``seq`` bounds of a read and its WHERE clause as a
  literal SQL text, for Spark's JDBC reader, which partitions by ``seq`` (primary key)
  ranges and runs its own statements.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .base import StoreBase, in_list

#: Columns of a message as :meth:`LogStore.read_range` returns them, in order.
LOG_COLUMNS = (
    "topic",
    "partition",
    "offset",
    "key",
    "id",
    "payload",
    "metadata",
    "created_at",
    "published_at",
    "deliver_at",
    "failed_at",
    "failure_count",
    "last_error",
    "original_topic",
)
#: Rows fetched per query while reading a range.
FETCH_ROWS = 10_000
#: Partitions per statement of :meth:`LogStore.offset_ranges` (two UNION ALL branches each).
RANGE_CHUNK = 64


@dataclass(frozen=True)
class LogFilter:
    """Filters of a read: offsets inclusive, ``published_at`` in ``[start_time, end_time)``."""

    start_offset: int | None = None
    end_offset: int | None = None
    start_time: dt.datetime | None = None
    end_time: dt.datetime | None = None
    #: Queue partitions to read (empty: all).
    partitions: tuple[int, ...] = ()


@dataclass(frozen=True)
class SeqBounds:
    """The ``seq`` range of a JDBC read, and its table expression as literal SQL."""

    low: int | None
    high: int | None
    count: int
    #: ``(SELECT seq, <columns> FROM queue_messages WHERE ...) AS m``, values inlined.
    table_sql: str


class LogStore(StoreBase):
    """Read-only access to ``queue_messages`` and the head rows for export and streaming."""

    def _time_filters(self, f: LogFilter) -> tuple[str, list[Any]]:
        sql, params = "", []
        if f.start_time:
            sql += " AND published_at >= %s"
            params.append(self.dialect.adapt_datetime(f.start_time))
        if f.end_time:
            sql += " AND published_at < %s"
            params.append(self.dialect.adapt_datetime(f.end_time))
        return sql, params

    def offset_ranges(self, topic: str, f: LogFilter) -> list[tuple[int, int, int]]:
        """Return ``(partition, lowest offset, highest offset)`` of ``topic``'s sequenced
        messages that pass ``f``, by partition.

        Two dives into the offset index per partition with a head row (every sequenced
        partition has one), not ``MIN/MAX ... GROUP BY partition``: PostgreSQL has no loose
        index scan and read the whole topic for it (1,000,000 rows; issue 32). A time filter
        walks each partition from its end up to the first row in time (no index on
        ``published_at``).
        """
        P, OFF, d = self.P, self.OFF, self.dialect
        wanted = set(f.partitions or ())
        partitions = [p for p in sorted(self.head_offsets(topic)) if not wanted or p in wanted]
        where = f"topic = %s AND {P} = %s AND {OFF} IS NOT NULL"
        bounds: list[Any] = []
        if f.start_offset:
            where += f" AND {OFF} >= %s"
            bounds.append(f.start_offset)
        if f.end_offset:
            where += f" AND {OFF} <= %s"
            bounds.append(f.end_offset)
        time_sql, time_params = self._time_filters(f)
        found: dict[int, list[int]] = {}
        for start in range(0, len(partitions), RANGE_CHUNK):
            branches: list[str] = []
            params: list[Any] = []
            for partition in partitions[start : start + RANGE_CHUNK]:
                for order in ("", " DESC"):
                    select = (
                        f"SELECT {P}, {OFF} FROM queue_messages {d.use_index('queue_msg_offset')} "
                        f"WHERE {where}{time_sql} ORDER BY {OFF}{order} LIMIT 1"
                    )
                    branches.append(d.union_branch(select, len(branches)))
                    params += [topic, partition, *bounds, *time_params]
            for partition, offset in self._fetchall(" UNION ALL ".join(branches), params):
                found.setdefault(int(partition), []).append(int(offset))
        return [(p, min(offsets), max(offsets)) for p, offsets in sorted(found.items())]

    def read_range(
        self, topic: str, partition: int, first: int, last: int, f: LogFilter, *, fetch_rows: int = FETCH_ROWS
    ) -> Iterator[tuple[Any, ...]]:
        """Yield the messages of offsets ``first..last`` of one partition, in offset order.

        One query per ``fetch_rows`` rows, each on a fresh cursor (keyset pagination on the
        offset: an index range of ``queue_msg_offset``). Rows are :data:`LOG_COLUMNS`; the
        partition, offset and failure count are ints, times aware UTC datetimes, and the
        JSON columns as the driver returns them (text, or decoded on PostgreSQL).
        """
        P, OFF, K = self.P, self.OFF, self.dialect.qn("key")
        time_sql, time_params = self._time_filters(f)
        sql = (
            f"SELECT topic, {P}, {OFF}, {K}, id, payload, metadata, created_at, published_at, deliver_at, "
            f"failed_at, failure_count, last_error, original_topic FROM queue_messages "
            f"WHERE topic = %s AND {P} = %s AND {OFF} > %s AND {OFF} <= %s{time_sql} ORDER BY {OFF} LIMIT {fetch_rows}"
        )
        to_dt = self.dialect.to_datetime
        after = first - 1
        while after < last:
            rows = self._fetchall(sql, [topic, partition, after, last, *time_params])
            if not rows:
                return
            for row in rows:
                yield (
                    row[0],
                    int(row[1]),
                    int(row[2]),
                    row[3],
                    row[4],
                    row[5],
                    row[6],
                    to_dt(row[7]),
                    to_dt(row[8]),
                    to_dt(row[9]),
                    to_dt(row[10]),
                    int(row[11]),
                    row[12],
                    row[13],
                )
            if len(rows) < fetch_rows:
                return
            after = int(rows[-1][2])

    def head_offsets(self, topic: str) -> dict[int, int]:
        """Return ``{partition: head offset}`` of ``topic``'s partitions with a head row.

        Every offset up to a committed head is a committed message: the sequencer commits
        a partition's numbering in one transaction with its head.
        """
        rows = self._fetchall(f"SELECT {self.P}, head_offset FROM queue_partitions WHERE topic = %s", [topic])
        return {int(partition): int(head) for partition, head in rows}

    def known_topics(self) -> list[str]:
        """Return the topics with sequenced partitions (a head row) or registered, sorted."""
        rows = self._fetchall("SELECT topic FROM queue_partitions UNION SELECT topic FROM queue_topics")
        return sorted({r[0] for r in rows})

    def seq_bounds(
        self,
        topics: Sequence[str],
        columns: Sequence[str],
        start_time: dt.datetime | None = None,
        end_time: dt.datetime | None = None,
    ) -> SeqBounds:
        """Return the ``seq`` bounds and count of the sequenced messages of ``topics``
        (``published_at`` in ``[start_time, end_time)``), and the table expression of a
        JDBC read of ``columns`` with the same WHERE, its values inlined as literals.
        """
        d = self.dialect
        where = f"topic IN ({in_list(topics)}) AND {self.OFF} IS NOT NULL"
        params: list[Any] = list(topics)
        for op, moment in ((">=", start_time), ("<", end_time)):
            if moment:
                where += f" AND published_at {op} %s"
                params.append(moment.astimezone(dt.UTC).replace(tzinfo=None).isoformat(sep=" "))
        ((low, high, count),) = self._fetchall(
            f"SELECT MIN(seq), MAX(seq), COUNT(*) FROM queue_messages WHERE {where}", params
        )
        # The JDBC reader runs the subquery itself: inline the values with the driver's escaping.
        literal = where
        for value in params:
            literal = literal.replace("%s", d.literal(value), 1)
        table_sql = f"(SELECT seq, {', '.join(d.qn(c) for c in columns)} FROM queue_messages WHERE {literal}) AS m"
        return SeqBounds(
            low=None if low is None else int(low),
            high=None if high is None else int(high),
            count=int(count or 0),
            table_sql=table_sql,
        )
