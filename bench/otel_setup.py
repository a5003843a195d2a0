"""An OpenTelemetry SDK tracer provider whose spans are counted and dropped (benchmarks only).

``install()`` sets the global tracer provider once, with a ``BatchSpanProcessor`` (what a
production setup uses) in front of :class:`CountingExporter`: every span is built, ended,
queued and exported as it would be, and nothing leaves the process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_installed: Any = None


def install(ratio: float = 1.0) -> Any:
    """Install the provider (once per process); return its exporter.

    ``ratio`` below 1: the provider samples ``ParentBased(TraceIdRatioBased(ratio))``, what a
    busy production service configures; 1 records every span.
    """
    global _installed
    if _installed is not None:
        return _installed
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

    class CountingExporter(SpanExporter):
        def __init__(self) -> None:
            self.count = 0
            self.processor: BatchSpanProcessor | None = None

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            self.count += len(spans)
            return SpanExportResult.SUCCESS

        def flush(self) -> None:
            if self.processor is not None:
                self.processor.force_flush()

    exporter = CountingExporter()
    provider = TracerProvider(sampler=ParentBased(ALWAYS_ON if ratio >= 1 else TraceIdRatioBased(ratio)))
    exporter.processor = BatchSpanProcessor(exporter)
    provider.add_span_processor(exporter.processor)
    trace.set_tracer_provider(provider)
    _installed = exporter
    return exporter


def sampled_tracer(ratio: float) -> Any:
    """A tracer of a second provider sampling ``TraceIdRatioBased(ratio)`` (its spans dropped):
    the request spans of a service that samples. Spans started under them follow their
    decision (the global provider's default sampler is parent-based)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    return TracerProvider(sampler=TraceIdRatioBased(ratio)).get_tracer("bench.sampled")
