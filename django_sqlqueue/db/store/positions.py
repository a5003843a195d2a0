"""Operator writes to a group's positions, fenced against live workers by the lease rows.

Every write a worker makes to a partition's delivery state or watermark runs in a
short transaction that first share-locks its lease row (:meth:`StoreBase.lock_held`)
and writes only if it still holds the lease. An operator action that changes a
group's positions in a partition (release a lease, seek, pause, drop a group, purge a
topic) therefore deletes that partition's ``queue_partition_leases`` rows *first*, in
the same transaction as the change:

- the DELETE takes the lease rows' exclusive locks, so it waits for a worker's fenced
  write in progress to commit; a fenced write that starts later waits for the
  operator's transaction, then finds no lease and writes nothing. A late ack cannot
  move a rewound watermark forward again nor ack a message made deliverable again;
- the former holder notices the lost lease at its next lease round (about a second)
  and drops the partition; a worker of the group takes it again and starts from the
  new position.

The lease rows always come first, so a worker that is about to write waits on the
lease row and holds nothing the operator's transaction needs. The caller (``ops``)
validates and plans; these methods read what a plan needs and write.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from django.db import transaction

from .base import in_list
from .seek_reads import SeekReads

#: Tables a group's rows live in, the lease first (the fence), in the order they are deleted.
GROUP_TABLES = (
    "queue_partition_leases",
    "queue_delivery_state",
    "queue_offsets",
    "queue_subscriber_heartbeats",
    "queue_paused_topics",
)


class SeekMove(Protocol):
    """One partition of a seek: where the watermark is and where it goes."""

    @property
    def partition(self) -> int: ...

    @property
    def watermark(self) -> int: ...

    @property
    def target(self) -> int: ...


class SeekMoves(Protocol):
    @property
    def partitions(self) -> Sequence[SeekMove]: ...


PlanT = TypeVar("PlanT", bound=SeekMoves)


class PositionStore(SeekReads):
    # -- leases ----------------------------------------------------------------------------

    def release_lease(self, group: str, topic: str, partition: int, holder: str | None = None) -> int:
        """Delete a partition's lease (only ``holder``'s, if given); return the rows deleted (0 or 1).

        The DELETE's exclusive row lock waits for the holder's fenced write in progress;
        after it, the holder's fenced writes to the partition are no-ops and it drops the
        partition at its next lease round, when a subscriber of the group takes it.
        """
        sql = f"DELETE FROM queue_partition_leases WHERE consumer_group = %s AND topic = %s AND {self.P} = %s"
        params: list[object] = [group, topic, int(partition)]
        if holder is not None:
            sql += " AND leased_by = %s"
            params.append(holder)
        return self._execute(sql, params)

    # -- seek ------------------------------------------------------------------------------

    def group_watermarks(self, group: str, topic: str, *, lock: bool = False) -> dict[int, int]:
        """Return ``{partition: watermark}`` of ``group`` on ``topic``; ``lock`` locks the rows (FOR UPDATE).

        Locked in partition order, as the worker's watermark writes lock them.
        """
        return {
            int(part): int(acked)
            for part, acked in self._fetchall(
                f"SELECT {self.P}, offset_acked FROM queue_offsets WHERE consumer_group = %s AND topic = %s "
                f"ORDER BY {self.P} {self.dialect.for_update if lock else ''}",
                [group, topic],
            )
        }

    def seek_to(
        self, group: str, topic: str, partitions: Sequence[int], replan: Callable[[dict[int, int]], PlanT]
    ) -> tuple[int, PlanT]:
        """Move ``group``'s watermarks in ``partitions``; return (leases deleted, the plan applied).

        One transaction: (1) delete the partitions' leases -- the fence, see the module
        docstring; (2) lock the group's watermark rows of the topic and let ``replan``
        compute the targets from them (the rows cannot move under it now); (3) rewind:
        delete the partition's delivery state, so every message above the new watermark
        is delivered again, acked or not; fast-forward: delete the delivery state at or
        below the new watermark and keep it above (acked stays acked, a retry keeps its
        count); (4) write the watermark, creating the row if the group had none (even
        when the watermark does not move: a seek creates a group new on the topic).
        """
        P, d = self.P, self.dialect
        with transaction.atomic(using=self.using):
            released = self._execute(
                "DELETE FROM queue_partition_leases WHERE consumer_group = %s AND topic = %s "
                f"AND {P} IN ({in_list(partitions)})",
                [group, topic, *partitions],
            )
            marks = self.group_watermarks(group, topic, lock=True)
            plan = replan(marks)
            for row in plan.partitions:
                if row.target == row.watermark:
                    if row.partition not in marks:
                        # A group new on the topic: its row is written even when nothing moves,
                        # so the group exists (and holds GC) from now on.
                        self._execute(
                            f"INSERT INTO queue_offsets (consumer_group, topic, {P}, offset_acked, updated_at) "
                            f"VALUES (%s, %s, %s, %s, {d.now_sql})",
                            [group, topic, row.partition, row.target],
                        )
                    continue
                sql = f"DELETE FROM queue_delivery_state WHERE consumer_group = %s AND topic = %s AND {P} = %s"
                params: list[object] = [group, topic, row.partition]
                if row.target > row.watermark:
                    sql += " AND message_offset <= %s"
                    params.append(row.target)
                self._execute(sql, params)
                changed = self._execute(
                    f"UPDATE queue_offsets SET offset_acked = %s, updated_at = {d.now_sql} "
                    f"WHERE consumer_group = %s AND topic = %s AND {P} = %s",
                    [row.target, group, topic, row.partition],
                )
                if not changed:
                    self._execute(
                        f"INSERT INTO queue_offsets (consumer_group, topic, {P}, offset_acked, updated_at) "
                        f"VALUES (%s, %s, %s, %s, {d.now_sql})",
                        [group, topic, row.partition, row.target],
                    )
        return released, plan

    def start_group(self, group: str, topic: str, since: dt.datetime) -> dict[int, int] | None:
        """Create a *new* group's watermarks just below the first message published at or after ``since``.

        In every partition with a head row; one without such a message starts at its
        head. Returns ``{partition: watermark}``, or None (nothing written) when the
        group has watermarks on the topic already. A new group holds no lease, so there
        is nothing to fence; a worker of the group that starts meanwhile creates rows of
        its own and one of the two INSERTs fails on the primary key.
        """
        P, d = self.P, self.dialect
        with transaction.atomic(using=self.using):
            if self._fetchall("SELECT 1 FROM queue_offsets WHERE consumer_group = %s AND topic = %s", [group, topic]):
                return None
            marks: dict[int, int] = {}
            for part, head in self._fetchall(
                f"SELECT {P}, head_offset FROM queue_partitions WHERE topic = %s ORDER BY {P}", [topic]
            ):
                first = self.first_offset(topic, int(part), since)
                marks[int(part)] = first - 1 if first is not None else int(head)
            for part, mark in marks.items():
                self._execute(
                    f"INSERT INTO queue_offsets (consumer_group, topic, {P}, offset_acked, updated_at) "
                    f"VALUES (%s, %s, %s, %s, {d.now_sql})",
                    [group, topic, part, mark],
                )
        return marks

    def set_watermarks(self, group: str, topic: str, marks: dict[int, int]) -> None:
        """Write ``group``'s watermarks on ``topic`` (create the rows a new group lacks).

        For a consumer that keeps its own position -- a Spark stream with option
        ``group``, whose checkpoint is the truth -- and holds no lease: nothing to fence.
        One upsert per partition, in partition order (the order the workers lock them in).
        """
        d = self.dialect
        with transaction.atomic(using=self.using):
            for part in sorted(marks):
                self._execute(
                    f"INSERT INTO queue_offsets (consumer_group, topic, {self.P}, offset_acked, updated_at) "
                    f"VALUES (%s, %s, %s, %s, {d.now_sql}) "
                    f"{d.on_conflict_update(['consumer_group', 'topic', 'partition'])} "
                    f"offset_acked = {d.excluded('offset_acked')}, updated_at = {d.excluded('updated_at')}",
                    [group, topic, int(part), int(marks[part])],
                )

    # -- pause -------------------------------------------------------------------------------

    def pause(self, group: str, topic: str, by: str, reason: str) -> bool:
        """Pause ``group`` on ``topic``: delete its leases and insert the pause row; False if paused already.

        The pause row is locked first (FOR UPDATE), so two operators pausing at once do
        not both insert it. The leases go in the same transaction, so the pause takes
        effect at the workers' next lease round even before they read the pause row;
        the lease keeper then takes none while the row exists.
        """
        with transaction.atomic(using=self.using):
            if self._fetchall(
                "SELECT 1 FROM queue_paused_topics WHERE consumer_group = %s AND topic = %s " + self.dialect.for_update,
                [group, topic],
            ):
                return False
            self._execute("DELETE FROM queue_partition_leases WHERE consumer_group = %s AND topic = %s", [group, topic])
            self._execute(
                "INSERT INTO queue_paused_topics (consumer_group, topic, paused_at, paused_by, reason) "
                f"VALUES (%s, %s, {self.dialect.now_sql}, %s, %s)",
                [group, topic, by, reason],
            )
        return True

    def resume(self, group: str, topic: str) -> bool:
        """Delete the pause row of (group, topic); return False if there was none.

        No lease to fence: a paused group holds none; the next lease round takes partitions.
        """
        return bool(
            self._execute("DELETE FROM queue_paused_topics WHERE consumer_group = %s AND topic = %s", [group, topic])
        )

    # -- dropping a group --------------------------------------------------------------------

    def _group_where(self, group: str, topic: str | None) -> tuple[str, list[str]]:
        if topic is None:
            return " WHERE consumer_group = %s", [group]
        return " WHERE consumer_group = %s AND topic = %s", [group, topic]

    def group_rows(self, group: str, topic: str | None = None) -> dict[str, int]:
        """Count ``group``'s rows (of ``topic`` only, if given) per table of :data:`GROUP_TABLES`."""
        where, params = self._group_where(group, topic)
        return {
            table: int(self._fetchall(f"SELECT COUNT(*) FROM {table}{where}", params)[0][0]) for table in GROUP_TABLES
        }

    def drop_group(self, group: str, topic: str | None = None) -> dict[str, int]:
        """Delete ``group``'s rows (of ``topic`` only, if given) in one transaction; return the count per table.

        The leases go first (the fence): a worker's fenced write waits for this
        transaction and then finds no lease, so it cannot recreate the delivery state or
        watermark deleted after them.
        """
        where, params = self._group_where(group, topic)
        with transaction.atomic(using=self.using):
            return {table: self._execute(f"DELETE FROM {table}{where}", params) for table in GROUP_TABLES}

    # -- purging a topic -----------------------------------------------------------------------

    def topic_extent(self, topic: str) -> tuple[int | None, int, bool]:
        """Return (largest seq, message count, registered or consumed) of ``topic``."""
        ((max_seq, count),) = self._fetchall("SELECT MAX(seq), COUNT(*) FROM queue_messages WHERE topic = %s", [topic])
        known = self._fetchall(
            "SELECT 1 FROM queue_topics WHERE topic = %s UNION ALL SELECT 1 FROM queue_offsets WHERE topic = %s",
            [topic, topic],
        )
        return (None if max_seq is None else int(max_seq)), int(count or 0), bool(known)

    def skip_topic(self, topic: str, then: Callable[[int, int], None] | None = None) -> tuple[int, int]:
        """Delete every lease of ``topic``, move every watermark to its head, delete its delivery state.

        One transaction, the lease rows first (the fence): a worker busy with a message
        of the topic can no longer ack it, and drops the partitions at its next lease
        round. ``then(leases, delivery rows)`` runs inside that transaction after the
        writes (an audit row commits with them). Returns (leases deleted, delivery rows deleted).
        """
        P = self.P
        with transaction.atomic(using=self.using):
            leases = self._execute("DELETE FROM queue_partition_leases WHERE topic = %s", [topic])
            self._execute(
                f"UPDATE queue_offsets SET offset_acked = (SELECT head_offset FROM queue_partitions h "
                f"WHERE h.topic = queue_offsets.topic AND h.{P} = queue_offsets.{P}), "
                f"updated_at = {self.dialect.now_sql} "
                f"WHERE topic = %s AND EXISTS (SELECT 1 FROM queue_partitions h2 WHERE h2.topic = queue_offsets.topic "
                f"AND h2.{P} = queue_offsets.{P} AND h2.head_offset > queue_offsets.offset_acked)",
                [topic],
            )
            states = self._execute("DELETE FROM queue_delivery_state WHERE topic = %s", [topic])
            if then is not None:
                then(leases, states)
        return leases, states

    def delete_messages(
        self, topic: str, max_seq: int, batch_size: int, on_batch: Callable[[int], None] | None = None
    ) -> int:
        """Delete the messages of ``topic`` with ``seq <= max_seq``, ``batch_size`` per transaction.

        Batches by ``seq`` along the (topic, seq) index, each its own short transaction,
        so a purge of a large topic never holds many row locks; a message published
        after ``max_seq`` was read is kept. ``on_batch(rows deleted)`` runs inside each
        batch's transaction after its DELETE. Returns the rows deleted.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            # LIMIT 0 deletes nothing and LIMIT -1 is "no limit" on SQLite: refuse, never loop or guess.
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        deleted = 0
        while True:
            with transaction.atomic(using=self.using):
                seqs = [
                    r[0]
                    for r in self._fetchall(
                        "SELECT seq FROM queue_messages WHERE topic = %s AND seq <= %s ORDER BY seq LIMIT %s",
                        [topic, max_seq, batch_size],
                    )
                ]
                if not seqs:
                    return deleted
                batch = self._execute(f"DELETE FROM queue_messages WHERE seq IN ({in_list(seqs)})", seqs)
                deleted += batch
                if on_batch is not None:
                    on_batch(batch)
