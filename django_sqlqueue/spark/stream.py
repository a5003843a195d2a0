"""Streaming reads: a topic as a stream whose Spark offsets are the queue's offsets.

A Spark offset is ``{"<partition>": <offset>, ...}``: per queue partition, the last
offset read. ``latestOffset`` first runs the sequencer on the topic -- so the stream
advances even when no worker consumes the topic -- and then reads the partitions' head
offsets (``queue_partitions.head_offset``). The sequencer numbers a message only after its
publishing transaction committed, and commits each partition's numbering in one
transaction with the head: every offset up to a committed head is a committed message.
A publisher that commits late gets a later offset and is read by a later micro-batch;
nothing is skipped. The offsets are checkpointed by Spark, so a restarted query
continues where it stopped.

Options: ``topic`` (one), ``startingOffsets`` (``earliest`` -- the default --,
``latest``, or JSON ``{"<partition>": <last offset read>}``), ``maxRecordsPerTrigger``
(admission control: at most that many messages per micro-batch, spread over the
partitions), ``rowsPerSplit``, ``payloadSchema``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from .options import SparkOptionError, get_int, get_str, get_topics
from .reader import Range, Split, read_split, run_sequencer, split_range
from .runtime import database


def head_offsets(alias: str, topic: str) -> dict[str, int]:
    """Return ``{"<partition>": head offset}`` of the topic's sequenced partitions."""
    # Imported here: Django is set up by runtime.database(), after Spark imported this module.
    from ..store.log import LogStore

    return {str(partition): head for partition, head in LogStore(alias).head_offsets(topic).items()}


def admit(start: Mapping[str, int], latest: Mapping[str, int], max_rows: int) -> dict[str, int]:
    """Advance ``start`` towards ``latest`` by at most ``max_rows`` offsets in all.

    The budget is shared round-robin between the partitions that have new messages, so
    one busy partition cannot starve the others.
    """
    end = {p: int(start.get(p, 0)) for p in latest}
    pending = sorted((p for p in latest if latest[p] > end[p]), key=lambda p: int(p))
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


class MessageStreamReader(DataSourceStreamReader):
    """The streaming reader of the ``sqlqueue`` data source (one topic)."""

    def __init__(self, options: Mapping[str, str], parse_payload: bool) -> None:
        self.options = dict(options)
        topics = get_topics(options)
        if len(topics) != 1:
            raise SparkOptionError(f"sqlqueue stream: give exactly one topic, got {', '.join(topics)}.")
        self.topic = topics[0]
        self.max_rows = get_int(options, "maxRecordsPerTrigger", None, minimum=1)
        self.rows_per_split = get_int(options, "rowsPerSplit", 100_000, minimum=1) or 100_000
        self.parse_payload = parse_payload
        self.starting = get_str(options, "startingOffsets", "earliest").strip()

    def _latest(self) -> dict[str, int]:
        with database(self.options) as alias:
            run_sequencer(alias, [self.topic])
            return head_offsets(alias, self.topic)

    def initialOffset(self) -> dict:
        if self.starting == "earliest":
            return {}
        if self.starting == "latest":
            return self._latest()
        try:
            given = json.loads(self.starting)
            return {str(int(p)): int(o) for p, o in given.items()}
        except (ValueError, AttributeError, TypeError):
            raise SparkOptionError(
                f"option 'startingOffsets' must be earliest, latest or JSON {{\"<partition>\": <offset>}}, "
                f"got {self.starting!r}."
            ) from None

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        latest = self._latest()
        begin = {p: int(o) for p, o in (start or {}).items()}
        if isinstance(limit, ReadMaxRows):
            end = admit(begin, latest, limit.max_rows)
        else:
            end = {p: max(int(latest[p]), begin.get(p, 0)) for p in latest}
        # Keep partitions of the start that have no head row any more (never the case today).
        for p, o in begin.items():
            end.setdefault(p, o)
        return end

    def reportLatestOffset(self) -> dict | None:
        return None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        splits: list[InputPartition] = []
        for p, last in sorted(end.items(), key=lambda item: int(item[0])):
            first = int((start or {}).get(p, 0)) + 1
            if int(last) >= first:
                splits.extend(split_range(self.topic, int(p), first, int(last), self.rows_per_split))
        return splits

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if not isinstance(partition, Split):
            return  # Spark plans one empty partition when there are no splits
        with database(self.options) as alias:
            yield from read_split(alias, partition, Range(), self.parse_payload)

    def commit(self, end: dict) -> None:
        """Nothing to release: the log keeps messages until GC (export them before)."""
