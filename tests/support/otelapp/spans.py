"""An OpenTelemetry SDK set up for tests: spans kept in memory and appended to a JSON-lines file.

:func:`install` sets the process's global TracerProvider (a runconsumer process of the
tracing tests calls it from its settings, tests/support/process_settings_otel.py); :func:`as_dict`
is the format of the file, read back by :func:`read` in the test process.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def as_dict(span: ReadableSpan) -> dict[str, Any]:
    """What the tests look at of a finished span, JSON-serializable (ids as hex)."""
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_span_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events],
        "links": [
            {"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
            for link in span.links
        ],
    }


class FileSpanExporter(InMemorySpanExporter):
    """The SDK's in-memory exporter that also appends each finished span to ``path`` (a
    line of JSON, written when the span ends: the test waits for lines, not for exit)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = Path(path)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = super().export(spans)
        with self._lock, self.path.open("a") as f:
            for span in spans:
                f.write(json.dumps(as_dict(span), default=str) + "\n")
        return result


def install(path: str) -> FileSpanExporter:
    """Set the global TracerProvider: every finished span goes to a :class:`FileSpanExporter`."""
    exporter = FileSpanExporter(path)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


def read(path: str | Path) -> list[dict[str, Any]]:
    """The spans a process wrote to ``path`` so far (complete lines only)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]
