"""Batch reads: sequenced messages split by queue partition and offset range.

Planning (``partitions()``) asks the database for each partition's lowest and highest
offset in the requested range, then cuts it into Spark partitions of at most
``rowsPerSplit`` offsets, so tasks read disjoint index ranges of
``queue_msg_offset (topic, partition, offset)`` in parallel. Only sequenced messages
have offsets; planning first runs the sequencer on the topics (option ``sequence``,
default true) so that everything committed before the read is included.

Options (see docs/spark.md): ``topic`` (comma-separated; ``subscribe``) or
``subscribePattern`` (a regular expression matched against the log's topics),
``startingOffsets`` (``earliest``, or JSON ``{"<partition>": <last offset read>}`` /
``{"<topic>": {"<partition>": ...}}``), ``endingOffsets`` (``latest``, or JSON of the last
offset to read), ``startingOffset``/``endingOffset`` (inclusive, in every partition),
``startTime``/``endTime`` (``published_at`` in ``[startTime, endTime)``, ISO 8601,
naive = UTC), ``partitions`` (comma-separated queue partitions), ``rowsPerSplit``
(default 100000), ``payloadSchema`` with ``mode``, ``failOnDataLoss``, ``sequence``. The
offset, time and partition options are parsed into a :class:`~.ranges.Range` (``ranges.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceReader, InputPartition

from ..conf import DEFAULT_DLQ_SUFFIX
from ..rules.dlq import is_dlq_topic
from .databases import choose_database
from .dataloss import checked
from .options import SparkOptionError, get_bool, get_int, get_str, get_topics
from .optionset import check_options
from .payload import DEFAULT_CORRUPT_COLUMN, PayloadParser, parse_mode
from .ranges import Range, positions_by_time
from .runtime import database
from .schema import COLUMN_NAMES

if TYPE_CHECKING:
    from ..db.store.log import LogFilter

#: Rows fetched per query while reading one split (keyset pagination on the offset).
FETCH_ROWS = 10_000


@dataclass(frozen=True)
class ReadSpec:
    """How a split's rows become Spark rows (shared by batch and stream reads)."""

    #: The payload parser (``payloadSchema``), or None: the payload stays JSON text.
    parser: PayloadParser | None = None
    #: Whether a corrupt-record column follows the message columns (``mode=PERMISSIVE``).
    corrupt_column: bool = False
    fail_on_data_loss: bool = True
    dlq_suffix: str = field(default=DEFAULT_DLQ_SUFFIX)

    @classmethod
    def from_options(cls, options: Mapping[str, str], schema: Any) -> ReadSpec:
        payload_schema = get_str(options, "payloadSchema")
        parser = None
        corrupt = False
        if payload_schema:
            mode = parse_mode(get_str(options, "mode"))
            parser = PayloadParser(schema["payload"].dataType, mode)
            corrupt = mode == "PERMISSIVE"
        elif get_str(options, "mode") or get_str(options, "columnNameOfCorruptRecord"):
            raise SparkOptionError("options 'mode' and 'columnNameOfCorruptRecord' go with 'payloadSchema'.")
        sqlqueue = json.loads(get_str(options, "sqlqueue") or "{}")
        return cls(
            parser=parser,
            corrupt_column=corrupt,
            fail_on_data_loss=get_bool(options, "failOnDataLoss", True),
            dlq_suffix=str(sqlqueue.get("DLQ_SUFFIX") or DEFAULT_DLQ_SUFFIX),
        )


def corrupt_column_name(options: Mapping[str, str]) -> str:
    """The name of the corrupt-record column (``columnNameOfCorruptRecord``)."""
    name = get_str(options, "columnNameOfCorruptRecord", DEFAULT_CORRUPT_COLUMN).strip()
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise SparkOptionError(f"option 'columnNameOfCorruptRecord' must be a column name, got {name!r}.")
    if name.lower() in COLUMN_NAMES:
        raise SparkOptionError(f"option 'columnNameOfCorruptRecord': {name!r} is a message column; pick another name.")
    return name


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
    """Return the store's filter of a read's range (times and partitions; offsets are per split)."""
    from ..db.store.log import LogFilter

    return LogFilter(start_time=rng.start_time, end_time=rng.end_time, partitions=rng.partitions)


def plan(alias: str, topics: Sequence[str], rng: Range, rows_per_split: int) -> list[Split]:
    """Return the splits of a read of ``topics`` (see the module docstring).

    Per partition the read covers the offsets asked for (``startingOffset(s)``,
    ``endingOffset(s)``) or, by default, the oldest retained offset to the head. Asked-for
    offsets that GC deleted stay in the split: reading it finds them missing
    (``failOnDataLoss``). A time-filtered read covers the offsets of the rows in range.
    """
    # Imported here, not at the top: Spark imports this module while planning, before
    # runtime.database() has set Django up.
    from ..db.store.log import LogStore

    store = LogStore(alias)
    splits: list[Split] = []
    for topic in topics:
        retained = {p: (lo, hi) for p, lo, hi in store.offset_ranges(topic, log_filter(rng))}
        heads = {} if rng.by_time else store.head_offsets(topic)
        known = sorted(set(retained) | set(heads))
        for partition in known:
            if rng.partitions and partition not in rng.partitions:
                continue
            low, high = retained.get(partition, (None, None))
            head = heads.get(partition, high)
            first, last = rng.first(topic, partition), rng.last(topic, partition)
            if rng.by_time:
                if low is None or high is None:
                    continue
                first = low if first is None else max(first, low)
                last = high if last is None else min(last, high)
            else:
                if first is None:
                    if low is None:
                        continue  # nothing retained, nothing asked for: the partition is empty
                    first = low
                last = head if last is None or head is None else min(last, head)
            if last is not None and first <= last:
                splits.extend(split_range(topic, partition, first, last, rows_per_split))
    return splits


def read_split(alias: str, split: Split, rng: Range, spec: ReadSpec) -> Iterator[tuple[Any, ...]]:
    """Yield the rows of one split in offset order, ``FETCH_ROWS`` per query, checking for holes."""
    from ..db.store.log import LogStore

    rows = LogStore(alias).read_range(
        split.topic, split.partition, split.first, split.last, log_filter(rng), fetch_rows=FETCH_ROWS
    )
    if not rng.by_time:
        on_purpose = is_dlq_topic(split.topic, spec.dlq_suffix)
        rows = checked(
            rows,
            split.topic,
            split.partition,
            split.first,
            split.last,
            fail=spec.fail_on_data_loss,
            on_purpose=on_purpose,
        )
    from django.db import connections

    from ..db.dialects import get_dialect

    # A database that prints JSON in its own text form (PostgreSQL's jsonb: {"n": 5}, with
    # spaces) is compacted, so a read returns the same text on every database (jsonb keeps
    # no key order: its own order).
    compact = not get_dialect(connections[alias]).json_text_is_compact
    for row in rows:
        text = _json_text(row[5], compact)
        metadata = _json_text(row[6], compact)
        if spec.parser is None:
            yield (*row[:5], text, metadata, *row[7:])
            continue

        def where(row: tuple[Any, ...] = row) -> str:
            return f"message id {row[4]!r} (topic {row[0]!r}, partition {row[1]}, offset {row[2]})"

        parsed = spec.parser.parse(text, where)
        if parsed is None:
            continue  # DROPMALFORMED
        payload, corrupt = parsed
        out = (*row[:5], payload, metadata, *row[7:])
        yield (*out, corrupt) if spec.corrupt_column else out


def _json_text(value: Any, compact: bool = False) -> str:
    """JSON columns come back as text or decoded, by driver: return compact text."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value).decode()
    if isinstance(value, str):
        if not compact:
            return value
        value = json.loads(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def topic_selection(options: Mapping[str, str]) -> tuple[list[str], re.Pattern[str] | None]:
    """Return the topics (``topic``) or the pattern (``subscribePattern``) of a read: exactly one."""
    pattern = get_str(options, "subscribePattern").strip()
    has_topic = bool(get_str(options, "topic").strip())
    if pattern and has_topic:
        raise SparkOptionError("give option 'topic' (or 'subscribe') or 'subscribePattern', not both.")
    if pattern:
        try:
            return [], re.compile(pattern)
        except re.error as exc:
            raise SparkOptionError(f"option 'subscribePattern' is not a valid regular expression: {exc}") from None
    return get_topics(options), None


def matching_topics(alias: str, pattern: re.Pattern[str]) -> list[str]:
    """The topics of the log (with sequenced partitions, or registered) that ``pattern`` matches whole."""
    from ..db.store.log import LogStore

    return sorted(t for t in LogStore(alias).known_topics() if pattern.fullmatch(t))


class MessageReader(DataSourceReader):
    """The batch reader of the ``sqlqueue`` data source."""

    def __init__(self, options: Mapping[str, str], schema: Any) -> None:
        self.options = check_options(options, "batch read")
        self.topics, self.pattern = topic_selection(self.options)
        self.options = choose_database(self.options, self.topics, "batch read")
        self.range = Range.from_options(self.options)
        self.rows_per_split = get_int(self.options, "rowsPerSplit", 100_000, minimum=1) or 100_000
        self.sequence = get_bool(self.options, "sequence", True)
        self.spec = ReadSpec.from_options(self.options, schema)

    def partitions(self) -> Sequence[InputPartition]:
        with database(self.options) as alias:
            topics = self.topics if self.pattern is None else matching_topics(alias, self.pattern)
            if self.sequence:
                run_sequencer(alias, topics)
            rng = self.range
            if rng.start_times is not None:
                starts = {topic: positions_by_time(alias, topic, rng.start_times) for topic in topics}
                rng = replace(rng, starts=starts, start_times=None)
            return plan(alias, topics, rng, self.rows_per_split)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if not isinstance(partition, Split):
            return  # Spark plans one empty partition when there are no splits
        with database(self.options) as alias:
            yield from read_split(alias, partition, self.range, self.spec)


def run_sequencer(alias: str, topics: Sequence[str]) -> None:
    """Number the committed unsequenced messages of ``topics`` (safe from any process)."""
    from ..db.sequencer import sequence

    for topic in topics:
        sequence(topic, using=alias)
