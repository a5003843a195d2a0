"""``atomic="batch"`` consumers: one transaction per partition batch.

:class:`~django_sqlqueue.worker.batch.runner.BatchRunner` runs a batch of an ``@consumer(...,
atomic="batch")`` consumer through :class:`AtomicBatches`, which it composes; everything
else about a batch -- the handler calls of single messages, per-message atomic consumers
(``atomic=True``) -- stays in ``runner.py``, and the outcomes and their writes are
``outcomes.py``'s. The fence and the transaction helpers are in ``atomic.py``, whose
docstring explains the guarantee.

**The batch transaction.** The fetched messages of one partition (a run of equal
partitions in the batch, in offset order) are handled inside one
``transaction.atomic()`` on the queue's database, one handler after the other, on the
batch's thread. Messages no handler takes (undecodable rows, dead letters replayed for
another group) go the ordinary way first (:meth:`BatchRunner.handle`: dead letter or
ack, written with the batch's outcomes), and so do messages with a rate or concurrency
limit (run alone: their admission must not wait in an open transaction). The consumer's ``before_atomic`` hook runs for
every message before the transaction opens. After the last handler, one fenced ack
(``ack_in_transaction``: the partition's lease row and every delivery checked, the
watermark moved if it can) and one COMMIT. Partitions run one after another, each with
its own transaction; a partition whose lease was lost, or a worker stopping, hands the
partition's messages back unrun.

**Locking and ordering.** While the handlers run, the transaction holds only what they
write (on SQLite: the database write lock, for the whole batch). The fence's locks --
this partition's lease row (shared), its watermark row and the delivery-state rows
(exclusive) -- are taken at the end, after ``progress.start_commit`` won the commit
against the watchdog, and held until the COMMIT. Each message handled in the open
transaction is kept in ``Outcomes.pending`` (under the progress lock) until the commit:
if the watchdog abandons the batch meanwhile, it fails the attempt in hand and hands the
pending messages back (``threads/watchdog.py``), and the late handler's thread finds
``record`` or ``start_commit`` refused and rolls the whole batch back. A lost fence
(:class:`~django_sqlqueue.exceptions.FenceLost`) rolls the batch back and leaves the
partition to its new holder: nothing is written, the rest of the partition is not run.

**The fallback.** If a handler (or ``before_atomic``) raises, or the ack or the COMMIT
fails, the batch's transaction rolls back and each of its messages runs again alone,
in a transaction of its own (as ``atomic=True``), through :meth:`BatchRunner.handle`:
a poison message fails its attempt on its own while its batch-mates commit. The
rolled-back run and the run alone are the same attempt (same attempt number; counted
as delivered once). A ``SystemExit`` or ``KeyboardInterrupt`` is not retried alone: it
fails its own message's attempt and stops the worker, and the batch's other messages
are handed back.

**A failure outside the handlers** (the thread is being killed): as for any batch
(``runner.py``), the messages whose handler had not begun -- in the transaction or
alone -- are handed back, the others stay in flight. :meth:`AtomicBatches.run` keeps
that position in a local; its steps return what they did (:class:`Together`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from django.db import transaction

from ...db.conn import tidy_connections
from ...exceptions import FenceLost
from ...rules import dlq
from ..limits import limits_of
from . import atomic
from .outcomes import Call, announce, log_late_return

if TYPE_CHECKING:
    from ...consumers import ReceivedMessage
    from ...db.store import FetchedMessage
    from .runner import Batch, BatchRunner

logger = logging.getLogger(__name__)


class Together(NamedTuple):
    """What became of one partition's messages run in one transaction."""

    #: How many were handled (the partition's count), or None: the watchdog took the batch over.
    handled: int | None
    #: The position after the last message whose handler began in the transaction (the
    #: first message's if none did): not handed back if the fallback fails outside its handlers.
    begun: int
    #: The messages to run again one per transaction: the transaction rolled back on a failure.
    alone: Sequence[int] = ()


class AtomicBatches:
    """Runs the batches of ``atomic="batch"`` consumers for one :class:`BatchRunner`."""

    def __init__(self, runner: BatchRunner) -> None:
        #: Handles single messages (the fallback, messages no handler takes) and records outcomes.
        self.runner = runner
        self.store = runner.store
        self.stats = runner.stats

    def run(self, batch: Batch) -> int | None:
        """Run the batch's messages, each partition's in one transaction (see the module
        docstring); return how many were handled, None if the watchdog took the batch over."""
        messages = batch.messages
        handled = started = 0  # messages begun (or skipped), in order
        try:
            while started < len(messages):
                indexes = _partition_run(messages, started)
                if not self.runner.runnable(batch, messages[started].partition):
                    batch.outcomes.unprocessed.extend((m.partition, m.offset) for m in messages[started : indexes.stop])
                    started = indexes.stop
                    continue
                together = self._together(batch, indexes)
                if together.handled is None:
                    return None
                started = max(started, together.begun)
                for index in together.alone:
                    started = max(started, index + 1)
                    if self.runner.alone(batch, index) is None:
                        return None
                handled += together.handled
                started = indexes.stop
        except BaseException as exc:
            self.runner.fail_outside(batch, started, exc)
            raise
        return handled

    def _together(self, batch: Batch, indexes: range) -> Together:
        """One partition's messages ``messages[indexes]`` in one transaction and one commit.

        Messages no handler takes (undecodable rows, dead letters replayed for another
        group) go the ordinary way first. If a handler (or ``before_atomic``) raises, or
        the ack or the COMMIT fails, the transaction rolls back and the messages are
        returned to run again alone, so a poison message cannot hold its batch-mates back.
        """
        sub, progress = batch.sub, batch.progress
        todo = self._to_handle(batch, indexes)
        if not todo:
            return Together(len(indexes), indexes.start)
        received = [self.runner.received(sub, batch.messages[i], progress) for i in todo]
        if sub.spec.before_atomic is not None:
            try:
                for message in received:
                    sub.spec.before_atomic(message)
            except Exception as exc:  # noqa: BLE001 - as a handler's failure: each message alone
                return Together(len(indexes), indexes.start, self._failed(batch, todo, [], exc))
        calls: list[Call] = []
        failure: BaseException | None = None
        committing = False
        moved: int | None = None
        try:
            with transaction.atomic(using=self.store.using), atomic.watch_other_aliases(sub, self.store.using):
                for index, message in zip(todo, received, strict=True):
                    call, failure = self._call(batch, index, message)
                    calls.append(call)
                    self._keep_pending(batch, call)
                    if failure is not None:
                        raise failure
                if progress is not None and not progress.start_commit():
                    raise atomic.Abandoned
                committing = progress is not None
                key = batch.messages[indexes.start].partition
                deliveries = [(c.message.offset, c.attempt - 1) for c in calls]
                settling = atomic.settling_of(sub, [c.message for c in calls])
                moved = self.store.ack_in_transaction(sub.group, sub.topic, sub.name, key, deliveries, settling)
        except atomic.Abandoned:
            self._abandoned(batch, todo, calls)
            return Together(None, indexes.start)
        except FenceLost as exc:
            self._lost(batch, todo, calls, exc, committing)
            return Together(len(indexes), indexes.stop)
        except BaseException as exc:  # noqa: BLE001 - a handler's error, or the ack's or COMMIT's
            if committing and progress is not None:
                progress.end_commit()
            begun = todo[len(calls) - 1] + 1 if calls else indexes.start
            return Together(len(indexes), begun, self._failed(batch, todo, calls, failure or exc))
        self._committed(batch, calls, moved)
        return Together(len(indexes), indexes.stop)

    def _to_handle(self, batch: Batch, indexes: range) -> list[int]:
        """The messages of ``indexes`` that go to the handler. The others (undecodable rows,
        dead letters replayed for another group) go the ordinary way now (dead letter or ack)."""
        todo: list[int] = []
        for index in indexes:
            m = batch.messages[index]
            taken = m.undecodable is None and not dlq.is_for_other_group(m.metadata, batch.sub.group)
            if taken and not self._limited(batch, m):
                todo.append(index)
            else:  # a limited one alone: its admission (and slot) outside any transaction
                self.runner.handle(batch.sub, m, batch.outcomes, batch.invoke, progress=batch.progress, index=index)
        return todo

    def _limited(self, batch: Batch, m: FetchedMessage) -> bool:
        """Whether ``m`` has rate or concurrency limits (``worker/limits.py``): it runs alone then."""
        spec = batch.sub.spec
        if spec.limits_for is None and spec.rate_limit is None:
            return False
        return limits_of(batch.sub, self.runner.received(batch.sub, m, batch.progress)) is not None

    def _call(self, batch: Batch, index: int, received: ReceivedMessage) -> tuple[Call, BaseException | None]:
        """Call the handler on ``messages[index]`` in the open transaction; return the call
        and the handler's exception (None: it returned). Raise ``Abandoned`` if the
        watchdog took the batch over before the call could begin."""
        call = self.runner.begin(batch.sub, batch.messages[index], received, batch.progress, index)
        if call is None:
            raise atomic.Abandoned
        try:
            call.run(partial(batch.invoke, batch.sub.spec.handler, received, batch.progress))
        except BaseException as exc:  # noqa: BLE001 - rolls the batch back (_together)
            return call, exc
        return call, None

    def _keep_pending(self, batch: Batch, call: Call) -> None:
        """Keep the call's message in ``Outcomes.pending`` until the commit (the watchdog
        hands it back if it takes the batch over); raise ``Abandoned`` if it did already."""
        keep = partial(batch.outcomes.pending.append, (call.message.partition, call.message.offset))
        if batch.progress is None:
            keep()
        elif not batch.progress.record(keep):
            raise atomic.Abandoned

    def _committed(self, batch: Batch, calls: list[Call], moved: int | None) -> None:
        """The transaction committed: count its acks (and the watermark it moved), announce each call."""
        outcomes, key = batch.outcomes, calls[0].message.partition

        def done() -> None:
            outcomes.pending.clear()
            outcomes.committed += len(calls)
            if moved is not None:
                outcomes.moved[key] = moved

        if batch.progress is None:
            done()
        else:
            batch.progress.end_commit(done)
        self.stats.add(delivered=len(calls))
        for call in calls:
            announce(batch.sub, call, None)

    def _abandoned(self, batch: Batch, todo: list[int], calls: list[Call]) -> None:
        """The watchdog took the batch over (it hands the pending messages back): the
        transaction rolled back. End the spans it does not end itself."""
        progress = batch.progress
        for call in calls:
            if call.span is not None and (progress is None or call.span is not progress.span):
                call.span.end(atomic.Abandoned("the batch was given up by the watchdog"))
        last = calls[-1].message if calls else batch.messages[todo[0]]
        log_late_return(batch.sub, last, rolled_back=True)

    def _lost(self, batch: Batch, todo: list[int], calls: list[Call], exc: FenceLost, committing: bool) -> None:
        """The fence rolled the transaction back: the partition is its new holder's."""
        progress = batch.progress if committing else None
        atomic.lost(batch.sub, batch.messages[todo[0]], exc, batch.outcomes, progress, None)
        if not committing:
            batch.outcomes.pending.clear()
        for call in calls:
            if call.span is not None:
                call.span.end(exc)

    def _failed(self, batch: Batch, todo: list[int], calls: list[Call], failure: BaseException) -> list[int]:
        """The batch's transaction rolled back because of ``failure``: return its messages,
        to run again one per transaction. A ``SystemExit`` or ``KeyboardInterrupt`` fails its
        message's attempt and stops the worker instead (the others are handed back)."""
        sub, outcomes = batch.sub, batch.outcomes
        outcomes.pending.clear()  # rolled back; no handler in hand: the watchdog cannot take over now
        for call in calls:
            if call.span is not None:
                call.span.end(failure)
        tidy_connections()
        if isinstance(failure, (SystemExit, KeyboardInterrupt)) and calls:
            last = calls[-1].message
            self.runner.writer.decide(sub, last, calls[-1].attempt, failure, outcomes)
            self.runner.interrupt(sub, last, failure)
            rest = [batch.messages[i] for i in todo if batch.messages[i] is not last]
            outcomes.unprocessed.extend((m.partition, m.offset) for m in rest)
            return []
        logger.info(
            "an atomic batch rolled back (%s); its %d message(s) run again one per transaction group=%s topic=%s "
            "partition=%d",
            f"{type(failure).__name__}: {failure}",
            len(todo),
            sub.group,
            sub.topic,
            batch.messages[todo[0]].partition,
        )
        return todo


def _partition_run(messages: Sequence[FetchedMessage], first: int) -> range:
    """The indexes of the run of messages of ``messages[first]``'s partition starting at ``first``."""
    end = first
    while end < len(messages) and messages[end].partition == messages[first].partition:
        end += 1
    return range(first, end)
