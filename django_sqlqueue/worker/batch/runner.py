"""One batch: run the handlers over its messages, then have the outcomes written.

The poll loop (``poller.py``) has already recorded the deliveries (``mark_delivered``)
before a batch runs, so a crash mid-batch redelivers after the visibility timeout. Then,
for each message in offset order per partition, outside any transaction:

- the handler is called; what its return or exception means -- ack, nack with a backoff
  delay, dead letter; any ``BaseException`` is a failed attempt -- is decided, and
  written once the batch is done, by ``outcomes.py``;
- a replayed dead letter meant for another group (``dlq.is_for_other_group``) is acked
  without calling the handler;
- a row that could not be decoded (``FetchedMessage.undecodable``: written by another
  program, not JSON, or metadata not an object) is dead-lettered without calling the
  handler, with an error naming the column and why; the partition goes on;
- a message over a rate or concurrency limit (``worker/limits.py``) is not run: it is
  handed back to wait (``Outcomes.postponed``), attempt not counted; the partition goes on;
- a message whose partition cannot run now (the worker is stopping, the lease was lost
  meanwhile: :meth:`BatchRunner.runnable`) is handed back with the outcomes.

**``SystemExit`` and ``KeyboardInterrupt``** fail their attempt like any exception --
counted, so a handler that always exits ends in the DLQ after ``max_attempts`` instead
of restarting workers forever -- but they are how Python code asks the *process* to stop
(``sys.exit()`` in a library, a Ctrl-C that reached the handler's thread), so they are
not swallowed: the runner records the exception (:attr:`BatchRunner.interrupted`) and
sets the worker's stop event. The rest of the batch is handed back, the outcomes are
written, the worker drains as on SIGTERM and ``Worker.run()`` re-raises the exception,
so ``runconsumer`` exits with the status it asked for.

**A failure outside the handlers** (the batch's thread is killed by an asynchronous
exception, the outcome writes fail): the messages whose handler had not begun are handed
back at once (attempt not counted); the others stay in flight and come back after their
visibility timeout, counted. Nothing is lost. Each loop over a batch's messages keeps in
a local ``started`` how many it began, for :meth:`BatchRunner.fail_outside`.

**Atomic consumers** (``atomic.py``): with ``atomic=True`` :meth:`BatchRunner.handle`
runs each handler and its fenced ack in one transaction (the ack is then committed, not
written afterwards); ``atomic="batch"`` runs each partition's messages in one
transaction, with a one-by-one fallback when it rolls back -- :class:`AtomicBatches`
(``atomic_batches.py``), which the runner composes, does that.

A :class:`BatchRunner` holds no thread of its own: the worker runs it on the poll loop's
thread, or on handler threads (``threads/executor.py``); what one batch's calls share is
a :class:`Batch`, never the runner's state.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from ... import tracing
from ...conf import QueueSettings
from ...consumers import ReceivedMessage
from ...db.conn import close_all_quietly, tidy_connections
from ...db.retry import Retrying
from ...db.store import FetchedMessage, QueueStore
from ...exceptions import FenceLost
from ...rules import dlq
from ...rules.atomic_modes import BATCH
from ..limits import Limiter
from ..subscription import Subscription
from . import atomic
from .atomic_batches import AtomicBatches
from .handlers import HandlerRunner
from .outcomes import BatchHooks, Call, Outcomes, OutcomeWriter, Stats, announce, attempt_number, log_late_return
from .progress import BatchProgress

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Batch:
    """One batch being run: what its handler calls share."""

    sub: Subscription
    #: In offset order per partition.
    messages: Sequence[FetchedMessage]
    outcomes: Outcomes
    invoke: HandlerRunner
    #: Shared with the watchdog (handler threads); None on the poll loop's thread.
    progress: BatchProgress | None


def handler_timeout(sub: Subscription, received: ReceivedMessage) -> float | None:
    """The timeout of one handler call: the consumer's ``timeout_for(message)`` if it gives
    one (per-task timeouts; ``math.inf``: none), else the consumer's ``timeout`` (None: no limit)."""
    timeout_for = sub.spec.timeout_for
    if timeout_for is not None:
        chosen = timeout_for(received)
        if chosen is not None:
            return None if math.isinf(chosen) else chosen
    return sub.options.timeout


class BatchRunner:
    """Runs batches of one worker; see the module docstring.

    ``hooks`` (:class:`~.outcomes.BatchHooks`): what the runner's owner watches or adjusts
    (the testing helpers' ``drain``); by default nothing.
    """

    def __init__(
        self,
        store: QueueStore,
        conf: QueueSettings,
        *,
        stats: Stats,
        stop_event: threading.Event,
        db: Retrying,
        hooks: BatchHooks | None = None,
    ) -> None:
        self.store = store
        self.conf = conf
        self.stats = stats
        self.stop_event = stop_event
        self.db = db
        self.hooks = hooks if hooks is not None else BatchHooks()
        # Not called per message unless the owner overrides it (the hot path).
        self._on_handled = None if type(self.hooks).on_handled is BatchHooks.on_handled else self.hooks.on_handled
        #: Decides what each outcome means and writes them (``outcomes.py``).
        self.writer = OutcomeWriter(store, conf, stats=stats, db=db, hooks=self.hooks)
        #: The ``SystemExit`` or ``KeyboardInterrupt`` a handler raised (the first one):
        #: the worker stops and re-raises it (see the module docstring).
        self.interrupted: SystemExit | KeyboardInterrupt | None = None
        #: ``atomic="batch"`` consumers' batches (``atomic_batches.py``).
        self.atomic_batches = AtomicBatches(self)
        self.limiter = Limiter(store, db)  # rate and concurrency limits (``worker/limits.py``)
        # Outcomes decided outside the handler calls, by the poller (messages out of
        # attempts) and the watchdog (timed-out attempts), are the writer's too.
        self.failed = self.writer.failed
        self.complete = self.writer.complete
        self.dead_letter = self.writer.dead_letter

    # -- a batch ---------------------------------------------------------------------------

    def run(
        self,
        sub: Subscription,
        messages: Sequence[FetchedMessage],
        watermarks: Mapping[int, int],
        invoke: HandlerRunner,
        progress: BatchProgress | None = None,
    ) -> int:
        """Run handlers over ``messages`` (offset order per partition), write the outcomes,
        and return how many were handled. ``watermarks``: each partition's watermark when
        the batch was fetched. ``progress``: shared with the watchdog, which may take the
        batch over (``progress.py``); then this returns 0 at once and writes nothing."""
        batch = Batch(sub, messages, progress.outcomes if progress is not None else Outcomes(), invoke, progress)
        loop = self.atomic_batches.run if sub.spec.atomic == BATCH else self._one_by_one
        handled = loop(batch)
        if handled is None or (progress is not None and not progress.start_writing()):
            return 0  # abandoned: the watchdog wrote what there was to write
        self.writer.complete(sub, batch.outcomes, watermarks)
        return handled

    def _one_by_one(self, batch: Batch) -> int | None:
        """Run the batch's messages one after the other; return how many were handled,
        None if the watchdog took the batch over."""
        handled = started = 0  # messages begun (or skipped), in order
        sub, outcomes, stop = batch.sub, batch.outcomes, self.stop_event
        try:
            for index, m in enumerate(batch.messages):
                started = index + 1
                # :meth:`runnable`, inline: this loop is the worker's hot path. ``held`` is read
                # each time: the lease keeper replaces it, the watchdog takes partitions out.
                if stop.is_set() or m.partition not in sub.held or m.partition in outcomes.lost:
                    outcomes.unprocessed.append((m.partition, m.offset))
                    continue
                # :meth:`handle`, unwrapped: the hook is looked at only if the owner set one.
                recorded = self._handle(sub, m, outcomes, batch.invoke, batch.progress, index)
                if self._on_handled is not None and self._on_handled(sub, m):
                    stop.set()  # the rest of the batch is handed back, as on a stop
                if not recorded:
                    return None
                handled += 1
        except BaseException as exc:
            self.fail_outside(batch, started, exc)
            raise
        return handled

    def alone(self, batch: Batch, index: int) -> int | None:
        """Run ``messages[index]`` by itself (:meth:`handle`), or hand it back if its partition
        is not :meth:`runnable` now. Return 1 (handled), 0 (handed back), or None if the
        watchdog took the batch over."""
        m = batch.messages[index]
        if not self.runnable(batch, m.partition):
            batch.outcomes.unprocessed.append((m.partition, m.offset))
            return 0
        if not self.handle(batch.sub, m, batch.outcomes, batch.invoke, progress=batch.progress, index=index):
            return None
        return 1

    def runnable(self, batch: Batch, partition: int) -> bool:
        """Whether the batch's messages of ``partition`` may run now: not when the worker is
        stopping, nor when the partition is no longer held or its fence failed meanwhile."""
        return not (self.stop_event.is_set() or partition not in batch.sub.held or partition in batch.outcomes.lost)

    def fail_outside(self, batch: Batch, started: int, exc: BaseException) -> None:
        """The batch failed outside its handlers (its thread is being killed, or the engine
        failed): hand back ``messages[started:]``, whose handler had not begun (attempt not
        counted) -- unless the watchdog took the batch over (it wrote what there was to
        write). The one in hand stays in flight (counted)."""
        if batch.progress is not None and not batch.progress.start_writing():
            return
        sub, messages = batch.sub, batch.messages[started:]
        logger.error(
            "batch failed outside its handlers group=%s topic=%s error=%s: %d message(s) not run handed back, "
            "the one in hand is redelivered after its visibility timeout",
            sub.group,
            sub.topic,
            f"{type(exc).__name__}: {exc}",
            len(messages),
        )
        if not messages:
            return
        # The failure may have left the connection mid-statement.
        close_all_quietly()
        keys = [(m.partition, m.offset) for m in messages]
        try:
            self.store.release_deliveries(sub.group, sub.topic, sub.name, keys)
        except Exception:
            logger.exception("could not hand the batch back group=%s topic=%s", sub.group, sub.topic)

    # -- one message -----------------------------------------------------------------------

    def handle(
        self,
        sub: Subscription,
        m: FetchedMessage,
        outcomes: Outcomes,
        invoke: HandlerRunner,
        *,
        progress: BatchProgress | None = None,
        index: int = 0,
    ) -> bool:
        """Call the handler on one message and add its outcome to ``outcomes``.

        With ``progress`` (``messages[index]`` of a batch on a handler thread) the call is
        timed by the watchdog; return False if it abandoned the batch meanwhile (the
        outcome is dropped: the watchdog already failed this attempt). Then the hooks'
        ``on_handled`` may stop the worker.
        """
        recorded = self._handle(sub, m, outcomes, invoke, progress, index)
        if self._on_handled is not None and self._on_handled(sub, m):
            self.stop_event.set()  # the rest of the batch is handed back, as on a stop
        return recorded

    def _handle(
        self,
        sub: Subscription,
        m: FetchedMessage,
        outcomes: Outcomes,
        invoke: HandlerRunner,
        progress: BatchProgress | None,
        index: int,
    ) -> bool:
        if m.undecodable is not None:
            # Written by another program: no handler can take it, and retrying will not help.
            outcomes.dead.append((m, attempt_number(m), m.undecodable))
            return True
        if dlq.is_for_other_group(m.metadata, sub.group):
            # A dead letter replayed for another group (ops replay): ack, do not handle.
            outcomes.acks[m.partition].append(m.offset)
            return True
        received = self.received(sub, m, progress)
        if sub.spec.limits_for is not None or sub.spec.rate_limit is not None:
            attempt = partial(self._attempt, sub, m, received, outcomes, invoke, progress, index)
            # Over a rate or concurrency limit: back to the queue to wait, not an attempt.
            return self.limiter.gate(sub, received, outcomes, handler_timeout(sub, received), attempt)
        return self._attempt(sub, m, received, outcomes, invoke, progress, index)

    def _attempt(
        self,
        sub: Subscription,
        m: FetchedMessage,
        received: ReceivedMessage,
        outcomes: Outcomes,
        invoke: HandlerRunner,
        progress: BatchProgress | None,
        index: int,
    ) -> bool:
        """One attempt: the handler called on ``received``, its outcome recorded (:meth:`handle`)."""
        self.stats.add(delivered=1)
        call = self.begin(sub, m, received, progress, index)
        if call is None:
            return False
        error: BaseException | None = None
        moved: int | None = None
        try:
            if sub.spec.atomic:
                # Also commits the fenced ack; returns the watermark it moved (None: not moved).
                handler = partial(invoke, sub.spec.handler, call.received, progress)
                moved = call.run(atomic.one_message(self.store, sub, call, handler, progress))
            else:
                call.run(invoke, sub.spec.handler, call.received, progress)
        except atomic.Abandoned:
            # The watchdog gave the attempt up first: the transaction rolled back.
            log_late_return(sub, m, rolled_back=True)
            return False
        except FenceLost as exc:
            atomic.lost(sub, m, exc, outcomes, progress, call.span)
            return True
        except BaseException as exc:  # noqa: BLE001 - any handler error is a failed attempt (OutcomeWriter.decide)
            error = exc
        return self._record(sub, call, error, outcomes, progress, moved)

    def _record(
        self,
        sub: Subscription,
        call: Call,
        error: BaseException | None,
        outcomes: Outcomes,
        progress: BatchProgress | None,
        moved: int | None,
    ) -> bool:
        """Add the call's outcome unless the watchdog took the batch over meanwhile (then
        return False), announce it, and tidy up after a failed handler."""
        m = call.message
        if error is not None and sub.spec.atomic:
            atomic.rolled_back(sub, call.received, error)
        committed = bool(sub.spec.atomic)
        attempt = call.received.attempt
        decide = partial(self.writer.decide, sub, m, attempt, error, outcomes, committed=committed, moved=moved)
        recorded = True
        if progress is None:
            decide()
        else:
            recorded = progress.record(decide)
        if recorded:
            announce(sub, call, error)  # outside the progress lock
        if error is not None:
            # A handler that failed may have broken the connection: not the next query's problem.
            tidy_connections()
            if isinstance(error, (SystemExit, KeyboardInterrupt)):
                self.interrupt(sub, m, error)
        if not recorded:
            log_late_return(sub, m, rolled_back=False)
        return recorded

    def begin(
        self,
        sub: Subscription,
        m: FetchedMessage,
        received: ReceivedMessage,
        progress: BatchProgress | None,
        index: int,
    ) -> Call | None:
        """A handler call on ``messages[index]`` of the batch starts: its ``process`` span
        (``tracing.py``) and the watchdog's clock, with the call's timeout. None if the
        watchdog abandoned the batch meanwhile (the span is ended at once)."""
        # Ended by whoever records the attempt's outcome: the batch's thread, or the
        # watchdog if it abandons the batch (``progress.span``).
        span = tracing.start_process(received) if tracing.ENABLED else None
        if progress is None or progress.begin(index, handler_timeout(sub, received), received, span):
            return Call(m, received, span)
        if span is not None:  # (abandoned meanwhile: not reached in practice, but never left open)
            span.end(None)
        return None

    def received(self, sub: Subscription, m: FetchedMessage, progress: BatchProgress | None) -> ReceivedMessage:
        """The :class:`ReceivedMessage` a handler is given for this delivery of ``m``."""
        return ReceivedMessage(
            topic=sub.topic,
            key=m.key,
            partition=m.partition,
            offset=m.offset,
            id=m.id,
            payload=m.payload,
            metadata=m.metadata,
            attempt=attempt_number(m),
            created_at=m.created_at,
            deliver_at=m.deliver_at,
            group=sub.group,
            _store=self.store,
            _subscriber=sub.name,
            _on_progress=None if progress is None else progress.touch,
            _atomic=bool(sub.spec.atomic),
        )

    def interrupt(self, sub: Subscription, m: FetchedMessage, exc: SystemExit | KeyboardInterrupt) -> None:
        """A handler asked the process to stop: stop the worker, which re-raises ``exc`` once drained."""
        logger.error(
            "handler raised %s, the worker stops (attempt recorded as failed, the rest handed back) "
            "group=%s topic=%s partition=%d offset=%d id=%s",
            f"{type(exc).__name__}({', '.join(map(repr, exc.args))})",
            sub.group,
            sub.topic,
            m.partition,
            m.offset,
            m.id,
        )
        if self.interrupted is None:
            self.interrupted = exc
        self.stop_event.set()
