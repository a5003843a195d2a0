"""Queue status: per group/topic/partition head, watermark, lag, deliveries, DLQ, lease.

:func:`queue_status` is what ``manage.py queue_status`` prints and what the admin shows.
A handful of grouped queries, whatever the number of partitions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connections

from .conf import get_settings
from .dialects import get_dialect
from .store import IN_FLIGHT, RETRY, SCHEDULED


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
    #: Messages published but not yet acked by the group (head - watermark + unsequenced).
    lag: int
    #: Being worked on now (delivered, visibility not expired).
    in_flight: int
    #: Nacked and waiting for their retry, or delivered and timed out.
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
class QueueStatus:
    partitions: list[PartitionStatus] = field(default_factory=list)
    groups: list[GroupSummary] = field(default_factory=list)


def _in(column: str, values: Sequence[Any]) -> str:
    return f"{column} IN ({', '.join(['%s'] * len(values))})"


def queue_status(*, group: str | None = None, topic: str | None = None, using: str | None = None) -> QueueStatus:
    """Return the status of every consumer group (or ``group``) on every topic it consumes."""
    conf = get_settings()
    connection = connections[using or conf.DATABASE]
    d = get_dialect(connection)
    cutoff, cutoff_params = d.now_minus(conf.LEASE_DURATION)

    def rows(sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    filters, params = [], []
    if group:
        filters.append("consumer_group = %s")
        params.append(group)
    if topic:
        filters.append("topic = %s")
        params.append(topic)
    where = f" WHERE {' AND '.join(filters)}" if filters else ""
    pairs = sorted(
        set(
            rows(
                f"SELECT consumer_group, topic FROM queue_offsets{where} UNION "
                f"SELECT consumer_group, topic FROM queue_subscriber_heartbeats{where}",
                params * 2,
            )
        )
    )
    if not pairs:
        return QueueStatus()
    topics = sorted({t for _, t in pairs})
    groups = sorted({g for g, _ in pairs})

    P, OFF = d.qn("partition"), d.qn("offset")
    partitions: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for t, key, head in rows(
        f"SELECT topic, {P}, head_offset FROM queue_partitions WHERE {_in('topic', topics)} ORDER BY topic, {P}",
        topics,
    ):
        partitions[t].append((int(key), int(head)))
    unsequenced = {
        (t, int(k)): int(n)
        for t, k, n in rows(
            f"SELECT topic, {P}, COUNT(*) FROM queue_messages WHERE {_in('topic', topics)} AND {OFF} IS NULL "
            f"GROUP BY topic, {P}",
            topics,
        )
    }
    marks = {
        (g, t, int(k)): int(o)
        for g, t, k, o in rows(
            f"SELECT consumer_group, topic, {P}, offset_acked FROM queue_offsets "
            f"WHERE {_in('topic', topics)} AND {_in('consumer_group', groups)}",
            [*topics, *groups],
        )
    }
    deliveries = {
        (g, t, int(k)): (int(a or 0), int(b or 0), int(c or 0))
        for g, t, k, a, b, c in rows(
            f"SELECT consumer_group, topic, {P}, "
            f"SUM(CASE WHEN status = {IN_FLIGHT} AND invisible_until > {d.now_sql} THEN 1 ELSE 0 END), "
            f"SUM(CASE WHEN status = {RETRY} OR (status = {IN_FLIGHT} AND invisible_until <= {d.now_sql}) "
            "THEN 1 ELSE 0 END), "
            f"SUM(CASE WHEN status = {SCHEDULED} THEN 1 ELSE 0 END) "
            f"FROM queue_delivery_state WHERE acked = FALSE AND {_in('topic', topics)} "
            f"AND {_in('consumer_group', groups)} GROUP BY consumer_group, topic, {P}",
            [*topics, *groups],
        )
    }
    leases = {
        (g, t, int(k)): (holder, bool(live))
        for g, t, k, holder, live in rows(
            f"SELECT consumer_group, topic, {P}, leased_by, "
            f"CASE WHEN lease_renewed_at > {cutoff} THEN 1 ELSE 0 END FROM queue_partition_leases "
            f"WHERE {_in('topic', topics)} AND {_in('consumer_group', groups)}",
            [*cutoff_params, *topics, *groups],
        )
    }
    # Distinct subscribers per group: one worker consuming two topics is one subscriber.
    subscribers = {
        g: int(n)
        for g, n in rows(
            "SELECT consumer_group, COUNT(DISTINCT subscriber_name) FROM queue_subscriber_heartbeats "
            f"WHERE deregistered_at IS NULL AND heartbeat_at > {cutoff} AND {_in('topic', topics)} "
            "GROUP BY consumer_group",
            [*cutoff_params, *topics],
        )
    }
    dead: dict[str, int] = defaultdict(int)
    for g, t in pairs:
        # Dead letters of a group have ids "<group>:<original id>": a prefix range of the
        # (topic, id) unique index.
        prefix = g.replace("!", "!!").replace("_", "!_").replace("%", "!%")
        ((count,),) = rows(
            "SELECT COUNT(*) FROM queue_messages WHERE topic = %s AND id LIKE %s ESCAPE '!'",
            [f"{t}{conf.DLQ_SUFFIX}", f"{prefix}:%"],
        )
        dead[g] += int(count)

    result: list[PartitionStatus] = []
    for g, t in pairs:
        for key, head in partitions.get(t, []):
            wm = marks.get((g, t, key), 0)
            in_flight, retrying, scheduled = deliveries.get((g, t, key), (0, 0, 0))
            holder, live = leases.get((g, t, key), (None, False))
            result.append(
                PartitionStatus(
                    group=g,
                    topic=t,
                    partition=key,
                    head=head,
                    watermark=wm,
                    unsequenced=unsequenced.get((t, key), 0),
                    lag=max(head - wm, 0) + unsequenced.get((t, key), 0),
                    in_flight=in_flight,
                    retrying=retrying,
                    scheduled=scheduled,
                    lease_holder=holder,
                    lease_live=live,
                )
            )
    summaries = []
    for g in groups:
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
                live_subscribers=subscribers.get(g, 0),
                unsequenced=sum(p.unsequenced for p in mine),
            )
        )
    return QueueStatus(partitions=result, groups=summaries)
