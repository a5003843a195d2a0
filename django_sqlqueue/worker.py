"""The worker: the poll loop that delivers messages to handlers.

One process runs one :class:`Worker` for any number of registered consumers. Per poll
and subscription it issues a handful of statements whatever the batch size:

1. ``poll_state``: one query over the partitions it leases that may have work;
2. ``fetch``: one query for all of them (fresh and due messages, per partition);
3. ``mark_delivered``: one transaction recording the deliveries *before* any handler
   runs, so a crash mid-batch redelivers after the visibility timeout, and counts the
   attempt (a message that kills its worker ends in the DLQ, not in a crash loop);
4. handlers run one by one, outside any transaction, in offset order per partition;
5. outcomes: dead letters (each moved atomically), nacks, then acks -- the happy path
   moves the watermark and deletes the rows in one transaction per partition.

Polling adapts: immediately again after a full batch, ``POLL_INTERVAL`` after a partial
one, and, while idle, an interval doubling up to ``POLL_INTERVAL_MAX``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from django.db import connections

from .backoff import retry_delay
from .conf import QueueSettings, get_settings
from .consumers import ConsumerSpec, ReceivedMessage
from .exceptions import Reject, Retry
from .leasing import LeaseKeeper
from .retry import with_retries
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


@dataclass
class _Outcomes:
    acks: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    nacks: list[tuple[str, int, float]] = field(default_factory=list)
    dead: list[tuple[FetchedMessage, int, str]] = field(default_factory=list)
    unprocessed: list[tuple[str, int]] = field(default_factory=list)


def tidy_connections() -> None:
    """Close connections that broke or outlived ``CONN_MAX_AGE``; keep healthy ones.

    Django's ``close_old_connections()`` closes a connection whose ``CONN_MAX_AGE`` is 0
    (the default: "one connection per request") every time it is called, which would
    make a worker reconnect on every poll. A worker is not a request: it keeps its
    connection unless it broke, or unless a positive ``CONN_MAX_AGE`` has passed.
    """
    for connection in connections.all(initialized_only=True):
        if connection.connection is None or connection.in_atomic_block:
            continue
        if connection.errors_occurred:
            if connection.is_usable():
                connection.errors_occurred = False
            else:
                connection.close()
        elif connection.settings_dict.get("CONN_MAX_AGE") and connection.close_at is not None:
            if time.monotonic() >= connection.close_at:
                connection.close()


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
    ) -> None:
        if not specs:
            raise ValueError("a worker needs at least one consumer")
        self.conf = conf or get_settings()
        self.name = name
        self.store = QueueStore(using or self.conf.DATABASE)
        self.subscriptions = [Subscription.create(spec, name, self.conf) for spec in specs]
        self.keeper = LeaseKeeper(self.subscriptions, self.store, self.conf)
        self.stop_event = threading.Event()
        self.stats = Stats()
        self._rng = random.Random()

    # -- lifecycle -----------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to finish the message in hand and shut down gracefully."""
        self.stop_event.set()

    def run(self) -> None:
        """Poll until stopped; then hand back unprocessed messages, leases and heartbeats."""
        logger.info(
            "worker starting subscriber=%s consumers=%s",
            self.name,
            ", ".join(s.spec.name for s in self.subscriptions),
        )
        self.keeper.start()
        for sub in self.subscriptions:
            sub.ready.wait(timeout=self.conf.LEASE_DURATION)
        try:
            self._loop()
        finally:
            self.keeper.stop()
            self.keeper.release_all()
            connections.close_all()
            logger.info(
                "worker stopped subscriber=%s delivered=%d acked=%d nacked=%d dead_lettered=%d",
                self.name,
                self.stats.delivered,
                self.stats.acked,
                self.stats.nacked,
                self.stats.dead_lettered,
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
                except Exception:
                    logger.exception("poll failed group=%s topic=%s", sub.group, sub.topic)
                    connections[self.store.using].close()
                    count, was_full = 0, False
                delivered = delivered or count > 0
                full = full or was_full
            if full:
                interval = conf.POLL_INTERVAL
                continue
            if delivered:
                # Busy: keep a POLL_INTERVAL cadence, counting the time the poll took.
                interval = conf.POLL_INTERVAL
                self.stop_event.wait(max(0.0, interval - (time.monotonic() - started)))
                continue
            interval = min(conf.POLL_INTERVAL_MAX, max(interval, conf.POLL_INTERVAL / 2) * 2)
            self.stop_event.wait(interval)

    def _db(self, what: str, fn: Any) -> Any:
        return with_retries(fn, using=self.store.using, what=what)

    # -- one poll ------------------------------------------------------------------------

    def poll(self, sub: Subscription) -> tuple[int, bool]:
        """Deliver one batch per partition with work; return (messages handled, any batch full)."""
        store, group, topic = self.store, sub.group, sub.topic
        if not sub.held:
            return 0, False
        states = self._db("poll state", lambda: store.poll_state(group, topic, sub.name, self.conf.LEASE_DURATION))
        states = [s for s in states if s.partition_key in sub.held]
        missing = [s.partition_key for s in states if not s.has_offsets_row]
        if missing:
            self._db("create watermarks", lambda: store.ensure_offsets(group, topic, missing))
            return 0, True  # poll again with the watermarks in place
        by_key: dict[str, PartitionState] = {s.partition_key: s for s in states}
        plans: list[FetchPlan] = []
        for state in states:
            if state.advanceable:
                key, wm = state.partition_key, state.watermark
                new = self._db(
                    "advance watermark", lambda key=key, wm=wm: store.advance_watermark(group, topic, key, wm)
                )
                state = by_key[key] = _with_watermark(state, new)
            fresh_after = max(state.watermark, state.delivered_max or 0)
            fresh = state.head > fresh_after
            due = state.next_due is not None and state.next_due <= state.now
            if sub.strict and state.in_flight:
                continue  # strict serialization: wait for the message in flight
            if fresh or due:
                plans.append(FetchPlan(state.partition_key, fresh_after if fresh else None, due))
        if not plans:
            return 0, False
        limit = sub.options.batch_size
        fetched = self._db("fetch", lambda: store.fetch(group, topic, plans, limit))
        batches, parked, full = self._select(sub, fetched, by_key)
        if not batches and not parked:
            return 0, False

        fresh = [m for batch in batches.values() for m in batch if m.retry_count is None]
        again = [m for batch in batches.values() for m in batch if m.retry_count is not None]
        self._db(
            "mark delivered",
            lambda: store.mark_delivered(group, topic, fresh, again, parked, sub.options.visibility_timeout),
        )
        outcomes = _Outcomes()
        handled = 0
        for key in sorted(batches):
            for message in batches[key]:
                if self.stop_event.is_set() or key not in sub.held:
                    outcomes.unprocessed.append((key, message.offset))
                    continue
                self._handle(sub, message, outcomes)
                handled += 1
        self._complete(sub, outcomes, by_key)
        # Parking delayed messages is progress too: poll again at once, or ready messages
        # behind many delayed ones would wait through idle backoff.
        return handled, full or bool(parked)

    def _select(
        self, sub: Subscription, fetched: list[FetchedMessage], states: dict[str, PartitionState]
    ) -> tuple[dict[str, list[FetchedMessage]], list[FetchedMessage], bool]:
        """Choose each partition's batch: the lowest deliverable offsets, up to batch_size.

        Fresh messages whose ``deliver_at`` lies ahead are parked, not delivered; messages
        delivered ``max_attempts`` times already go to the DLQ without another attempt.
        """
        by_key: dict[str, list[FetchedMessage]] = defaultdict(list)
        for m in fetched:
            by_key[m.partition_key].append(m)
        limit, max_attempts = sub.options.batch_size, sub.options.max_attempts
        batches: dict[str, list[FetchedMessage]] = {}
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

    def _handle(self, sub: Subscription, m: FetchedMessage, outcomes: _Outcomes) -> None:
        attempt = _attempt(m)
        received = ReceivedMessage(
            topic=sub.topic,
            partition_key=m.partition_key,
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
        self.stats.delivered += 1
        try:
            sub.spec.handler(received)
        except Reject as exc:
            outcomes.dead.append((m, attempt, describe_error(exc)))
        except Exception as exc:  # noqa: BLE001 - any handler error is a nack
            if attempt >= sub.options.max_attempts:
                outcomes.dead.append((m, attempt, describe_error(exc)))
            else:
                if isinstance(exc, Retry) and exc.delay is not None:
                    delay = exc.delay
                else:
                    delay = retry_delay(attempt, self.conf.BACKOFF_MIN, self.conf.BACKOFF_MAX, self._rng)
                logger.info(
                    "handler failed, retrying in %.1fs group=%s topic=%s key=%s offset=%d attempt=%d error=%r",
                    delay,
                    sub.group,
                    sub.topic,
                    m.partition_key,
                    m.offset,
                    attempt,
                    exc,
                )
                outcomes.nacks.append((m.partition_key, m.offset, delay))
        else:
            outcomes.acks[m.partition_key].append(m.offset)
            return
        # A handler that failed may have broken the connection: not the next query's problem.
        tidy_connections()

    def _complete(self, sub: Subscription, outcomes: _Outcomes, states: dict[str, PartitionState]) -> None:
        store, group, topic = self.store, sub.group, sub.topic
        for message, attempt, error in outcomes.dead:
            self._dead_letter(sub, message, attempt, error)
        if outcomes.nacks:
            self._db("nack", lambda: store.nack(group, topic, outcomes.nacks))
            self.stats.nacked += len(outcomes.nacks)
        dead = defaultdict(set)
        for message, _, _ in outcomes.dead:
            dead[message.partition_key].add(message.offset)
        contiguous: list[tuple[str, int, int]] = []
        plain: list[tuple[str, int]] = []
        for key, offsets in outcomes.acks.items():
            done = sorted({*offsets, *dead.get(key, ())})
            wm = states[key].watermark
            if done == list(range(wm + 1, wm + len(done) + 1)):
                contiguous.append((key, wm, wm + len(done)))
            else:
                plain += [(key, off) for off in offsets]
        if contiguous:
            failed = set(self._db("ack and advance", lambda: store.ack_contiguous(group, topic, contiguous)))
            plain += [(key, off) for key in failed for off in outcomes.acks[key]]
        if plain:
            self._db("ack", lambda: store.ack(group, topic, plain))
        self.stats.acked += sum(len(v) for v in outcomes.acks.values())
        if outcomes.unprocessed:
            self._db("release deliveries", lambda: store.release_deliveries(group, topic, outcomes.unprocessed))

    def _dead_letter(self, sub: Subscription, m: FetchedMessage, attempts: int, error: str) -> None:
        dlq_topic = f"{sub.topic}{self.conf.DLQ_SUFFIX}"
        self._db(
            "dead letter",
            lambda: self.store.dead_letter(
                sub.group, sub.topic, m, dlq_topic=dlq_topic, attempts=attempts, error=error
            ),
        )
        self.stats.dead_lettered += 1
        logger.warning(
            "dead-lettered group=%s topic=%s key=%s offset=%d attempts=%d to=%s error=%s",
            sub.group,
            sub.topic,
            m.partition_key,
            m.offset,
            attempts,
            dlq_topic,
            error.splitlines()[0],
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
