"""Queue status: per group/topic/partition head, watermark, lag, deliveries, DLQ, lease.

:func:`queue_status` is what ``manage.py queue_status`` prints (the admin console shows
``ops.overview``). A thin view over the store's grouped reads (``store/reports.py``):
a handful of queries, whatever the number of partitions, and the same lag as the
console's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..conf import get_settings
from ..consumers import known_consumers
from ..db.store import DeliveryCounts, QueueStore
from ..rules.atomic_modes import describe
from ..rules.dlq import dlq_topic
from .base import topic_alias


@dataclass(frozen=True)
class PartitionStatus:
    group: str
    topic: str
    partition: int
    #: Highest offset the sequencer handed out.
    head: int
    watermark: int
    #: Committed messages not numbered yet (the sequencer runs in the workers' polls).
    unsequenced: int
    #: Messages published and committed but not yet acked by the group (``store.lag``:
    #: head - watermark + unsequenced).
    lag: int
    #: Delivered, neither acked nor nacked, its visibility timeout running or ended
    #: (``DeliveryCounts.in_flight_total``, the console's and the metrics' number).
    in_flight: int
    #: Nacked and waiting for their retry (``DeliveryCounts.retrying_total``).
    retrying: int
    #: Delayed messages parked until their deliver_at.
    scheduled: int
    lease_holder: str | None
    lease_live: bool


@dataclass(frozen=True)
class GroupSummary:
    group: str
    topics: tuple[str, ...]
    partitions: int
    lag: int
    in_flight: int
    retrying: int
    #: This group's messages in the dead-letter topics of its topics.
    dead_letters: int
    live_subscribers: int
    #: Messages of its topics waiting for the sequencer.
    unsequenced: int = 0


@dataclass(frozen=True)
class ConsumerInfo:
    """A consumer this project's code declares (``consumers.known_consumers``)."""

    group: str
    topic: str
    #: "no", "per message" or "per batch" (``@consumer(atomic=...)``).
    atomic: str


@dataclass(frozen=True)
class QueueStatus:
    partitions: list[PartitionStatus] = field(default_factory=list)
    groups: list[GroupSummary] = field(default_factory=list)
    #: The atomic consumers declared in this project's code (the others are not listed).
    atomic_consumers: list[ConsumerInfo] = field(default_factory=list)


def atomic_consumers(group: str | None = None, topic: str | None = None) -> list[ConsumerInfo]:
    """The atomic consumers this project declares (of ``group``/``topic`` only)."""
    return [
        ConsumerInfo(c.group, c.topic, describe(c.atomic))
        for c in known_consumers()
        if c.atomic and (group is None or c.group == group) and (topic is None or c.topic == topic)
    ]


def queue_status(*, group: str | None = None, topic: str | None = None, using: str | None = None) -> QueueStatus:
    """Return the status of every consumer group (or ``group``) on every topic it consumes.

    Of one database: ``using``, else ``topic``'s (or the chosen one, or ``SQLQUEUE["DATABASE"]``);
    ``queue_status`` reads each database in turn.
    """
    conf = get_settings()
    store = QueueStore(topic_alias(topic, using))
    pairs = store.consumer_pairs(group, topic)
    consumers = atomic_consumers(group, topic)
    if not pairs:
        return QueueStatus(atomic_consumers=consumers)
    lags = store.lags(pairs)
    deliveries = store.delivery_counts(group, topic)
    leases = {
        (lease.group, lease.topic, lease.partition): (lease.leased_by, not lease.stale)
        for lease in store.leases(group, topic, conf.LEASE_DURATION)
    }
    # Distinct subscribers per group: one worker consuming two topics is one subscriber.
    subscribers: dict[str, set[str]] = {}
    for sub in store.subscribers(group, topic, conf.LEASE_DURATION):
        if sub.live:
            subscribers.setdefault(sub.group, set()).add(sub.name)
    dead: dict[str, int] = {}
    for g, t in pairs:
        dead[g] = dead.get(g, 0) + store.dead_letter_count(dlq_topic(t, conf.DLQ_SUFFIX), g)

    result: list[PartitionStatus] = []
    for p in lags:
        c = deliveries.get((p.group, p.topic, p.partition), DeliveryCounts())
        holder, live = leases.get((p.group, p.topic, p.partition), (None, False))
        result.append(
            PartitionStatus(
                group=p.group,
                topic=p.topic,
                partition=p.partition,
                head=p.head,
                watermark=p.watermark,
                unsequenced=p.unsequenced,
                lag=p.lag,
                in_flight=c.in_flight_total,
                retrying=c.retrying_total,
                scheduled=c.scheduled,
                lease_holder=holder,
                lease_live=live,
            )
        )
    summaries = []
    for g in sorted({g for g, _ in pairs}):
        mine = [p for p in result if p.group == g]
        summaries.append(
            GroupSummary(
                group=g,
                topics=tuple(sorted({t for gg, t in pairs if gg == g})),
                partitions=len(mine),
                lag=sum(p.lag for p in mine),
                in_flight=sum(p.in_flight for p in mine),
                retrying=sum(p.retrying for p in mine),
                dead_letters=dead.get(g, 0),
                live_subscribers=len(subscribers.get(g, ())),
                unsequenced=sum(p.unsequenced for p in mine),
            )
        )
    return QueueStatus(partitions=result, groups=summaries, atomic_consumers=consumers)
