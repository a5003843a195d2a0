"""What a handler's outcome means, and the writes it leads to.

After each handler call (``runner.py``), :meth:`OutcomeWriter.decide` adds the call's
outcome to its batch's :class:`Outcomes`, in memory:

- the handler returned: an **ack** (an atomic consumer's ack was committed with its
  transaction already: it is only counted, with the watermark the commit moved);
- it raised ``Reject``: a **dead letter** at once;
- it raised anything else, ``BaseException`` subclasses included: a **failed attempt**
  (:meth:`OutcomeWriter.failed`): a nack, due again after a backoff delay
  (``backoff.retry_delay``, or the ``Retry``'s own ``delay``), with the error kept for
  ``last_error``; on the consumer's ``max_attempts``-th attempt a dead letter instead.
  The watchdog fails a timed-out attempt the same way (``threads/watchdog.py``).

:meth:`OutcomeWriter.complete` then writes a batch's outcomes, each kind in a short
transaction of its own fenced by the partition's lease (``db/store/acks.py``), in this
order: dead letters (each moved atomically by the store), nacks, acks -- which move the
watermark when the batch's offsets are contiguous with it -- and last the hand-backs of
the messages not run (``release_deliveries``: due now, attempt not counted) and of those
over a limit (``postpone_deliveries``: due after their delay, attempt not counted). Each write
is retried through a database outage (``db/retry.py``).

:class:`BatchHooks` is the runner's public seam: what its owner (the testing helpers'
``drain``) may watch or adjust without overriding the runner's methods.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ... import signals
from ...db.session import handler_section
from ...db.store import SCHEDULED, FetchedMessage
from ...db.store.settle import Settling
from ...exceptions import Reject, Retry
from ...rules import dlq
from ...rules.backoff import retry_delay

if TYPE_CHECKING:
    from ...conf import QueueSettings
    from ...consumers import ReceivedMessage
    from ...db.retry import Retrying
    from ...db.store import QueueStore
    from ...tracing import ProcessSpan
    from ..subscription import Subscription

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Lines of traceback kept in a dead letter's ``last_error``.
TRACEBACK_LINES = 12


@dataclass
class Stats:
    """A worker's counters (logged when it stops)."""

    delivered: int = 0
    acked: int = 0
    nacked: int = 0
    dead_lettered: int = 0
    #: Deliveries over a rate or concurrency limit, handed back to wait (not attempts).
    postponed: int = 0
    #: Handler threads update the counters too.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        """Add ``counts`` (``acked=3``...) to the counters, atomically."""
        with self.lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)


@dataclass
class Outcomes:
    """What one batch decided, written by :meth:`OutcomeWriter.complete`."""

    acks: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    #: (partition, offset, delay in seconds).
    nacks: list[tuple[int, int, float]] = field(default_factory=list)
    #: (partition, offset) -> the error of a nacked attempt.
    errors: dict[tuple[int, int], str] = field(default_factory=dict)
    #: (message, attempts, error).
    dead: list[tuple[FetchedMessage, int, str]] = field(default_factory=list)
    #: (partition, offset) of messages not run: handed back, attempt not counted.
    unprocessed: list[tuple[int, int]] = field(default_factory=list)
    #: (partition, offset, delay) of messages over a limit (``worker/limits.py``): handed
    #: back due after the delay, attempt not counted.
    postponed: list[tuple[int, int, float]] = field(default_factory=list)
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
    #: (partition, offset) -> token of the acks the consumer's ``settlement`` records
    #: with them (``db/store/settle.py``); empty for consumers without one.
    settle: dict[tuple[int, int], Any] = field(default_factory=dict)


@dataclass
class Call:
    """One handler call on one message of a batch."""

    message: FetchedMessage
    #: What the handler was given.
    received: ReceivedMessage
    #: The attempt's ``process`` span (None: not traced), ended once its outcome is recorded.
    span: ProcessSpan | None
    #: Seconds the handler ran (set when it returned or raised).
    duration: float = 0.0

    @property
    def attempt(self) -> int:
        """The attempt number of this delivery (1 = first)."""
        return self.received.attempt

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Return ``fn(*args)`` (the handler call), run with the attempt's span current (its
        publishes are the span's children); :attr:`duration` is set whether it returns or raises."""
        began = time.monotonic()
        try:
            # The handler's own transactions are never under the engine's idle bound.
            with handler_section():
                if self.span is None:
                    return fn(*args)
                with self.span:
                    return fn(*args)
        finally:
            self.duration = time.monotonic() - began


class BatchHooks:
    """What the owner of a :class:`~.runner.BatchRunner` may watch or adjust.

    The seam the testing helpers use (``testing/draining.py``): subclass it, override what
    you need and pass an instance as ``BatchRunner(..., hooks=...)``. Every method here
    does nothing. They run on the thread that handles or writes the batch (the poll
    loop's, or a handler thread's; the watchdog's writes run on the poll loop's), and
    must be quick and must not raise.
    """

    def on_handled(self, sub: Subscription, message: FetchedMessage) -> bool:
        """``message`` went through :meth:`~.runner.BatchRunner.handle` (one message run by
        itself: handled, dead-lettered or acked without a handler call, or dropped because
        the watchdog took the batch over). Return True to stop the worker: the rest of
        the batch is handed back, attempts not counted, as on SIGTERM."""
        return False

    def on_outcomes(self, sub: Subscription, outcomes: Outcomes) -> None:
        """A batch's ``outcomes`` are about to be written; they may be changed here (e.g.
        every nack's delay set to 0)."""

    def on_dead_letter(self, sub: Subscription, message: FetchedMessage, attempts: int, error: str) -> None:
        """``message`` was moved to its dead-letter topic after ``attempts`` attempts."""


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


def announce(sub: Subscription, call: Call, error: BaseException | None) -> None:
    """A call's outcome was recorded: end its span, send ``message_processed`` (``error``
    None) or ``message_failed``. Call it outside the progress lock: a signal receiver
    must not hold the watchdog up."""
    if call.span is not None:
        call.span.end(error, requested=isinstance(error, Retry))
    if error is None:
        signals.send(signals.message_processed, sub.topic, message=call.received, duration=call.duration)
        return
    final = isinstance(error, Reject) or call.attempt >= sub.options.max_attempts
    signals.send(
        signals.message_failed, sub.topic, message=call.received, duration=call.duration, error=error, final=final
    )


def log_late_return(sub: Subscription, m: FetchedMessage, *, rolled_back: bool) -> None:
    """A handler returned after the watchdog had taken its batch over: its outcome is dropped."""
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


class OutcomeWriter:
    """Decides and writes the outcomes of one worker's batches; see the module docstring."""

    def __init__(
        self,
        store: QueueStore,
        conf: QueueSettings,
        *,
        stats: Stats,
        db: Retrying,
        hooks: BatchHooks | None = None,
    ) -> None:
        self.store = store
        self.conf = conf
        self.stats = stats
        self.db = db
        self.hooks = hooks if hooks is not None else BatchHooks()
        self._rng = random.Random()

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

        Any exception is a failed attempt, ``BaseException`` subclasses included (see
        ``runner.py`` for ``SystemExit`` and ``KeyboardInterrupt``). ``committed``: the
        ack was committed with an atomic handler's transaction (``moved``: the watermark
        it moved to, if it did).
        """
        if error is None and committed:
            outcomes.committed += 1
            if moved is not None:
                outcomes.moved[m.partition] = moved
        elif error is None:
            outcomes.acks[m.partition].append(m.offset)
            if sub.spec.settlement is not None:  # recorded with the ack (db/store/settle.py)
                token = sub.spec.settlement.key_of(m)
                if token is not None:
                    outcomes.settle[(m.partition, m.offset)] = token
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

    def complete(self, sub: Subscription, outcomes: Outcomes, watermarks: Mapping[int, int]) -> None:
        """Write a batch's outcomes: dead letters, nacks, acks (and the watermark), hand-backs.
        ``watermarks``: each partition's watermark when the batch was fetched."""
        self.hooks.on_outcomes(sub, outcomes)
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
            settlement = sub.spec.settlement
            settling = Settling(settlement, outcomes.settle) if settlement is not None and outcomes.settle else None
            self.db("ack", lambda: store.record_acks(group, topic, name, outcomes.acks, dead, watermarks, settling))
        self.stats.add(acked=sum(len(v) for v in outcomes.acks.values()) + outcomes.committed)
        if outcomes.unprocessed:
            self.db("release deliveries", lambda: store.release_deliveries(group, topic, name, outcomes.unprocessed))
        if outcomes.postponed:
            self.db("postpone", lambda: store.postpone_deliveries(group, topic, name, outcomes.postponed))
            self.stats.add(postponed=len(outcomes.postponed))

    def dead_letter(self, sub: Subscription, m: FetchedMessage, attempts: int, error: str) -> None:
        """Move one message to its topic's dead-letter topic for ``sub``'s group (through
        the store: the copy and the group's ack in one fenced transaction)."""
        dlq_topic = dlq.dlq_topic(sub.topic, self.conf.DLQ_SUFFIX)
        settlement, settling = sub.spec.settlement, None
        if settlement is not None and (token := settlement.key_of(m)) is not None:
            settling = Settling(settlement, {(m.partition, m.offset): token})  # counted with it (settle.py)
        store, group, topic, name = self.store, sub.group, sub.topic, sub.name
        self.db(
            "dead letter",
            lambda: store.dead_letter(
                group, topic, name, m, dlq_topic=dlq_topic, attempts=attempts, error=error, settling=settling
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
        self.hooks.on_dead_letter(sub, m, attempts, error)


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
