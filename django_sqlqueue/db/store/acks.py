"""Outcomes of deliveries: acks, nacks and the watermark (dead letters: ``dead_lettering.py``).

Every write here is fenced by the subscriber's lease (``StoreBase.lock_held``): a worker
that lost a partition -- its lease expired and was stolen, or an operator released it or
moved the group's position -- cannot ack, nack or move the watermark of that partition
any more. So an operator's rewind is never undone by a late ack from the former holder.

The atomic consumers' ack, written inside the handler's own transaction, is in
``atomic_acks.py``; both move the watermark with the one compare-and-set here,
:func:`move_watermark`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from django.db import transaction

from ...rules.validation import MAX_ERROR_LENGTH
from . import history
from .base import RETRY, StoreBase, in_list
from .settle import Settling, report

#: Delivery-state rows read per watermark step.
ADVANCE_SCAN = 1000
#: Offsets without a delivery row looked up at once when the walk meets one.
ADVANCE_PROBE = 100


class AckStore(StoreBase):
    def ensure_offsets(self, group: str, topic: str, partitions: Sequence[int]) -> None:
        """Create the group's watermark rows for partitions it starts consuming.

        A new group starts at the oldest retained message: the watermark is set just
        below it (or at the head when nothing is retained), so a partition whose start
        was garbage-collected does not wait forever for offsets that no longer exist.
        """
        d, P, OFF = self.dialect, self.P, self.OFF
        for partition in sorted(set(partitions)):
            self._execute(
                f"INSERT INTO queue_offsets (consumer_group, topic, {P}, offset_acked, updated_at) "
                # The subquery takes constants, not p's columns: correlated, MariaDB would
                # walk the partition's unsequenced (NULL) entries before the first offset.
                f"SELECT %s, p.topic, p.{P}, COALESCE((SELECT m.{OFF} FROM queue_messages m "
                f"WHERE m.topic = %s AND m.{P} = %s AND m.{OFF} IS NOT NULL ORDER BY m.{OFF} LIMIT 1) - 1, "
                f"p.head_offset), {d.now_sql} FROM queue_partitions p WHERE p.topic = %s AND p.{P} = %s "
                f"{d.on_conflict_ignore(['consumer_group', 'topic', 'partition'], 'offset_acked')}",
                [group, topic, partition, topic, partition],
            )

    def nack(
        self,
        group: str,
        topic: str,
        name: str,
        delays: Sequence[tuple[int, int, float]],
        errors: Mapping[tuple[int, int], str] | None = None,
    ) -> None:
        """Make messages invisible for their retry delay (status RETRY).

        ``errors`` maps (partition, offset) to the failed attempt's error, kept in
        ``last_error`` for the console (cut to ``MAX_ERROR_LENGTH``).
        """
        d, P = self.dialect, self.P
        errors = errors or {}
        with self.transaction() as cursor:
            held = self.lock_held(cursor, group, topic, name, [p for p, _, _ in delays])
            mine = sorted(x for x in delays if x[0] in held)
            # The running totals first (lease, watermark, deliveries: the lock order), then
            # taken back for a delivery no longer unacked (a retry of this transaction).
            failures = _per_partition(p for p, _, _ in mine)
            for partition, n in failures.items():
                history.add_totals(self, cursor, group, topic, partition, failed=n, retried=n)
            for partition, offset, delay in mine:
                until, params = d.now_plus(delay)
                error = errors.get((partition, offset))
                cursor.execute(
                    f"UPDATE queue_delivery_state SET status = {RETRY}, invisible_until = {until}, last_error = %s "
                    f"WHERE consumer_group = %s AND topic = %s AND {P} = %s AND message_offset = %s AND acked = FALSE",
                    [*params, None if error is None else error[:MAX_ERROR_LENGTH], group, topic, partition, offset],
                )
                if not cursor.rowcount:
                    history.add_totals(self, cursor, group, topic, partition, failed=-1, retried=-1)

    def ack(
        self,
        group: str,
        topic: str,
        name: str,
        keys: Sequence[tuple[int, int]],
        *,
        settling: Settling | None = None,
        count: bool = True,
    ) -> None:
        """Mark messages acked for ``group`` (one statement after the lease check);
        ``settling``: report the messages settled for good (``settle.py``); ``count``: add
        them to the group's running total of handled messages (``history.py``)."""
        if not keys:
            return
        with self.transaction() as cursor:
            held = self.lock_held(cursor, group, topic, name, [p for p, _ in keys])
            keys = [k for k in keys if k[0] in held]
            if not keys:
                return
            # The running totals first (lease, watermark, deliveries: the lock order); a row
            # acked already (a retry of this transaction, a row behind the watermark) is taken back.
            handled = _per_partition(p for p, _ in keys) if count else {}
            for partition, n in handled.items():
                history.add_totals(self, cursor, group, topic, partition, handled=n)
            claimed = settling.claim(self, cursor, group, topic, keys) if settling is not None else []
            match, match_params = self.match_offsets(keys)
            cursor.execute(
                f"UPDATE queue_delivery_state SET acked = TRUE WHERE consumer_group = %s AND topic = %s AND {match} "
                "AND acked = FALSE",
                [group, topic, *match_params],
            )
            if handled and cursor.rowcount < len(keys):
                history.add_totals(self, cursor, group, topic, keys[0][0], handled=cursor.rowcount - len(keys))
            report(settling, cursor, claimed)

    def ack_contiguous(
        self,
        group: str,
        topic: str,
        name: str,
        advances: Sequence[tuple[int, int, int]],
        *,
        report_skipped: bool = False,
        settling: Settling | None = None,
        handled: Mapping[int, int] | None = None,
    ) -> list[int]:
        """The happy path: for each (partition, watermark, new_watermark) whose acks are
        exactly watermark+1..new_watermark, move the watermark and drop the rows behind it
        in one transaction, instead of flagging each row acked and advancing later.

        The watermark update is a compare-and-set on the old value; a partition whose
        watermark moved meanwhile is returned, and its acks must go through :meth:`ack`.
        A partition no longer held is not written, and returned only with
        ``report_skipped`` (its acks must then not be retried: the lease is gone).
        ``settling``: report the messages settled for good (``settle.py``); ``handled``: the
        messages per partition to add to the group's running totals (``history.py``), in the
        watermark's own UPDATE.
        """
        P = self.P
        if settling is None and self.dialect.writable_ctes and self.connection.get_autocommit():
            return _ack_contiguous_fused(self, group, topic, name, advances, report_skipped, handled or {})
        failed: list[int] = []
        claimed: list[object] = []
        with self.transaction() as cursor:
            held = self.lock_held(cursor, group, topic, name, [p for p, _, _ in advances])
            for partition, old, new in sorted(advances):
                if partition not in held:
                    if report_skipped:
                        failed.append(partition)
                    continue
                count = handled.get(partition, 0) if handled else 0
                if not move_watermark(self, cursor, group, topic, partition, old, new, handled=count):
                    failed.append(partition)
                    continue
                if settling is not None:  # before the DELETE: only rows still unacked count
                    keys = [k for k in settling.tokens if k[0] == partition and old < k[1] <= new]
                    claimed += settling.claim(self, cursor, group, topic, keys)
                cursor.execute(
                    f"DELETE FROM queue_delivery_state WHERE consumer_group = %s AND topic = %s "
                    f"AND {P} = %s AND message_offset <= %s",
                    [group, topic, partition, new],
                )
            report(settling, cursor, claimed)
        return failed

    def record_acks(
        self,
        group: str,
        topic: str,
        name: str,
        acks: Mapping[int, Sequence[int]],
        dead: Mapping[int, Collection[int]],
        watermarks: Mapping[int, int],
        settling: Settling | None = None,
    ) -> None:
        """Record a batch's acks; move each partition's watermark when they allow it.

        ``acks`` and ``dead`` (offsets dead-lettered in this batch, already acked by
        :meth:`dead_letter`) are per partition; ``watermarks`` is each partition's watermark
        when the batch was fetched. The happy path -- the batch's offsets are exactly
        watermark+1..watermark+n -- moves the watermark and drops the rows behind it in one
        transaction (:meth:`ack_contiguous`). Otherwise (a gap: a nacked message, or a
        watermark moved meanwhile) the acks only flag their rows (:meth:`ack`), and a later
        poll's :meth:`advance_watermark` walks over them.

        ``settling`` (``settle.py``): messages to report as settled for good, in the
        transaction that acks them. Then both steps run in one ``atomic()`` block (the
        consumer's bookkeeping may publish, which needs one).
        """
        if settling is not None:
            with transaction.atomic(using=self.using):
                self._record_acks(group, topic, name, acks, dead, watermarks, settling)
        else:
            self._record_acks(group, topic, name, acks, dead, watermarks, None)

    def _record_acks(
        self,
        group: str,
        topic: str,
        name: str,
        acks: Mapping[int, Sequence[int]],
        dead: Mapping[int, Collection[int]],
        watermarks: Mapping[int, int],
        settling: Settling | None,
    ) -> None:
        contiguous: list[tuple[int, int, int]] = []
        plain: list[tuple[int, int]] = []
        for partition, offsets in acks.items():
            done = sorted({*offsets, *dead.get(partition, ())})
            wm = watermarks[partition]
            if done == list(range(wm + 1, wm + len(done) + 1)):
                contiguous.append((partition, wm, wm + len(done)))
            else:
                plain += [(partition, off) for off in offsets]
        if contiguous:
            counts = {partition: len(acks[partition]) for partition, _, _ in contiguous}
            failed = set(self.ack_contiguous(group, topic, name, contiguous, settling=settling, handled=counts))
            plain += [(partition, off) for partition in failed for off in acks[partition]]
        if plain:
            self.ack(group, topic, name, plain, settling=settling)

    def advance_watermark(self, group: str, topic: str, name: str, partition: int, watermark: int) -> int:
        """Move the watermark over contiguous acked rows and deleted offsets; return the new watermark.

        Offsets up to the head were all assigned (the sequencer commits offsets and head
        together), so an offset at or below the head without a message was deleted: by GC
        (from the bottom: the walk starts no lower than just below the oldest retained
        message) or by an operator (a dead letter replayed or purged from a DLQ topic that
        a group consumes: a hole in the middle). The walk passes acked rows and deleted
        offsets; it stops at the first unacked row or at a message not delivered yet.
        Rows behind the new watermark are deleted in the same transaction. Bounded per
        call; converges over polls.
        """
        P, OFF = self.P, self.OFF
        # The oldest retained offset: ORDER BY ... LIMIT 1 with constants is one index dive
        # (MariaDB reads the partition's whole offset range for MIN(), and walks its NULL
        # entries first when the subquery is correlated).
        ((oldest, head),) = self._fetchall(
            f"SELECT (SELECT m.{OFF} FROM queue_messages m WHERE m.topic = %s AND m.{P} = %s "
            f"AND m.{OFF} IS NOT NULL ORDER BY m.{OFF} LIMIT 1), p.head_offset FROM queue_partitions p "
            f"WHERE p.topic = %s AND p.{P} = %s",
            [topic, partition, topic, partition],
        )
        head = int(head)
        start = max(watermark, (head if oldest is None else int(oldest) - 1))
        acked = {
            int(offset): bool(done)
            for offset, done in self._fetchall(
                "SELECT message_offset, acked FROM queue_delivery_state WHERE consumer_group = %s AND topic = %s "
                f"AND {P} = %s AND message_offset > %s ORDER BY message_offset LIMIT {ADVANCE_SCAN}",
                [group, topic, partition, start],
            )
        }
        new = start
        while True:
            while acked.get(new + 1):
                new += 1
            if new + 1 in acked or new >= head:
                break  # an unacked row, or the head
            # No delivery row: not delivered yet, or deleted. Look up the next few offsets
            # without a row at once; the walk goes on over the deleted ones only.
            probe = [o for o in range(new + 1, min(head, new + ADVANCE_PROBE) + 1) if o not in acked]
            present = {
                int(r[0])
                for r in self._fetchall(
                    f"SELECT {OFF} FROM queue_messages WHERE topic = %s AND {P} = %s AND {OFF} IN ({in_list(probe)})",
                    [topic, partition, *probe],
                )
            }
            before = new
            while new + 1 in probe and new + 1 not in present:
                new += 1
                while acked.get(new + 1):
                    new += 1
            if new == before:
                break  # a message not delivered yet
        if new == watermark:
            return watermark
        moved = self.ack_contiguous(group, topic, name, [(partition, watermark, new)], report_skipped=True)
        return new if not moved else watermark


def move_watermark(
    store: StoreBase, cursor: Any, group: str, topic: str, partition: int, old: int, new: int, *, handled: int = 0
) -> bool:
    """Move a partition's watermark from ``old`` to ``new``, a compare-and-set; return whether it moved.

    One UPDATE of the group's watermark row on ``cursor``, which exclusively locks that
    row until the caller's transaction ends. It writes only if the watermark is still
    ``old``: a watermark moved meanwhile (by the poll's watermark walk, say) makes it a
    no-op (False), and the caller flags its rows acked instead. Called after
    ``lock_held`` in the same transaction, so the lock order is lease, watermark,
    deliveries. ``handled``: messages to add to the row's running total of handled ones
    (the history's count, ``history.py``), in the same statement.
    """
    counted = ", handled_total = handled_total + %s" if handled and history.enabled() else ""
    cursor.execute(
        f"UPDATE queue_offsets SET offset_acked = %s, updated_at = {store.dialect.now_sql}{counted} "
        f"WHERE consumer_group = %s AND topic = %s AND {store.P} = %s AND offset_acked = %s",
        [new, *([handled] if counted else []), group, topic, partition, old],
    )
    return bool(cursor.rowcount == 1)


def _ack_contiguous_fused(
    store: StoreBase,
    group: str,
    topic: str,
    name: str,
    advances: Sequence[tuple[int, int, int]],
    report_skipped: bool,
    handled: Mapping[int, int],
) -> list[int]:
    """:meth:`AckStore.ack_contiguous` without settling, as one autocommitted statement
    (PostgreSQL's data-modifying WITH): one round trip instead of five.

    The same writes in the same lock order, each step reading the one before it: the
    lease rows share-locked (``held``, the fence of ``lock_held``), then the watermarks of
    the partitions held moved by compare-and-set (``moved``, the UPDATE of
    :func:`move_watermark`), then the delivery rows behind the watermarks that moved
    deleted. Returns the partitions the Python form returns.
    """
    P = store.P
    held_sql, held_params = store.held_leases(group, topic, name, [p for p, _, _ in advances], as_array=True)
    counted = ", handled_total = o.handled_total + m.n" if history.enabled() else ""
    relaxed = store.relaxed_commit()
    filler = ", ''" if relaxed else ""  # the UNION's branches have the same columns
    ordered = sorted(advances)
    # unnest() of four array parameters, not a VALUES list: one prepared statement for
    # every number of partitions.
    columns = [[row[i] for row in ordered] for i in range(3)]
    columns.append([handled.get(partition, 0) for partition, _, _ in ordered])
    rows = store._fetchall_hot(
        f"WITH held AS ({held_sql}), "
        f"moves AS (SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[]) "
        f"AS m(p, old, new, n)), "
        f"moved AS (UPDATE queue_offsets o SET offset_acked = m.new, updated_at = {store.dialect.now_sql}{counted} "
        f"FROM moves m WHERE o.consumer_group = %s AND o.topic = %s AND o.{P} = m.p AND o.offset_acked = m.old "
        f"AND m.p IN (SELECT {P} FROM held) RETURNING o.{P}, o.offset_acked), "
        f"dropped AS (DELETE FROM queue_delivery_state d USING moved WHERE d.consumer_group = %s "
        f"AND d.topic = %s AND d.{P} = moved.{P} AND d.message_offset <= moved.offset_acked) "
        f"SELECT 'held', {P}{relaxed} FROM held UNION ALL SELECT 'moved', {P}{filler} FROM moved",
        [*held_params, *columns, group, topic, group, topic],
    )
    held = {int(row[1]) for row in rows if row[0] == "held"}
    moved = {int(row[1]) for row in rows if row[0] == "moved"}
    failed: list[int] = []
    for partition, _, _ in sorted(advances):
        if partition not in held:
            if report_skipped:
                failed.append(partition)
        elif partition not in moved:
            failed.append(partition)
    return failed


def _per_partition(partitions: Iterable[int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for partition in partitions:
        out[partition] = out.get(partition, 0) + 1
    return out
