"""The worker: the poll loop that delivers messages to handlers.

One process runs one :class:`Worker` for any number of registered consumers. Per poll
and subscription it issues a handful of statements whatever the batch size (``poller.py``):
``poll_state`` (sequencing what is not numbered yet), ``fetch``, and ``mark_delivered``,
which records the deliveries *before* any handler runs -- a crash mid-batch redelivers
after the visibility timeout, and the attempt counts (a message that kills its worker ends
in the DLQ, not in a crash loop). Then the handlers run one by one, outside any
transaction, in offset order per partition, and the outcomes are written (``batch/``).

Where the batches run is decided once, when the worker is built (``dispatch.py``): on
the poll loop's thread, on one handler thread (a handler timeout, the default) or on N
(``--concurrency N``). With handler threads the poll loop is the watchdog of handler
timeouts (``threads/watchdog.py``): a handler that stops making progress gives its
partition up instead of stalling it.

Polling adapts (``cadence.py``): at once again after a poll that delivered something, then,
while polls come back empty, waits that start at ``POLL_INTERVAL / 8`` and double up to
``POLL_INTERVAL_MAX``. A wait ends early when a batch finishes on a handler thread, or, on
PostgreSQL, when a notification says a consumed topic got a message (``threads/listener.py``).

:class:`Worker`'s constructor builds and wires its parts (``poller.py``, ``dispatch.py``,
``batch/``, the side threads in ``threads/``); this module holds its lifecycle, cadence and
supervision. What runs once before the first poll is ``startup.py``.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import connections

from .. import signals
from ..conf import QueueSettings, get_settings
from ..consumers import ConsumerSpec
from ..db.conn import close_quietly, tidy_connections
from ..db.retry import Retrying
from ..db.sequencer import Sequencer
from ..db.session import engine_connections, handler_thread_connections
from ..db.store import QueueStore
from ..exceptions import ConfigurationError, HandlersStuck, WorkerCrashed
from ..instruments import NO_INSTRUMENTS, Instruments
from ..rules.notify_channels import channel_for
from ..schedules import Schedule
from . import dispatch, startup
from .bands import BandRound, in_poll_order
from .batch.handlers import HandlerRunner
from .batch.outcomes import Stats
from .batch.runner import BatchRunner
from .budget import ConnectionBudget, connection_budget
from .cadence import Cadence
from .healthfile import HealthFile
from .outage import OutageReporter
from .poller import Poller
from .probe import Probe
from .subscription import Subscription
from .threads.collector import GarbageCollector
from .threads.executor import DeadThread
from .threads.leasing import LeaseKeeper
from .threads.listener import Listener
from .threads.listener import supported as notifications_supported
from .threads.scheduler import Scheduler
from .threads.service import ServiceThread

logger = logging.getLogger(__name__)

__all__ = ["Stats", "Worker"]

#: What stopped a worker by dying: a side thread, or a handler thread.
Crash = ServiceThread | DeadThread


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
        batches: dispatch.BatchRunnerFactory = BatchRunner,
        inline: bool = False,
    ) -> None:
        """``concurrency``: handler threads running batches of different partitions in parallel.
        ``schedules``: recurring tasks and messages this worker helps fire (``threads/scheduler.py``).
        ``health_file``: a file touched after healthy rounds (``healthfile.py``). ``instruments``:
        monitoring hooks (django_sqlqueue.instruments; ``runconsumer --metrics-port``).

        The seam for callers that drive a worker themselves (``django_sqlqueue.testing``):
        ``batches`` builds the batch runner (default :class:`BatchRunner`); ``inline=True``
        runs every batch on the thread that polls, whatever the consumers' timeouts (no
        handler threads, no watchdog), and builds no listener -- for a caller that calls
        :meth:`poll` and the keeper's rounds itself instead of :meth:`run`. Every part is
        built and wired here; :meth:`run` only starts threads.
        """
        if not specs:
            raise ValueError("a worker needs at least one consumer")
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise ConfigurationError(f"concurrency must be a positive integer, got {concurrency!r}.")
        if inline and concurrency > 1:
            raise ConfigurationError(f"an inline worker runs one batch at a time, got concurrency={concurrency}.")
        self.concurrency = concurrency
        self.conf = conf or get_settings()
        self.name = name
        self.instruments = instruments or NO_INSTRUMENTS
        self.store = QueueStore(using or self.conf.DATABASE)
        self.sequencer = Sequencer(self.store.using)
        self.subscriptions = in_poll_order(Subscription.create(spec, name, self.conf) for spec in specs)
        self.topics = sorted({sub.topic for sub in self.subscriptions})
        #: Whether batches run on handler threads (``dispatch.handler_threads``).
        self.uses_handler_threads = not inline and dispatch.handler_threads(concurrency, self.subscriptions)
        self.probe = Probe(self.store, self.topics)
        self.stop_event = threading.Event()
        #: What the poll loop sleeps on between rounds: set by a stop, a batch finishing
        #: on a handler thread and a notification of new messages.
        self.wakeup = threading.Event()
        self.cadence = Cadence(self.conf.POLL_INTERVAL, self.conf.POLL_INTERVAL_MAX)
        self.db = Retrying(self.store.using, self.stop_event)
        # One outage reporter for the poll loop and the side threads (outage.py).
        self.outage = OutageReporter(alias=self.store.using, report_interval=self.conf.OUTAGE_REPORT_INTERVAL)
        self.keeper = LeaseKeeper(
            self.subscriptions, self.store, self.conf, outage=self.outage, instruments=self.instruments
        )
        # Calls sync and async handlers on the poll loop; owns its event loop (batch/handlers.py).
        self.invoke = HandlerRunner()
        self.scheduler = Scheduler(schedules, using=self.store.using, outage=self.outage) if schedules else None
        # PostgreSQL: a connection that LISTENs for new messages of the consumed topics and
        # cuts the poll loop's wait short (threads/listener.py); polling stays the safety net.
        self.listener = (
            Listener(
                self.topics,
                using=self.store.using,
                outage=self.outage,
                wake=self.wakeup.set,
                on_connected=self._listening,
                wanted=self._leases,
                name=name,
                reconnect_interval=self.conf.POLL_INTERVAL_MAX,
            )
            if self.conf.NOTIFY and not inline and notifications_supported(self.store.using)
            else None
        )
        self.stats = Stats()
        self.batches = batches(self.store, self.conf, stats=self.stats, stop_event=self.stop_event, db=self.db)
        #: Where batches run, decided here once (dispatch.py); its threads start in run().
        self.dispatch = dispatch.choose(
            self.batches,
            concurrency=concurrency,
            handler_threads=self.uses_handler_threads,
            invoke=self.invoke,
            on_death=self._service_died,
            finished=self.wakeup,
            outage=self.outage,
            instruments=self.instruments,
        )
        #: The handler threads and their watchdog (None: batches run on the poll loop).
        self.executor, self.watchdog = self.dispatch.executor, self.dispatch.watchdog
        self.poller = Poller(
            self.store, self.sequencer, self.conf, db=self.db, dispatch=self.dispatch, instruments=self.instruments
        )
        self.collector = GarbageCollector(self.subscriptions, self.store, self.conf, db=self.db, outage=self.outage)
        #: The side thread or handler thread whose death stopped the worker (None: none
        #: died). Set once, the first report winning, under ``_crash_lock``: side threads,
        #: handler threads and the watchdog may report at the same time.
        self.crashed: Crash | None = None
        self._crash_lock = threading.Lock()
        self.health_file = HealthFile(health_file)

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def services(self) -> list[ServiceThread]:
        """The side threads this worker runs and supervises."""
        return [s for s in (self.keeper, self.scheduler, self.listener) if s is not None]

    def stop(self) -> None:
        """Ask the worker to finish the message(s) in hand and shut down gracefully."""
        self.stop_event.set()
        self.wakeup.set()  # wake the poll loop

    def run(self) -> None:
        """Poll until stopped; then hand back unprocessed messages, leases and heartbeats.

        Raises :class:`~django_sqlqueue.exceptions.WorkerCrashed` (after the hand-back) when
        a side thread or a handler thread died, and re-raises the ``SystemExit`` or
        ``KeyboardInterrupt`` a handler raised (``batch/runner.py``), after the same hand-back.
        """
        logger.info(
            "worker starting subscriber=%s consumers=%s concurrency=%d",
            self.name,
            ", ".join(s.spec.name for s in self.subscriptions),
            self.concurrency,
        )
        registered = startup.register_when_reachable(
            self.store, self.conf, self.db, self.topics, stop_event=self.stop_event, outage=self.outage
        )
        if not registered:
            logger.info("worker stopped before it started subscriber=%s", self.name)
            connections.close_all()
            return
        startup.check_connection_room(self.store, self.connections_needed(), name=self.name)
        startup.warn_unreached_topics(self.store, self.conf, [(s.group, s.topic) for s in self.subscriptions])
        self.keeper.start(on_death=self._service_died)
        for sub in self.subscriptions:
            sub.ready.wait(timeout=self.conf.LEASE_DURATION)
        self.dispatch.start()
        if self.scheduler is not None:
            self.scheduler.start(on_death=self._service_died)
        if self.listener is not None:
            self.listener.start(on_death=self._service_died)
        signals.send(signals.worker_started, Worker, worker=self, name=self.name)
        try:
            self._loop()
        finally:
            signals.send(signals.worker_stopping, Worker, worker=self, name=self.name)
            # Drain the handler threads, if any, before the leases are released.
            self.dispatch.drain()
            for service in reversed(self.services):
                service.stop()
            self.keeper.release_all()
            self.invoke.close()
            connections.close_all()
            logger.info(
                "worker stopped subscriber=%s delivered=%d acked=%d nacked=%d dead_lettered=%d postponed=%d",
                self.name,
                *(self.stats.delivered, self.stats.acked, self.stats.nacked, self.stats.dead_lettered),
                self.stats.postponed,  # waited for a rate or concurrency limit (``limits.py``)
            )
        error = _exit_error(self.name, self.batches.interrupted, self.crashed)
        if error is not None:
            raise error

    def _service_died(self, service: Crash) -> None:
        """Called on a side thread that ends unasked, or a handler thread that dies: stop
        the worker (it exits non-zero)."""
        with self._crash_lock:
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

    # -- startup (startup.py) ------------------------------------------------------------

    def connections_needed(self) -> ConnectionBudget:
        """The connections this worker holds on the queue's alias (``budget.py``)."""
        return connection_budget(
            concurrency=self.concurrency,
            handler_threads=self.uses_handler_threads,
            scheduler=self.scheduler is not None,
            async_handlers=any(startup.is_async(sub.spec.handler) for sub in self.subscriptions),
            listener=self.listener is not None,
        )

    def register_topics(self) -> None:
        """Register the consumed topics with their partition counts; refuse a mismatch."""
        startup.register_topics(self.store, self.conf, self.db, self.topics)

    # -- the poll loop -------------------------------------------------------------------

    def _loop(self) -> None:
        conf = self.conf
        # A worker frozen inside one of the loop's transactions must not hold its locks
        # (lease fence, sequencer heads) past the moment its leases may be stolen. When
        # handlers run on this thread (``--concurrency 1`` and no handler timeout), only the
        # engine's transactions are bounded: the handlers' own may idle (db/session.py).
        bound = conf.LEASE_DURATION - conf.LEASE_RENEW_INTERVAL
        frozen_guard = (
            engine_connections(self.store.using, bound)
            if self.uses_handler_threads
            else handler_thread_connections(self.store.using, bound)
        )
        with frozen_guard:
            self._rounds()

    def _rounds(self) -> None:
        conf = self.conf
        woken = True
        while not self.stop_event.is_set():
            self._supervise()
            self.dispatch.check()
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
            bands = BandRound()  # a task queue's priority levels: the highest with work first
            for sub in self.subscriptions:
                if self.stop_event.is_set():
                    break
                if (not full_round and changed is not None and sub.topic not in changed) or bands.skips(sub):
                    continue
                try:
                    count, was_full = self.poll(sub)
                except Exception as exc:  # noqa: BLE001 - reported by the outage reporter
                    self.outage.failure(logger, exc, "poll failed group=%s topic=%s", sub.group, sub.topic)
                    close_quietly(self.store.using)
                    count, was_full = 0, False
                else:
                    self.outage.reachable()
                bands.polled(sub, count)
                delivered = delivered or count > 0
                full = full or was_full
            self.collector.run_if_due()
            self.health_file.beat(healthy=not self.outage.in_outage and self.crashed is None)
            if self.dispatch.saturated:
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
        end = time.monotonic() + seconds
        while (remaining := end - time.monotonic()) > 0:
            due = self.dispatch.next_check()
            if self.wakeup.wait(remaining if due is None else min(remaining, due)):
                if not self.stop_event.is_set():
                    self.wakeup.clear()
                return True
            self.dispatch.check()
        return False

    def poll(self, sub: Subscription) -> tuple[int, bool]:
        """Deliver one batch per partition with work; return (messages handled, any batch full)."""
        return self.poller.poll(sub)


def _exit_error(name: str, interrupted: BaseException | None, crashed: Crash | None) -> BaseException | None:
    """What a stopped worker raises, logged once: the ``SystemExit``/``KeyboardInterrupt`` a
    handler raised, ``HandlersStuck``, or ``WorkerCrashed`` for a thread that died; None
    after a plain stop."""
    if interrupted is not None:
        logger.error(
            "worker exiting subscriber=%s: a handler raised %s; leases released, in-flight messages handed back",
            name,
            type(interrupted).__name__,
        )
        return interrupted
    if crashed is None:
        return None
    error = crashed.error
    if isinstance(error, HandlersStuck):
        logger.error("worker exiting subscriber=%s: %s; leases released", name, error)
        return error
    logger.error(
        "worker exiting subscriber=%s: its %s thread died (%s: %s); leases released, in-flight messages handed back",
        name,
        crashed.title,
        type(error).__name__,
        error,
    )
    return WorkerCrashed(
        f"worker {name}: its {crashed.title} thread died ({type(error).__name__}: {error}); "
        "the worker stopped so that it can be restarted."
    )
