"""Consumer groups: what they consume, their watermarks per partition, and dropping a retired one.

Seeking (rewind / fast-forward) is in ``ops/seek.py``, pausing in ``ops/pausing.py``.
Dropping a group deletes its leases first, in the same transaction, which is the same
fence a seek uses against live workers (see ``ops/seek.py``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..conf import get_settings
from ..db.store import DeliveryCounts
from ..db.store import lag as partition_lag
from ..rules.limits import MAX_BIGINT
from ..rules.validation import validate_group, validate_topic
from .base import NotFound, OperationError, listing_aliases, store, topic_alias

# -- reading ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupTopic:
    """One group's consumption of one topic."""

    group: str
    topic: str
    partitions: int
    lag: int
    live_subscribers: int
    paused: bool
    last_ack_at: dt.datetime | None
    #: The database alias that holds the group's rows of the topic.
    database: str = ""


def heads(topic: str | None = None, using: str | None = None) -> dict[tuple[str, int], int]:
    """Return ``{(topic, partition): head_offset}`` from ``queue_partitions`` (the sequencer's head rows)."""
    return store(topic_alias(topic, using)).heads(None if topic is None else [topic])


def list_groups(group: str | None = None, topic: str | None = None, using: str | None = None) -> list[GroupTopic]:
    """Return every (group, topic) with a watermark row, a subscriber or a pause, sorted.

    Lag is the store's one definition (:func:`django_sqlqueue.db.store.lag`): messages
    published and committed that the group has not acked yet, unsequenced ones included.
    Of ``topic``'s database, or ``using``; without either, of every database (each row
    names its ``database``).
    """
    return [row for db in listing_aliases(topic, using) for row in _groups(group, topic, db)]


def _groups(group: str | None, topic: str | None, using: str) -> list[GroupTopic]:
    s = store(using)
    partitions: dict[tuple[str, str], set[int]] = {}
    last_ack: dict[tuple[str, str], dt.datetime] = {}
    for w in s.watermarks(group, topic):
        pair = (w.group, w.topic)
        partitions.setdefault(pair, set()).add(w.partition)
        if w.updated_at and (last_ack.get(pair) is None or w.updated_at > last_ack[pair]):
            last_ack[pair] = w.updated_at
    live: dict[tuple[str, str], int] = {}
    for sub in s.subscribers(group, topic, get_settings().LEASE_DURATION):
        live[(sub.group, sub.topic)] = live.get((sub.group, sub.topic), 0) + int(sub.live)
    paused = {(p.group, p.topic) for p in s.paused_topics(group, topic)}
    pairs = sorted(set(partitions) | set(live) | paused)
    lag: dict[tuple[str, str], int] = {}
    for row in s.lags(pairs):
        pair = (row.group, row.topic)
        partitions.setdefault(pair, set()).add(row.partition)
        lag[pair] = lag.get(pair, 0) + row.lag
    return [
        GroupTopic(
            g,
            t,
            len(partitions.get((g, t), ())),
            lag.get((g, t), 0),
            live.get((g, t), 0),
            (g, t) in paused,
            last_ack.get((g, t)),
            using,
        )
        for g, t in pairs
    ]


@dataclass(frozen=True)
class PartitionOffset:
    """A group's position in one partition."""

    partition: int
    head: int
    watermark: int
    #: Delivered, neither acked nor nacked, expired ones included (``DeliveryCounts.in_flight_total``).
    in_flight: int
    #: Nacked, waiting for their retry (``DeliveryCounts.retrying_total``).
    retrying: int
    leased_by: str | None
    lease_renewed_at: dt.datetime | None
    lease_stale: bool
    #: Committed messages of the partition without an offset yet (part of the lag).
    unsequenced: int = 0

    @property
    def lag(self) -> int:
        """Messages published and committed that the group has not acked yet (``store.lag``)."""
        return partition_lag(self.head, self.watermark, self.unsequenced)


def group_offsets(group: str, topic: str, using: str | None = None) -> list[PartitionOffset]:
    """Return head, watermark, lag, deliveries and lease of each partition of ``topic`` for ``group``."""
    using = topic_alias(topic, using)
    s = store(using)
    wm = s.group_watermarks(group, topic)
    if not wm and not list_groups(group, topic, using):
        raise NotFound(f"consumer group {group!r} does not consume topic {topic!r}.")
    lags = {row.partition: row for row in s.lags([(group, topic)])}
    counts = {part: c for (_, _, part), c in s.delivery_counts(group, topic).items()}
    leases = {
        lease.partition: (lease.leased_by, lease.renewed_at, lease.stale)
        for lease in s.leases(group, topic, get_settings().LEASE_DURATION)
    }
    rows = []
    for part in sorted(set(lags) | set(wm)):
        holder, renewed, stale = leases.get(part, (None, None, False))
        c = counts.get(part, DeliveryCounts())
        row = lags.get(part)
        rows.append(
            PartitionOffset(
                part,
                row.head if row else 0,
                wm.get(part, 0),
                c.in_flight_total,
                c.retrying_total,
                holder,
                renewed,
                stale,
                row.unsequenced if row else 0,
            )
        )
    return rows


# -- drop ------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupDrop:
    group: str
    topic: str | None
    rows: dict[str, int]
    live_subscribers: int
    dry_run: bool = False
    #: The database aliases the group had rows in (and lost them, unless ``dry_run``).
    databases: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.rows.values())


def drop_group(
    group: str, *, topic: str | None = None, force: bool = False, dry_run: bool = False, using: str | None = None
) -> GroupDrop:
    """Forget a retired consumer group (or its consumption of one ``topic``) so GC can proceed.

    Deletes its leases, delivery state, watermarks, heartbeats and pause rows in one
    transaction. A group with a live subscriber (heartbeat within LEASE_DURATION) is
    refused unless ``force``: its workers would recreate the rows and start over from
    the oldest message still in the log. ``dry_run`` counts the rows only.

    On ``topic``'s database, or ``using``; without either, on every database that has
    rows of the group (one transaction each, after checking all of them).
    """
    validate_group(group)
    if topic is not None:
        validate_topic(topic, max_length=10_000)
    duration = get_settings().LEASE_DURATION
    live, found = 0, {}
    for db in listing_aliases(topic, using):
        s = store(db)
        live += sum(1 for sub in s.subscribers(group, topic, duration) if sub.live)
        counts = s.group_rows(group, topic)
        if any(counts.values()):
            found[db] = counts
    if not found:
        raise NotFound(f"consumer group {group!r} has no rows" + (f" for topic {topic!r}." if topic else "."))
    if live and not force:
        raise OperationError(
            f"consumer group {group!r} has {live} live subscriber(s); stop its workers first "
            "(or force it: they would start over from the oldest message in the log). Nothing was deleted."
        )
    if not dry_run:
        found = {db: store(db).drop_group(group, topic) for db in found}
    rows: dict[str, int] = {}
    for counts in found.values():
        for table, n in counts.items():
            rows[table] = rows.get(table, 0) + n
    return GroupDrop(group, topic, rows, live, dry_run=dry_run, databases=list(found))


def parse_partitions(values: Sequence[str] | str | None) -> list[int] | None:
    """Parse "0,3,5" / ["0", "3"] into partition numbers; None/empty means all."""
    if values is None or values == "" or values == []:
        return None
    items = values.split(",") if isinstance(values, str) else [v for x in values for v in str(x).split(",")]
    try:
        numbers = sorted({int(x) for x in items if x.strip() != ""})
    except ValueError as exc:
        raise OperationError(f"partitions must be integers, got {values!r}.") from exc
    if numbers and not -MAX_BIGINT <= numbers[0] <= numbers[-1] <= MAX_BIGINT:
        raise OperationError(f"partitions must be at most {MAX_BIGINT}, got {values!r}.")
    return numbers or None
