"""Tracing across a real ``runconsumer``: the producer's context travels in the message.

The test process publishes inside its own span (the SDK's in-memory exporter behind
``tracing._tracer``); the worker process (settings tests/support/process_settings_otel.py) runs the
consumers of tests/otelapp with a global TracerProvider whose finished spans it appends to a
JSON-lines file (tests/support/otelapp/spans.py), which the test waits on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_sqlqueue import publish, tracing
from django_sqlqueue.models import Message

from ..support.otelapp.spans import as_dict, read
from ..support.processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("django_sqlqueue"))
    yield exporter
    provider.shutdown()


@pytest.fixture
def traced_worker(runconsumer: Callable[..., Any], tmp_path: Path) -> Callable[..., tuple[Any, Path]]:
    def start(name: str, *args: str) -> tuple[Any, Path]:
        spans = tmp_path / f"{name}-spans.jsonl"
        worker = runconsumer(
            name, *args, settings="tests.support.process_settings_otel", env={"SQLQUEUE_TEST_SPANS": str(spans)}
        )
        return worker, spans

    return start


def sent(exporter: InMemorySpanExporter, topic: str) -> dict[str, dict[str, Any]]:
    """This process's send spans of ``topic``, by message id."""
    spans: list[ReadableSpan] = [s for s in exporter.get_finished_spans() if s.name == f"send {topic}"]
    return {str((s.attributes or {})["messaging.message.id"]): as_dict(s) for s in spans}


def test_a_real_worker_traces_each_handler_call(
    traced_worker: Callable[..., tuple[Any, Path]], exporter: InMemorySpanExporter
) -> None:
    worker, path = traced_worker("otel1", "--group", "otel", "--topic", "otel.events")
    with tracing._tracer.start_as_current_span("POST /orders"):
        partitions = {
            "fwd": publish("otel.events", {"forward": "otel.forwarded"}, key="a", id="fwd").partition,
            "bad": publish("otel.events", {"fail": True}, key="b", id="bad").partition,
        }
    producers = sent(exporter, "otel.events")
    assert partitions["fwd"] != partitions["bad"]  # crc32: each the first message of its partition

    def spans_when(done: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
        return wait_until(lambda: (found := read(path)) and done(found) and found, 30, "spans", show=worker.log)

    # fwd: one attempt; bad: two (max_attempts=2), then a dead letter; fwd's handler publishes once.
    spans = spans_when(lambda s: sum(x["name"] == "process otel.events" for x in s) == 3)
    spans = spans_when(lambda s: any(x["name"] == "send otel.forwarded" for x in s))
    assert worker.terminate() == 0
    process = [s for s in spans if s["name"] == "process otel.events"]
    by_id: dict[str, list[dict[str, Any]]] = {}
    for span in sorted(process, key=lambda s: s["attributes"]["sqlqueue.message.attempt"]):
        by_id.setdefault(span["attributes"]["messaging.message.id"], []).append(span)
    assert sorted(by_id) == ["bad", "fwd"] and len(by_id["bad"]) == 2

    for message_id, attempts in by_id.items():
        producer = producers[message_id]
        for attempt, span in enumerate(attempts, 1):
            assert span["kind"] == "CONSUMER"
            assert span["parent_span_id"] is None
            assert span["links"] == [{"trace_id": producer["trace_id"], "span_id": producer["span_id"]}]
            assert span["trace_id"] != producer["trace_id"]  # its own trace, linked
            assert {k: v for k, v in span["attributes"].items() if k != "error.type"} == {
                "messaging.system": "sqlqueue",
                "messaging.destination.name": "otel.events",
                "messaging.destination.partition.id": str(partitions[message_id]),
                "messaging.consumer.group.name": "otel",
                "messaging.message.id": message_id,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "sqlqueue.message.offset": 1,
                "sqlqueue.message.attempt": attempt,
            }
    assert by_id["fwd"][0]["status"] == "UNSET" and by_id["fwd"][0]["events"] == []
    for span in by_id["bad"]:
        assert span["status"] == "ERROR"
        assert span["attributes"]["error.type"] == "tests.support.otelapp.consumers.ScriptedFailure"
        [event] = span["events"]
        assert event["name"] == "exception"
        assert event["attributes"]["exception.message"] == "scripted failure of bad"

    # The publish inside the handler: a child of the process span, its context in the message.
    [forward] = [s for s in spans if s["name"] == "send otel.forwarded"]
    assert forward["kind"] == "PRODUCER"
    assert (forward["trace_id"], forward["parent_span_id"]) == (by_id["fwd"][0]["trace_id"], by_id["fwd"][0]["span_id"])
    stored = Message.objects.get(topic="otel.forwarded").metadata["traceparent"]
    assert stored.split("-")[1:3] == [forward["trace_id"], forward["span_id"]]


def test_a_timed_out_handler_in_a_real_worker_records_the_timeout_once(
    traced_worker: Callable[..., tuple[Any, Path]], exporter: InMemorySpanExporter
) -> None:
    worker, path = traced_worker("otel2", "--group", "otelslow", "--topic", "otel.slow")
    with tracing._tracer.start_as_current_span("request"):
        # 1.5 s: over the 0.3 s timeout; the handler returns while the worker still runs.
        publish("otel.slow", {"sleep": 1.5}, id="slow")
        publish("otel.slow", {"sleep": 0}, id="quick")  # handled after the first (another partition maybe)

    def both() -> list[dict[str, Any]]:
        found = [s for s in read(path) if s["name"] == "process otel.slow"]
        return found if len(found) == 2 else []

    wait_until(both, 30, "two process spans", show=worker.log)
    # The abandoned handler returns 1.5 s after it started (batch.py logs it): a second end() of
    # its span would make the SDK warn in the worker's log.
    wait_until(lambda: "a timed-out handler returned after all" in worker.log(), 10, "the slow handler to return")
    assert worker.terminate() == 0
    spans = [s for s in read(path) if s["name"] == "process otel.slow"]
    by_id = {s["attributes"]["messaging.message.id"]: s for s in spans}
    assert len(spans) == 2 and sorted(by_id) == ["quick", "slow"]
    assert by_id["slow"]["status"] == "ERROR"
    assert by_id["slow"]["attributes"]["error.type"] == "django_sqlqueue.exceptions.HandlerTimeout"
    assert by_id["quick"]["status"] == "UNSET"
    assert "on an ended span" not in worker.log()
