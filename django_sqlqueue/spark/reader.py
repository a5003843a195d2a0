"""Batch reads: sequenced messages split by queue partition and offset range.

Planning (``partitions()``) asks the database for each partition's lowest and highest
offset in the requested range, then cuts it into Spark partitions of at most
``rowsPerSplit`` offsets, so tasks read disjoint index ranges of
``queue_msg_offset (topic, partition, offset)`` in parallel. Only sequenced messages
have offsets; planning first runs the sequencer on the topics (option ``sequence``,
default true) so that everything committed before the read is included.

Options: ``topic`` (comma-separated), ``startingOffset``/``endingOffset`` (inclusive,
applied in every partition), ``startTime``/``endTime`` (``published_at`` in
``[startTime, endTime)``, ISO 8601, naive = UTC), ``partitions`` (comma-separated queue
partitions), ``rowsPerSplit`` (default 100000), ``payloadSchema`` (a DDL struct: the
payload column is then parsed), ``sequence``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition

from .options import SparkOptionError, get_bool, get_int, get_str, get_time, get_topics
from .runtime import database

#: Rows fetched per query while reading one split (keyset pagination on the offset).
FETCH_ROWS = 10_000


@dataclass(frozen=True)
class Range:
    """Filters shared by every split of a read."""

    start_offset: int | None = None
    end_offset: int | None = None
    start_time: dt.datetime | None = None
    end_time: dt.datetime | None = None
    partitions: tuple[int, ...] = ()

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Range:
        raw_partitions = get_str(options, "partitions")
        try:
            partitions = tuple(int(p) for p in raw_partitions.split(",") if p.strip())
        except ValueError:
            raise SparkOptionError(
                f"option 'partitions' must be comma-separated integers, got {raw_partitions!r}."
            ) from None
        found = cls(
            start_offset=get_int(options, "startingOffset", None, minimum=1),
            end_offset=get_int(options, "endingOffset", None, minimum=1),
            start_time=get_time(options, "startTime"),
            end_time=get_time(options, "endTime"),
            partitions=partitions,
        )
        if found.start_offset and found.end_offset and found.start_offset > found.end_offset:
            raise SparkOptionError(f"startingOffset {found.start_offset} is after endingOffset {found.end_offset}.")
        if found.start_time and found.end_time and found.start_time >= found.end_time:
            raise SparkOptionError("startTime must be before endTime.")
        return found


class Split(InputPartition):
    """Offsets ``first..last`` (inclusive) of one queue partition of one topic."""

    def __init__(self, topic: str, partition: int, first: int, last: int) -> None:
        super().__init__((topic, partition, first, last))
        self.topic = topic
        self.partition = partition
        self.first = first
        self.last = last


def split_range(topic: str, partition: int, first: int, last: int, rows: int) -> list[Split]:
    """Cut ``first..last`` into splits of at most ``rows`` offsets."""
    return [Split(topic, partition, lo, min(lo + rows - 1, last)) for lo in range(first, last + 1, rows)]


def _quoted(connection: Any) -> tuple[str, str, str]:
    qn = connection.ops.quote_name
    return qn("partition"), qn("offset"), qn("key")


def _time_filters(rng: Range, connection: Any) -> tuple[str, list[Any]]:
    sql, params = "", []
    if rng.start_time:
        sql += " AND published_at >= %s"
        params.append(connection.ops.adapt_datetimefield_value(rng.start_time))
    if rng.end_time:
        sql += " AND published_at < %s"
        params.append(connection.ops.adapt_datetimefield_value(rng.end_time))
    return sql, params


def plan(alias: str, topics: Sequence[str], rng: Range, rows_per_split: int) -> list[Split]:
    """Return the splits of a read of ``topics`` (see the module docstring)."""
    from django.db import connections

    connection = connections[alias]
    p, o, _ = _quoted(connection)
    splits: list[Split] = []
    with connection.cursor() as cursor:
        for topic in topics:
            sql = f"SELECT {p}, MIN({o}), MAX({o}) FROM queue_messages WHERE topic = %s AND {o} IS NOT NULL"
            params: list[Any] = [topic]
            if rng.start_offset:
                sql += f" AND {o} >= %s"
                params.append(rng.start_offset)
            if rng.end_offset:
                sql += f" AND {o} <= %s"
                params.append(rng.end_offset)
            if rng.partitions:
                sql += f" AND {p} IN ({', '.join(['%s'] * len(rng.partitions))})"
                params.extend(rng.partitions)
            time_sql, time_params = _time_filters(rng, connection)
            cursor.execute(f"{sql}{time_sql} GROUP BY {p} ORDER BY {p}", params + time_params)
            for partition, first, last in cursor.fetchall():
                splits.extend(split_range(topic, int(partition), int(first), int(last), rows_per_split))
    return splits


def read_split(alias: str, split: Split, rng: Range, parse_payload: bool) -> Iterator[tuple[Any, ...]]:
    """Yield the rows of one split in offset order, ``FETCH_ROWS`` per query."""
    from django.db import connections

    from ..dialects import get_dialect

    connection = connections[alias]
    dialect = get_dialect(connection)
    p, o, k = _quoted(connection)
    time_sql, time_params = _time_filters(rng, connection)
    sql = (
        f"SELECT topic, {p}, {o}, {k}, id, payload, metadata, created_at, published_at, deliver_at, "
        f"failed_at, failure_count, last_error, original_topic FROM queue_messages "
        f"WHERE topic = %s AND {p} = %s AND {o} > %s AND {o} <= %s{time_sql} ORDER BY {o} LIMIT {FETCH_ROWS}"
    )
    to_dt = dialect.to_datetime
    after = split.first - 1
    while after < split.last:
        with connection.cursor() as cursor:
            cursor.execute(sql, [split.topic, split.partition, after, split.last, *time_params])
            rows = cursor.fetchall()
        if not rows:
            return
        for row in rows:
            payload = _json_text(row[5])
            yield (
                row[0],
                int(row[1]),
                int(row[2]),
                row[3],
                row[4],
                json.loads(payload) if parse_payload else payload,
                _json_text(row[6]),
                to_dt(row[7]),
                to_dt(row[8]),
                to_dt(row[9]),
                to_dt(row[10]),
                int(row[11]),
                row[12],
                row[13],
            )
        if len(rows) < FETCH_ROWS:
            return
        after = int(rows[-1][2])


def _json_text(value: Any) -> str:
    """JSON columns come back as text (MySQL, SQLite) or decoded (PostgreSQL): return text."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode()
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class MessageReader(DataSourceReader):
    """The batch reader of the ``sqlqueue`` data source."""

    def __init__(self, options: Mapping[str, str], parse_payload: bool) -> None:
        self.options = dict(options)
        self.topics = get_topics(options)
        self.range = Range.from_options(options)
        self.rows_per_split = get_int(options, "rowsPerSplit", 100_000, minimum=1) or 100_000
        self.sequence = get_bool(options, "sequence", True)
        self.parse_payload = parse_payload

    def partitions(self) -> Sequence[InputPartition]:
        with database(self.options) as alias:
            if self.sequence:
                run_sequencer(alias, self.topics)
            return plan(alias, self.topics, self.range, self.rows_per_split)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if not isinstance(partition, Split):
            return  # Spark plans one empty partition when there are no splits
        with database(self.options) as alias:
            yield from read_split(alias, partition, self.range, self.parse_payload)


def run_sequencer(alias: str, topics: Sequence[str]) -> None:
    """Number the committed unsequenced messages of ``topics`` (safe from any process)."""
    from ..sequencer import sequence

    for topic in topics:
        sequence(topic, using=alias)
