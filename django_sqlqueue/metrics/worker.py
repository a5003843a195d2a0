"""Counters and histograms of one ``runconsumer`` process, served on ``--metrics-port``.

:class:`WorkerMetrics` keeps its metrics on a private ``CollectorRegistry`` (no global
state), connects receivers to the signals of :mod:`django_sqlqueue.signals` (sent on the
worker's handler threads, see that module) and serves them with ``prometheus_client``'s
HTTP server. Each process serves its own, so several processes on one host need several
ports. Labels: ``group`` and ``topic`` only.
"""

from __future__ import annotations

from typing import Any

from django_sqlqueue import signals
from django_sqlqueue.exceptions import HandlerTimeout, Reject

from . import require_prometheus_client

#: Buckets of ``sqlqueue_handler_duration_seconds``: 1 ms to 5 minutes.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class WorkerMetrics:
    """The metrics of one worker process; :meth:`start` connects the receivers and serves them."""

    def __init__(self) -> None:
        require_prometheus_client()
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        gt = ["group", "topic"]

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
        self._server: Any = None

    # -- receivers (sender: the topic) ------------------------------------------------------

    def on_processed(self, sender: str, *, message: Any, duration: float, **kwargs: Any) -> None:
        labels = (message.group, message.topic)
        self.delivered.labels(*labels).inc()
        self.processed.labels(*labels).inc()
        self.duration.labels(*labels).observe(duration)

    def on_failed(
        self, sender: str, *, message: Any, duration: float, error: BaseException, final: bool, **kwargs: Any
    ) -> None:
        labels = (message.group, message.topic)
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
        self.dead_lettered.labels(group, topic).inc()

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

    def stop(self) -> None:
        self.disconnect()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
