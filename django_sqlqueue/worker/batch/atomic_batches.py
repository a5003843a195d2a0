"""``atomic="batch"`` consumers: one transaction per partition batch.

:class:`~django_sqlqueue.worker.batch.runner.BatchRunner` runs a batch of an ``@consumer(...,
atomic="batch")`` consumer through :class:`AtomicBatches`, which it composes; everything
else about a batch -- the outcomes, the writes, per-message atomic consumers
(``atomic=True``) -- stays in ``batch.py``. The fence and the transaction helpers are in
``atomic.py``, whose docstring explains the guarantee.

**The batch transaction.** The fetched messages of one partition (a run of equal
partitions in the batch, in offset order) are handled inside one
``transaction.atomic()`` on the queue's database, one handler after the other, on the
batch's thread. Messages no handler takes (undecodable rows, dead letters replayed for
another group) go the ordinary way first (:meth:`BatchRunner.handle`: dead letter or
ack, written with the batch's outcomes). The consumer's ``before_atomic`` hook runs for
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
pending messages back (``watchdog.py``), and the late handler's thread finds
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
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from django.db import transaction

from ... import signals, tracing
from ...db.conn import tidy_connections
from ...exceptions import FenceLost
from ...rules import dlq
from . import atomic

if TYPE_CHECKING:
    from ...consumers import ReceivedMessage
    from ...db.store import FetchedMessage
    from ..subscription import Subscription
    from .handlers import HandlerRunner
    from .progress import BatchProgress
    from .runner import BatchRunner, Outcomes

# The worker's records keep the logger name they had before the batch left worker.py:
# projects route and filter them by it.
logger = logging.getLogger("django_sqlqueue.worker")


class AtomicBatches:
    """Runs the batches of ``atomic="batch"`` consumers for one :class:`BatchRunner`."""

    def __init__(self, runner: BatchRunner) -> None:
        #: Handles single messages (the fallback, messages no handler takes) and records outcomes.
        self.runner = runner
        self.store = runner.store
        self.stats = runner.stats
        self.stop_event = runner.stop_event

    def run(
        self,
        sub: Subscription,
        messages: list[FetchedMessage],
        outcomes: Outcomes,
        invoke: HandlerRunner,
        progress: BatchProgress | None,
        started: list[int],
    ) -> int | None:
        """Run ``messages`` (offset order per partition), each partition's in one transaction
        (see the module docstring); return how many were handled, None if the watchdog took
        over. ``started[0]``: how many messages were begun, kept up to date for the runner,
        which hands the rest back if this fails outside the handlers."""
        handled = 0
        while started[0] < len(messages):
            first = started[0]
            key = messages[first].partition
            end = first
            while end < len(messages) and messages[end].partition == key:
                end += 1
            if self.stop_event.is_set() or key not in sub.held or key in outcomes.lost:
                outcomes.unprocessed.extend((key, m.offset) for m in messages[first:end])
                started[0] = end
                continue
            count = self._batch(sub, messages, range(first, end), outcomes, invoke, progress, started)
            if count is None:
                return None
            handled += count
            started[0] = end
        return handled

    def _batch(
        self,
        sub: Subscription,
        messages: list[FetchedMessage],
        indexes: range,
        outcomes: Outcomes,
        invoke: HandlerRunner,
        progress: BatchProgress | None,
        started: list[int],
    ) -> int | None:
        """One partition's messages ``messages[indexes]`` in one transaction and one commit.

        Messages no handler takes (undecodable rows, dead letters replayed for another
        group) go the ordinary way first. If a handler raises, or the ack or the COMMIT
        fails, the transaction rolls back and each message runs again alone in its own
        transaction (:meth:`BatchRunner.handle`), so a poison message cannot hold its batch-mates
        back. Return how many were handled; None if the watchdog took the batch over.
        """
        key = messages[indexes[0]].partition
        todo: list[int] = []
        for index in indexes:
            m = messages[index]
            if m.undecodable is not None or dlq.is_for_other_group(m.metadata, sub.group):
                self.runner.handle(sub, m, outcomes, invoke, progress=progress, index=index)
            else:
                todo.append(index)
        if not todo:
            return len(indexes)
        calls: list[tuple[FetchedMessage, ReceivedMessage, int, Any, float]] = []
        failure: BaseException | None = None
        committing = False
        moved: int | None = None
        prepare = sub.spec.before_atomic
        received_of = {i: self.runner.received(sub, messages[i], progress) for i in todo}
        if prepare is not None:
            try:
                for index in todo:
                    prepare(received_of[index])
            except Exception as exc:  # noqa: BLE001 - as a handler's failure: each message alone
                return self._failed(sub, messages, todo, [], exc, outcomes, invoke, progress, indexes)
        try:
            with transaction.atomic(using=self.store.using), atomic.watch_other_aliases(sub, self.store.using):
                for index in todo:
                    started[0] = max(started[0], index + 1)
                    m = messages[index]
                    received = received_of[index]
                    attempt = received.attempt
                    span = tracing.start_process(received) if tracing.ENABLED else None
                    if not self.runner.begin(sub, received, progress, index, span):
                        if span is not None:
                            span.end(None)
                        raise atomic.Abandoned
                    began = time.monotonic()
                    try:
                        if span is None:
                            invoke(sub.spec.handler, received, progress)
                        else:
                            with span:
                                invoke(sub.spec.handler, received, progress)
                    except BaseException as exc:  # noqa: BLE001 - rolls the batch back, see below
                        failure = exc
                    calls.append((m, received, attempt, span, time.monotonic() - began))
                    keep = partial(outcomes.pending.append, (m.partition, m.offset))
                    if progress is None:
                        keep()
                    elif not progress.record(keep):
                        raise atomic.Abandoned
                    if failure is not None:
                        raise failure
                if progress is not None:
                    if not progress.start_commit():
                        raise atomic.Abandoned
                    committing = True
                deliveries = [(m.offset, attempt - 1) for m, _, attempt, _, _ in calls]
                moved = self.store.ack_in_transaction(sub.group, sub.topic, sub.name, key, deliveries)
        except atomic.Abandoned:
            # The watchdog took over (it hands the pending messages back): rolled back.
            for _, _, _, span, _ in calls:
                if span is not None and (progress is None or span is not progress.span):
                    span.end(atomic.Abandoned("the batch was given up by the watchdog"))
            self.runner.log_late_return(sub, calls[-1][0] if calls else messages[todo[0]], rolled_back=True)
            return None
        except FenceLost as exc:
            self.runner.lost(sub, messages[todo[0]], exc, outcomes, progress if committing else None, None)
            if not committing:
                outcomes.pending.clear()
            for _, _, _, span, _ in calls:
                if span is not None:
                    span.end(exc)
            return len(indexes)
        except BaseException as exc:  # noqa: BLE001 - a handler's error, or the ack's or COMMIT's
            failure = failure or exc
            if committing and progress is not None:
                progress.end_commit()
            return self._failed(sub, messages, todo, calls, failure, outcomes, invoke, progress, indexes)

        def done() -> None:
            outcomes.pending.clear()
            outcomes.committed += len(calls)
            if moved is not None:
                outcomes.moved[key] = moved

        if progress is None:
            done()
        else:
            progress.end_commit(done)
        self.stats.add(delivered=len(calls))
        for _, received, _, span, duration in calls:
            if span is not None:
                span.end(None)
            signals.send(signals.message_processed, sub.topic, message=received, duration=duration)
        return len(indexes)

    def _failed(
        self,
        sub: Subscription,
        messages: list[FetchedMessage],
        todo: list[int],
        calls: list[tuple[FetchedMessage, ReceivedMessage, int, Any, float]],
        failure: BaseException,
        outcomes: Outcomes,
        invoke: HandlerRunner,
        progress: BatchProgress | None,
        indexes: range,
    ) -> int | None:
        """The batch's transaction rolled back because of ``failure``: run its messages again
        one per transaction. A ``SystemExit`` or ``KeyboardInterrupt`` fails its message's
        attempt and stops the worker instead (the others are handed back)."""
        outcomes.pending.clear()  # rolled back; no handler in hand: the watchdog cannot take over now
        for _, _, _, span, _ in calls:
            if span is not None:
                span.end(failure)
        tidy_connections()
        if isinstance(failure, (SystemExit, KeyboardInterrupt)) and calls:
            m, _, attempt, _, _ = calls[-1]
            self.runner.decide(sub, m, attempt, failure, outcomes)
            self.runner.interrupt(sub, m, failure)
            rest = [messages[i] for i in todo if messages[i] is not m]
            outcomes.unprocessed.extend((other.partition, other.offset) for other in rest)
            return len(indexes)
        logger.info(
            "an atomic batch rolled back (%s); its %d message(s) run again one per transaction group=%s topic=%s "
            "partition=%d",
            f"{type(failure).__name__}: {failure}",
            len(todo),
            sub.group,
            sub.topic,
            messages[todo[0]].partition,
        )
        for index in todo:
            m = messages[index]
            if self.stop_event.is_set() or m.partition not in sub.held or m.partition in outcomes.lost:
                outcomes.unprocessed.append((m.partition, m.offset))
                continue
            if not self.runner.handle(sub, m, outcomes, invoke, progress=progress, index=index):
                return None
        return len(indexes)
