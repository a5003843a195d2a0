"""The queue gauges, read from the database at scrape time (a custom collector, no global state).

:func:`read_snapshot` reads everything in a constant number of statements whatever the
number of groups, topics and partitions (``ops.overview.group_statuses``, the lag per
partition and the leases: grouped reads of the small tables, index ranges of the log);
in flight and retrying are the overview rows' numbers, so the store's one definition
(``DeliveryCounts.in_flight_total``/``retrying_total``), as ``queue_status`` and the console;
:class:`QueueCollector` turns a snapshot into metric families and :func:`render` into
the text exposition format. Labels are bounded: group, topic, partition -- never a
message id or key.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django_sqlqueue.conf import get_settings
from django_sqlqueue.db.store import PartitionLag
from django_sqlqueue.ops.base import store
from django_sqlqueue.ops.overview import GroupTopicStatus, group_statuses

#: Dead-letter counts are capped (an index range of at most this many + 1 rows each).
DEAD_LETTER_CAP = 100_000


@dataclass
class Snapshot:
    """What one scrape read: the database time and the rows the metrics are built from."""

    now: dt.datetime
    groups: list[GroupTopicStatus] = field(default_factory=list)
    partitions: list[PartitionLag] = field(default_factory=list)
    #: Committed messages without an offset yet, per topic with head rows.
    unsequenced: dict[str, int] = field(default_factory=dict)
    #: Live (renewed within LEASE_DURATION) partition leases per (group, topic).
    leased: dict[tuple[str, str], int] = field(default_factory=dict)


def read_snapshot(using: str | None = None) -> Snapshot:
    """Read the queue's state for one scrape, in a constant number of statements."""
    now, rows = group_statuses(using=using, cap=DEAD_LETTER_CAP)
    s = store(using)
    topics = sorted({t for t, _ in s.heads()})
    unsequenced = dict.fromkeys(topics, 0)
    for (topic, _), n in s.unsequenced(topics).items():
        unsequenced[topic] = unsequenced.get(topic, 0) + n
    leased: dict[tuple[str, str], int] = {}
    for lease in s.leases(None, None, get_settings().LEASE_DURATION):
        if not lease.stale:
            leased[(lease.group, lease.topic)] = leased.get((lease.group, lease.topic), 0) + 1
    return Snapshot(
        now=now,
        groups=rows,
        partitions=s.lags([(g.group, g.topic) for g in rows]),
        unsequenced=unsequenced,
        leased=leased,
    )


class QueueCollector:
    """A ``prometheus_client`` collector of a :class:`Snapshot` (register it on a private registry)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def describe(self) -> list[Any]:
        return []  # an unchecked collector: the families depend on the database

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        snap = self.snapshot
        lag = GaugeMetricFamily(
            "sqlqueue_consumergroup_lag",
            "Messages published and committed that the group has not acked yet, per partition.",
            labels=["group", "topic", "partition"],
        )
        for p in snap.partitions:
            lag.add_metric([p.group, p.topic, str(p.partition)], p.lag)
        yield lag
        gt = ["group", "topic"]
        families = {
            "lag_seconds": GaugeMetricFamily(
                "sqlqueue_consumergroup_lag_seconds",
                "Age in seconds of the oldest message the group has not handled (0 when caught up).",
                labels=gt,
            ),
            "dead": GaugeMetricFamily(
                "sqlqueue_dead_letters",
                f"Messages of the topic the group dead-lettered (in the topic's dead-letter topic), "
                f"capped at {DEAD_LETTER_CAP + 1}.",
                labels=gt,
            ),
            "subscribers": GaugeMetricFamily(
                "sqlqueue_live_subscribers",
                "Subscribers of the group on the topic with a heartbeat within LEASE_DURATION.",
                labels=gt,
            ),
            "leased": GaugeMetricFamily(
                "sqlqueue_leased_partitions",
                "Partitions of the topic with a live lease of the group.",
                labels=gt,
            ),
            "paused": GaugeMetricFamily(
                "sqlqueue_consumergroup_paused", "1 when the group's consumption of the topic is paused.", labels=gt
            ),
            "in_flight": GaugeMetricFamily(
                "sqlqueue_in_flight_messages", "Messages delivered to the group and not acked yet.", labels=gt
            ),
            "retrying": GaugeMetricFamily(
                "sqlqueue_retrying_messages", "Messages nacked by the group, waiting for their retry.", labels=gt
            ),
        }
        for g in snap.groups:
            labels = [g.group, g.topic]
            families["lag_seconds"].add_metric(labels, g.lag_seconds)
            families["dead"].add_metric(labels, g.dead_letters)
            families["subscribers"].add_metric(labels, g.live_subscribers)
            families["leased"].add_metric(labels, snap.leased.get((g.group, g.topic), 0))
            families["paused"].add_metric(labels, 1 if g.paused else 0)
            families["in_flight"].add_metric(labels, g.in_flight)
            families["retrying"].add_metric(labels, g.retrying)
        yield from families.values()
        unsequenced = GaugeMetricFamily(
            "sqlqueue_topic_unsequenced_messages",
            "Committed messages of the topic waiting for the sequencer to give them an offset.",
            labels=["topic"],
        )
        for topic, n in sorted(snap.unsequenced.items()):
            unsequenced.add_metric([topic], n)
        yield unsequenced


def render(snapshot: Snapshot) -> tuple[bytes, str]:
    """Return the text exposition of ``snapshot`` and its content type (a private registry per call)."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(snapshot))
    return generate_latest(registry), CONTENT_TYPE_LATEST
