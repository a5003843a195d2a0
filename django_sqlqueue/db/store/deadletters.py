"""Taking dead letters out of the log: the rows an operator's replay or purge removes.

A dead letter is a row of its DLQ topic in ``queue_messages`` (``original_topic`` set). A
replay or a purge removes it in the operator's transaction (``ops/replay.py`` opens it, one
per batch): :meth:`DeadLetterStore.lock_dead_letters` first, then
:meth:`DeadLetterStore.delete_dead_letters` of exactly the rows it locked, then, for a
replay, the copies (``messages.write_messages``) in the same transaction.

**The once-only guard.** The locking read (``SELECT ... FOR UPDATE``, in ``seq`` order so
two operators' batches lock in the same order and cannot deadlock) is what makes a second
click, or a second operator, replay nothing: it waits for the first transaction, then finds
no row. Rows already gone are simply not returned (the caller counts them as "missing").

**Against the sequencer.** Neither step takes the partition's head lock, so a dead letter
not yet numbered can vanish between the sequencer's read and its offset UPDATE; the
sequencer checks the rows it wrote and reads the partition again
(``db/sequencer.py``, ``StaleReadAhead``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...models import Message
from .base import StoreBase


class DeadLetterStore(StoreBase):
    """Locking and deleting dead-letter rows, inside the caller's transaction."""

    def lock_dead_letters(self, seqs: Sequence[int]) -> list[Message]:
        """Lock the dead letters among ``seqs`` that still exist, in ``seq`` order; return them.

        Must run inside the caller's ``atomic()`` on this alias: the locks last until it ends.
        Rows of ``seqs`` that are not dead letters (no ``original_topic``) are never locked.
        """
        return list(
            Message.objects.using(self.using)
            .select_for_update()
            .filter(seq__in=list(seqs))
            .exclude(original_topic="")
            .order_by("seq")
        )

    def delete_dead_letters(self, rows: Sequence[Message]) -> int:
        """Delete exactly the dead letters ``rows`` (locked by :meth:`lock_dead_letters` in
        this transaction); return how many were deleted."""
        deleted, _ = Message.objects.using(self.using).filter(seq__in=[m.seq for m in rows]).delete()
        return deleted
