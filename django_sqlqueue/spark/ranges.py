"""What a read asks for: its offsets, times and partitions, parsed from the options.

:class:`Range` holds the filters every split of a read shares (``startingOffset(s)``,
``endingOffset(s)``, ``startTime``/``endTime``, ``partitions``) and the starting
timestamps (``startingTimestamp``, ``startingOffsetsByTimestamp``), which planning turns
into starting offsets (:func:`positions_by_time`). Used by the batch reader
(``reader.py``) and the stream reader (``stream.py``). Nothing here imports pyspark; the
store is imported inside the functions that read it, once ``runtime.database()`` has set
Django up.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .options import SparkOptionError, get_int, get_str, get_time

#: ``startingOffsets``/``endingOffsets`` given as JSON: ``{topic or "*": {partition: offset}}``.
Positions = Mapping[str, Mapping[int, int]]


def parse_positions(options: Mapping[str, str], name: str, keyword: str) -> Positions | None:
    """Parse a JSON offsets option (flat per partition, or by topic); None for ``keyword`` or absent."""
    raw = get_str(options, name).strip()
    if not raw or raw.lower() == keyword:
        return None
    try:
        given = json.loads(raw)
        if not isinstance(given, dict):
            raise TypeError
        if all(isinstance(v, dict) for v in given.values()) and given:
            return {str(t): {int(p): int(o) for p, o in by_part.items()} for t, by_part in given.items()}
        return {"*": {int(p): int(o) for p, o in given.items()}}
    except (ValueError, TypeError, AttributeError):
        raise SparkOptionError(
            f'option {name!r} must be {keyword} or JSON {{"<partition>": <offset>}} (or '
            f'{{"<topic>": {{"<partition>": <offset>}}}}), got {raw!r}.'
        ) from None


#: ``startingTimestamp``/``startingOffsetsByTimestamp``: ``{topic or "*": {partition or -1: time}}``.
Timestamps = Mapping[str, Mapping[int, dt.datetime]]
#: The partition key of a time that applies to every partition.
EVERY_PARTITION = -1


def _moment(name: str, value: Any) -> dt.datetime:
    """A time as Kafka gives it (milliseconds since the epoch) or ISO 8601 (naive = UTC)."""
    from ..rules.timeparse import parse_time

    try:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return dt.datetime.fromtimestamp(value / 1000, tz=dt.UTC)
        text = str(value).strip()
        if text.lstrip("-").isdigit():
            return dt.datetime.fromtimestamp(int(text) / 1000, tz=dt.UTC)
        return parse_time(text)
    except (ValueError, OverflowError, OSError):
        raise SparkOptionError(
            f"option {name!r}: {value!r} is neither milliseconds since the epoch nor an ISO 8601 time."
        ) from None


def parse_timestamps(options: Mapping[str, str]) -> Timestamps | None:
    """Parse ``startingTimestamp`` (every partition) or ``startingOffsetsByTimestamp`` (JSON)."""
    single = get_str(options, "startingTimestamp").strip()
    by_partition = get_str(options, "startingOffsetsByTimestamp").strip()
    if single and by_partition:
        raise SparkOptionError("give startingTimestamp or startingOffsetsByTimestamp, not both.")
    if single:
        return {"*": {EVERY_PARTITION: _moment("startingTimestamp", single)}}
    if not by_partition:
        return None
    name = "startingOffsetsByTimestamp"
    try:
        given = json.loads(by_partition)
        if not isinstance(given, dict) or not given:
            raise TypeError
        if all(isinstance(v, dict) for v in given.values()):
            return {str(t): {int(p): _moment(name, v) for p, v in parts.items()} for t, parts in given.items()}
        return {"*": {int(p): _moment(name, v) for p, v in given.items()}}
    except (ValueError, TypeError, AttributeError):
        raise SparkOptionError(
            f'option {name!r} must be JSON {{"<partition>": <ms since epoch>}} or by topic, got {by_partition!r}.'
        ) from None


def positions_by_time(alias: str, topic: str, stamps: Timestamps) -> dict[int, int]:
    """Per partition, the offset just below the first message published at or after its time.

    A partition without such a message starts at its head; one without a time (not named
    in ``startingOffsetsByTimestamp``) at its oldest retained message. Each is a search of
    probes (:meth:`~django_sqlqueue.db.store.seek_reads.SeekReads.first_offset`).
    """
    from ..db.store import QueueStore
    from ..db.store.log import LogFilter, LogStore

    log = LogStore(alias)
    times = stamps.get(topic, stamps.get("*", {}))
    heads = log.head_offsets(topic)
    retained = {p: first for p, first, _ in log.offset_ranges(topic, LogFilter())}
    marks: dict[int, int] = {}
    store = QueueStore(alias)  # one store: the partitions of one time share its seq search
    for partition, head in heads.items():
        moment = times.get(partition, times.get(EVERY_PARTITION))
        first = store.first_offset(topic, partition, moment) if moment else retained.get(partition)
        marks[partition] = head if first is None else first - 1
    return marks


def positions_of(positions: Positions | None, topic: str) -> Mapping[int, int] | None:
    """The positions given for ``topic`` (or for every topic, ``"*"``); None when none were given."""
    if positions is None:
        return None
    return positions.get(topic, positions.get("*", {}))


@dataclass(frozen=True)
class Range:
    """Filters shared by every split of a read."""

    start_offset: int | None = None
    end_offset: int | None = None
    start_time: dt.datetime | None = None
    end_time: dt.datetime | None = None
    partitions: tuple[int, ...] = ()
    #: Per partition: the last offset already read (the read starts after it).
    starts: Positions | None = None
    #: Per partition: the last offset to read.
    ends: Positions | None = None
    #: ``startingTimestamp``/``startingOffsetsByTimestamp``: resolved to ``starts`` when planning.
    start_times: Timestamps | None = None

    @property
    def by_time(self) -> bool:
        return bool(self.start_time or self.end_time)

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
            starts=parse_positions(options, "startingOffsets", "earliest"),
            ends=parse_positions(options, "endingOffsets", "latest"),
            start_times=parse_timestamps(options),
        )
        if found.start_times is not None and (found.start_offset or found.starts is not None):
            raise SparkOptionError("give a starting offset or a starting timestamp, not both.")
        if found.start_offset and found.starts is not None:
            raise SparkOptionError("give startingOffset or startingOffsets, not both.")
        if found.end_offset and found.ends is not None:
            raise SparkOptionError("give endingOffset or endingOffsets, not both.")
        if found.start_offset and found.end_offset and found.start_offset > found.end_offset:
            raise SparkOptionError(f"startingOffset {found.start_offset} is after endingOffset {found.end_offset}.")
        if found.start_time and found.end_time and found.start_time >= found.end_time:
            raise SparkOptionError("startTime must be before endTime.")
        return found

    def first(self, topic: str, partition: int) -> int | None:
        """The first offset asked for in the partition, or None (the oldest retained)."""
        if self.start_offset:
            return self.start_offset
        starts = positions_of(self.starts, topic)
        return None if starts is None or partition not in starts else starts[partition] + 1

    def last(self, topic: str, partition: int) -> int | None:
        """The last offset asked for in the partition, or None (the head)."""
        if self.end_offset:
            return self.end_offset
        ends = positions_of(self.ends, topic)
        return None if ends is None or partition not in ends else ends[partition]
