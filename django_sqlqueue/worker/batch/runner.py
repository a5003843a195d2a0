"""One batch: run the handlers, decide each message's outcome, write the outcomes.

The poll loop (``worker.py``) has already recorded the deliveries (``mark_delivered``)
before a batch runs, so a crash mid-batch redelivers after the visibility timeout. Then,
for each message in offset order per partition, outside any transaction:

- a handler that returns **acks** the message;
- a handler that raises **nacks** it: it is retried after a backoff delay
  (``backoff.retry_delay``, or ``Retry(delay=...)``), with the error kept in
  ``last_error``; on its ``max_attempts``-th attempt it is **dead-lettered** instead;
- ``Reject`` dead-letters at once;
- a replayed dead letter meant for another group (``dlq.is_for_other_group``) is acked
  without calling the handler;
- a row that could not be decoded (``FetchedMessage.undecodable``: written by another
  program, not JSON, or metadata not an object) is dead-lettered without calling the
  handler, with an error naming the column and why; the partition goes on.

**Exceptions that are not ``Exception``.** A handler that raises another
``BaseException`` (``asyncio.CancelledError``, a library's own ``BaseException``
subclass) has failed its attempt like any handler: nack (or dead letter on the last
attempt), with the error kept. ``SystemExit`` and ``KeyboardInterrupt`` are also a failed
attempt -- counted, so a handler that always exits ends in the DLQ after
``max_attempts`` instead of restarting workers forever -- but they are how Python code
asks the *process* to stop (``sys.exit()`` in a library, a Ctrl-C that reached the
handler's thread), so they are not swallowed: the runner records the exception
(:attr:`BatchRunner.interrupted`) and sets the worker's stop event. The rest of the
batch is handed back unprocessed, the outcomes are written, the worker drains as on
SIGTERM (other batches hand their rest back, leases are released) and ``Worker.run()``
re-raises the exception, so ``runconsumer`` exits with the status it asked for.

**A failure outside the handlers** (the batch's thread is killed by an asynchronous
exception, the outcome writes fail): the messages whose handler had not run are handed
back at once (attempt not counted); the others stay in flight and come back after their
visibility timeout, counted. Nothing is lost.

The outcomes are written afterwards, each kind in a short transaction of its own fenced
by the partition's lease (``store/acks.py``): dead letters (each moved atomically), nacks,
then acks -- which move the watermark when the batch's offsets are contiguous with it.
Messages of the batch not handled because the worker is stopping, or because the
partition's lease was lost meanwhile, are handed back (``release_deliveries``).

**Atomic consumers** (``atomic.py``): with ``atomic=True`` :meth:`BatchRunner.handle`
runs each handler and its fenced ack in one transaction (the ack is then committed, not
written afterwards); ``atomic="batch"`` runs each partition's messages in one
transaction, with a one-by-one fallback when it rolls back -- :class:`AtomicBatches`
(``atomic_batches.py``), which the runner composes, does that.

A :class:`BatchRunner` holds no thread of its own: the worker runs it on the poll loop's
thread, or on a handler thread with ``--concurrency`` (``executor.py``).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ... import signals, tracing
from ...conf import QueueSettings
from ...consumers import ReceivedMessage
from ...db.conn import close_all_quietly, tidy_connections
from ...db.retry import Retrying
from ...db.store import SCHEDULED, FetchedMessage, QueueStore
from ...exceptions import FenceLost, Reject, Retry
from ...rules import dlq
from ...rules.atomic_modes import BATCH
from ...rules.backoff import retry_delay
from ..subscription import Subscription
from . import atomic
from .atomic_batches import AtomicBatches
from .handlers import HandlerRunner
from .progress import BatchProgress

# The worker's records keep the logger name they had before the batch left worker.py:
# projects route and filter them by it.
logger = logging.getLogger("django_sqlqueue.worker")

#: Lines of traceback kept in a dead letter's ``last_error``.
TRACEBACK_LINES = 12


@dataclass
class Stats:
    """A worker's counters (logged when it stops)."""

    delivered: int = 0
    acked: int = 0
    nacked: int = 0
    dead_lettered: int = 0
    #: Handler threads update the counters too.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)


@dataclass
class Outcomes:
    """What one batch decided, written by :meth:`BatchRunner.complete`."""

    acks: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    nacks: list[tuple[int, int, float]] = field(default_factory=list)
    #: (partition, offset) -> the error of a nacked attempt.
    errors: dict[tuple[int, int], str] = field(default_factory=dict)
    dead: list[tuple[FetchedMessage, int, str]] = field(default_factory=list)
    unprocessed: list[tuple[int, int]] = field(default_factory=list)
    #: Atomic consumers (``atomic.py``): acks committed with their handler's transaction
    #: (counted here, never written again) and the watermarks those commits moved.
    committed: int = 0
    moved: dict[int, int] = field(default_factory=dict)
    #: Partitions whose fence failed in this batch (lease or delivery lost): the rest of
    #: their messages are not run.
    lost: set[int] = field(default_factory=set)
    #: ``atomic="batch"``: messages handled in the open transaction, not committed yet;
    #: handed back if the watchdog gives the batch up.
    pending: list[tuple[int, int]] = field(default_factory=list)


def describe_error(exc: BaseException) -> str:
    """Return the exception's type, message and a short traceback, for ``last_error``."""
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    tail = "".join(lines[-TRACEBACK_LINES:])
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}\n{tail}"


def attempt_number(m: FetchedMessage) -> int:
    """Return the attempt number this delivery will be (1 = first)."""
    if m.retry_count is None:
        return 1
    return m.retry_count + (1 if m.status == SCHEDULED else 2)


def expired_error(m: FetchedMessage, sub: Subscription) -> str:
    """Return the ``last_error`` of a message whose every delivery timed out."""
    return (
        f"delivered {attempt_number(m) - 1} times without an ack or nack (visibility timeout "
        f"{sub.options.visibility_timeout:g}s expired each time: the handler hung or its worker died)"
    )


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
    """Runs batches of one worker; see the module docstring."""

    def __init__(
        self,
        store: QueueStore,
        conf: QueueSettings,
        *,
        stats: Stats,
        stop_event: threading.Event,
        db: Retrying,
    ) -> None:
        self.store = store
        self.conf = conf
        self.stats = stats
        self.stop_event = stop_event
        self.db = db
        self._rng = random.Random()
        #: The ``SystemExit`` or ``KeyboardInterrupt`` a handler raised (the first one):
        #: the worker stops and re-raises it (see the module docstring).
        self.interrupted: SystemExit | KeyboardInterrupt | None = None
        #: ``atomic="batch"`` consumers' batches (``atomic_batches.py``).
        self.atomic_batches = AtomicBatches(self)

    def run(
        self,
        sub: Subscription,
        messages: list[FetchedMessage],
        watermarks: Mapping[int, int],
        invoke: HandlerRunner,
        progress: BatchProgress | None = None,
    ) -> int:
        """Run handlers over ``messages`` (offset order per partition), write the outcomes,
        and return how many were handled. ``watermarks``: each partition's watermark when
        the batch was fetched. ``progress``: shared with the watchdog, which may take the
        batch over (``progress.py``); then this returns at once and writes nothing."""
        outcomes: Outcomes = progress.outcomes if progress is not None else Outcomes()
        handled = 0
        started = [0]  # messages whose handler began (or that were skipped), in order
        try:
            if sub.spec.atomic == BATCH:
                count = self.atomic_batches.run(sub, messages, outcomes, invoke, progress, started)
                if count is None:
                    return handled  # abandoned: the watchdog wrote what there was to write
                handled = count
            for index, message in enumerate(messages[started[0] :], start=started[0]):
                key = message.partition
                started[0] += 1
                if self.stop_event.is_set() or key not in sub.held or key in outcomes.lost:
                    outcomes.unprocessed.append((key, message.offset))
                    continue
                if not self.handle(sub, message, outcomes, invoke, progress=progress, index=index):
                    return handled  # abandoned: the watchdog wrote what there was to write
                handled += 1
        except BaseException as exc:
            # Not a handler's exception (handle() keeps those): the thread is being
            # killed, or the engine failed. Hand back what did not run, then let it go on.
            if progress is None or progress.start_writing():
                self._hand_back(sub, messages[started[0] :], exc)
            raise
        if progress is not None and not progress.start_writing():
            return handled
        self.complete(sub, outcomes, watermarks)
        return handled

    def _hand_back(self, sub: Subscription, messages: list[FetchedMessage], exc: BaseException) -> None:
        """Hand back messages whose handler did not run after the batch failed outside its
        handlers (attempt not counted); the one in hand stays in flight (counted)."""
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
        outcome is dropped: the watchdog already failed this attempt).
        """
        if m.undecodable is not None:
            # Written by another program: no handler can take it, and retrying will not help.
            outcomes.dead.append((m, attempt_number(m), m.undecodable))
            return True
        if dlq.is_for_other_group(m.metadata, sub.group):
            # A dead letter replayed for another group (ops replay): ack, do not handle.
            outcomes.acks[m.partition].append(m.offset)
            return True
        attempt = attempt_number(m)
        received = self.received(sub, m, progress)
        self.stats.add(delivered=1)
        # The attempt's process span (tracing.py): started here, ended by whoever records the
        # attempt's outcome -- below, or the watchdog if it abandons the batch (progress.span).
        span = tracing.start_process(received) if tracing.ENABLED else None
        if not self.begin(sub, received, progress, index, span):
            if span is not None:  # (abandoned meanwhile: not reached in practice, but never left open)
                span.end(None)
            return False
        error: BaseException | None = None
        lost: FenceLost | None = None
        call = partial(invoke, sub.spec.handler, received, progress)
        if sub.spec.atomic:
            # The handler and its fenced ack in one transaction (atomic.py).
            ack = partial(atomic.ack_and_commit, self.store, sub, m.partition, [(m.offset, attempt - 1)], progress)
            call = partial(atomic.run_in_transaction, self.store, sub, call, ack)
        started = time.monotonic()
        moved: int | None = None
        if sub.spec.atomic and sub.spec.before_atomic is not None:
            call = partial(_after, partial(sub.spec.before_atomic, received), call)
        try:
            if span is None:
                moved = call()
            else:
                with span:  # the current span while the handler runs: its publishes are children
                    moved = call()
        except atomic.Abandoned:
            # The watchdog gave the attempt up first: the transaction rolled back.
            self.log_late_return(sub, m, rolled_back=True)
            return False
        except FenceLost as exc:
            lost = exc
        except BaseException as exc:  # noqa: BLE001 - any handler error is a failed attempt; see _decide
            error = exc
        duration = time.monotonic() - started
        if lost is not None:
            self.lost(sub, m, lost, outcomes, progress, span)
            return True
        if error is not None and sub.spec.atomic:
            self._rolled_back(sub, received, error)
        decide = partial(self.decide, sub, m, attempt, error, outcomes, committed=bool(sub.spec.atomic), moved=moved)
        recorded = True
        if progress is None:
            decide()
        else:
            recorded = progress.record(decide)
        if recorded:
            if span is not None:
                span.end(error, requested=isinstance(error, Retry))
            # Outside the progress lock: a receiver must not hold the watchdog up.
            if error is None:
                signals.send(signals.message_processed, sub.topic, message=received, duration=duration)
            else:
                final = isinstance(error, Reject) or attempt >= sub.options.max_attempts
                signals.send(
                    signals.message_failed, sub.topic, message=received, duration=duration, error=error, final=final
                )
        if error is not None:
            # A handler that failed may have broken the connection: not the next query's problem.
            tidy_connections()
            if isinstance(error, (SystemExit, KeyboardInterrupt)):
                self.interrupt(sub, m, error)
        if not recorded:
            self.log_late_return(sub, m, rolled_back=False)
        return recorded

    def _rolled_back(self, sub: Subscription, received: ReceivedMessage, error: BaseException) -> None:
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

    def begin(
        self, sub: Subscription, received: ReceivedMessage, progress: BatchProgress | None, index: int, span: Any
    ) -> bool:
        """A handler call on ``messages[index]`` of the batch starts: start the watchdog's
        clock with its timeout. False if the watchdog abandoned the batch meanwhile."""
        return progress is None or progress.begin(index, handler_timeout(sub, received), received, span)

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

    def log_late_return(self, sub: Subscription, m: FetchedMessage, *, rolled_back: bool) -> None:
        logger.info(
            "a timed-out handler returned after all; its outcome is dropped%s (the attempt was failed and the "
            "partition given up) group=%s topic=%s partition=%d offset=%d id=%s",
            " and its transaction rolled back" if rolled_back else "",
            sub.group,
            sub.topic,
            m.partition,
            m.offset,
            m.id,
        )

    def lost(
        self,
        sub: Subscription,
        m: FetchedMessage,
        exc: FenceLost,
        outcomes: Outcomes,
        progress: BatchProgress | None,
        span: Any,
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

    def decide(
        self,
        sub: Subscription,
        m: FetchedMessage,
        attempt: int,
        error: BaseException | None,
        outcomes: Outcomes,
        *,
        committed: bool = False,
        moved: int | None = None,
    ) -> None:
        """Add the outcome of a handler call: ack, dead letter (``Reject``), or a failed attempt.

        Any exception is a failed attempt, ``BaseException`` subclasses included (see the
        module docstring for ``SystemExit`` and ``KeyboardInterrupt``). ``committed``: the
        ack was committed with an atomic handler's transaction (``moved``: the watermark
        it moved to, if it did).
        """
        if error is None and committed:
            outcomes.committed += 1
            if moved is not None:
                outcomes.moved[m.partition] = moved
        elif error is None:
            outcomes.acks[m.partition].append(m.offset)
        elif isinstance(error, Reject):
            outcomes.dead.append((m, attempt, describe_error(error)))
        else:
            self.failed(sub, m, attempt, error, outcomes)

    def failed(
        self,
        sub: Subscription,
        m: FetchedMessage,
        attempt: int,
        exc: BaseException,
        outcomes: Outcomes,
        *,
        log: bool = True,
    ) -> None:
        """A failed attempt: nack with a backoff delay (or the ``Retry``'s), or dead-letter the
        last one. ``log=False``: the caller logged the failure already (the watchdog)."""
        context = (sub.group, sub.topic, m.partition, m.key, m.offset, m.id, attempt, sub.options.max_attempts)
        if attempt >= sub.options.max_attempts:
            if log:
                _log_handler_failure(exc, "giving up (dead letter)", context)
            outcomes.dead.append((m, attempt, describe_error(exc)))
            return
        if isinstance(exc, Retry) and exc.delay is not None:
            delay = exc.delay
        else:
            delay = retry_delay(attempt, self.conf.BACKOFF_MIN, self.conf.BACKOFF_MAX, self._rng)
        if log:
            _log_handler_failure(exc, f"retrying in {delay:.1f}s", context)
        outcomes.nacks.append((m.partition, m.offset, delay))
        outcomes.errors[(m.partition, m.offset)] = describe_error(exc)

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

    def complete(self, sub: Subscription, outcomes: Outcomes, watermarks: Mapping[int, int]) -> None:
        """Write a batch's outcomes: dead letters, nacks, acks (and the watermark), hand-backs."""
        store, group, topic, name = self.store, sub.group, sub.topic, sub.name
        for message, attempt, error in outcomes.dead:
            self.dead_letter(sub, message, attempt, error)
        if outcomes.nacks:
            self.db("nack", lambda: store.nack(group, topic, name, outcomes.nacks, outcomes.errors))
            self.stats.add(nacked=len(outcomes.nacks))
        dead: dict[int, set[int]] = defaultdict(set)
        for message, _, _ in outcomes.dead:
            dead[message.partition].add(message.offset)
        if outcomes.moved:
            watermarks = {**watermarks, **outcomes.moved}  # moved by atomic commits
        if outcomes.acks:
            self.db("ack", lambda: store.record_acks(group, topic, name, outcomes.acks, dead, watermarks))
        self.stats.add(acked=sum(len(v) for v in outcomes.acks.values()) + outcomes.committed)
        if outcomes.unprocessed:
            self.db("release deliveries", lambda: store.release_deliveries(group, topic, name, outcomes.unprocessed))

    def dead_letter(self, sub: Subscription, m: FetchedMessage, attempts: int, error: str) -> None:
        """Move one message to its topic's dead-letter topic for ``sub``'s group."""
        dlq_topic = dlq.dlq_topic(sub.topic, self.conf.DLQ_SUFFIX)
        self.db(
            "dead letter",
            lambda: self.store.dead_letter(
                sub.group, sub.topic, sub.name, m, dlq_topic=dlq_topic, attempts=attempts, error=error
            ),
        )
        self.stats.add(dead_lettered=1)
        signals.send(
            signals.message_dead_lettered,
            sub.topic,
            group=sub.group,
            topic=sub.topic,
            partition=m.partition,
            offset=m.offset,
            message_id=m.id,
            attempts=attempts,
            error=error.splitlines()[0] if error else "",
            dlq_topic=dlq_topic,
        )
        logger.warning(
            "dead-lettered group=%s topic=%s partition=%d offset=%d attempts=%d to=%s error=%s",
            sub.group,
            sub.topic,
            m.partition,
            m.offset,
            attempts,
            dlq_topic,
            error.splitlines()[0],
        )


def _after(first: Callable[[], object], then: Callable[[], Any]) -> Any:
    """``first()``, then return ``then()`` (an atomic consumer's ``before_atomic`` hook)."""
    first()
    return then()


def _log_handler_failure(exc: BaseException, then: str, context: tuple[Any, ...]) -> None:
    """Log a WARNING with the traceback for a failed attempt; a ``Retry`` asked for is not a failure (INFO)."""
    if isinstance(exc, Retry):
        logger.info(
            "handler asked for a retry, %s group=%s topic=%s partition=%d key=%s offset=%d id=%s attempt=%d/%d",
            then,
            *context,
        )
        return
    logger.warning(
        "handler failed, %s group=%s topic=%s partition=%d key=%s offset=%d id=%s attempt=%d/%d error=%s",
        then,
        *context,
        f"{type(exc).__name__}: {exc}",
        exc_info=exc,
    )
