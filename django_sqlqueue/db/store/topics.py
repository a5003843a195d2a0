"""The topic registry and partition head rows.

A worker registers each topic it consumes: a ``queue_topics`` row with the partition
count from ``SQLQUEUE`` and one ``queue_partitions`` head row per partition. The count
of a registered topic changes only through :meth:`TopicStore.repartition` (``manage.py
queue_topic repartition``): a worker whose settings disagree with the registry refuses
to start rather than hash keys differently from the other workers' publishers.

Topics with one partition per key have no fixed set: their head rows are created as
keys appear (:meth:`TopicStore.discover_partitions`).
"""

from __future__ import annotations

from .base import StoreBase, in_list

#: Head rows created per INSERT statement.
CREATE_CHUNK = 500


class TopicStore(StoreBase):
    def registered_topics(self) -> dict[str, int | None]:
        """Return ``{topic: partition count (None: one per key)}`` of the registry, sorted by topic."""
        rows = self._fetchall("SELECT topic, partitions FROM queue_topics ORDER BY topic")
        return {topic: None if n is None else int(n) for topic, n in rows}

    def registered_partitions(self, topic: str) -> tuple[bool, int | None]:
        """Return (registered, partition count or None for per-key) of ``topic``."""
        rows = self._fetchall("SELECT partitions FROM queue_topics WHERE topic = %s", [topic])
        if not rows:
            return False, None
        return True, None if rows[0][0] is None else int(rows[0][0])

    def register_topic(self, topic: str, partitions: int | None) -> int | None:
        """Register ``topic`` with ``partitions`` unless it is registered; return the registered count.

        The caller compares the result with its own settings. Creating the head rows is
        idempotent; two workers registering at once both succeed.
        """
        d = self.dialect
        self._execute(
            "INSERT INTO queue_topics (topic, partitions, created_at, updated_at) "
            f"VALUES (%s, %s, {d.now_sql}, {d.now_sql}) {d.on_conflict_ignore(['topic'], 'topic')}",
            [topic, partitions],
        )
        _, registered = self.registered_partitions(topic)
        if registered is not None:
            self.create_partitions(topic, range(registered))
        return registered

    def create_partitions(self, topic: str, partitions: range | list[int]) -> None:
        """Create missing head rows (head offset 0) for ``partitions`` of ``topic``."""
        d = self.dialect
        wanted = sorted(partitions)
        for start in range(0, len(wanted), CREATE_CHUNK):
            chunk = wanted[start : start + CREATE_CHUNK]
            values = ", ".join([f"(%s, %s, 0, {d.now_sql})"] * len(chunk))
            params: list[object] = []
            for partition in chunk:
                params += [topic, partition]
            self._execute(
                f"INSERT INTO queue_partitions (topic, {self.P}, head_offset, created_at) VALUES {values} "
                f"{d.on_conflict_ignore(['topic', 'partition'], 'head_offset')}",
                params,
            )

    def discover_partitions(self, topic: str) -> int:
        """Per-key topics: create head rows for partitions that have unsequenced messages.

        Returns how many were new. Reads the unsequenced rows' index range only.
        """
        P, OFF = self.P, self.OFF
        seen = [
            int(r[0])
            for r in self._fetchall(
                f"SELECT DISTINCT {P} FROM queue_messages WHERE topic = %s AND {OFF} IS NULL", [topic]
            )
        ]
        if not seen:
            return 0
        known: set[int] = set()
        for start in range(0, len(seen), CREATE_CHUNK):
            chunk = seen[start : start + CREATE_CHUNK]
            known |= {
                int(r[0])
                for r in self._fetchall(
                    f"SELECT {P} FROM queue_partitions WHERE topic = %s AND {P} IN ({in_list(chunk)})", [topic, *chunk]
                )
            }
        new = sorted(set(seen) - known)
        if new:
            self.create_partitions(topic, new)
        return len(new)

    def partitions(self, topic: str) -> list[int]:
        """Return every partition of ``topic`` that has a head row, sorted."""
        rows = self._fetchall(f"SELECT {self.P} FROM queue_partitions WHERE topic = %s ORDER BY {self.P}", [topic])
        return [int(r[0]) for r in rows]

    def partition_count(self, topic: str) -> int:
        ((count,),) = self._fetchall("SELECT COUNT(*) FROM queue_partitions WHERE topic = %s", [topic])
        return int(count)

    def paused(self, group: str, topic: str) -> bool:
        """Return whether an operator paused ``group``'s consumption of ``topic``."""
        return bool(
            self._fetchall("SELECT 1 FROM queue_paused_topics WHERE consumer_group = %s AND topic = %s", [group, topic])
        )

    def repartition(self, topic: str, partitions: int) -> tuple[int | None, int]:
        """Change a registered hashed topic's partition count; return (old, new).

        Head rows of new partitions are created. Partitions beyond a smaller count are
        kept: messages already in them are still delivered, and they simply receive no
        new ones. Keys move to other partitions (``crc32(key) % partitions``), so a
        key's messages published before and after the change are ordered only within
        each side: drain the topic first if order across the change matters.
        """
        d = self.dialect
        registered, old = self.registered_partitions(topic)
        self._execute(
            "INSERT INTO queue_topics (topic, partitions, created_at, updated_at) "
            f"VALUES (%s, %s, {d.now_sql}, {d.now_sql}) {d.on_conflict_update(['topic'])} "
            f"partitions = {d.excluded('partitions')}, updated_at = {d.excluded('updated_at')}",
            [topic, partitions],
        )
        self.create_partitions(topic, range(partitions))
        return (old if registered else None), partitions
