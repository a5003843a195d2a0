"""The operator's overview: one read of everything that matters, with the problems flagged.

Every query is bounded by the small tables (groups x topics x partitions) or capped
(``capped_count``); none counts or scans ``queue_messages`` as a whole.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from ..conf import get_settings
from ..models import Message
from . import _db
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
    oldest_unhandled_at: dt.datetime | None
    in_flight: int
    retrying: int
    dead_letters: int
    paused: bool
    stale_leases: int
    #: No live subscriber, messages behind it: it keeps GC from deleting the topic's messages.
    holds_back_gc: bool
    last_ack_at: dt.datetime | None

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

    @property
    def unconsumed_topics(self) -> list[TopicStatus]:
        return [t for t in self.topics if t.info.unconsumed]

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
                f"last renewed {lease.renewed_at:%Y-%m-%d %H:%M:%S}"
                if lease.renewed_at
                else f"stale lease: {lease.group}:{lease.topic}[{lease.partition}] held by {lease.leased_by}"
            )
        for s in self.silent_subscribers:
            out.append(f"subscriber {s.name} of {s.group}:{s.topic} sends no heartbeat")
        for t in self.unconsumed_topics:
            kind = "dead-letter topic" if t.info.dead_letter_topic else "topic"
            out.append(f"{kind} {t.info.topic} is consumed by no group: its messages are never collected")
        for p in self.paused:
            out.append(f"group {p.group} is paused on {p.topic}" + (f" ({p.reason})" if p.reason else ""))
        return out


def _oldest_unhandled(using: str) -> dict[tuple[str, str], dt.datetime]:
    """Publication time of the message right after each watermark (unique-index lookups)."""
    p, o = _db.qn("partition", using), _db.qn("offset", using)
    d = _db.dialect(using)
    rows = _db.fetchall(
        f"SELECT w.consumer_group, w.topic, MIN(m.published_at) FROM queue_offsets w JOIN queue_messages m "
        f"ON m.topic = w.topic AND m.{p} = w.{p} AND m.{o} = w.offset_acked + 1 GROUP BY w.consumer_group, w.topic",
        using=using,
    )
    return {(g, t): d.to_datetime(at) for g, t, at in rows if at is not None}  # type: ignore[misc]


def _deliveries(using: str) -> dict[tuple[str, str], dict[int, int]]:
    out: dict[tuple[str, str], dict[int, int]] = {}
    for g, t, status, n in _db.fetchall(
        "SELECT consumer_group, topic, status, COUNT(*) FROM queue_delivery_state WHERE acked = %s "
        "GROUP BY consumer_group, topic, status",
        [False],
        using,
    ):
        out.setdefault((g, t), {})[int(status)] = int(n)
    return out


def _dead_letters(pairs: list[tuple[str, str]], topics: list[str], cap: int, using: str) -> tuple[dict, dict]:
    """Dead letters per (group, topic) and per topic, each a capped range of the (topic, id) index.

    A dead letter's id is ``<group>:<original id>`` (the ORM escapes the prefix for LIKE).
    """
    suffix = get_settings().DLQ_SUFFIX
    messages = Message.objects.using(using)
    per_group = {
        (g, t): messages.filter(topic=f"{t}{suffix}", id__startswith=f"{g}:")[: cap + 1].count() for g, t in pairs
    }
    per_topic = {t: messages.filter(topic=f"{t}{suffix}")[: cap + 1].count() for t in topics if not t.endswith(suffix)}
    return per_group, per_topic


def _unsequenced(using: str, cap: int) -> dict[str, int]:
    """Messages waiting for an offset, per topic, over the partitions the sequencer knows.

    Each count is a range of the index that serves the sequencer's own read (MySQL: the
    unique (topic, partition, offset) index, NULLs first; PostgreSQL/SQLite: the partial
    index of unsequenced rows), capped.
    """
    p, o = _db.qn("partition", using), _db.qn("offset", using)
    out: dict[str, int] = {}
    for topic, part in _db.fetchall(f"SELECT topic, {p} FROM queue_partitions", using=using):
        n = _db.capped_count(
            f"SELECT 1 FROM queue_messages WHERE topic = %s AND {p} = %s AND {o} IS NULL", [topic, part], cap, using
        )
        out[topic] = min(cap + 1, out.get(topic, 0) + n)
    return out


def overview(using: str | None = None, cap: int = COUNT_CAP) -> Overview:
    """Everything the console's first page shows."""
    using = _db.alias(using)
    now = _db.db_now(using)
    groups = list_groups(using=using)
    leases = list_leases(using=using)
    subscribers = list_subscribers(using=using)
    topics = list_topics(using)
    oldest = _oldest_unhandled(using)
    deliveries = _deliveries(using)
    pairs = [(g.group, g.topic) for g in groups]
    dl_group, dl_topic = _dead_letters(pairs, [t.topic for t in topics], cap, using)
    unsequenced = _unsequenced(using, cap)
    stale = [lease for lease in leases if lease.stale]
    rows = []
    for g in groups:
        c = deliveries.get((g.group, g.topic), {})
        rows.append(
            _status(
                g,
                oldest,
                c,
                dl_group.get((g.group, g.topic), 0),
                sum(1 for lease in stale if lease.group == g.group and lease.topic == g.topic),
            )
        )
    return Overview(
        now=now,
        groups=rows,
        topics=[TopicStatus(t, unsequenced.get(t.topic, 0), dl_topic.get(t.topic, 0)) for t in topics],
        stale_leases=stale,
        silent_subscribers=[s for s in subscribers if s.silent],
        paused=paused_topics(using),
        cap=cap,
    )


def _status(g: GroupTopic, oldest: dict, c: dict[int, int], dead: int, stale: int) -> GroupTopicStatus:
    return GroupTopicStatus(
        group=g.group,
        topic=g.topic,
        partitions=g.partitions,
        live_subscribers=g.live_subscribers,
        lag=g.lag,
        oldest_unhandled_at=oldest.get((g.group, g.topic)),
        in_flight=c.get(1, 0),
        retrying=c.get(2, 0),
        dead_letters=dead,
        paused=g.paused,
        stale_leases=stale,
        holds_back_gc=g.live_subscribers == 0 and g.lag > 0 and not g.paused,
        last_ack_at=g.last_ack_at,
    )
