"""Partition leases: which subscriber of a group owns which partition.

A round costs a few statements whatever the number of partitions: one UPDATE renews
every lease a subscriber holds, one SELECT lists them, one UPDATE steals expired ones
and one multi-row INSERT takes never-leased ones. Multi-row statements list partitions
in sorted order, so two subscribers' rounds lock rows in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import StoreBase, in_list


class LeaseStore(StoreBase):
    def renew_leases(self, group: str, topic: str, name: str) -> list[int]:
        """Renew every lease ``name`` still holds; return those partitions, sorted.

        A lease stolen after it expired, or deleted by an operator, has another (or no)
        ``leased_by`` and is neither renewed nor returned: that is how a subscriber
        learns it lost a partition.
        """
        d = self.dialect
        self._execute(
            f"UPDATE queue_partition_leases SET lease_renewed_at = {d.now_sql} "
            "WHERE consumer_group = %s AND topic = %s AND leased_by = %s",
            [group, topic, name],
        )
        return self.held_partitions(group, topic, name)

    def held_partitions(self, group: str, topic: str, name: str) -> list[int]:
        rows = self._fetchall(
            f"SELECT {self.P} FROM queue_partition_leases WHERE consumer_group = %s AND topic = %s "
            f"AND leased_by = %s ORDER BY {self.P}",
            [group, topic, name],
        )
        return [int(r[0]) for r in rows]

    def release_leases(self, group: str, topic: str, name: str, partitions: Sequence[int] | None = None) -> int:
        """Give up leases (all of ``name``'s, or ``partitions``) so others can take them at once."""
        sql = "DELETE FROM queue_partition_leases WHERE consumer_group = %s AND topic = %s AND leased_by = %s"
        params: list[Any] = [group, topic, name]
        if partitions is not None:
            if not partitions:
                return 0
            wanted = sorted(partitions)
            sql += f" AND {self.P} IN ({in_list(wanted)})"
            params += wanted
        return self._execute(sql, params)

    def free_partitions(self, group: str, topic: str, lease_duration: float) -> list[int]:
        """Partitions of ``topic`` with no lease in ``group``, or an expired one."""
        P = self.P
        cutoff, params = self.dialect.now_minus(lease_duration)
        rows = self._fetchall(
            f"SELECT p.{P} FROM queue_partitions p LEFT JOIN queue_partition_leases l "
            f"ON l.consumer_group = %s AND l.topic = p.topic AND l.{P} = p.{P} "
            f"WHERE p.topic = %s AND (l.{P} IS NULL OR l.lease_renewed_at <= {cutoff}) ORDER BY p.{P}",
            [group, topic, *params],
        )
        return [int(r[0]) for r in rows]

    def acquire_leases(
        self, group: str, topic: str, partitions: Sequence[int], name: str, lease_duration: float
    ) -> list[int]:
        """Try to take ``partitions`` (missing or expired leases); return those now held by ``name``.

        Stealing is one conditional UPDATE: its row locks make it atomic against the
        holder's renewal, and the expiry condition is evaluated on the latest version of
        each row. Missing leases are one multi-row INSERT that skips rows another
        subscriber inserted first. Both list partitions in sorted order.
        """
        if not partitions:
            return []
        d, P = self.dialect, self.P
        wanted = sorted(set(partitions))
        cutoff, params = d.now_minus(lease_duration)
        self._execute(
            f"UPDATE queue_partition_leases SET leased_by = %s, leased_at = {d.now_sql}, "
            f"lease_renewed_at = {d.now_sql} WHERE consumer_group = %s AND topic = %s "
            f"AND {P} IN ({in_list(wanted)}) AND lease_renewed_at <= {cutoff}",
            [name, group, topic, *wanted, *params],
        )
        values = ", ".join([f"(%s, %s, %s, %s, {d.now_sql}, {d.now_sql})"] * len(wanted))
        insert_params: list[Any] = []
        for partition in wanted:
            insert_params += [group, topic, partition, name]
        self._execute(
            f"INSERT INTO queue_partition_leases (consumer_group, topic, {P}, leased_by, leased_at, "
            f"lease_renewed_at) VALUES {values} "
            f"{d.on_conflict_ignore(['consumer_group', 'topic', 'partition'], 'leased_by')}",
            insert_params,
        )
        rows = self._fetchall(
            f"SELECT {P} FROM queue_partition_leases WHERE consumer_group = %s AND topic = %s AND leased_by = %s "
            f"AND {P} IN ({in_list(wanted)}) ORDER BY {P}",
            [group, topic, name, *wanted],
        )
        return [int(r[0]) for r in rows]
