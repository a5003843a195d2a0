"""The operator's overview: one read of everything that matters, with the problems flagged.

Every query is bounded by the small tables (groups x topics x partitions) or capped
(``MessageReportStore.capped_count``); none counts or scans ``queue_messages`` as a whole. The
one exception is exact on purpose: lag includes the sequencer's backlog, counted over
the index of unsequenced rows (see ``db/store/reports.py``, which also defines in flight
and retrying, the same numbers as ``queue_status``'s and the metrics').

A topic consumed by no group is a problem (nothing reads it, GC never deletes it), except a
dead-letter topic: no group consumes one by design, its dead letters wait for a replay or a
purge (``TopicInfo.orphaned``). Too many dead letters is a health threshold instead
(``SQLQUEUE["HEALTH"]["MAX_DEAD_LETTERS"]``, ``ops/health.py``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from ..conf import get_settings
from ..consumers import known_consumers
from ..db.store import DeliveryCounts, QueueStore
from ..rules.atomic_modes import describe
from ..rules.dlq import dlq_topic
from .base import alias, store, topic_alias
from .groups import GroupTopic, list_groups
from .leases import Lease, Subscriber, list_leases, list_subscribers
from .pausing import PausedTopic, paused_topics
from .topics import TopicInfo, list_topics

#: Counts above this are shown as "CAP+" (they stay cheap whatever the backlog).
COUNT_CAP = 10_000


@dataclass(frozen=True)
class GroupTopicStatus:
    """A row of the overview: one group's consumption of one topic."""

    group: str
    topic: str
    partitions: int
    live_subscribers: int
    lag: int
    #: Publication time of the oldest message the lag counts: the earliest of the messages
    #: right after the group's watermark in each partition (the head of each line) and the
    #: topic's oldest message still waiting for the sequencer. None when there is none.
    oldest_unhandled_at: dt.datetime | None
    #: Delivered, neither acked nor nacked, expired ones included (``DeliveryCounts.in_flight_total``).
    in_flight: int
    #: Nacked, waiting for their retry (``DeliveryCounts.retrying_total``).
    retrying: int
    dead_letters: int
    paused: bool
    stale_leases: int
    #: No live subscriber, messages behind it: it keeps GC from deleting the topic's messages.
    holds_back_gc: bool
    last_ack_at: dt.datetime | None
    #: Seconds since ``oldest_unhandled_at`` by the database clock (0 when nothing is unhandled):
    #: the one definition ``queue_health --max-lag-seconds`` checks (``ops/health.py``).
    lag_seconds: float = 0.0
    #: The consumer's ``atomic`` option as declared in this project's code ("no", "per
    #: message", "per batch"; "" when this process declares no such consumer).
    atomic: str = ""

    @property
    def problems(self) -> list[str]:
        out = []
        if self.holds_back_gc:
            out.append(f"no live subscriber, {self.lag} message(s) behind: holds back garbage collection")
        if self.stale_leases:
            out.append(f"{self.stale_leases} stale lease(s)")
        if self.paused:
            out.append("paused")
        return out


@dataclass(frozen=True)
class TopicStatus:
    info: TopicInfo
    #: Committed messages without an offset yet (sequencer backlog), capped at COUNT_CAP.
    unsequenced: int
    #: The dead letters of the pair ``<topic>`` / ``<topic><DLQ_SUFFIX>``, capped at the
    #: overview's cap: on a topic's row its messages that some group dead-lettered, on its
    #: dead-letter topic's row the dead letters that topic holds -- the same rows, so the
    #: two rows show the same number (every group's, unlike ``GroupTopicStatus.dead_letters``).
    dead_letters: int


@dataclass
class Overview:
    now: dt.datetime
    groups: list[GroupTopicStatus] = field(default_factory=list)
    topics: list[TopicStatus] = field(default_factory=list)
    stale_leases: list[Lease] = field(default_factory=list)
    silent_subscribers: list[Subscriber] = field(default_factory=list)
    paused: list[PausedTopic] = field(default_factory=list)
    cap: int = COUNT_CAP
    #: The database alias it describes.
    database: str = ""

    @property
    def orphaned_topics(self) -> list[TopicStatus]:
        """Topics no group consumes, dead-letter topics left out (``TopicInfo.orphaned``)."""
        return [t for t in self.topics if t.info.orphaned]

    @property
    def problems(self) -> list[str]:
        """One line per problem, worst first."""
        out = []
        for g in self.groups:
            if g.holds_back_gc:
                out.append(
                    f"group {g.group} has no live subscriber on {g.topic} and is {g.lag} message(s) behind: "
                    "it holds back garbage collection (drop it if it is retired)"
                )
        for lease in self.stale_leases:
            out.append(
                f"stale lease: {lease.group}:{lease.topic}[{lease.partition}] held by {lease.leased_by}, "
                f"last renewed {lease.renewed_at.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC"
                if lease.renewed_at
                else f"stale lease: {lease.group}:{lease.topic}[{lease.partition}] held by {lease.leased_by}"
            )
        for s in self.silent_subscribers:
            out.append(f"subscriber {s.name} of {s.group}:{s.topic} sends no heartbeat")
        # A dead-letter topic is consumed by no group by design (its dead letters wait for a
        # replay or a purge): the Topics table says so, it is not a problem.
        for t in self.orphaned_topics:
            out.append(f"topic {t.info.topic} is consumed by no group: its messages are never collected")
        for p in self.paused:
            out.append(f"group {p.group} is paused on {p.topic}" + (f" ({p.reason})" if p.reason else ""))
        return out


def overview(using: str | None = None, cap: int = COUNT_CAP) -> Overview:
    """Everything the console's first page shows, of one database (``using``, else the chosen one or
    ``SQLQUEUE["DATABASE"]``: see :mod:`django_sqlqueue.ops.base`)."""
    using = alias(using)
    s = store(using)
    now = s.now()
    stale = list_leases(stale_only=True, using=using)
    rows = _rows(s, now, list_groups(using=using), stale, cap)
    subscribers = list_subscribers(using=using)
    topics = list_topics(using)
    suffix = get_settings().DLQ_SUFFIX
    # A topic and its dead-letter topic show the same count: one capped read per pair.
    pair = {t.topic: t.topic if t.dead_letter_topic else dlq_topic(t.topic, suffix) for t in topics}
    dead = {name: s.dead_letter_count(name, cap=cap) for name in sorted(set(pair.values()))}
    unsequenced = s.unsequenced_capped(cap)
    return Overview(
        now=now,
        groups=rows,
        topics=[TopicStatus(t, unsequenced.get(t.topic, 0), dead[pair[t.topic]]) for t in topics],
        stale_leases=stale,
        silent_subscribers=[s for s in subscribers if s.silent],
        paused=paused_topics(using),
        cap=cap,
        database=using,
    )


def consumer_atomic(group: str, topic: str) -> str:
    """The ``atomic`` option of the consumer of ``topic`` in ``group`` as declared in this
    project's code ("no", "per message", "per batch"), or "" if it declares none."""
    for c in known_consumers():
        if (c.group, c.topic) == (group, topic):
            return describe(c.atomic)
    return ""


def group_statuses(
    group: str | None = None, topic: str | None = None, *, using: str | None = None, cap: int = COUNT_CAP
) -> tuple[dt.datetime, list[GroupTopicStatus]]:
    """Return the database time and the overview's group rows (of ``group`` and/or ``topic`` only).

    The rows ``queue_health`` checks (``ops/health.py``): the same numbers the console shows.
    Of one database: ``using``, else ``topic``'s (or the chosen one, or ``SQLQUEUE["DATABASE"]``).
    """
    using = topic_alias(topic, using)
    s = store(using)
    now = s.now()
    groups = list_groups(group, topic, using=using)
    return now, _rows(s, now, groups, list_leases(group, topic, stale_only=True, using=using), cap, group, topic)


def _rows(
    s: QueueStore,
    now: dt.datetime,
    groups: list[GroupTopic],
    stale: list[Lease],
    cap: int,
    group: str | None = None,
    topic: str | None = None,
) -> list[GroupTopicStatus]:
    """The overview's rows of ``groups``: a constant number of grouped reads (the capped
    dead-letter counts of every (group, topic) in one statement)."""
    if not groups:
        return []
    oldest = s.oldest_unhandled()
    unsequenced_since = s.oldest_unsequenced(sorted({g.topic for g in groups}))
    deliveries: dict[tuple[str, str], DeliveryCounts] = {}
    for (g, t, _), counts in s.delivery_counts(group, topic).items():
        deliveries[(g, t)] = deliveries.get((g, t), DeliveryCounts()) + counts
    suffix = get_settings().DLQ_SUFFIX
    dead = s.dead_letter_counts([(dlq_topic(g.topic, suffix), g.group) for g in groups], cap)
    atomic = {(c.group, c.topic): describe(c.atomic) for c in known_consumers()}
    return [
        _status(
            g,
            now,
            min((at for at in (oldest.get((g.group, g.topic)), unsequenced_since.get(g.topic)) if at), default=None),
            deliveries.get((g.group, g.topic), DeliveryCounts()),
            dead.get((dlq_topic(g.topic, suffix), g.group), 0),
            sum(1 for lease in stale if lease.group == g.group and lease.topic == g.topic),
            atomic.get((g.group, g.topic), ""),
        )
        for g in groups
    ]


def _status(
    g: GroupTopic,
    now: dt.datetime,
    oldest: dt.datetime | None,
    c: DeliveryCounts,
    dead: int,
    stale: int,
    atomic: str = "",
) -> GroupTopicStatus:
    return GroupTopicStatus(
        group=g.group,
        topic=g.topic,
        partitions=g.partitions,
        live_subscribers=g.live_subscribers,
        lag=g.lag,
        oldest_unhandled_at=oldest,
        in_flight=c.in_flight_total,
        retrying=c.retrying_total,
        dead_letters=dead,
        paused=g.paused,
        stale_leases=stale,
        holds_back_gc=g.live_subscribers == 0 and g.lag > 0 and not g.paused,
        last_ack_at=g.last_ack_at,
        lag_seconds=max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0,
        atomic=atomic,
    )
