"""Running the registered consumers in a test: :func:`drain` and :func:`process`.

:func:`drain` is a worker run in-process, synchronously, on the calling thread and its
database connection, until nothing is left to deliver. It is the engine's own path --
the :class:`~django_sqlqueue.worker.Worker`'s topic registration, the lease keeper's
round (taken synchronously, no thread), the :class:`~django_sqlqueue.worker.poller.Poller`
(sequencer, poll state, fetch, ``mark_delivered``) and the
:class:`~django_sqlqueue.worker.batch.runner.BatchRunner` (handlers, acks, nacks, dead letters) --
with two differences:

- **retry delays are collapsed**: a failed attempt is nacked with a delay of 0 (instead
  of the backoff's, or a ``Retry(delay=...)``'s), so the retry is due at once on the
  database's own clock -- nothing mocks the clock or the database;
- handlers run on the calling thread: there is no handler thread, hence no watchdog and
  no handler timeout.

It works inside a test transaction (Django's ``TestCase``, pytest-django's ``db``
fixture): every statement runs on the test's connection, the engine's short
transactions become savepoints of it, and what the handlers write is rolled back with
the test. It works just as well with ``transactional_db`` / ``TransactionTestCase``,
where everything commits. Two things need committed data and therefore
``transactional_db``: a handler that calls ``message.extend_visibility()`` of an
*atomic* consumer (it writes on a connection of its own, which would wait for the test's
locks), an ``async def`` handler that uses the ORM (its queries run on asgiref's executor
thread, another connection, which cannot see the test's uncommitted rows), and another
process (a ``runconsumer``) consuming the messages the test published.

Messages published with a ``delay`` or ``deliver_at`` in the future are not due: they
are left for later. A handler that publishes drives the drain on: its messages are
delivered in the same call. A group paused by an operator is not drained; a group whose
partitions a live ``runconsumer`` holds is refused (``TestingError``).
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Any

from django.db import connections
from django.utils import timezone

from ..conf import QueueSettings, get_settings
from ..consumers import ConsumerSpec, ReceivedMessage, known_consumers
from ..db.store import FetchedMessage
from ..exceptions import TestingError
from ..worker.batch.handlers import HandlerRunner
from ..worker.batch.outcomes import BatchHooks, Outcomes
from ..worker.batch.runner import BatchRunner
from ..worker.loop import Worker
from ..worker.subscription import Subscription

_drains = itertools.count(1)

#: Rounds in a row without a delivery before ``drain`` ends (the second looks again
#: after a lease round, which discovers partitions of new keys).
_IDLE_ROUNDS = 2


@dataclass
class ConsumerSummary:
    """What one consumer did in a :func:`drain`."""

    #: Messages whose handler returned (acked).
    handled: int = 0
    #: Failed attempts that will be retried (nacked).
    retried: int = 0
    #: Messages moved to the dead-letter topic.
    dead_lettered: int = 0

    @property
    def attempts(self) -> int:
        """Handler calls (and dead letters decided without one)."""
        return self.handled + self.retried + self.dead_lettered


@dataclass
class DrainSummary:
    """What a :func:`drain` did, in total and per consumer (``"group:topic"``)."""

    consumers: dict[str, ConsumerSummary] = field(default_factory=dict)
    #: Polling rounds run (one poll of every consumer each).
    rounds: int = 0
    #: Seconds the drain took.
    duration: float = 0.0
    #: True when ``max_messages`` stopped the drain before the queue was empty.
    stopped_early: bool = False

    @property
    def handled(self) -> int:
        """Messages whose handler returned, over every consumer."""
        return sum(c.handled for c in self.consumers.values())

    @property
    def retried(self) -> int:
        """Failed attempts retried, over every consumer."""
        return sum(c.retried for c in self.consumers.values())

    @property
    def dead_lettered(self) -> int:
        """Messages dead-lettered, over every consumer."""
        return sum(c.dead_lettered for c in self.consumers.values())

    def __getitem__(self, consumer: str) -> ConsumerSummary:
        """The summary of consumer ``"group:topic"`` (an empty one if it saw nothing)."""
        return self.consumers.get(consumer, ConsumerSummary())

    def __str__(self) -> str:
        lines = [
            (
                f"drained in {self.rounds} round(s), {self.duration:.3f}s: handled={self.handled} "
                f"retried={self.retried} dead_lettered={self.dead_lettered}"
            )
        ]
        for name, c in sorted(self.consumers.items()):
            lines.append(f"  {name}: handled={c.handled} retried={c.retried} dead_lettered={c.dead_lettered}")
        return "\n".join(lines)


class DrainHooks(BatchHooks):
    """What :func:`drain` watches in the worker's batch runner (``BatchRunner(..., hooks=...)``):
    retry delays collapsed to 0, outcomes counted per consumer into ``summary``, and the
    worker stopped once ``max_messages`` messages went through (None: no limit)."""

    def __init__(self, summary: DrainSummary, max_messages: int | None) -> None:
        self.summary = summary
        self.budget = max_messages

    def _of(self, sub: Subscription) -> ConsumerSummary:
        return self.summary.consumers.setdefault(sub.spec.name, ConsumerSummary())

    def on_handled(self, sub: Subscription, message: FetchedMessage) -> bool:
        if self.budget is None:
            return False
        self.budget -= 1
        # Stop once spent: the rest of the batch is handed back (attempt not counted), as on a stop.
        return self.budget <= 0

    def on_outcomes(self, sub: Subscription, outcomes: Outcomes) -> None:
        # Delays collapsed: every retry is due at once (on the database's clock).
        outcomes.nacks = [(partition, offset, 0.0) for partition, offset, _ in outcomes.nacks]
        counts = self._of(sub)
        counts.retried += len(outcomes.nacks)
        counts.handled += sum(len(offsets) for offsets in outcomes.acks.values()) + outcomes.committed

    def on_dead_letter(self, sub: Subscription, message: FetchedMessage, attempts: int, error: str) -> None:
        self._of(sub).dead_lettered += 1


def select_consumers(topic: str | None = None, group: str | None = None) -> list[ConsumerSpec]:
    """The registered consumers (``@consumer`` handlers and task queues) of ``topic`` and
    ``group`` (None: any); ``TestingError`` when none matches."""
    specs = [
        s for s in known_consumers() if (topic is None or s.topic == topic) and (group is None or s.group == group)
    ]
    if not specs:
        known = ", ".join(s.name for s in known_consumers()) or "none"
        wanted = " and ".join(
            part for part in (f"topic {topic!r}" if topic else "", f"group {group!r}" if group else "") if part
        )
        raise TestingError(f"no registered consumer of {wanted or 'any topic'} (registered: {known}).")
    return specs


def drain(
    topic: str | None = None,
    *,
    group: str | None = None,
    max_messages: int | None = None,
    using: str | None = None,
    conf: QueueSettings | None = None,
) -> DrainSummary:
    """Run the registered consumers until nothing is left to deliver; return what they did.

    ``topic``/``group`` choose the consumers (default: all, task queues included).
    ``max_messages`` stops after that many deliveries (the rest of a batch is handed
    back, not counted as an attempt). Each consumer is drained in the database that holds
    its topic (``SQLQUEUE["TOPIC_DATABASES"]``, else ``SQLQUEUE["DATABASE"]``), or every
    one in ``using`` if given. See the module docstring for what differs from a worker:
    retry delays collapse to 0, handlers run on this thread without timeouts.

    Raise :class:`~django_sqlqueue.exceptions.TestingError` when no consumer matches or
    the connection is broken (a database error inside the test's transaction).
    """
    return drain_consumers(select_consumers(topic, group), max_messages=max_messages, using=using, conf=conf)


def drain_consumers(
    specs: list[ConsumerSpec],
    *,
    max_messages: int | None = None,
    using: str | None = None,
    conf: QueueSettings | None = None,
) -> DrainSummary:
    """:func:`drain` for the consumers ``specs`` (e.g. the task queues' specs)."""
    if max_messages is not None and (not isinstance(max_messages, int) or max_messages < 0):
        raise TestingError(f"max_messages must be a non-negative integer or None, got {max_messages!r}.")
    conf = conf or get_settings()
    # Each consumer is drained in the database that holds its topic (SQLQUEUE["TOPIC_DATABASES"]),
    # as runconsumer serves it; or every one in ``using``.
    by_alias: dict[str, list[ConsumerSpec]] = {}
    for spec in specs:
        by_alias.setdefault(using or conf.database_for(spec.topic), []).append(spec)
    for alias in by_alias:
        _check_connection(alias)
    started = time.perf_counter()
    summary = DrainSummary()
    hooks = DrainHooks(summary, max_messages)
    # A handler may publish to a topic of another database: the databases are drained in
    # turn until a pass over all of them delivers nothing (one pass with one database).
    while True:
        before = summary.handled + summary.retried + summary.dead_lettered
        for alias, alias_specs in by_alias.items():
            _drain_database(alias_specs, alias, conf, hooks, summary)
            if summary.stopped_early:
                break
        after = summary.handled + summary.retried + summary.dead_lettered
        if summary.stopped_early or len(by_alias) == 1 or after == before:
            break
    if max_messages != 0:  # (0: the workers were built, their checks run, nothing polled)
        summary.duration = time.perf_counter() - started
    return summary


def _check_connection(alias: str) -> None:
    """Refuse a broken transaction on ``alias``; connect to it."""
    connection = connections[alias]
    if connection.in_atomic_block and connection.needs_rollback:
        raise TestingError(
            f"drain(): the transaction on database {alias!r} is broken (an earlier query failed inside it); "
            "it can only be rolled back."
        )
    # Connect before anything else: in a test that may not use the database (pytest-django
    # without the django_db mark blocks ensure_connection) the refusal is raised here, alone,
    # rather than by the first query followed by a failing lease release per consumer.
    connection.ensure_connection()


def _drain_database(
    specs: list[ConsumerSpec], alias: str, conf: QueueSettings, hooks: DrainHooks, summary: DrainSummary
) -> None:
    """Drain the consumers ``specs`` of database ``alias`` until nothing is left, counting into ``summary``."""
    # The worker's seam (worker/loop.py): its batch runner with the drain's hooks, and
    # every batch on this thread (inline: no handler threads, no watchdog, no listener).
    # Its keeper's rounds run here too (_lease_round); its threads are never started.
    worker = Worker(
        specs,
        name=f"drain-{os.getpid()}-{next(_drains)}",
        conf=conf,
        using=alias,
        batches=functools.partial(BatchRunner, hooks=hooks),
        inline=True,
    )
    try:
        if hooks.budget is not None and hooks.budget <= 0:  # max_messages=0, or spent
            return
        worker.register_topics()
        _lease_round(worker, first=True)
        idle = 0
        while idle < _IDLE_ROUNDS and not worker.stop_event.is_set():
            summary.rounds += 1
            busy = False
            for sub in worker.subscriptions:
                count, more = worker.poll(sub)
                busy = busy or count > 0 or more
                if worker.stop_event.is_set():
                    break
            if busy:
                idle = 0
                continue
            idle += 1
            if idle < _IDLE_ROUNDS:
                _lease_round(worker)  # partitions of new keys, renewed leases
        summary.stopped_early = worker.stop_event.is_set()
    finally:
        worker.keeper.release_all()
        worker.invoke.close()
    if worker.batches.interrupted is not None:
        raise worker.batches.interrupted


def _lease_round(worker: Worker, *, first: bool = False) -> None:
    """The lease keeper's round for every consumer, on this thread: with no other live
    subscriber of the group, every partition. Errors propagate (a test wants them).

    ``first``: refuse to drain a group whose partitions another live subscriber holds (a
    ``runconsumer`` on the same database): the drain could not empty the queue, and the two
    would share its messages. A paused group holds nothing and is left alone.
    """
    for sub in worker.subscriptions:
        worker.keeper.rebalance(sub)
        sub.ready.set()
        if not first or sub.paused:
            continue
        total = worker.store.partition_count(sub.topic)
        if len(sub.held) < total:
            others = [
                name
                for name in worker.store.active_subscriber_names(sub.group, sub.topic, worker.conf.LEASE_DURATION)
                if name != sub.name
            ]
            raise TestingError(
                f"drain(): consumer {sub.spec.name} could lease only {len(sub.held)} of its {total} partitions: "
                f"other live subscribers of the group hold the rest ({', '.join(others) or 'leases not expired yet'}). "
                "Stop the runconsumer processes on this database (or let their leases expire) before draining."
            )


def process(
    message: Any,
    *,
    topic: str | None = None,
    group: str | None = None,
    attempt: int = 1,
) -> Any:
    """Run one consumer's handler on one message, directly, and return what it returns.

    ``message`` is a captured message (:class:`~django_sqlqueue.testing.CapturedMessage`),
    a :class:`~django_sqlqueue.ReceivedMessage`, or a payload (then ``topic`` is
    required). The consumer is the one registered for the topic (``group`` chooses among
    several). Nothing is read from or written to the queue tables: the handler's
    exceptions (``Retry``, ``Reject``, any other) propagate, and ``extend_visibility``
    raises. ``attempt`` is the attempt number the handler sees. An ``async def`` handler
    is awaited.
    """
    topic = topic or getattr(message, "topic", None)
    if topic is None:
        raise TestingError("process(): give topic= with a bare payload.")
    specs = select_consumers(topic, group)
    if len(specs) > 1:
        raise TestingError(
            f"process(): topic {topic!r} has {len(specs)} consumers ({', '.join(s.group for s in specs)}); "
            "choose one with group=."
        )
    (spec,) = specs
    if isinstance(message, ReceivedMessage):
        received = message
    else:
        received = _received(spec, message, attempt)
    runner = HandlerRunner()
    try:
        return runner(spec.handler, received)
    finally:
        runner.close()


def _received(spec: ConsumerSpec, message: Any, attempt: int) -> ReceivedMessage:
    now = timezone.now()
    has_payload = hasattr(message, "payload") and hasattr(message, "topic")
    return ReceivedMessage(
        topic=spec.topic,
        key=str(getattr(message, "key", "")) if has_payload else "",
        partition=int(getattr(message, "partition", 0)) if has_payload else 0,
        offset=0,
        id=str(getattr(message, "id", "")) if has_payload else "process",
        payload=message.payload if has_payload else message,
        metadata=dict(getattr(message, "metadata", {}) or {}) if has_payload else {},
        attempt=attempt,
        created_at=now,
        deliver_at=now,
        group=spec.group,
    )
