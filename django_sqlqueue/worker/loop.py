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
With ``concurrency`` 1 and a handler timeout (the default: each consumer's visibility
timeout) the batches run on one handler thread while the poll loop waits. Either way the
poll loop is the watchdog of handler timeouts (``watchdog.py``): a handler that stops
making progress gives its partition up instead of stalling it.

Polling adapts (``cadence.py``): at once again after a poll that delivered something, then,
while polls come back empty, waits that start at ``POLL_INTERVAL / 8`` and double up to
``POLL_INTERVAL_MAX``. A wait ends early when a batch finishes on a handler thread, or, on
PostgreSQL, when a notification says a consumed topic got a message (``notifications.py``).

This module holds the worker's lifecycle, its cadence and the poll's planning; a batch's
handlers and outcomes are ``batch.py``, the side threads ``leasing.py`` (leases) and
``scheduler.py`` (recurring schedules), supervised here (``service.py``); garbage
collection runs between polls (``collector.py``).

At start it registers its topics -- waiting out a database it cannot reach, or that
refuses another connection, like any outage -- and compares the server's room for more
connections with its budget (``budget.py``), warning once if they do not fit.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from contextlib import nullcontext
from functools import partial

from django.db import connections

from .. import signals
from ..conf import QueueSettings, get_settings
from ..consumers import ConsumerSpec
from ..db.conn import close_quietly, tidy_connections
from ..db.retry import Retrying
from ..db.sequencer import Sequencer
from ..db.session import engine_connections
from ..db.store import QueueStore
from ..exceptions import ConfigurationError, HandlersStuck, WorkerCrashed
from ..instruments import NO_INSTRUMENTS, Instruments
from ..rules.notify_channels import channel_for
from ..schedules import Schedule
from .batch.handlers import HandlerRunner
from .batch.runner import BatchRunner, Stats
from .budget import ConnectionBudget, connection_budget, room_warning
from .cadence import Cadence
from .healthfile import HealthFile
from .outage import OutageReporter, is_unreachable
from .poller import Poller
from .probe import Probe
from .subscription import Subscription
from .threads.collector import GarbageCollector
from .threads.executor import DeadThread, PartitionExecutor
from .threads.leasing import LeaseKeeper
from .threads.listener import Listener
from .threads.listener import supported as notifications_supported
from .threads.scheduler import Scheduler
from .threads.service import ServiceThread
from .threads.watchdog import Watchdog

logger = logging.getLogger(__name__)

__all__ = ["Stats", "Worker"]


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
        health_file: str | None = None,
        instruments: Instruments | None = None,
    ) -> None:
        """``concurrency``: handler threads running batches of different partitions in parallel
        (1: handlers run on the poll loop's thread, one at a time). ``schedules``: recurring
        tasks and messages this worker helps fire (django_sqlqueue.worker.threads.scheduler). ``health_file``: a
        file touched after healthy poll-loop rounds (django_sqlqueue.worker.healthfile).
        ``instruments``: monitoring hooks for polls, batches, sequencer runs and leases
        (django_sqlqueue.instruments; ``runconsumer --metrics-port`` passes its metrics)."""
        if not specs:
            raise ValueError("a worker needs at least one consumer")
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise ConfigurationError(f"concurrency must be a positive integer, got {concurrency!r}.")
        self.concurrency = concurrency
        self.executor: PartitionExecutor | None = None
        self.watchdog: Watchdog | None = None
        self.conf = conf or get_settings()
        self.name = name
        self.instruments = instruments or NO_INSTRUMENTS
        self.store = QueueStore(using or self.conf.DATABASE)
        self.sequencer = Sequencer(self.store.using)
        self.subscriptions = [Subscription.create(spec, name, self.conf) for spec in specs]
        self.probe = Probe(self.store, [sub.topic for sub in self.subscriptions])
        self.stop_event = threading.Event()
        #: What the poll loop sleeps on between rounds: set by a stop, a batch finishing
        #: on a handler thread and a notification of new messages.
        self.wakeup = threading.Event()
        self.cadence = Cadence(self.conf.POLL_INTERVAL, self.conf.POLL_INTERVAL_MAX)
        self.db = Retrying(self.store.using, self.stop_event)
        # One outage reporter for the poll loop and the side threads (django_sqlqueue.worker.outage).
        self.outage = OutageReporter(alias=self.store.using, report_interval=self.conf.OUTAGE_REPORT_INTERVAL)
        self.keeper = LeaseKeeper(
            self.subscriptions, self.store, self.conf, outage=self.outage, instruments=self.instruments
        )
        # Calls sync and async handlers; owns this worker's event loop (django_sqlqueue.worker.batch.handlers).
        self.invoke = HandlerRunner()
        self.scheduler = Scheduler(schedules, using=self.store.using, outage=self.outage) if schedules else None
        # PostgreSQL: a connection that LISTENs for new messages of the consumed topics and
        # cuts the poll loop's wait short (notifications.py); polling stays the safety net.
        self.listener = (
            Listener(
                sorted({sub.topic for sub in self.subscriptions}),
                using=self.store.using,
                outage=self.outage,
                wake=self.wakeup.set,
                on_connected=self._listening,
                wanted=self._leases,
                name=name,
                reconnect_interval=self.conf.POLL_INTERVAL_MAX,
            )
            if self.conf.NOTIFY and notifications_supported(self.store.using)
            else None
        )
        self.stats = Stats()
        self.batches = BatchRunner(self.store, self.conf, stats=self.stats, stop_event=self.stop_event, db=self.db)
        self.poller = Poller(
            self.store,
            self.sequencer,
            self.conf,
            db=self.db,
            batches=self.batches,
            invoke=self.invoke,
            outage=self.outage,
            instruments=self.instruments,
        )
        self.collector = GarbageCollector(self.subscriptions, self.store, self.conf, db=self.db, outage=self.outage)
        #: The side thread or handler thread whose death stopped the worker (None: none died).
        self.crashed: ServiceThread | DeadThread | None = None
        self.health_file = HealthFile(health_file)

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def services(self) -> list[ServiceThread]:
        """The side threads this worker runs and supervises."""
        return (
            [self.keeper]
            + ([self.scheduler] if self.scheduler is not None else [])
            + ([self.listener] if self.listener is not None else [])
        )

    def stop(self) -> None:
        """Ask the worker to finish the message(s) in hand and shut down gracefully."""
        self.stop_event.set()
        self.wakeup.set()  # wake the poll loop

    def run(self) -> None:
        """Poll until stopped; then hand back unprocessed messages, leases and heartbeats.

        Raises :class:`~django_sqlqueue.exceptions.WorkerCrashed` (after the hand-back) when
        a side thread or a handler thread died, and re-raises the ``SystemExit`` or
        ``KeyboardInterrupt`` a handler raised (``batch.py``), after the same hand-back.
        """
        logger.info(
            "worker starting subscriber=%s consumers=%s concurrency=%d",
            self.name,
            ", ".join(s.spec.name for s in self.subscriptions),
            self.concurrency,
        )
        if not self._register_topics_when_reachable():
            logger.info("worker stopped before it started subscriber=%s", self.name)
            connections.close_all()
            return
        self.check_connection_room()
        self.keeper.start(on_death=self._service_died)
        for sub in self.subscriptions:
            sub.ready.wait(timeout=self.conf.LEASE_DURATION)
        if self.uses_handler_threads:
            self.executor = self.poller.executor = PartitionExecutor(
                self.concurrency, on_death=self._service_died, finished=self.wakeup
            )
            self.watchdog = self.poller.watchdog = Watchdog(
                self.executor,
                self.store,
                self.batches,
                db=self.db,
                on_stuck=self._service_died,
                instruments=self.instruments,
            )
        if self.scheduler is not None:
            self.scheduler.start(on_death=self._service_died)
        if self.listener is not None:
            self.listener.start(on_death=self._service_died)
        signals.send(signals.worker_started, Worker, worker=self, name=self.name)
        try:
            self._loop()
        finally:
            signals.send(signals.worker_stopping, Worker, worker=self, name=self.name)
            if self.executor is not None and self.watchdog is not None:
                # Drain: the batches in hand finish their current message, hand the rest
                # back and write their outcomes before the leases are released; a handler
                # that overruns its timeout meanwhile is given up, not waited for.
                self.executor.finished.set()
                self.watchdog.drain()
            for service in reversed(self.services):
                service.stop()
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
        interrupted = self.batches.interrupted
        if interrupted is not None:
            logger.error(
                "worker exiting subscriber=%s: a handler raised %s; leases released, in-flight messages handed back",
                self.name,
                type(interrupted).__name__,
            )
            raise interrupted
        if self.crashed is not None:
            error = self.crashed.error
            if isinstance(error, HandlersStuck):
                logger.error("worker exiting subscriber=%s: %s; leases released", self.name, error)
                raise error
            logger.error(
                "worker exiting subscriber=%s: its %s thread died (%s: %s); leases released, in-flight messages "
                "handed back",
                self.name,
                self.crashed.title,
                type(error).__name__,
                error,
            )
            raise WorkerCrashed(
                f"worker {self.name}: its {self.crashed.title} thread died ({type(error).__name__}: {error}); "
                "the worker stopped so that it can be restarted."
            )

    def _service_died(self, service: ServiceThread | DeadThread) -> None:
        """Called on a side thread that ends unasked, or a handler thread that dies: stop
        the worker (it exits non-zero)."""
        if self.crashed is None:
            self.crashed = service
        self.stop()

    def _leases(self, channel: str, partition: int) -> bool:
        """Whether this worker leases ``partition`` of the topic of ``channel`` (the listener
        wakes the poll loop for those only; called on the listener's thread)."""
        return any(channel_for(sub.topic) == channel and partition in sub.held for sub in self.subscriptions)

    def _listening(self, connected: bool) -> None:
        """The listener started (True) or stopped (False) listening: while it listens, new
        messages announce themselves and the cadence skips its short looks."""
        self.cadence.pushed = connected

    def _supervise(self) -> None:
        """Notice a side thread that ended without reporting it (the poll loop checks each round)."""
        for service in self.services:
            if service.died:
                self._service_died(service)

    @property
    def uses_handler_threads(self) -> bool:
        """Whether batches run on handler threads: with ``--concurrency`` > 1, or when a
        handler has a timeout (the poll loop must stay free to watch it)."""
        return self.concurrency > 1 or any(
            sub.options.timeout is not None or sub.spec.timeout_for is not None for sub in self.subscriptions
        )

    def connections_needed(self) -> ConnectionBudget:
        """The connections this worker holds on the queue's alias (``budget.py``)."""
        return connection_budget(
            concurrency=self.concurrency,
            handler_threads=self.uses_handler_threads,
            scheduler=self.scheduler is not None,
            async_handlers=any(_is_async(sub.spec.handler) for sub in self.subscriptions),
            listener=self.listener is not None,
        )

    def check_connection_room(self) -> None:
        """Warn once if the server has less room for connections than this worker needs.

        Runs on the poll loop's connection, before the side threads open theirs. A server
        that will not say (no privilege, SQLite) is not an error: logged at DEBUG.
        """
        budget = self.connections_needed()
        try:
            limits = self.store.connection_limits()
        except Exception:  # a courtesy check: the worker goes on without it
            logger.debug("could not read the server's connection limits", exc_info=True)
            close_quietly(self.store.using)
            return
        if not limits:
            logger.debug("no connection limit to check (%s) alias=%s", self.store.connection.vendor, self.store.using)
            return
        warning = room_warning(limits, needed=budget.total)
        if warning is not None:
            logger.warning("%s; connections of this worker: %s subscriber=%s", warning, budget.describe(), self.name)
        else:
            logger.debug("connection limits %s leave room for this worker's %s", limits, budget.describe())

    def _register_topics_when_reachable(self) -> bool:
        """Register the topics, waiting out an unreachable database; False if stopped first.

        A worker started while the server is down, or while it refuses more connections
        (MySQL 1040, PostgreSQL 53300), reports an outage (a few lines, no traceback) and
        starts once it gets in, instead of exiting with a traceback for its process
        manager to restart.
        """
        while not self.stop_event.is_set():
            try:
                self.register_topics()
            except Exception as exc:
                if not is_unreachable(exc):
                    raise
                self.outage.unreachable(exc)
                close_quietly(self.store.using)
                self.stop_event.wait(self.conf.POLL_INTERVAL_MAX)
            else:
                self.outage.reachable()
                return True
        return False

    def register_topics(self) -> None:
        """Register the consumed topics with their partition counts; refuse a mismatch.

        Publishers hash keys with the count in their settings: a worker whose settings
        disagree with the registered count would consume a topic that publishers
        partition differently. Changing the count is an explicit operation
        (``manage.py queue_topic repartition``).
        """
        for topic in sorted({sub.topic for sub in self.subscriptions}):
            wanted = self.conf.partitions_for(topic)
            registered = self.db("register topic", partial(self.store.register_topic, topic, wanted))
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
        # A worker frozen inside one of the loop's transactions must not hold its locks
        # (lease fence, sequencer heads) past the moment its leases may be stolen. Not when
        # handlers run on this thread (``--concurrency 1`` and no handler timeout): their
        # own transactions may idle.
        frozen_guard = (
            engine_connections(self.store.using, conf.LEASE_DURATION - conf.LEASE_RENEW_INTERVAL)
            if self.uses_handler_threads
            else nullcontext()
        )
        with frozen_guard:
            self._rounds()

    def _rounds(self) -> None:
        conf = self.conf
        woken = True
        while not self.stop_event.is_set():
            self._supervise()
            if self.watchdog is not None:
                self.watchdog.check()
            tidy_connections()
            # This round looks at everything: what woke the loop until now is seen by it;
            # what sets the event from here on (a batch finishing, a notification that
            # arrives after its topic was polled) cuts the next wait short.
            if not self.stop_event.is_set():
                self.wakeup.clear()
            # A full poll of every subscription, or, right after work ran out, a look: the
            # probe (one cheap statement) and a poll of only the topics it saw change. While
            # work is recent, full rounds take a probe too, as the next look's baseline.
            full_round = self.cadence.full_poll_due(woken=woken)
            if self.cadence.hot:
                changed = self.probe.changed()
            else:
                changed = None
                self.probe.forget()
            full = delivered = False
            for sub in self.subscriptions:
                if self.stop_event.is_set():
                    break
                if not full_round and changed is not None and sub.topic not in changed:
                    continue
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
            self.collector.run_if_due()
            self.health_file.beat(healthy=not self.outage.in_outage and self.crashed is None)
            executor = self.executor
            if executor is not None and executor.free == 0:
                # Every handler thread has a batch: poll again when one finishes (or a
                # handler's timeout is due: the watchdog runs at the top of the loop).
                woken = self._pause(conf.POLL_INTERVAL_MAX)
                continue
            wait = self.cadence.after_round(delivered=delivered, more=full)
            woken = self._pause(wait) if wait > 0 else False

    def _pause(self, seconds: float) -> bool:
        """Sleep between polls until ``seconds`` pass or :attr:`wakeup` is set (a stop, a
        batch finishing on a handler thread -- its partition may have more work, and it is
        fetchable again -- or a notification of new messages); with handler threads, watch
        the running handlers' timeouts meanwhile. True if woken before the time was up."""
        if self.stop_event.is_set():
            return True
        watchdog = self.watchdog
        end = time.monotonic() + seconds
        while (remaining := end - time.monotonic()) > 0:
            due = None if watchdog is None else watchdog.next_check()
            if self.wakeup.wait(remaining if due is None else min(remaining, due)):
                if not self.stop_event.is_set():
                    self.wakeup.clear()
                return True
            if watchdog is not None:
                watchdog.check()
        return False

    def poll(self, sub: Subscription) -> tuple[int, bool]:
        """Deliver one batch per partition with work; return (messages handled, any batch full)."""
        return self.poller.poll(sub)


def _is_async(handler: object) -> bool:
    """Whether ``handler`` is ``async def`` (a function or an object whose ``__call__`` is)."""
    call = type(handler).__call__ if not inspect.isroutine(handler) else None
    return inspect.iscoroutinefunction(handler) or (call is not None and inspect.iscoroutinefunction(call))
