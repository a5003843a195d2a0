"""The worker: the poll loop that delivers messages to handlers.

One process runs one :class:`Worker` for any number of registered consumers. Per poll
and subscription it issues a handful of statements whatever the batch size:

1. ``poll_state``: one query over the partitions it leases that may have work;
   partitions with committed messages not numbered yet are sequenced first (one short
   transaction for all of them, see ``sequencer.py``);
2. ``fetch``: one query for all of them (fresh and due messages, per partition);
3. ``mark_delivered``: one transaction recording the deliveries *before* any handler
   runs, so a crash mid-batch redelivers after the visibility timeout, and counts the
   attempt (a message that kills its worker ends in the DLQ, not in a crash loop);
4. handlers run one by one, outside any transaction, in offset order per partition;
5. outcomes: dead letters (each moved atomically), nacks, then acks -- the happy path
   moves the watermark and deletes the rows in one transaction per partition.

With ``concurrency`` > 1 (``runconsumer --concurrency N``) steps 4 and 5 of each
partition's batch run on one of N handler threads (``executor.py``) while the poll loop
goes on polling the other partitions; a partition with a batch on a handler thread is not
fetched again until that batch's outcomes are written, so order within a partition holds.

Polling adapts: immediately again after a full batch, ``POLL_INTERVAL`` after a partial
one, and, while idle, an interval doubling up to ``POLL_INTERVAL_MAX``.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from django.db import connections

from . import dlq
from .backoff import retry_delay
from .conf import QueueSettings, get_settings
from .consumers import ConsumerSpec, ReceivedMessage
from .dbconn import close_quietly, tidy_connections
from .exceptions import ConfigurationError, Reject, Retry
from .executor import PartitionExecutor
from .handlers import HandlerRunner
from .leasing import LeaseKeeper
from .outage import OutageReporter
from .retry import with_retries
from .scheduler import Scheduler
from .schedules import Schedule
from .sequencer import Sequencer
from .store import SCHEDULED, FetchedMessage, FetchPlan, PartitionState, QueueStore
from .subscription import Subscription

logger = logging.getLogger(__name__)

#: Lines of traceback kept in a dead letter's ``last_error``.
TRACEBACK_LINES = 12


@dataclass
class Stats:
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
class _Outcomes:
    acks: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    nacks: list[tuple[int, int, float]] = field(default_factory=list)
    #: (partition, offset) -> the error of a nacked attempt.
    errors: dict[tuple[int, int], str] = field(default_factory=dict)
    dead: list[tuple[FetchedMessage, int, str]] = field(default_factory=list)
    unprocessed: list[tuple[int, int]] = field(default_factory=list)


def describe_error(exc: BaseException) -> str:
    """Exception type, message and a short traceback, for ``last_error``."""
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    tail = "".join(lines[-TRACEBACK_LINES:])
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}\n{tail}"


class Worker:
    """Runs consumers until :meth:`stop` is called (or a signal arrives, see ``runconsumer``)."""

    def __init__(
        self,
        specs: list[ConsumerSpec],
        *,
        name: str,
        conf: QueueSettings | None = None,
        using: str | None = None,
        concurrency: int = 1,
        schedules: list[Schedule] | None = None,
    ) -> None:
        """``concurrency``: handler threads running batches of different partitions in parallel
        (1: handlers run on the poll loop's thread, one at a time). ``schedules``: recurring
        tasks and messages this worker helps fire (django_sqlqueue.scheduler)."""
        if not specs:
            raise ValueError("a worker needs at least one consumer")
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise ConfigurationError(f"concurrency must be a positive integer, got {concurrency!r}.")
        self.concurrency = concurrency
        self.executor: PartitionExecutor | None = None
        self._turn = 0
        self.conf = conf or get_settings()
        self.name = name
        self.store = QueueStore(using or self.conf.DATABASE)
        self.sequencer = Sequencer(self.store.using)
        self.subscriptions = [Subscription.create(spec, name, self.conf) for spec in specs]
        self.stop_event = threading.Event()
        # One outage reporter for the poll loop and the lease keeper (django_sqlqueue.outage).
        self.outage = OutageReporter(alias=self.store.using, report_interval=self.conf.OUTAGE_REPORT_INTERVAL)
        self.keeper = LeaseKeeper(self.subscriptions, self.store, self.conf, outage=self.outage)
        # Calls sync and async handlers; owns this worker's event loop (django_sqlqueue.handlers).
        self.invoke = HandlerRunner()
        self.scheduler = Scheduler(schedules, using=self.store.using, outage=self.outage) if schedules else None
        self.stats = Stats()
        self._rng = random.Random()

    # -- lifecycle -----------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to finish the message(s) in hand and shut down gracefully."""
        self.stop_event.set()
        if self.executor is not None:
            self.executor.finished.set()  # wake the poll loop

    def run(self) -> None:
        """Poll until stopped; then hand back unprocessed messages, leases and heartbeats."""
        logger.info(
            "worker starting subscriber=%s consumers=%s concurrency=%d",
            self.name,
            ", ".join(s.spec.name for s in self.subscriptions),
            self.concurrency,
        )
        self.register_topics()
        self.keeper.start()
        for sub in self.subscriptions:
            sub.ready.wait(timeout=self.conf.LEASE_DURATION)
        if self.concurrency > 1:
            self.executor = PartitionExecutor(self.concurrency)
        if self.scheduler is not None:
            self.scheduler.start()
        try:
            self._loop()
        finally:
            if self.executor is not None:
                # Drain: the batches in hand finish their current message, hand the rest
                # back and write their outcomes before the leases are released.
                self.executor.finished.set()
                self.executor.shutdown()
            if self.scheduler is not None:
                self.scheduler.stop()
            self.keeper.stop()
            self.keeper.release_all()
            self.invoke.close()
            connections.close_all()
            logger.info(
                "worker stopped subscriber=%s delivered=%d acked=%d nacked=%d dead_lettered=%d",
                self.name,
                self.stats.delivered,
                self.stats.acked,
                self.stats.nacked,
                self.stats.dead_lettered,
            )

    def register_topics(self) -> None:
        """Register the consumed topics with their partition counts; refuse a mismatch.

        Publishers hash keys with the count in their settings: a worker whose settings
        disagree with the registered count would consume a topic that publishers
        partition differently. Changing the count is an explicit operation
        (``manage.py queue_topic repartition``).
        """
        for topic in sorted({sub.topic for sub in self.subscriptions}):
            wanted = self.conf.partitions_for(topic)
            registered = self._db(
                "register topic", lambda topic=topic, wanted=wanted: self.store.register_topic(topic, wanted)
            )
            if registered != wanted:

                def describe(n: int | None) -> str:
                    return "one partition per key" if n is None else f"{n} partitions"

                raise ConfigurationError(
                    f"topic {topic!r} is registered with {describe(registered)}, but SQLQUEUE gives it "
                    f"{describe(wanted)}. Change the partition count explicitly with "
                    f"`manage.py queue_topic repartition {topic} <n>` (keys move to other partitions; drain "
                    "the topic first if order across the change matters), or fix SQLQUEUE['TOPICS']."
                )

    def _loop(self) -> None:
        conf = self.conf
        interval = conf.POLL_INTERVAL
        while not self.stop_event.is_set():
            tidy_connections()
            started = time.monotonic()
            full = delivered = False
            for sub in self.subscriptions:
                if self.stop_event.is_set():
                    break
                try:
                    count, was_full = self.poll(sub)
                except Exception as exc:  # noqa: BLE001 - reported by the outage reporter
                    self.outage.failure(logger, exc, "poll failed group=%s topic=%s", sub.group, sub.topic)
                    close_quietly(self.store.using)
                    count, was_full = 0, False
                else:
                    self.outage.reachable()
                delivered = delivered or count > 0
                full = full or was_full
            executor = self.executor
            if executor is not None and executor.free == 0:
                # Every handler thread has a batch: poll again when one finishes.
                executor.finished.wait(conf.POLL_INTERVAL_MAX)
                executor.finished.clear()
                interval = conf.POLL_INTERVAL
                continue
            if full:
                interval = conf.POLL_INTERVAL
                continue
            if delivered:
                # Busy: keep a POLL_INTERVAL cadence, counting the time the poll took.
                interval = conf.POLL_INTERVAL
                self._pause(max(0.0, interval - (time.monotonic() - started)))
                continue
            interval = min(conf.POLL_INTERVAL_MAX, max(interval, conf.POLL_INTERVAL / 2) * 2)
            self._pause(interval)

    def _pause(self, seconds: float) -> None:
        """Sleep between polls; with handler threads, wake early when a batch finishes
        (its partition may have more work, and it is fetchable again)."""
        if self.executor is None:
            self.stop_event.wait(seconds)
            return
        if self.executor.finished.wait(seconds):
            self.executor.finished.clear()

    def _db(self, what: str, fn: Any) -> Any:
        return with_retries(fn, using=self.store.using, what=what, stop_event=self.stop_event)

    # -- one poll ------------------------------------------------------------------------

    def poll(self, sub: Subscription) -> tuple[int, bool]:
        """Deliver one batch per partition with work; return (messages handled, any batch full)."""
        with sub.poll_lock:  # the lease keeper hands partitions over between polls
            return self._poll(sub)

    def _poll(self, sub: Subscription) -> tuple[int, bool]:
        store, group, topic = self.store, sub.group, sub.topic
        if not sub.held:
            return 0, False
        states = self._db("poll state", lambda: store.poll_state(group, topic, sub.name, self.conf.LEASE_DURATION))
        busy = sub.in_flight.snapshot()
        # A partition whose batch is still on a handler thread is left alone (order).
        states = [s for s in states if s.partition in sub.held and s.partition not in busy]
        missing = [s.partition for s in states if not s.has_offsets_row]
        if missing:
            self._db("create watermarks", lambda: store.ensure_offsets(group, topic, missing))
            return 0, True  # poll again with the watermarks in place
        by_key: dict[int, PartitionState] = {s.partition: s for s in states}
        unsequenced = [s.partition for s in states if s.unsequenced]
        if unsequenced:
            heads = self._db("sequence", lambda: self.sequencer.sequence(topic, unsequenced))
            for partition, head in heads.items():
                by_key[partition] = replace(by_key[partition], head=head)
            states = [by_key[s.partition] for s in states]
        plans: list[FetchPlan] = []
        for state in states:
            if state.advanceable:
                key, wm = state.partition, state.watermark
                new = self._db(
                    "advance watermark",
                    lambda key=key, wm=wm: store.advance_watermark(group, topic, sub.name, key, wm),
                )
                state = by_key[key] = _with_watermark(state, new)
            fresh_after = max(state.watermark, state.delivered_max or 0)
            fresh = state.head > fresh_after
            due = state.next_due is not None and state.next_due <= state.now
            if sub.strict and state.in_flight:
                continue  # strict serialization: wait for the message in flight
            if fresh or due:
                plans.append(FetchPlan(state.partition, fresh_after if fresh else None, due))
        if self.executor is not None:
            plans = self._share_slots(plans)
        if not plans:
            return 0, False
        logger.debug(
            "poll group=%s topic=%s leased=%d with_work=%d partitions=%s",
            group,
            topic,
            len(sub.held),
            len(plans),
            [p.partition for p in plans],
        )
        limit = sub.options.batch_size
        fetched = self._db("fetch", lambda: store.fetch(group, topic, plans, limit))
        batches, parked, full = self._select(sub, fetched, by_key)
        if not batches and not parked:
            return 0, False
        for key, batch in batches.items():
            logger.debug(
                "batch group=%s topic=%s partition=%d size=%d offsets=%d-%d",
                group,
                topic,
                key,
                len(batch),
                batch[0].offset,
                batch[-1].offset,
            )
        if parked:
            logger.debug("parked delayed messages group=%s topic=%s count=%d", group, topic, len(parked))

        fresh = [m for batch in batches.values() for m in batch if m.retry_count is None]
        again = [m for batch in batches.values() for m in batch if m.retry_count is not None]
        held = self._db(
            "mark delivered",
            lambda: store.mark_delivered(group, topic, sub.name, fresh, again, parked, sub.options.visibility_timeout),
        )
        # A partition whose lease was lost since the poll began (stolen after expiry,
        # released by an operator) was not recorded: deliver none of its messages.
        batches = {key: batch for key, batch in batches.items() if key in held}
        if self.executor is not None:
            for key in sorted(batches):
                job = functools.partial(self._run_batch, sub, batches[key], {key: by_key[key]})
                self.executor.submit(sub.in_flight, key, job)
            handled = sum(len(b) for b in batches.values())
            return handled, full or bool(parked)
        handled = self._run_batch(sub, [m for key in sorted(batches) for m in batches[key]], by_key, self.invoke)
        # Parking delayed messages is progress too: poll again at once, or ready messages
        # behind many delayed ones would wait through idle backoff.
        return handled, full or bool(parked)

    def _share_slots(self, plans: list[FetchPlan]) -> list[FetchPlan]:
        """Fetch no more partitions than there are free handler threads, rotating the start
        so that every partition with work gets its turn."""
        assert self.executor is not None
        free = self.executor.free
        if len(plans) <= free:
            return plans
        self._turn = (self._turn + 1) % len(plans)
        rotated = plans[self._turn :] + plans[: self._turn]
        return rotated[:free]

    def _run_batch(
        self,
        sub: Subscription,
        messages: list[FetchedMessage],
        states: dict[int, PartitionState],
        invoke: HandlerRunner,
    ) -> int:
        """Run handlers over ``messages`` (offset order per partition) and write the outcomes.

        Runs on the poll loop's thread, or on a handler thread with ``--concurrency``.
        """
        if self.executor is not None:
            tidy_connections()
        outcomes = _Outcomes()
        handled = 0
        for message in messages:
            key = message.partition
            if self.stop_event.is_set() or key not in sub.held:
                outcomes.unprocessed.append((key, message.offset))
                continue
            self._handle(sub, message, outcomes, invoke)
            handled += 1
        self._complete(sub, outcomes, states)
        return handled

    def _select(
        self, sub: Subscription, fetched: list[FetchedMessage], states: dict[int, PartitionState]
    ) -> tuple[dict[int, list[FetchedMessage]], list[FetchedMessage], bool]:
        """Choose each partition's batch: the lowest deliverable offsets, up to batch_size.

        Fresh messages whose ``deliver_at`` lies ahead are parked, not delivered; messages
        delivered ``max_attempts`` times already go to the DLQ without another attempt.
        """
        by_key: dict[int, list[FetchedMessage]] = defaultdict(list)
        for m in fetched:
            by_key[m.partition].append(m)
        limit, max_attempts = sub.options.batch_size, sub.options.max_attempts
        batches: dict[int, list[FetchedMessage]] = {}
        parked: list[FetchedMessage] = []
        full = False
        for key, messages in by_key.items():
            now = states[key].now
            batch: list[FetchedMessage] = []
            for m in sorted(messages, key=lambda m: m.offset):
                if m.retry_count is None and m.deliver_at > now:
                    parked.append(m)
                    continue
                if len(batch) >= limit:
                    full = True
                    break
                if _attempt(m) > max_attempts:
                    self._dead_letter(sub, m, _attempt(m) - 1, _expired_error(m, sub))
                    continue
                batch.append(m)
            if len(batch) >= limit:
                full = True
            if batch:
                batches[key] = batch
        return batches, parked, full

    def _handle(self, sub: Subscription, m: FetchedMessage, outcomes: _Outcomes, invoke: HandlerRunner) -> None:
        if dlq.is_for_other_group(m.metadata, sub.group):
            # A dead letter replayed for another group (ops.deadletters): ack, do not handle.
            outcomes.acks[m.partition].append(m.offset)
            return
        attempt = _attempt(m)
        received = ReceivedMessage(
            topic=sub.topic,
            key=m.key,
            partition=m.partition,
            offset=m.offset,
            id=m.id,
            payload=m.payload,
            metadata=m.metadata,
            attempt=attempt,
            created_at=m.created_at,
            deliver_at=m.deliver_at,
            group=sub.group,
            _store=self.store,
        )
        self.stats.add(delivered=1)
        try:
            invoke(sub.spec.handler, received)
        except Reject as exc:
            outcomes.dead.append((m, attempt, describe_error(exc)))
        except Exception as exc:  # noqa: BLE001 - any handler error is a nack
            context = (sub.group, sub.topic, m.partition, m.key, m.offset, m.id, attempt, sub.options.max_attempts)
            if attempt >= sub.options.max_attempts:
                _log_handler_failure(exc, "giving up (dead letter)", context)
                outcomes.dead.append((m, attempt, describe_error(exc)))
            else:
                if isinstance(exc, Retry) and exc.delay is not None:
                    delay = exc.delay
                else:
                    delay = retry_delay(attempt, self.conf.BACKOFF_MIN, self.conf.BACKOFF_MAX, self._rng)
                _log_handler_failure(exc, f"retrying in {delay:.1f}s", context)
                outcomes.nacks.append((m.partition, m.offset, delay))
                outcomes.errors[(m.partition, m.offset)] = describe_error(exc)
        else:
            outcomes.acks[m.partition].append(m.offset)
            return
        # A handler that failed may have broken the connection: not the next query's problem.
        tidy_connections()

    def _complete(self, sub: Subscription, outcomes: _Outcomes, states: dict[int, PartitionState]) -> None:
        store, group, topic, name = self.store, sub.group, sub.topic, sub.name
        for message, attempt, error in outcomes.dead:
            self._dead_letter(sub, message, attempt, error)
        if outcomes.nacks:
            self._db("nack", lambda: store.nack(group, topic, name, outcomes.nacks, outcomes.errors))
            self.stats.add(nacked=len(outcomes.nacks))
        dead: dict[int, set[int]] = defaultdict(set)
        for message, _, _ in outcomes.dead:
            dead[message.partition].add(message.offset)
        contiguous: list[tuple[int, int, int]] = []
        plain: list[tuple[int, int]] = []
        for key, offsets in outcomes.acks.items():
            done = sorted({*offsets, *dead.get(key, ())})
            wm = states[key].watermark
            if done == list(range(wm + 1, wm + len(done) + 1)):
                contiguous.append((key, wm, wm + len(done)))
            else:
                plain += [(key, off) for off in offsets]
        if contiguous:
            failed = set(self._db("ack and advance", lambda: store.ack_contiguous(group, topic, name, contiguous)))
            plain += [(key, off) for key in failed for off in outcomes.acks[key]]
        if plain:
            self._db("ack", lambda: store.ack(group, topic, name, plain))
        self.stats.add(acked=sum(len(v) for v in outcomes.acks.values()))
        if outcomes.unprocessed:
            self._db("release deliveries", lambda: store.release_deliveries(group, topic, name, outcomes.unprocessed))

    def _dead_letter(self, sub: Subscription, m: FetchedMessage, attempts: int, error: str) -> None:
        dlq_topic = dlq.dlq_topic(sub.topic, self.conf.DLQ_SUFFIX)
        self._db(
            "dead letter",
            lambda: self.store.dead_letter(
                sub.group, sub.topic, sub.name, m, dlq_topic=dlq_topic, attempts=attempts, error=error
            ),
        )
        self.stats.add(dead_lettered=1)
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


def _log_handler_failure(exc: BaseException, then: str, context: tuple[Any, ...]) -> None:
    """WARNING with the traceback for a failed attempt; a ``Retry`` asked for is not a failure (INFO)."""
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


def _attempt(m: FetchedMessage) -> int:
    """The attempt number this delivery will be (1 = first)."""
    if m.retry_count is None:
        return 1
    return m.retry_count + (1 if m.status == SCHEDULED else 2)


def _expired_error(m: FetchedMessage, sub: Subscription) -> str:
    return (
        f"delivered {_attempt(m) - 1} times without an ack or nack (visibility timeout "
        f"{sub.options.visibility_timeout:g}s expired each time: the handler hung or its worker died)"
    )


def _with_watermark(state: PartitionState, watermark: int) -> PartitionState:
    return replace(state, watermark=watermark, advanceable=False)
