"""Subscriber heartbeats: who is alive in a (group, topic), for fair share."""

from __future__ import annotations

from .base import StoreBase


class HeartbeatStore(StoreBase):
    def heartbeat(self, group: str, topic: str, name: str) -> None:
        """Record that subscriber ``name`` is alive (and no longer deregistered)."""
        d = self.dialect
        self._execute(
            "INSERT INTO queue_subscriber_heartbeats (consumer_group, topic, subscriber_name, heartbeat_at, "
            f"deregistered_at) VALUES (%s, %s, %s, {d.now_sql}, NULL) "
            f"{d.on_conflict_update(['consumer_group', 'topic', 'subscriber_name'])} "
            f"heartbeat_at = {d.excluded('heartbeat_at')}, deregistered_at = NULL",
            [group, topic, name],
        )

    def deregister(self, group: str, topic: str, name: str) -> None:
        """Mark subscriber ``name`` as gone (graceful shutdown)."""
        self._execute(
            f"UPDATE queue_subscriber_heartbeats SET deregistered_at = {self.dialect.now_sql} "
            "WHERE consumer_group = %s AND topic = %s AND subscriber_name = %s",
            [group, topic, name],
        )

    def active_subscriber_names(self, group: str, topic: str, lease_duration: float) -> list[str]:
        """Names of the live subscribers of (group, topic), sorted: every worker sees one order."""
        cutoff, params = self.dialect.now_minus(lease_duration)
        rows = self._fetchall(
            "SELECT subscriber_name FROM queue_subscriber_heartbeats WHERE consumer_group = %s AND topic = %s "
            f"AND deregistered_at IS NULL AND heartbeat_at > {cutoff}",
            [group, topic, *params],
        )
        return sorted(name for (name,) in rows)

    def active_subscribers(self, group: str, topic: str, lease_duration: float) -> int:
        """Count subscribers of (group, topic) with a heartbeat within ``lease_duration``."""
        return len(self.active_subscriber_names(group, topic, lease_duration))

    def forget_subscribers(self, topic: str, older_than: float) -> int:
        """Delete heartbeat rows not renewed for ``older_than`` seconds."""
        cutoff, params = self.dialect.now_minus(older_than)
        return self._execute(
            f"DELETE FROM queue_subscriber_heartbeats WHERE topic = %s AND heartbeat_at < {cutoff}",
            [topic, *params],
        )
