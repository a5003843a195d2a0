"""Streaming reads: topics as a stream whose Spark offsets are the queue's offsets.

A Spark offset is ``{"<partition>": <offset>, ...}`` (one ``topic``) or
``{"<topic>": {"<partition>": <offset>}}`` (several topics, ``subscribePattern``): per
queue partition, the last offset read. ``latestOffset`` first runs the sequencer on the
topics -- so the stream advances even when no worker consumes them -- and then reads the
partitions' head offsets (``queue_partitions.head_offset``). The sequencer numbers a
message only after its publishing transaction committed, and commits each partition's
numbering in one transaction with the head: every offset up to a committed head is a
committed message. A publisher that commits late gets a later offset and is read by a
later micro-batch; nothing is skipped. The offsets are checkpointed by Spark, so a
restarted query continues where it stopped.

Option ``group`` makes the query a consumer group of its topics: a new query starts at
the group's watermarks when the group has some (else from ``startingOffsets``, creating
the group there), and each ``commit(end)`` writes ``end`` as the group's watermarks. GC
then keeps every message until the stream has committed past it, and the group shows in
``queue_status``, the console and the metrics with its lag. The checkpoint wins: Spark
asks for a starting offset only when the checkpoint has none, and a restarted query
continues from its checkpoint whatever the group's watermarks say (see docs/spark.md).

Options (docs/spark.md): ``topic``/``subscribe`` or ``subscribePattern``,
``startingOffsets`` (``earliest`` -- the default: the oldest retained message --,
``latest``, or JSON), ``maxOffsetsPerTrigger`` (alias ``maxRecordsPerTrigger``),
``minOffsetsPerTrigger`` with ``maxTriggerDelay``, ``group``, ``failOnDataLoss``,
``rowsPerSplit``, ``payloadSchema`` with ``mode``. ``Trigger.AvailableNow`` is supported.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

try:
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # a pyspark without Trigger.AvailableNow for Python sources (tested with 4.3.0)

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in: this pyspark cannot tell a Python source about Trigger.AvailableNow."""


from .databases import choose_database
from .options import SparkOptionError, get_duration, get_group, get_int, get_str
from .optionset import check_options
from .ranges import Positions, Range, parse_positions, parse_timestamps, positions_by_time, positions_of
from .reader import ReadSpec, Split, matching_topics, read_split, run_sequencer, split_range, topic_selection
from .runtime import database

#: ``maxTriggerDelay``'s default, as in Spark's Kafka source.
DEFAULT_MAX_TRIGGER_DELAY = 15 * 60.0
#: Offsets inside the reader: ``{topic: {partition: last offset}}``.
Offsets = dict[str, dict[int, int]]
K = TypeVar("K", bound=Hashable)


def head_offsets(alias: str, topic: str) -> dict[int, int]:
    """Return ``{partition: head offset}`` of the topic's sequenced partitions."""
    # Imported here: Django is set up by runtime.database(), after Spark imported this module.
    from ..db.store.log import LogStore

    return LogStore(alias).head_offsets(topic)


def earliest_offsets(alias: str, topic: str) -> dict[int, int]:
    """Return, per partition, the offset just below the oldest retained message (the head if none)."""
    from ..db.store.log import LogFilter, LogStore

    store = LogStore(alias)
    marks = store.head_offsets(topic)
    for partition, first, _ in store.offset_ranges(topic, LogFilter()):
        marks[partition] = first - 1
    return marks


def admit(start: Mapping[K, int], latest: Mapping[K, int], max_rows: int) -> dict[K, int]:
    """Advance ``start`` towards ``latest`` by at most ``max_rows`` offsets in all.

    The budget is shared round-robin between the partitions that have new messages, so
    one busy partition cannot starve the others.
    """
    end = {p: int(start.get(p, 0)) for p in latest}
    pending = sorted((p for p in latest if latest[p] > end[p]), key=repr)
    budget = max_rows
    while budget > 0 and pending:
        share = max(1, budget // len(pending))
        still = []
        for p in pending:
            if budget <= 0:
                break
            step = min(share, latest[p] - end[p], budget)
            end[p] += step
            budget -= step
            if end[p] < latest[p]:
                still.append(p)
        pending = still
    return end


def _flat(offsets: Offsets) -> dict[tuple[str, int], int]:
    return {(t, p): o for t, parts in offsets.items() for p, o in parts.items()}


def _nest(flat: Mapping[tuple[str, int], int]) -> Offsets:
    nested: Offsets = {}
    for (t, p), o in flat.items():
        nested.setdefault(t, {})[p] = o
    return nested


class MessageStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming reader of the ``sqlqueue`` data source."""

    def __init__(self, options: Mapping[str, str], schema: Any) -> None:
        self.options = check_options(options, "stream read")
        self.topics, self.pattern = topic_selection(self.options)
        self.options = choose_database(self.options, self.topics, "stream read")
        # One topic keeps the flat offsets of earlier versions (checkpoints stay valid).
        self.nested = self.pattern is not None or len(self.topics) != 1
        self.max_rows = get_int(self.options, "maxOffsetsPerTrigger", None, minimum=1)
        self.min_rows = get_int(self.options, "minOffsetsPerTrigger", None, minimum=1)
        self.max_delay = get_duration(self.options, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY)
        if get_str(self.options, "maxTriggerDelay") and not self.min_rows:
            raise SparkOptionError("option 'maxTriggerDelay' goes with 'minOffsetsPerTrigger'.")
        if self.max_rows and self.min_rows and self.min_rows > self.max_rows:
            raise SparkOptionError(
                f"minOffsetsPerTrigger {self.min_rows} is more than maxOffsetsPerTrigger {self.max_rows}."
            )
        self.rows_per_split = get_int(self.options, "rowsPerSplit", 100_000, minimum=1) or 100_000
        self.spec = ReadSpec.from_options(self.options, schema)
        starting = get_str(self.options, "startingOffsets", "earliest").strip()
        self.latest_start = starting.lower() == "latest"
        self.starting: Positions | None = (
            None if self.latest_start else parse_positions(self.options, "startingOffsets", "earliest")
        )
        self.start_times = parse_timestamps(self.options)
        if self.start_times is not None and get_str(self.options, "startingOffsets"):
            raise SparkOptionError("give startingOffsets or a starting timestamp, not both.")
        self.group = get_group(self.options)
        #: Trigger.AvailableNow: the offsets the query stops at (set by prepareForTriggerAvailableNow).
        self.target: Offsets | None = None
        self.last_batch = time.monotonic()
        #: The group's watermarks as last written (not written again unchanged).
        self.written: Offsets = {}

    # -- offsets as Spark stores them ---------------------------------------------------------

    def _encode(self, offsets: Offsets) -> dict:
        if self.nested:
            return {t: {str(p): o for p, o in parts.items()} for t, parts in offsets.items()}
        return {str(p): o for p, o in offsets.get(self.topics[0], {}).items()}

    def _decode(self, offset: dict | None) -> Offsets:
        if not offset:
            return {}
        if self.nested:
            return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in offset.items()}
        return {self.topics[0]: {int(p): int(o) for p, o in offset.items()}}

    def _topics(self, alias: str) -> list[str]:
        return self.topics if self.pattern is None else matching_topics(alias, self.pattern)

    def _latest(self) -> Offsets:
        with database(self.options) as alias:
            topics = self._topics(alias)
            run_sequencer(alias, topics)
            return {topic: head_offsets(alias, topic) for topic in topics}

    # -- the stream ----------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        """Where a query without a checkpoint starts: the group's watermarks, else ``startingOffsets``."""
        offsets: Offsets = {}
        with database(self.options) as alias:
            # Imported once Django is set up (by database()).
            from ..db.store import QueueStore

            store = QueueStore(alias)
            topics = self._topics(alias)
            if self.latest_start or self.start_times is not None:
                run_sequencer(alias, topics)
            for topic in topics:
                marks = store.group_watermarks(self.group, topic) if self.group else {}
                if not marks:
                    if self.start_times is not None:
                        marks = positions_by_time(alias, topic, self.start_times)
                    elif self.latest_start:
                        marks = head_offsets(alias, topic)
                    elif self.starting is not None:
                        marks = dict(positions_of(self.starting, topic) or {})
                    else:
                        marks = earliest_offsets(alias, topic)
                    if self.group and marks:
                        # A new group, created where the query starts: GC keeps everything above.
                        self._refuse_live_workers(store, {topic: marks})
                        store.set_watermarks(self.group, topic, marks)
                offsets[topic] = marks
        return self._encode(offsets)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: stop at what is sequenced now (later messages wait for the next run)."""
        self.target = self._latest()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        # Spark calls commit(end) of a micro-batch only when it plans the next one *with
        # data*; ``start`` here is the end of the last batch the sink committed, durable in
        # the checkpoint's commit log: the group's watermarks follow it at every trigger.
        self._write_watermarks(self._decode(start))
        begin = _flat(self._decode(start))
        latest = _flat(self._target() if self.target is not None else self._latest())
        if isinstance(limit, ReadMaxRows):
            end = admit(begin, latest, limit.max_rows)
        else:
            end = {p: max(int(latest[p]), begin.get(p, 0)) for p in latest}
        # Keep partitions of the start that have no head row any more (never the case today).
        for p, o in begin.items():
            end.setdefault(p, o)
        if self.min_rows and self.target is None:
            pending = sum(o - begin.get(p, 0) for p, o in end.items())
            if pending < self.min_rows and time.monotonic() - self.last_batch < self.max_delay:
                return self._encode(_nest(begin))  # wait for more (no micro-batch this trigger)
        if end != begin:
            self.last_batch = time.monotonic()
        return self._encode(_nest(end))

    def _target(self) -> Offsets:
        assert self.target is not None
        return self.target

    def reportLatestOffset(self) -> dict | None:
        return None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = self._decode(start)
        new = [(t, p) for t, parts in self._decode(end).items() for p in parts if p not in begin.get(t, {})]
        if new:
            # A topic or partition that appeared after the query started: from its oldest retained offset.
            with database(self.options) as alias:
                for topic in {t for t, _ in new}:
                    earliest = earliest_offsets(alias, topic)
                    for t, p in new:
                        if t == topic and p in earliest:
                            begin.setdefault(topic, {})[p] = min(earliest[p], self._decode(end)[t][p])
        splits: list[InputPartition] = []
        for topic, parts in sorted(self._decode(end).items()):
            for p, last in sorted(parts.items()):
                first = begin.get(topic, {}).get(p, 0) + 1
                if last >= first:
                    splits.extend(split_range(topic, p, first, last, self.rows_per_split))
        return splits

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if not isinstance(partition, Split):
            return  # Spark plans one empty partition when there are no splits
        with database(self.options) as alias:
            yield from read_split(alias, partition, Range(), self.spec)

    def commit(self, end: dict) -> None:
        """With ``group``: write ``end`` as the group's watermarks (GC may then delete up to them)."""
        self._write_watermarks(self._decode(end))

    def _write_watermarks(self, offsets: Offsets) -> None:
        if not self.group or not offsets or offsets == self.written:
            return
        with database(self.options) as alias:
            from ..db.store import QueueStore

            store = QueueStore(alias)
            if not self.written:
                self._refuse_live_workers(store, offsets)
            for topic, parts in offsets.items():
                store.set_watermarks(self.group, topic, parts)
        self.written = offsets

    def _refuse_live_workers(self, store: Any, offsets: Offsets) -> None:
        """The group is the stream's own: refuse one that ``runconsumer`` workers consume."""
        from ..conf import get_settings

        assert self.group is not None
        lease = get_settings().LEASE_DURATION
        for topic in offsets:
            live = store.active_subscriber_names(self.group, topic, lease)
            if live:
                raise SparkOptionError(
                    f"option group={self.group!r}: the group has live workers on topic {topic!r} "
                    f"({', '.join(live[:5])}); a stream's group must be its own (their acks and the stream's "
                    "watermarks would overwrite each other). Pick another group name."
                )
