"""Atomic consumers: a handler's writes and its ack commit in one transaction.

``@consumer(..., atomic=True)`` runs the handler inside ``transaction.atomic()`` on the
database of its topic (``SQLQUEUE['DATABASE']``, or the alias ``SQLQUEUE['TOPIC_DATABASES']``
routes the topic to) and, at its end, in that same transaction,
writes the message's ack and the watermark move it allows
(:meth:`~django_sqlqueue.db.store.atomic_acks.AtomicAckStore.ack_in_transaction`). Either the handler's
writes, its ``publish()`` calls and the ack all commit, or none of it does: a crash, a
``kill -9`` or a lost lease at any instant leaves no half-done effect, and a redelivery
never finds the effect already applied. ``atomic="batch"`` does the same for a whole
fetched batch of one partition (one commit per batch).

**The fence, and why at the end.** The ack is fenced by the partition's lease: just
before COMMIT a locking read (``FOR SHARE``; ``LOCK IN SHARE MODE`` on MariaDB) of this
worker's lease row checks that it still holds the partition, and the delivery's own row
must still be the delivery this worker was given (in flight, same attempt, unacked).
If not, :class:`~django_sqlqueue.exceptions.FenceLost` rolls the whole transaction back:
the handler's effects vanish and the partition's new holder redelivers the message.
The lock is taken at the end, never at the start: the lease keeper renews the lease with
an UPDATE of that same row on its own connection, and a share lock held for the whole
handler would make the renewal wait behind the handler -- a handler longer than the
lease duration would let its own lease expire and be stolen. Taken at the end, the
share lock lives for a few statements and the COMMIT. Under READ COMMITTED the locking
read sees the latest committed lease row; a thief's UPDATE of the row (an expired lease
taken over) either committed before it -- we see ``leased_by`` changed and roll back --
or waits for our COMMIT, after which its poll reads our ack (the watermark moved, or
the delivery row acked) and does not redeliver.

**What the handler's transaction locks, and for how long.** While the handler runs:
only what the handler itself writes (plus, for ``publish()``, its new ``queue_messages``
rows -- an append that no publisher, sequencer or worker waits for: the sequencer
numbers messages only once committed). From the fence to the COMMIT (milliseconds):
this partition's lease row (shared), its watermark row and the acked messages'
delivery-state rows (exclusive). Nothing of other partitions, nothing publishers or the
sequencer take. On **SQLite** a transaction takes the database write lock at BEGIN
(``transaction_mode`` IMMEDIATE): an atomic handler blocks every other writer --
publishers, the lease keeper's renewals, other workers -- for its whole run, so keep
atomic handlers short there (or use MariaDB/PostgreSQL).

**Failures.** A handler that raises rolls its transaction back; the nack (attempt
count, backoff, dead letter on the last attempt) is then written in a short transaction
of its own, as for any consumer. So is a failure of the ack or the COMMIT itself: if a
COMMIT whose outcome is unknown did commit, the nack finds the delivery acked and
changes nothing.

**Handler timeouts** (``threads/watchdog.py``) apply: the batch's ``BatchProgress`` lock
decides between the watchdog and the handler. The handler's transaction writes its ack
only after ``start_commit`` succeeded, and from then until the outcome is recorded the
watchdog cannot abandon the batch; once the watchdog has abandoned it (nack written,
partition given up), ``start_commit`` is refused and the late handler's transaction
rolls back. The delivery fence stops it too: the nack changed the delivery row.

**Batch mode.** ``atomic="batch"`` runs each fetched batch of one partition in one
transaction with one fence and one COMMIT. If a handler raises, the batch's transaction
rolls back and each of its messages runs again alone in a transaction of its own (as
with ``atomic=True``), so one poison message is nacked on its own while its batch-mates
commit.

**Where the guarantee ends.** Only writes on the queue's database alias, made on the
handler's thread through Django's connection, are in the transaction. Writes on another
alias (even one pointing at the same database), emails, HTTP calls, files, caches are
not: a redelivery repeats them. Use idempotency keys for those, or defer them with
``transaction.on_commit`` (run once, after the ack committed -- at most once: a crash
right after the commit loses them). A write on another alias during an atomic handler
is logged once per consumer as a WARNING (a query wrapper on the thread's other
connections for the handler's duration: cheap, and it sees every query Django runs).
``async def`` handlers cannot be atomic: their ORM calls run on another thread's
connection.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from ...db.conn import tidy_connections
from ...db.store.settle import Settling
from ...exceptions import Reject

if TYPE_CHECKING:
    from ...consumers import ReceivedMessage
    from ...db.store import FetchedMessage, QueueStore
    from ...exceptions import FenceLost
    from ...tracing import ProcessSpan
    from ..subscription import Subscription
    from .outcomes import Call, Outcomes
    from .progress import BatchProgress

logger = logging.getLogger(__name__)

_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "MERGE", "UPSERT")


class Abandoned(Exception):
    """The watchdog gave the batch up before its transaction could commit: roll back."""


def ack_and_commit(
    store: QueueStore,
    sub: Subscription,
    partition: int,
    deliveries: list[tuple[int, int]],
    progress: BatchProgress | None,
    settling: Settling | None = None,
) -> int | None:
    """Inside the handler's open transaction: win the commit against the watchdog, then
    write the fenced ack (``ack_in_transaction``); return the new watermark, if moved.

    Raise :class:`Abandoned` if the watchdog gave the batch up; ``FenceLost`` if the
    lease or the delivery was lost. Either way the caller's ``atomic()`` block rolls back.
    After a successful ``start_commit`` the caller must end it (``progress.record`` or
    ``progress.end_commit``) whatever happens.
    """
    if progress is not None and not progress.start_commit():
        raise Abandoned
    return store.ack_in_transaction(sub.group, sub.topic, sub.name, partition, deliveries, settling)


def run_in_transaction(
    store: QueueStore,
    sub: Subscription,
    call: Callable[[], Any],
    commit: Callable[[], int | None],
) -> int | None:
    """Run ``call()`` (the handler) then ``commit()`` (the fenced ack) in one transaction on
    the queue's database; return what ``commit`` returned. Any exception rolls back."""
    with transaction.atomic(using=store.using):
        with watch_other_aliases(sub, store.using):
            call()
        return commit()


def one_message(
    store: QueueStore,
    sub: Subscription,
    call: Call,
    handler: Callable[[], object],
    progress: BatchProgress | None,
) -> Callable[[], int | None]:
    """An atomic consumer's call on one message (``atomic=True``): its ``before_atomic`` hook,
    then ``handler()`` and the fenced ack in one transaction. The callable returns the
    watermark the ack moved (None: not moved)."""
    m = call.message
    settling = settling_of(sub, [m])
    ack = partial(ack_and_commit, store, sub, m.partition, [(m.offset, call.attempt - 1)], progress, settling)
    in_transaction = partial(run_in_transaction, store, sub, handler, ack)
    hook = sub.spec.before_atomic
    if hook is None:
        return in_transaction
    return partial(_after, partial(hook, call.received), in_transaction)


def settling_of(sub: Subscription, messages: Iterable[FetchedMessage]) -> Settling | None:
    """The consumer's ``settlement`` with the tokens of ``messages`` it records with their
    ack (``db/store/settle.py``), or None: none to record."""
    settlement = sub.spec.settlement
    if settlement is None:
        return None
    tokens = {(m.partition, m.offset): t for m in messages if (t := settlement.key_of(m)) is not None}
    return Settling(settlement, tokens) if tokens else None


def _after(first: Callable[[], object], then: Callable[[], int | None]) -> int | None:
    """``first()``, then return ``then()``."""
    first()
    return then()


def rolled_back(sub: Subscription, received: ReceivedMessage, error: BaseException) -> None:
    """An atomic handler's transaction rolled back on ``error``: tell the consumer's
    ``on_rollback`` hook (in autocommit: what it writes stays)."""
    hook = sub.spec.on_rollback
    if hook is None:
        return
    final = isinstance(error, Reject) or received.attempt >= sub.options.max_attempts
    try:
        tidy_connections()
        hook(received, error, final)
    except Exception:  # the attempt is failed all the same
        logger.exception("on_rollback hook failed group=%s topic=%s id=%s", sub.group, sub.topic, received.id)


def lost(
    sub: Subscription,
    m: FetchedMessage,
    exc: FenceLost,
    outcomes: Outcomes,
    progress: BatchProgress | None,
    span: ProcessSpan | None,
) -> None:
    """An atomic transaction was rolled back by its fence: the message is the partition's
    new holder's now. Nothing is written; the rest of the partition's batch is not run."""

    def apply() -> None:
        outcomes.lost.add(m.partition)
        outcomes.pending.clear()

    if progress is None:
        apply()
    else:
        progress.record(apply)  # ends the commit: not abandoned meanwhile (see progress.py)
    if span is not None:
        span.end(exc)
    logger.warning(
        "an atomic consumer's transaction was rolled back: %s; the handler's effects are undone and the "
        "partition's holder redelivers group=%s topic=%s partition=%d offset=%d id=%s",
        exc,
        sub.group,
        sub.topic,
        m.partition,
        m.offset,
        m.id,
    )


# -- writes on other aliases ---------------------------------------------------------------

_warned: set[str] = set()
_warned_lock = threading.Lock()


@contextmanager
def watch_other_aliases(sub: Subscription, using: str) -> Iterator[None]:
    """Warn (once per consumer) if the handler writes through another alias meanwhile."""
    if sub.spec.name in _warned:
        yield
        return
    with ExitStack() as stack:
        for alias in connections:
            if alias != using:
                stack.enter_context(connections[alias].execute_wrapper(_Watcher(sub, alias, using)))
        yield


class _Watcher:
    def __init__(self, sub: Subscription, alias: str, using: str) -> None:
        self.sub = sub
        self.alias = alias
        self.using = using

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.lstrip()[:7].upper().startswith(_WRITES):
            _warn_other_alias(self.sub, self.alias, self.using)
        return execute(sql, params, many, context)


def _warn_other_alias(sub: Subscription, alias: str, using: str) -> None:
    name = sub.spec.name
    with _warned_lock:
        if name in _warned:
            return
        _warned.add(name)
    logger.warning(
        "an atomic consumer's handler wrote through database alias %r, outside its transaction on %r: those "
        "writes are not covered by the exactly-once guarantee (a redelivery repeats them) group=%s topic=%s",
        alias,
        using,
        sub.group,
        sub.topic,
    )
