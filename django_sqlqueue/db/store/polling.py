"""The poll state: one query telling a worker which of its partitions may have work."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .base import IN_FLIGHT, StoreBase

#: The columns of :meth:`PollStore.poll_state_query`, in order.
POLL_COLUMNS = (
    "partition_",
    "head",
    "watermark",
    "has_offsets_row",
    "delivered_max",
    "next_due",
    "in_flight",
    "next_acked",
    "next_gone",
    "unsequenced",
    "now_",
)


@dataclass(frozen=True)
class PartitionState:
    """What one poll needs to know about a held partition, from one query."""

    partition: int
    head: int
    watermark: int
    has_offsets_row: bool
    #: Highest offset with a delivery-state row (delivered, parked or acked), if any.
    delivered_max: int | None
    #: Earliest invisible_until of the partition's unacked rows, if any.
    next_due: dt.datetime | None
    #: Unacked rows being worked on right now (status IN_FLIGHT, still invisible).
    in_flight: int
    #: The row right after the watermark is acked, or that offset was garbage-collected:
    #: the watermark can move.
    advanceable: bool
    #: Committed messages wait for the sequencer to number them.
    unsequenced: bool
    now: dt.datetime


class PollStore(StoreBase):
    """The poll state: one statement per poll of a subscription, which on PostgreSQL can
    run the sequencing round as well (:meth:`poll_and_sequence`)."""

    def poll_state(self, group: str, topic: str, name: str, lease_duration: float) -> list[PartitionState]:
        """The partitions ``name`` validly leases that may have work, in partition order."""
        sql, params = self.poll_state_query(group, topic, name, lease_duration)
        return self.poll_states(self._fetchall_hot(f"{sql} ORDER BY l.{self.P}", params))

    def poll_and_sequence(
        self, group: str, topic: str, name: str, lease_duration: float, round_fragment: tuple[str, list[Any]]
    ) -> tuple[list[PartitionState], dict[int, int]]:
        """:meth:`poll_state` and the sequencing round of its partitions with unsequenced
        messages in one statement (PostgreSQL; ``round_fragment`` is
        ``Sequencer.round_fragment(topic, "todo.parts")``): the states, and the new head of
        each partition the round numbered.

        The poll state is read first, in the statement's snapshot, without locks (a
        MATERIALIZED CTE: once). The round's function runs after it, exactly once, and only if
        a partition has unsequenced messages: with none, ``todo`` has no row and an idle poll
        stays a plain read. The states carry the heads read before the round.
        """
        poll_sql, poll_params = self.poll_state_query(group, topic, name, lease_duration)
        round_sql, round_params = round_fragment
        columns = ", ".join(POLL_COLUMNS)
        sql = (
            f"WITH polled ({columns}) AS MATERIALIZED ({poll_sql}), "
            "todo AS (SELECT parts FROM (SELECT array_agg(partition_ ORDER BY partition_)::bigint[] AS parts "
            "FROM polled WHERE unsequenced) a WHERE a.parts IS NOT NULL), "
            f"moved AS MATERIALIZED (SELECT r.moved_partition, r.moved_head FROM todo, LATERAL {round_sql} r) "
            f"SELECT {columns}, moved.moved_head FROM polled "
            "LEFT JOIN moved ON moved.moved_partition = polled.partition_ ORDER BY polled.partition_"
        )
        rows = self._fetchall_hot(sql, [*poll_params, *round_params])
        heads = {int(row[0]): int(row[-1]) for row in rows if row[-1] is not None}
        return self.poll_states([row[:-1] for row in rows]), heads

    def poll_state_query(self, group: str, topic: str, name: str, lease_duration: float) -> tuple[str, list[Any]]:
        """The one query of :meth:`poll_state`, unordered, and its parameters; its columns are
        :data:`POLL_COLUMNS`.

        Partitions whose head equals the watermark and that have nothing waiting for the
        sequencer are filtered out before any per-partition subquery runs, so idle
        partitions cost almost nothing; the subqueries are primary-key or index dives.
        """
        d, P, OFF = self.dialect, self.P, self.OFF
        cutoff, cutoff_params = d.now_minus(lease_duration)
        same = f"d.consumer_group = l.consumer_group AND d.topic = l.topic AND d.{P} = l.{P}"
        # A scalar subquery, not EXISTS: in the WHERE clause MariaDB turns EXISTS into a
        # semi-join that materializes every partition's NULL offsets (an index scan of
        # the whole log); this is one dive into (topic, partition, offset) per partition.
        unsequenced = (
            f"(SELECT 1 FROM queue_messages u {d.use_index('queue_msg_offset')} WHERE u.topic = l.topic "
            f"AND u.{P} = l.{P} AND u.{OFF} IS NULL LIMIT 1) IS NOT NULL"
        )
        sql = (
            f"SELECT l.{P}, p.head_offset, COALESCE(o.offset_acked, 0), o.offset_acked IS NOT NULL, "
            f"(SELECT MAX(d.message_offset) FROM queue_delivery_state d WHERE {same}), "
            f"(SELECT MIN(d.invisible_until) FROM queue_delivery_state d WHERE {same} AND d.acked = FALSE), "
            f"(SELECT COUNT(*) FROM queue_delivery_state d WHERE {same} AND d.acked = FALSE "
            f"AND d.status = {IN_FLIGHT} AND d.invisible_until > {d.now_sql}), "
            f"(SELECT d.acked FROM queue_delivery_state d WHERE {same} "
            "AND d.message_offset = COALESCE(o.offset_acked, 0) + 1), "
            # The message right above the watermark is gone although the head is past it:
            # GC (or an operator's purge or replay) removed offsets the watermark must skip.
            # One unique-index probe; a correlated "oldest retained offset" would step
            # through every unsequenced (NULL offset) entry of the partition first.
            f"p.head_offset > COALESCE(o.offset_acked, 0) AND NOT EXISTS (SELECT 1 FROM queue_messages m "
            f"WHERE m.topic = l.topic AND m.{P} = l.{P} AND m.{OFF} = COALESCE(o.offset_acked, 0) + 1), "
            f"{unsequenced}, {d.now_sql} "
            # The leased_by index: InnoDB appends the primary key (group, topic, partition) to
            # it, so this is one ref read of the subscriber's own leases, in partition order.
            # Left to itself MariaDB ranges over the primary key's (group, topic) prefix and
            # reads every lease of the topic (4,096 rows per idle poll of every worker).
            f"FROM queue_partition_leases l {d.use_index('queue_lease_leased_by')} "
            f"JOIN queue_partitions p ON p.topic = l.topic AND p.{P} = l.{P} "
            f"LEFT JOIN queue_offsets o ON o.consumer_group = l.consumer_group AND o.topic = l.topic AND o.{P} = l.{P} "
            f"WHERE l.consumer_group = %s AND l.topic = %s AND l.leased_by = %s AND l.lease_renewed_at > {cutoff} "
            f"AND (p.head_offset > COALESCE(o.offset_acked, 0) OR {unsequenced})"
        )
        return sql, [group, topic, name, *cutoff_params]

    def poll_states(self, rows: Sequence[Sequence[Any]]) -> list[PartitionState]:
        """The :class:`PartitionState` of each row of :meth:`poll_state_query`."""
        d = self.dialect
        return [
            PartitionState(
                partition=int(r[0]),
                head=int(r[1]),
                watermark=int(r[2]),
                has_offsets_row=bool(r[3]),
                delivered_max=None if r[4] is None else int(r[4]),
                next_due=d.to_datetime(r[5]),
                in_flight=int(r[6] or 0),
                advanceable=bool(r[7]) or bool(r[8]),
                unsequenced=bool(r[9]),
                now=d.to_datetime(r[10]),
            )
            for r in rows
        ]
