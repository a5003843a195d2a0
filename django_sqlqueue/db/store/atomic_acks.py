"""The atomic consumers' ack: fenced writes inside the handler's own transaction.

An atomic consumer (``@consumer(atomic=True)`` or ``atomic="batch"``, see
``worker/batch/atomic.py``) commits its handler's writes and the message's ack together:
:meth:`AtomicAckStore.ack_in_transaction` runs on the handler's connection at the end of
its open transaction, just before COMMIT, and never opens or commits a transaction of its
own. The other acks (``acks.py``) run in short transactions of the engine's; both share
the watermark's compare-and-set (:func:`~.acks.move_watermark`) and the lock order
lease, watermark, deliveries.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from ...exceptions import FenceLost
from . import history
from .acks import move_watermark
from .base import IN_FLIGHT, StoreBase, in_list
from .settle import Settling, report


class AtomicAckStore(StoreBase):
    def ack_in_transaction(
        self,
        group: str,
        topic: str,
        name: str,
        partition: int,
        deliveries: Sequence[tuple[int, int]],
        settling: Settling | None = None,
    ) -> int | None:
        """Ack deliveries of one partition inside the caller's open transaction, fenced;
        return the new watermark if it moved, else None. Raise :class:`FenceLost` if
        ``name`` no longer holds the partition's lease or a delivery is no longer the one
        it was given: the caller must roll its transaction back.

        The atomic consumers' ack (``worker/batch/atomic.py``): ``deliveries`` are (offset,
        retry_count) pairs, ``retry_count`` being the value ``mark_delivered`` gave this
        delivery (the attempt number - 1). Called at the very end of the handler's
        transaction, just before COMMIT, so the locks below are held for a few
        statements and the commit, never while the handler runs:

        1. the lease row, share-locked (``lock_held``): the lease keeper's renewal and a
           thief's UPDATE of that row wait for our COMMIT (a few ms); a thief that got
           there first has changed ``leased_by`` and we roll back. Expiry is not
           checked: an expired lease that nobody took yet is still ours -- a thief's
           UPDATE waits for our commit and then reads the ack (its poll runs after it).
        2. the partition's watermark row, exclusively (a compare-and-set from
           ``first offset - 1``: moved only when the acks are contiguous with it);
        3. the deliveries' own rows, exclusively: deleted behind a moved watermark, else
           flagged acked -- each only if still in flight with the same ``retry_count``
           and unacked. That second fence catches what the lease alone cannot: the lease
           lost and taken back by this same subscriber name while another worker
           redelivered, nacked or acked the message.

        Only this partition's rows: publishers (append-only INSERTs), the sequencer
        (``queue_messages`` and ``queue_partitions``) and other partitions' workers touch
        none of them. Lock order -- lease, watermark, deliveries -- is the order of
        every fenced write here, so no deadlock with the poll's own writes or an
        operator's (who deletes the lease row first).

        ``settling`` (``settle.py``): the deliveries' tokens are reported last, once every
        row passed the fence (so each was unacked and is acked by this transaction). The
        group's running total of handled messages (``history.py``) is added on the
        watermark row, in this transaction: it commits with the ack or not at all.
        """
        P = self.P
        if not deliveries:
            return None
        offsets = sorted(offset for offset, _ in deliveries)
        retry_of = dict(deliveries)
        run = 1
        while run < len(offsets) and offsets[run] == offsets[0] + run:
            run += 1
        with self.connection.cursor() as cursor:
            if not self.lock_held(cursor, group, topic, name, [partition]):
                raise FenceLost(f"the lease of partition {partition} of {group}:{topic} is no longer held by {name}")
            new = offsets[run - 1]
            # The history's running total rides on the watermark's UPDATE, or is added to the
            # same row before the deliveries (the lock order) when the watermark did not move.
            moved = move_watermark(self, cursor, group, topic, partition, offsets[0] - 1, new, handled=len(offsets))
            if not moved:
                history.add_totals(self, cursor, group, topic, partition, handled=len(offsets))
            behind = set(offsets[:run]) if moved else set()
            by_retry: dict[tuple[bool, int], list[int]] = defaultdict(list)
            for offset in offsets:
                by_retry[(offset in behind, retry_of[offset])].append(offset)
            for (delete, retry_count), group_offsets in sorted(by_retry.items()):
                verb = "DELETE FROM queue_delivery_state" if delete else "UPDATE queue_delivery_state SET acked = TRUE"
                cursor.execute(
                    f"{verb} WHERE consumer_group = %s AND topic = %s AND {P} = %s "
                    f"AND message_offset IN ({in_list(group_offsets)}) AND acked = FALSE "
                    f"AND status = {IN_FLIGHT} AND retry_count = %s",
                    [group, topic, partition, *group_offsets, retry_count],
                )
                if cursor.rowcount != len(group_offsets):
                    raise FenceLost(
                        f"{len(group_offsets) - cursor.rowcount} delivery(ies) of partition {partition} of "
                        f"{group}:{topic} were redelivered, nacked or acked elsewhere meanwhile"
                    )
            if settling is not None:  # every row passed the fence: each is acked by this transaction
                tokens = [t for (p, o), t in settling.tokens.items() if p == partition and o in retry_of]
                report(settling, cursor, tokens)
        return new if moved else None
