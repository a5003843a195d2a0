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
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceReader, InputPartition

from .options import SparkOptionError, get_bool, get_int, get_str, get_time, get_topics
from .runtime import database

if TYPE_CHECKING:
    from ..store.log import LogFilter

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


def log_filter(rng: Range) -> LogFilter:
    """Return the store's filter of a read's range."""
    from ..store.log import LogFilter

    return LogFilter(
        start_offset=rng.start_offset,
        end_offset=rng.end_offset,
        start_time=rng.start_time,
        end_time=rng.end_time,
        partitions=rng.partitions,
    )


def plan(alias: str, topics: Sequence[str], rng: Range, rows_per_split: int) -> list[Split]:
    """Return the splits of a read of ``topics`` (see the module docstring)."""
    # Imported here, not at the top: Spark imports this module while planning, before
    # runtime.database() has set Django up.
    from ..store.log import LogStore

    store = LogStore(alias)
    splits: list[Split] = []
    for topic in topics:
        for partition, first, last in store.offset_ranges(topic, log_filter(rng)):
            splits.extend(split_range(topic, partition, first, last, rows_per_split))
    return splits


def read_split(alias: str, split: Split, rng: Range, parse_payload: bool) -> Iterator[tuple[Any, ...]]:
    """Yield the rows of one split in offset order, ``FETCH_ROWS`` per query."""
    from ..store.log import LogStore

    rows = LogStore(alias).read_range(
        split.topic, split.partition, split.first, split.last, log_filter(rng), fetch_rows=FETCH_ROWS
    )
    for row in rows:
        payload = _json_text(row[5])
        yield (*row[:5], json.loads(payload) if parse_payload else payload, _json_text(row[6]), *row[7:])


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
