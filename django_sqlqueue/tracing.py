"""OpenTelemetry tracing of publishes and handler calls (the ``otel`` extra).

Follows the OpenTelemetry messaging semantic conventions:

- **publish.** When a span is active in the publishing code, ``publish()`` and
  ``publish_many()`` record a ``send {topic}`` span (kind PRODUCER, a child of the active
  span) and inject its context into each message's ``metadata`` as W3C Trace Context
  (``traceparent``, and ``tracestate`` when there is one). Without an active span nothing
  is recorded or injected. A ``traceparent`` the caller put in ``metadata`` is kept as it
  is: an explicit context (a message forwarded on behalf of another system) wins.
- **process.** The worker calls each handler inside a ``process {topic}`` span (kind
  CONSUMER). It is the root of a trace of its own and **links** to the producer's context
  found in the metadata: a message may be handled hours later, several times, by several
  groups, and a link keeps the publishing request's trace short while still leading to it.
  The span is the current span while the handler runs, so a publish (or any instrumented
  call) inside the handler is its child. A failed attempt records the exception and sets
  the status to ERROR; a timed-out handler's span is ended by the watchdog with the
  :class:`~django_sqlqueue.exceptions.HandlerTimeout` (:meth:`ProcessSpan.end` acts once).

The engine calls :func:`start_send` and :func:`start_process` only when :data:`ENABLED`
(``opentelemetry-api`` importable): without the package the whole cost is that one check.
With it, :func:`start_send` returns None at once when no span is active, and
:func:`start_process` when no tracer provider is configured. Only the API is used; the
project installs and configures an SDK (exporter, sampler).

This module imports nothing of the package (a leaf: the engine imports it).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the ``otel`` extra is not installed: the engine never calls below
    ENABLED = False
else:
    ENABLED = True
    # A ProxyTracer until the project sets a TracerProvider, then that provider's tracer.
    _tracer = trace.get_tracer("django_sqlqueue")
    # W3C Trace Context, whatever the process's global propagator: a message may be handled
    # by workers configured otherwise, long after it was published.
    _propagator = TraceContextTextMapPropagator()
    # The parent of every process span: none.
    _ROOT = otel_context.Context()

#: The value of ``messaging.system``.
SYSTEM = "sqlqueue"
#: The attribute naming a ``django.tasks`` task on its ``send`` and ``process`` spans.
TASK_NAME = "sqlqueue.task.name"
#: The metadata keys of the W3C Trace Context.
TRACE_KEYS = ("traceparent", "tracestate")


class Processed(Protocol):
    """What :func:`start_process` reads of a message (a ``ReceivedMessage``)."""

    topic: str
    partition: int
    offset: int
    id: str
    group: str
    attempt: int
    metadata: Any


def _fail(span: Any, error: BaseException) -> None:
    """Record ``error`` on ``span``: an exception event, ``error.type`` and status ERROR."""
    span.record_exception(error)
    span.set_attribute("error.type", f"{type(error).__module__}.{type(error).__qualname__}")
    span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"[:1000]))


class SendSpan:
    """The ``send`` span of one publish call, current until :meth:`end`."""

    __slots__ = ("_headers", "_span", "_token")

    def __init__(self, span: Any) -> None:
        self._span = span
        #: The W3C headers of this span, computed at the first inject (one per publish_many).
        self._headers: dict[str, str] | None = None
        # Current while the message is written: a database instrumentation's spans nest in it.
        self._token = otel_context.attach(trace.set_span_in_context(span))

    def inject(self, metadata: Any) -> Any:
        """Return ``metadata`` with this span's W3C context added (a copy; the caller's dict
        is not changed). Kept as it is if it holds a ``traceparent`` already, or is not a
        dict (validation then says what is wrong with it)."""
        if metadata is None:
            carrier: dict[str, Any] = {}
        elif isinstance(metadata, dict) and "traceparent" not in metadata:
            carrier = dict(metadata)
        else:
            return metadata
        if self._headers is None:
            self._headers = {}
            _propagator.inject(self._headers, context=trace.set_span_in_context(self._span))
        carrier.update(self._headers)
        return carrier

    def end(self, error: BaseException | None, published: Sequence[Any] = ()) -> None:
        """End the span: describe the ``published`` messages (``PublishedMessage``), or record
        ``error``. Call it exactly once, on the thread that started it."""
        span = self._span
        try:
            if error is not None:
                _fail(span, error)
            elif len(published) == 1:
                span.set_attribute("messaging.message.id", published[0].id)
                span.set_attribute("messaging.destination.partition.id", str(published[0].partition))
        finally:
            otel_context.detach(self._token)
            span.end()


def start_send(topic: str, count: int | None = None, attributes: Mapping[str, Any] | None = None) -> SendSpan | None:
    """Start the ``send {topic}`` span of a publish when a span is active, else return None.

    ``count``: the number of messages of a ``publish_many()`` (``messaging.batch.message_count``).
    ``attributes``: more attributes (the tasks backend adds the task's name).
    """
    if not trace.get_current_span().get_span_context().is_valid:
        return None  # nothing to continue: no span, no injection
    span = _tracer.start_span(
        f"send {topic}",
        kind=trace.SpanKind.PRODUCER,
        attributes={
            "messaging.system": SYSTEM,
            "messaging.destination.name": topic,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            **({"messaging.batch.message_count": count} if count is not None else {}),
            **(attributes or {}),
        },
    )
    return SendSpan(span)


def _producer_context(metadata: Any) -> Any:
    """The producer's span context ``metadata`` carries (a valid ``SpanContext``), or None."""
    if not isinstance(metadata, dict) or not isinstance(metadata.get("traceparent"), str):
        return None
    carrier = {k: metadata[k] for k in TRACE_KEYS if isinstance(metadata.get(k), str)}
    producer = trace.get_current_span(_propagator.extract(carrier)).get_span_context()
    return producer if producer.is_valid else None


class ProcessSpan:
    """The ``process`` span of one handler call.

    ``with span:`` makes it the current span around the handler call (on the handler's
    thread); :meth:`end` ends it, once, from whichever thread owns the attempt's outcome
    (the handler's thread, or the watchdog's after a timeout).
    """

    __slots__ = ("_lock", "_span", "_token")

    def __init__(self, span: Any) -> None:
        self._span: Any = span
        self._token: Any = None
        self._lock = threading.Lock()

    def __enter__(self) -> ProcessSpan:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        token, self._token = self._token, None
        if token is not None:
            otel_context.detach(token)

    def end(self, error: BaseException | None, *, requested: bool = False) -> None:
        """End the span, recording ``error`` if the attempt failed; later calls do nothing.

        ``requested``: the handler asked for the retry (``Retry``): the exception is recorded
        as an event, and the status is not ERROR.
        """
        with self._lock:
            span, self._span = self._span, None
        if span is None:
            return
        if error is not None:
            if requested:
                span.record_exception(error)
            else:
                _fail(span, error)
        span.end()


def _configured() -> bool:
    """Whether the process has a tracer provider to record with (an SDK was set up).

    Until the project sets one, the API's tracer is a proxy to a no-op tracer: then a
    process span would cost its link extraction and context switch for nothing.
    """
    if not isinstance(_tracer, trace.ProxyTracer):
        return True  # a tracer of a real provider (put in place by a test, say)
    return not isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def start_process(message: Processed, attributes: Mapping[str, Any] | None = None) -> ProcessSpan | None:
    """Start the ``process {topic}`` span of a handler call on ``message``, linked to its
    producer; None if no tracer provider is configured (nothing would record it)."""
    if not _configured():
        return None
    # A root: the worker's thread may hold another context, the message does not belong to it.
    span = _tracer.start_span(f"process {message.topic}", context=_ROOT, kind=trace.SpanKind.CONSUMER)
    if span.is_recording():
        # Attributes and the producer link are added once the sampler has kept the span: a
        # span it dropped costs neither (their validation is most of a recorded span's cost,
        # ~15 of ~30 us). So a sampler sees only the span's name and kind.
        span.set_attributes(
            {
                "messaging.system": SYSTEM,
                "messaging.destination.name": message.topic,
                "messaging.destination.partition.id": str(message.partition),
                "messaging.consumer.group.name": message.group,
                "messaging.message.id": message.id,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "sqlqueue.message.offset": message.offset,
                "sqlqueue.message.attempt": message.attempt,
                **(attributes or {}),
            }
        )
        producer = _producer_context(message.metadata)
        if producer is not None:
            span.add_link(producer)
    return ProcessSpan(span)


def set_current_attributes(attributes: Mapping[str, Any]) -> None:
    """Add attributes to the current span if it records (the tasks backend names the task)."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(attributes)
