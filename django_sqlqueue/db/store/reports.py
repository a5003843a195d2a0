"""Grouped reads of consumer groups and partitions, for operators: ``queue_status``, the console, Spark.

Plain reads, no locks: a report is a snapshot and may be a moment old. Each read is one
grouped query over the small tables (groups x topics x partitions); reads of
``queue_messages`` are index ranges (the head of a partition, its unsequenced messages),
never a scan of the log. :class:`ReportStore` reads positions and lag, subscribers,
leases and pauses; the reads about messages -- deliveries by status, dead letters, the
log's counters -- are ``message_reports.py``'s.

The numbers every operator surface shows (``queue_status``, the console, the metrics,
``queue_health``) are defined here, once:

**Lag** has one definition, :func:`lag`: the messages of a partition that were published
and committed but that the group has not acked yet -- the sequenced ones above its
watermark (``head - watermark``) plus those committed but not numbered yet (the
sequencer runs in the workers' polls, so a burst waits there a moment before it gets
offsets). Every report reads it through :meth:`ReportStore.lags`.

**In flight and retrying** have one definition each, by the delivery's status code
(:class:`DeliveryCounts`): :attr:`~DeliveryCounts.in_flight_total` counts every unacked
``IN_FLIGHT`` delivery, its visibility timeout running or ended -- an expired delivery
was not nacked and its attempt is not over (its handler may still run, with
``timeout=None``, or its worker died) until a poll redelivers it;
:attr:`~DeliveryCounts.retrying_total` counts the ``RETRY`` ones, nacked (by the handler,
or by the watchdog at a handler timeout) and waiting for their retry.

Liveness has one definition too, the engine's: a lease or heartbeat is live while it
was renewed within ``LEASE_DURATION`` (``renewed > now - LEASE_DURATION``, by the
database clock), stale otherwise -- the moment another subscriber may take it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .base import StoreBase, in_list


def lag(head: int, watermark: int, unsequenced: int) -> int:
    """Return the messages of a partition published and committed that a group has not acked yet."""
    return max(head - watermark, 0) + unsequenced


@dataclass(frozen=True)
class PartitionLag:
    """A group's position in one partition, and what it has still to handle."""

    group: str
    topic: str
    partition: int
    #: Highest offset the sequencer handed out.
    head: int
    watermark: int
    #: Committed messages without an offset yet.
    unsequenced: int

    @property
    def lag(self) -> int:
        return lag(self.head, self.watermark, self.unsequenced)


class Watermark(NamedTuple):
    group: str
    topic: str
    partition: int
    offset: int
    updated_at: dt.datetime | None


@dataclass(frozen=True)
class DeliveryCounts:
    """Unacked delivery state of a partition by status (``queue_delivery_state.status``).

    The fields split by status and visibility, as read; what the operator surfaces show
    are :attr:`in_flight_total` and :attr:`retrying_total` (the module docstring says why).
    """

    #: IN_FLIGHT with the visibility timeout still running.
    in_flight: int = 0
    #: IN_FLIGHT whose visibility timeout ended: due for redelivery, not redelivered yet.
    expired: int = 0
    #: RETRY: nacked, waiting for the retry.
    retry: int = 0
    #: SCHEDULED: parked until their deliver_at.
    scheduled: int = 0

    @property
    def in_flight_total(self) -> int:
        """Delivered and neither acked nor nacked: every IN_FLIGHT delivery, expired ones included."""
        return self.in_flight + self.expired

    @property
    def retrying_total(self) -> int:
        """Nacked (by the handler or at a handler timeout), waiting for the retry: the RETRY deliveries."""
        return self.retry

    def __add__(self, other: DeliveryCounts) -> DeliveryCounts:
        return DeliveryCounts(
            self.in_flight + other.in_flight,
            self.expired + other.expired,
            self.retry + other.retry,
            self.scheduled + other.scheduled,
        )


class SubscriberRow(NamedTuple):
    group: str
    topic: str
    name: str
    heartbeat_at: dt.datetime | None
    deregistered_at: dt.datetime | None
    live: bool


class LeaseRow(NamedTuple):
    group: str
    topic: str
    partition: int
    leased_by: str
    leased_at: dt.datetime | None
    renewed_at: dt.datetime | None
    stale: bool


class PausedRow(NamedTuple):
    group: str
    topic: str
    paused_at: dt.datetime | None
    paused_by: str
    reason: str


def where_filters(group: str | None, topic: str | None, prefix: str = "") -> tuple[str, list[Any]]:
    """``WHERE consumer_group = %s AND topic = %s`` for the filters given (or nothing)."""
    conds, params = [], []
    for column, value in (("consumer_group", group), ("topic", topic)):
        if value is not None:
            conds.append(f"{prefix}{column} = %s")
            params.append(value)
    return (" WHERE " + " AND ".join(conds) if conds else ""), params


class ReportStore(StoreBase):
    """Reads of groups and partitions: heads, watermarks, lag, subscribers, leases, pauses."""

    # -- positions and lag -----------------------------------------------------------

    def heads(self, topics: Sequence[str] | None = None) -> dict[tuple[str, int], int]:
        """Return ``{(topic, partition): head_offset}`` from the sequencer's head rows."""
        sql = f"SELECT topic, {self.P}, head_offset FROM queue_partitions"
        if topics is not None:
            if not topics:
                return {}
            sql += f" WHERE topic IN ({in_list(topics)})"
        return {(t, int(part)): int(head) for t, part, head in self._fetchall(sql, list(topics or ()))}

    def watermarks(self, group: str | None = None, topic: str | None = None) -> list[Watermark]:
        """Return the watermark rows (``queue_offsets``) of ``group`` and/or ``topic``, or all."""
        where, params = where_filters(group, topic)
        d = self.dialect
        return [
            Watermark(g, t, int(part), int(acked), d.to_datetime(updated))
            for g, t, part, acked, updated in self._fetchall(
                f"SELECT consumer_group, topic, {self.P}, offset_acked, updated_at FROM queue_offsets{where}", params
            )
        ]

    def unsequenced(self, topics: Sequence[str]) -> dict[tuple[str, int], int]:
        """Return ``{(topic, partition): committed messages without an offset}`` of ``topics``.

        As long as the sequencer's backlog: PostgreSQL/SQLite read the partial index of
        unsequenced rows; MySQL/MariaDB one range of the unique (topic, partition, offset)
        index per partition with a head row (NULLs first), so there a partition that has no
        head row yet (a per-key topic's new key, before its first sequencing) is not counted,
        as :meth:`lags` never counts it (``Dialect.unsequenced_via_heads``).
        """
        if not topics:
            return {}
        P, OFF = self.P, self.OFF
        if self.dialect.unsequenced_via_heads:
            # Pinned (on MySQL/MariaDB, the vendor of this branch): the head rows first, then one
            # range of the offset index each. Right after a bulk load, without statistics,
            # MariaDB chose (topic, seq) and walked the whole topic per head row (issue 32).
            sql = (
                f"SELECT h.topic, h.{P}, COUNT(*) FROM queue_partitions h {self.dialect.straight_join} "
                f"queue_messages m {self.dialect.use_index('queue_msg_offset')} "
                f"ON m.topic = h.topic AND m.{P} = h.{P} AND m.{OFF} IS NULL "
                f"WHERE h.topic IN ({in_list(topics)}) GROUP BY h.topic, h.{P}"
            )
        else:
            sql = (
                f"SELECT topic, {P}, COUNT(*) FROM queue_messages WHERE topic IN ({in_list(topics)}) "
                f"AND {OFF} IS NULL GROUP BY topic, {P}"
            )
        return {(t, int(part)): int(n) for t, part, n in self._fetchall(sql, list(topics))}

    def lags(self, pairs: Iterable[tuple[str, str]]) -> list[PartitionLag]:
        """Return the lag of each (group, topic) in ``pairs`` per partition with a head row, sorted.

        A partition gets its head row when a worker registers the topic or the sequencer
        first sees a message of it; before that it has no offsets to lag behind.
        """
        pairs = sorted(set(pairs))
        topics = sorted({t for _, t in pairs})
        groups = {g for g, _ in pairs}
        # Three reads, not one snapshot (PostgreSQL's READ COMMITTED gives each statement its
        # own), so their order matters: the unsequenced messages, then the heads, then the
        # watermarks. A message the sequencer numbers between two reads is counted in the first
        # or below the head it raised; heads read before the unsequenced count could miss it
        # and report a lag of 0 while it still waited. The cost of this order is a moment's
        # over-count (a message counted unsequenced and already below a head).
        unsequenced = self.unsequenced(topics)
        heads = self.heads(topics)
        # One group or one topic (a page of one group, ``queue_status --group``) narrows the read.
        marks = {
            (w.group, w.topic, w.partition): w.offset
            for w in self.watermarks(
                next(iter(groups)) if len(groups) == 1 else None, topics[0] if len(topics) == 1 else None
            )
            if w.group in groups
        }
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for (t, part), head in sorted(heads.items()):
            by_topic.setdefault(t, []).append((part, head))
        return [
            PartitionLag(g, t, part, head, marks.get((g, t, part), 0), unsequenced.get((t, part), 0))
            for g, t in pairs
            for part, head in by_topic.get(t, [])
        ]

    def consumer_pairs(self, group: str | None = None, topic: str | None = None) -> list[tuple[str, str]]:
        """Return every (group, topic) with a watermark row or a heartbeat, sorted (GC's "consumers")."""
        where, params = where_filters(group, topic)
        rows = self._fetchall(
            f"SELECT consumer_group, topic FROM queue_offsets{where} UNION "
            f"SELECT consumer_group, topic FROM queue_subscriber_heartbeats{where}",
            params * 2,
        )
        return sorted({(g, t) for g, t in rows})

    def oldest_unhandled(self) -> dict[tuple[str, str], dt.datetime]:
        """Return per (group, topic) the publication time of the oldest message right after a watermark.

        One unique-index lookup (topic, partition, offset) per watermark row.
        """
        P, OFF, d = self.P, self.OFF, self.dialect
        rows = self._fetchall(
            f"SELECT w.consumer_group, w.topic, MIN(m.published_at) FROM queue_offsets w JOIN queue_messages m "
            f"ON m.topic = w.topic AND m.{P} = w.{P} AND m.{OFF} = w.offset_acked + 1 "
            "GROUP BY w.consumer_group, w.topic"
        )
        out: dict[tuple[str, str], dt.datetime] = {}
        for g, t, at in rows:
            when = d.to_datetime(at)
            if when is not None:
                out[(g, t)] = when
        return out

    def oldest_unsequenced(self, topics: Sequence[str] | None = None) -> dict[str, dt.datetime]:
        """Return per topic the publication time of its oldest committed message without an offset.

        One grouped statement over the unsequenced rows (the index range the sequencer
        reads), as long as the sequencer's backlog, like the unsequenced part of the lag (and,
        on MySQL/MariaDB, over the same partitions: those with a head row, see :meth:`unsequenced`).
        """
        if topics is not None and not topics:
            return {}
        P, OFF = self.P, self.OFF
        if self.dialect.unsequenced_via_heads:
            where = "" if topics is None else f" WHERE h.topic IN ({in_list(topics)})"
            # Pinned as in :meth:`unsequenced` (the > 50 s call of issue 32 was this one).
            sql = (
                f"SELECT h.topic, MIN(m.published_at) FROM queue_partitions h {self.dialect.straight_join} "
                f"queue_messages m {self.dialect.use_index('queue_msg_offset')} "
                f"ON m.topic = h.topic AND m.{P} = h.{P} AND m.{OFF} IS NULL{where} GROUP BY h.topic"
            )
        else:
            where = "" if topics is None else f" AND topic IN ({in_list(topics)})"
            sql = f"SELECT topic, MIN(published_at) FROM queue_messages WHERE {OFF} IS NULL{where} GROUP BY topic"
        out: dict[str, dt.datetime] = {}
        for t, at in self._fetchall(sql, list(topics or ())):
            when = self.dialect.to_datetime(at)
            if when is not None:
                out[t] = when
        return out

    # -- subscribers, leases, pauses ----------------------------------------------------------

    def subscribers(self, group: str | None, topic: str | None, lease_duration: float) -> list[SubscriberRow]:
        """Return heartbeat rows, sorted, each flagged live (not deregistered, beat within the lease)."""
        d = self.dialect
        cutoff, cparams = d.now_minus(lease_duration)
        where, params = where_filters(group, topic)
        return [
            SubscriberRow(g, t, name, d.to_datetime(hb), d.to_datetime(gone), bool(live))
            for g, t, name, hb, gone, live in self._fetchall(
                "SELECT consumer_group, topic, subscriber_name, heartbeat_at, deregistered_at, "
                f"CASE WHEN deregistered_at IS NULL AND heartbeat_at > {cutoff} THEN 1 ELSE 0 END "
                f"FROM queue_subscriber_heartbeats{where} ORDER BY consumer_group, topic, subscriber_name",
                [*cparams, *params],
            )
        ]

    def leases(
        self, group: str | None, topic: str | None, lease_duration: float, *, stale_only: bool = False
    ) -> list[LeaseRow]:
        """Return lease rows, sorted, each flagged stale (not renewed within the lease: free to take)."""
        d = self.dialect
        cutoff, cparams = d.now_minus(lease_duration)
        where, params = where_filters(group, topic)
        if stale_only:
            where = (where + " AND" if where else " WHERE") + f" lease_renewed_at <= {cutoff}"
            params += cparams
        return [
            LeaseRow(g, t, int(part), by, d.to_datetime(at), d.to_datetime(renewed), bool(stale))
            for g, t, part, by, at, renewed, stale in self._fetchall(
                f"SELECT consumer_group, topic, {self.P}, leased_by, leased_at, lease_renewed_at, "
                f"CASE WHEN lease_renewed_at <= {cutoff} THEN 1 ELSE 0 END FROM queue_partition_leases{where} "
                f"ORDER BY consumer_group, topic, {self.P}",
                [*cparams, *params],
            )
        ]

    def paused_topics(self, group: str | None = None, topic: str | None = None) -> list[PausedRow]:
        """Return the pause rows (``queue_paused_topics``), sorted."""
        d = self.dialect
        where, params = where_filters(group, topic)
        return [
            PausedRow(g, t, d.to_datetime(at), by, reason)
            for g, t, at, by, reason in self._fetchall(
                f"SELECT consumer_group, topic, paused_at, paused_by, reason FROM queue_paused_topics{where} "
                "ORDER BY consumer_group, topic",
                params,
            )
        ]
