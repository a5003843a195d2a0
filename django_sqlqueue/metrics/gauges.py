"""The queue gauges, read from the database at scrape time (a custom collector, no global state).

:func:`read_snapshot` reads everything in a constant number of statements whatever the
number of groups, topics and partitions (``ops.overview.group_statuses``, the lag per
partition and the leases: grouped reads of the small tables, index ranges of the log);
in flight and retrying are the overview rows' numbers, so the store's one definition
(``DeliveryCounts.in_flight_total``/``retrying_total``), as ``queue_status`` and the console;
:class:`QueueCollector` turns a snapshot into metric families and :func:`render` into
the text exposition format. Labels are bounded: database, group, topic, partition --
never a message id or key.

Every database of the queue (``SQLQUEUE["DATABASE"]`` and ``SQLQUEUE["TOPIC_DATABASES"]``'s
aliases) is read in turn (:func:`read_snapshots`), and every series carries the alias in
its ``database`` label. A database that fails its read (down, unreachable, no tables)
does not fail the scrape: its series are left out and ``sqlqueue_database_up`` says 0 for
it, 1 for each database read.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import Error as DatabaseError
from django.db import connections

from django_sqlqueue.conf import get_settings
from django_sqlqueue.db.store import PartitionLag
from django_sqlqueue.ops.base import store
from django_sqlqueue.ops.overview import GroupTopicStatus, group_statuses

logger = logging.getLogger(__name__)

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
    #: The alias of the database read (the ``database`` label).
    database: str = ""


@dataclass
class Scrape:
    """What one scrape read from every database: the snapshots, and the aliases that failed."""

    snapshots: list[Snapshot] = field(default_factory=list)
    #: Aliases whose read failed (``sqlqueue_database_up`` 0), in ``conf.databases`` order.
    down: list[str] = field(default_factory=list)


def read_snapshots(aliases: Sequence[str] | None = None) -> Scrape:
    """Read every database of the queue (or ``aliases``); one that fails is reported, not raised.

    The databases are read one after the other on this thread: a scrape holds one
    connection at a time, and no statement spans two databases.
    """
    scrape = Scrape()
    for alias in get_settings().databases if aliases is None else aliases:
        try:
            scrape.snapshots.append(read_snapshot(alias))
        except DatabaseError as exc:
            logger.warning("metrics: reading database=%s failed: %s", alias, exc)
            scrape.down.append(alias)
            _discard(alias)
    return scrape


def _discard(alias: str) -> None:
    """Close the failed connection (outside a transaction), so the next scrape opens a new one."""
    connection = connections[alias]
    if not connection.in_atomic_block:
        try:
            connection.close()
        except DatabaseError:
            pass  # a connection that cannot even close is already gone


def read_snapshot(using: str | None = None) -> Snapshot:
    """Read the queue's state of one database (``SQLQUEUE["DATABASE"]`` by default) in a
    constant number of statements."""
    using = using or get_settings().DATABASE
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
        database=using,
    )


class QueueCollector:
    """A ``prometheus_client`` collector of snapshots (register it on a private registry).

    Built from one :class:`Snapshot` or a :class:`Scrape` of several databases; each
    family holds the series of every database, told apart by the ``database`` label.
    """

    def __init__(self, snapshot: Snapshot | Scrape) -> None:
        self.scrape = snapshot if isinstance(snapshot, Scrape) else Scrape(snapshots=[snapshot])

    def describe(self) -> list[Any]:
        return []  # an unchecked collector: the families depend on the database

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily(
            "sqlqueue_database_up",
            "1 when the scrape read the queue's tables of the database, 0 when that read failed.",
            labels=["database"],
        )
        for snap in self.scrape.snapshots:
            up.add_metric([snap.database], 1)
        for alias in self.scrape.down:
            up.add_metric([alias], 0)
        yield up
        lag = GaugeMetricFamily(
            "sqlqueue_consumergroup_lag",
            "Messages published and committed that the group has not acked yet, per partition.",
            labels=["database", "group", "topic", "partition"],
        )
        for snap in self.scrape.snapshots:
            for p in snap.partitions:
                lag.add_metric([snap.database, p.group, p.topic, str(p.partition)], p.lag)
        yield lag
        yield from self._group_families(GaugeMetricFamily)
        unsequenced = GaugeMetricFamily(
            "sqlqueue_topic_unsequenced_messages",
            "Committed messages of the topic waiting for the sequencer to give them an offset.",
            labels=["database", "topic"],
        )
        for snap in self.scrape.snapshots:
            for topic, n in sorted(snap.unsequenced.items()):
                unsequenced.add_metric([snap.database, topic], n)
        yield unsequenced

    def _group_families(self, family: Any) -> Iterator[Any]:
        """The gauges per (database, group, topic)."""
        gt = ["database", "group", "topic"]
        families = {
            "lag_seconds": family(
                "sqlqueue_consumergroup_lag_seconds",
                "Age in seconds of the oldest message the group has not handled (0 when caught up).",
                labels=gt,
            ),
            "dead": family(
                "sqlqueue_dead_letters",
                f"Messages of the topic the group dead-lettered (in the topic's dead-letter topic), "
                f"capped at {DEAD_LETTER_CAP + 1}.",
                labels=gt,
            ),
            "subscribers": family(
                "sqlqueue_live_subscribers",
                "Subscribers of the group on the topic with a heartbeat within LEASE_DURATION.",
                labels=gt,
            ),
            "leased": family(
                "sqlqueue_leased_partitions",
                "Partitions of the topic with a live lease of the group.",
                labels=gt,
            ),
            "paused": family(
                "sqlqueue_consumergroup_paused", "1 when the group's consumption of the topic is paused.", labels=gt
            ),
            "in_flight": family(
                "sqlqueue_in_flight_messages", "Messages delivered to the group and not acked yet.", labels=gt
            ),
            "retrying": family(
                "sqlqueue_retrying_messages", "Messages nacked by the group, waiting for their retry.", labels=gt
            ),
        }
        for snap in self.scrape.snapshots:
            for g in snap.groups:
                labels = [snap.database, g.group, g.topic]
                families["lag_seconds"].add_metric(labels, g.lag_seconds)
                families["dead"].add_metric(labels, g.dead_letters)
                families["subscribers"].add_metric(labels, g.live_subscribers)
                families["leased"].add_metric(labels, snap.leased.get((g.group, g.topic), 0))
                families["paused"].add_metric(labels, 1 if g.paused else 0)
                families["in_flight"].add_metric(labels, g.in_flight)
                families["retrying"].add_metric(labels, g.retrying)
        yield from families.values()


def render(snapshot: Snapshot | Scrape) -> tuple[bytes, str]:
    """Return the text exposition of ``snapshot`` and its content type (a private registry per call)."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(snapshot))
    return generate_latest(registry), CONTENT_TYPE_LATEST
