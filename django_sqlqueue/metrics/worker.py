"""Counters and histograms of one ``runconsumer`` process, served on ``--metrics-port``.

:class:`WorkerMetrics` keeps its metrics on a private ``CollectorRegistry`` (no global
state). Per-message metrics come from receivers of the signals of
:mod:`django_sqlqueue.signals` (sent on the worker's handler threads, see that module);
polls, batches, sequencer runs and lease changes from the worker's monitoring hooks
(:class:`~django_sqlqueue.instruments.Instruments`, which this class implements: the
command passes it as ``Worker(instruments=...)``). It serves them with
``prometheus_client``'s HTTP server. Each process serves its own, so several processes on
one host need several ports. Labels: ``database``, ``group`` and ``topic`` only
(``database`` and ``topic`` for the sequencer, which numbers a topic's messages for every
group). ``database`` is the alias that holds the topic (``conf.database_for``): a process
serving several databases (``worker/fleet.py``) reports each topic under its own.
"""

from __future__ import annotations

import logging
from typing import Any

from django_sqlqueue import signals
from django_sqlqueue.conf import get_settings
from django_sqlqueue.exceptions import HandlerTimeout, Reject
from django_sqlqueue.instruments import Instruments

from . import require_prometheus_client

logger = logging.getLogger(__name__)

#: Buckets of ``sqlqueue_handler_duration_seconds``: 1 ms to 5 minutes.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
#: Buckets of the poll and sequencer durations: 0.5 ms to 10 s.
QUERY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
#: Buckets of ``sqlqueue_batch_size`` (messages).
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


class WorkerMetrics(Instruments):
    """The metrics of one worker process; :meth:`start` connects the receivers and serves them."""

    def __init__(self) -> None:
        require_prometheus_client()
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        gt = ["database", "group", "topic"]

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, gt, registry=self.registry)

        self.delivered = counter("sqlqueue_messages_delivered", "Messages handed to a handler (each attempt).")
        self.processed = counter("sqlqueue_messages_processed", "Handler calls that returned: the message is acked.")
        self.failed = counter("sqlqueue_messages_failed", "Handler calls that raised (or timed out), final or not.")
        self.retried = counter("sqlqueue_messages_retried", "Failed handler calls that will be retried.")
        self.rejected = counter("sqlqueue_messages_rejected", "Handler calls that raised Reject (dead letter at once).")
        self.timed_out = counter("sqlqueue_messages_timed_out", "Handler calls abandoned after the consumer's timeout.")
        self.dead_lettered = counter(
            "sqlqueue_messages_dead_lettered", "Messages this process moved to the dead-letter topic."
        )
        self.duration = Histogram(
            "sqlqueue_handler_duration_seconds",
            "Seconds a handler ran, whatever its outcome.",
            gt,
            registry=self.registry,
            buckets=DURATION_BUCKETS,
        )
        self.batch_size = Histogram(
            "sqlqueue_batch_size",
            "Messages per batch handed to the handlers (one partition's batch).",
            gt,
            registry=self.registry,
            buckets=BATCH_BUCKETS,
        )
        self.polls = counter("sqlqueue_polls", "Polls of a subscription (one group and topic).")
        self.polls_empty = counter("sqlqueue_polls_empty", "Polls that found nothing to deliver.")
        self.poll_duration = Histogram(
            "sqlqueue_poll_duration_seconds",
            "Seconds a poll took to plan and record its deliveries (state, sequencing, fetch, mark "
            "delivered), the handlers not included.",
            gt,
            registry=self.registry,
            buckets=QUERY_BUCKETS,
        )
        self.sequencer_runs = Counter(
            "sqlqueue_sequencer_runs",
            "Sequencer runs (numbering committed messages).",
            ["database", "topic"],
            registry=self.registry,
        )
        self.sequenced_messages = Counter(
            "sqlqueue_sequenced_messages",
            "Messages the sequencer numbered.",
            ["database", "topic"],
            registry=self.registry,
        )
        self.sequencer_duration = Histogram(
            "sqlqueue_sequencer_duration_seconds",
            "Seconds a sequencer run took (its transactions).",
            ["database", "topic"],
            registry=self.registry,
            buckets=QUERY_BUCKETS,
        )
        self.leases_acquired = counter("sqlqueue_leases_acquired", "Partition leases this process acquired.")
        self.leases_released = counter(
            "sqlqueue_leases_released",
            "Partition leases this process gave back (fair share, a pause, a handler timeout, shutdown).",
        )
        self.leases_lost = counter(
            "sqlqueue_leases_lost", "Partition leases this process found taken by another subscriber (expired)."
        )
        self._server: Any = None
        #: (group, topic) -> the children on_processed updates (dict reads and writes are atomic).
        self._processed_children: dict[tuple[str, str], tuple[Any, Any, Any]] = {}

    @staticmethod
    def _database(topic: str) -> str:
        """The ``database`` label of ``topic``: the alias that holds it (a pure function of the settings)."""
        return get_settings().database_for(topic)

    # -- receivers (sender: the topic) ------------------------------------------------------

    def on_processed(self, sender: str, *, message: Any, duration: float, **kwargs: Any) -> None:
        # The one receiver called for every message: its children are looked up once per
        # (group, topic) (``labels()`` takes a lock and builds a key each call).
        key = (message.group, message.topic)
        children = self._processed_children.get(key)
        if children is None:
            labels = (self._database(message.topic), *key)
            children = self._processed_children[key] = (
                self.delivered.labels(*labels),
                self.processed.labels(*labels),
                self.duration.labels(*labels),
            )
        delivered, processed, duration_child = children
        delivered.inc()
        processed.inc()
        duration_child.observe(duration)

    def on_failed(
        self, sender: str, *, message: Any, duration: float, error: BaseException, final: bool, **kwargs: Any
    ) -> None:
        labels = (self._database(message.topic), message.group, message.topic)
        self.delivered.labels(*labels).inc()
        self.failed.labels(*labels).inc()
        if not final:
            self.retried.labels(*labels).inc()
        if isinstance(error, Reject):
            self.rejected.labels(*labels).inc()
        if isinstance(error, HandlerTimeout):
            self.timed_out.labels(*labels).inc()
        self.duration.labels(*labels).observe(duration)

    def on_dead_lettered(self, sender: str, *, group: str, topic: str, **kwargs: Any) -> None:
        self.dead_lettered.labels(self._database(topic), group, topic).inc()

    # -- the worker's hooks (django_sqlqueue.instruments) -------------------------------------

    def polled(self, group: str, topic: str, seconds: float, batches: int) -> None:
        labels = (self._database(topic), group, topic)
        self.polls.labels(*labels).inc()
        if not batches:
            self.polls_empty.labels(*labels).inc()
        self.poll_duration.labels(*labels).observe(seconds)

    def batch(self, group: str, topic: str, size: int) -> None:
        self.batch_size.labels(self._database(topic), group, topic).observe(size)

    def sequenced(self, topic: str, seconds: float, numbered: int) -> None:
        labels = (self._database(topic), topic)
        self.sequencer_runs.labels(*labels).inc()
        self.sequenced_messages.labels(*labels).inc(numbered)
        self.sequencer_duration.labels(*labels).observe(seconds)

    def leases(self, group: str, topic: str, *, acquired: int = 0, released: int = 0, lost: int = 0) -> None:
        labels = (self._database(topic), group, topic)
        if acquired:
            self.leases_acquired.labels(*labels).inc(acquired)
        if released:
            self.leases_released.labels(*labels).inc(released)
        if lost:
            self.leases_lost.labels(*labels).inc(lost)

    # -- life ---------------------------------------------------------------------------------

    def connect(self) -> None:
        uid = f"sqlqueue-metrics-{id(self)}"
        signals.message_processed.connect(self.on_processed, weak=False, dispatch_uid=f"{uid}-processed")
        signals.message_failed.connect(self.on_failed, weak=False, dispatch_uid=f"{uid}-failed")
        signals.message_dead_lettered.connect(self.on_dead_lettered, weak=False, dispatch_uid=f"{uid}-dead")

    def disconnect(self) -> None:
        uid = f"sqlqueue-metrics-{id(self)}"
        signals.message_processed.disconnect(dispatch_uid=f"{uid}-processed")
        signals.message_failed.disconnect(dispatch_uid=f"{uid}-failed")
        signals.message_dead_lettered.disconnect(dispatch_uid=f"{uid}-dead")

    def start(self, port: int, addr: str = "0.0.0.0") -> None:
        """Connect the receivers and serve ``/metrics`` (any path) on ``addr:port`` in a daemon thread."""
        from prometheus_client import start_http_server

        self.connect()
        self._server, _ = start_http_server(port, addr=addr, registry=self.registry)
        # Where to point a scrape job: nothing else says which port this process took.
        host = f"[{addr}]" if ":" in addr else addr
        logger.info("serving metrics on http://%s:%d/metrics", host, port)

    def stop(self) -> None:
        self.disconnect()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
