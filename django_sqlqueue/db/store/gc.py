"""Garbage collection of the message log."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import StoreBase, in_list


class GCStore(StoreBase):
    def consuming_groups(self, topic: str) -> set[str]:
        """Groups that consume ``topic``: with a watermark row or a subscriber heartbeat."""
        rows = self._fetchall(
            "SELECT consumer_group FROM queue_offsets WHERE topic = %s UNION "
            "SELECT consumer_group FROM queue_subscriber_heartbeats WHERE topic = %s",
            [topic, topic],
        )
        return {r[0] for r in rows}

    def collect_garbage(self, topic: str, partitions: Sequence[int] | None, retention: float) -> int:
        """Delete messages every consuming group has acked (and older than ``retention``).

        For each partition the floor is the minimum ``offset_acked`` over every group
        that consumes the topic, a group without a watermark row counting as 0. Nothing
        above any group's watermark, and nothing unsequenced, is ever deleted; a topic
        nobody consumes keeps all.
        """
        groups = self.consuming_groups(topic)
        if not groups:
            return 0
        P, OFF = self.P, self.OFF
        params: list[Any] = [topic]
        sql = f"SELECT {P}, consumer_group, offset_acked FROM queue_offsets WHERE topic = %s"
        if partitions is not None:
            if not partitions:
                return 0
            sql += f" AND {P} IN ({in_list(partitions)})"
            params += list(partitions)
        marks: dict[int, dict[str, int]] = {}
        for partition, group, acked in self._fetchall(sql, params):
            marks.setdefault(int(partition), {})[group] = int(acked)
        d = self.dialect
        deleted = 0
        for partition in sorted(marks):
            floor = min(marks[partition].get(group, 0) for group in groups)
            if floor <= 0:
                continue
            sql = f"DELETE FROM queue_messages WHERE topic = %s AND {P} = %s AND {OFF} <= %s"
            params = [topic, partition, floor]
            if retention > 0:
                cutoff, cutoff_params = d.now_minus(retention)
                sql += f" AND published_at <= {cutoff}"
                params += cutoff_params
            deleted += self._execute(sql, params)
        return deleted

    def prune_topic_hours(self, retention: float) -> int:
        """Delete the per-hour counters (``queue_topic_hours``) of hours that started more
        than ``retention`` seconds ago (the database clock); return the rows deleted.

        A range of the ``hour`` index, usually empty: the sequencer's upserts touch the
        current hours, never these, so the two do not wait for each other.
        """
        cutoff, params = self.dialect.now_minus(retention)
        return self._execute(f"DELETE FROM queue_topic_hours WHERE {self.dialect.qn('hour')} < {cutoff}", params)
