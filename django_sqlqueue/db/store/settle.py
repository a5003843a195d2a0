"""Settling messages for good: a consumer's bookkeeping committed with the final outcome.

Some consumers must record a message's *final* outcome exactly once -- the tasks
backend counts the members of a batch (``tasks/batches.py``). "Once" cannot be had
from the handler: a worker killed between the handler's return and the ack runs the
message again (or finds it finished and skips it), and a crash between an ack and a
write of its own loses the write. So the record is written by the transaction that
acks or dead-letters the message, on its cursor: it commits with the ack or not at all.

A consumer opts in with a :class:`Settlement` (``ConsumerSpec.settlement``):

- ``key_of(message)`` names a message to settle with a token of the consumer's
  (None: nothing to record -- the usual case: a plain message costs that one call);
- ``settled(cursor, acked, dead)`` records, inside the ack's or dead letter's
  transaction, the tokens of the messages it settled: ``acked`` (the handler returned)
  and ``dead`` (dead-lettered: rejected or out of attempts).

**Why exactly once.** A token is reported only for a delivery row that this
transaction moves from unacked to acked (or deletes while unacked): the rows are
read ``acked = FALSE ... FOR UPDATE`` first (:meth:`Settling.claim`), under the lease's
share lock that fences every ack. A second transaction acking the same message -- the
retry of an ack whose COMMIT reply was lost, a redelivery's ack after the first
committed -- waits on those row locks, then finds the row acked or gone and reports
nothing. The atomic consumers' ack checks each row the same way (``acked = FALSE``,
rowcount) before it reports. Lock order: lease, watermark, deliveries (claimed before
they are written), then whatever ``settled`` locks -- last, held only until COMMIT.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .base import StoreBase
    from .delivery import FetchedMessage


class Settlement(Protocol):
    """What a consumer records when its messages are settled for good (module docstring)."""

    def key_of(self, message: FetchedMessage) -> Any:
        """The token of a message to settle, or None (nothing to record). Cheap: called per message."""

    def settled(self, cursor: Any, acked: Sequence[Any], dead: Sequence[Any]) -> None:
        """Record settled messages' tokens on ``cursor``, inside the transaction that settles them."""


@dataclass(frozen=True)
class Settling:
    """A :class:`Settlement` and the tokens of the messages of one write, by (partition, offset)."""

    settlement: Settlement
    tokens: Mapping[tuple[int, int], Any]

    def claim(
        self, store: StoreBase, cursor: Any, group: str, topic: str, keys: Collection[tuple[int, int]]
    ) -> list[Any]:
        """Lock the delivery rows of ``keys`` that have a token and are still unacked; return
        their tokens. Call it in the write's transaction, after the lease check and before
        the rows are acked or deleted (see the module docstring)."""
        mine = sorted(k for k in keys if k in self.tokens)
        if not mine:
            return []
        match, params = store.match_offsets(mine)
        cursor.execute(
            f"SELECT {store.P}, message_offset FROM queue_delivery_state WHERE consumer_group = %s AND topic = %s "
            f"AND {match} AND acked = FALSE ORDER BY {store.P}, message_offset {store.dialect.for_update}",
            [group, topic, *params],
        )
        return [self.tokens[(int(p), int(o))] for p, o in cursor.fetchall()]


def report(settling: Settling | None, cursor: Any, acked: Sequence[Any], dead: Sequence[Any] = ()) -> None:
    """Hand the claimed tokens to the settlement (nothing when there are none)."""
    if settling is not None and (acked or dead):
        settling.settlement.settled(cursor, acked, dead)
