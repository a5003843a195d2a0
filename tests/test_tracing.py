"""OpenTelemetry tracing (django_sqlqueue/tracing.py), in this process: the SDK's in-memory
exporter behind the module's tracer, a real database and real (in-process) workers.

The tracer provider is a local one put in ``tracing._tracer`` for each test (not the global
provider: the rest of the suite runs untraced). tests/processes/test_tracing.py covers a real
``runconsumer`` with a global provider.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, Tracer

from django_sqlqueue import publish, publish_many, tracing
from django_sqlqueue.exceptions import IdempotencyConflict, InvalidMessage
from django_sqlqueue.models import Message

from .support.engine_helpers import Calls, fast_conf, running, spec, wait_until
from .support.processes import ROOT, database_url

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "tr.events"


class Traced:
    """The test's tracer (for the caller's spans) and what was exported."""

    def __init__(self, tracer: Tracer, exporter: InMemorySpanExporter) -> None:
        self.tracer = tracer
        self.exporter = exporter

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.spans(name)
        assert len(found) == 1, f"{len(found)} spans named {name!r}: {[s.name for s in self.spans()]}"
        return found[0]


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[Traced]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("django_sqlqueue"))
    yield Traced(provider.get_tracer("tests"), exporter)
    provider.shutdown()


def traceparent(span: ReadableSpan) -> str:
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def ids(context: Any) -> tuple[int, int]:
    """A span context's (trace id, span id): a link's context is "remote", the span's is not."""
    return context.trace_id, context.span_id


def stored_metadata(topic: str, message_id: str) -> Any:
    return Message.objects.get(topic=topic, id=message_id).metadata


# -- publish ---------------------------------------------------------------------------------


def test_publish_in_an_active_span_injects_the_send_spans_context(traced: Traced) -> None:
    mine = {"origin": "checkout"}
    with traced.tracer.start_as_current_span("POST /orders") as request:
        message = publish(TOPIC, {"n": 1}, key="alice", id="o-1", metadata=mine)
    send = traced.one(f"send {TOPIC}")
    assert send.kind is SpanKind.PRODUCER
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert send.context is not None and send.context.trace_id == request.get_span_context().trace_id
    assert dict(send.attributes or {}) == {
        "messaging.system": "sqlqueue",
        "messaging.destination.name": TOPIC,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.message.id": "o-1",
        "messaging.destination.partition.id": str(message.partition),
    }
    assert stored_metadata(TOPIC, "o-1") == {"origin": "checkout", "traceparent": traceparent(send)}
    assert mine == {"origin": "checkout"}  # the caller's dict is not changed


def test_publish_without_an_active_span_records_and_injects_nothing(traced: Traced) -> None:
    publish(TOPIC, {"n": 1}, id="plain")
    publish(TOPIC, {"n": 2}, id="plain-meta", metadata={"a": 1})
    publish_many(TOPIC, [{"payload": 3, "id": "plain-many"}])
    assert traced.spans() == []
    assert stored_metadata(TOPIC, "plain") == {}
    assert stored_metadata(TOPIC, "plain-meta") == {"a": 1}
    assert stored_metadata(TOPIC, "plain-many") == {}


def test_a_traceparent_the_caller_put_in_metadata_is_kept(traced: Traced) -> None:
    theirs = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "x=1"}
    with traced.tracer.start_as_current_span("relay"):
        publish(TOPIC, {"n": 1}, id="relayed", metadata=theirs)
    assert stored_metadata(TOPIC, "relayed") == theirs
    traced.one(f"send {TOPIC}")  # recorded all the same


def test_publish_many_records_one_send_span_for_the_batch(traced: Traced) -> None:
    items = [{"payload": i, "id": f"b-{i}", "metadata": {"i": i}} for i in range(3)]
    with traced.tracer.start_as_current_span("import"):
        publish_many(TOPIC, items)
    send = traced.one(f"send {TOPIC}")
    assert send.attributes is not None and send.attributes["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in send.attributes
    for i in range(3):
        assert stored_metadata(TOPIC, f"b-{i}") == {"i": i, "traceparent": traceparent(send)}
    assert items[0]["metadata"] == {"i": 0}


def test_a_rolled_back_publish_keeps_its_send_span_but_no_message(traced: Traced) -> None:
    class Abort(Exception):
        pass

    with traced.tracer.start_as_current_span("request"), pytest.raises(Abort):
        with transaction.atomic():
            publish(TOPIC, {"n": 1}, id="rolled-back")
            raise Abort
    # The span describes the write, which happened; the outbox rolled the message back.
    assert traced.one(f"send {TOPIC}").status.status_code is StatusCode.UNSET
    assert not Message.objects.filter(topic=TOPIC, id="rolled-back").exists()


def test_a_failed_publish_records_the_error_on_its_send_span(traced: Traced) -> None:
    publish(TOPIC, {"n": 1}, id="taken")
    with traced.tracer.start_as_current_span("request"):
        with pytest.raises(IdempotencyConflict):
            publish(TOPIC, {"n": 2}, id="taken")
        with pytest.raises(InvalidMessage):
            publish_many(TOPIC, [{"payload": 1}, {"nope": 2}])
    single, batch = traced.spans(f"send {TOPIC}")
    for span, error in ((single, IdempotencyConflict), (batch, InvalidMessage)):
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes is not None
        assert span.attributes["error.type"] == f"django_sqlqueue.exceptions.{error.__qualname__}"
        assert [e.name for e in span.events] == ["exception"]


# -- process ---------------------------------------------------------------------------------


def test_handlers_run_in_a_process_span_linked_to_the_producer(traced: Traced) -> None:
    calls = Calls()

    def handler(message: Any) -> None:
        calls.add(message.id)
        if message.payload.get("forward"):
            publish("tr.forwarded", {"from": message.id})
        if message.payload.get("fail"):
            raise ValueError("boom")

    with traced.tracer.start_as_current_span("request"):
        publish(TOPIC, {"forward": True}, key="k", id="fwd")
        publish(TOPIC, {"fail": True}, key="k", id="bad")
    sends = {s.attributes["messaging.message.id"]: s for s in traced.spans(f"send {TOPIC}") if s.attributes}
    with running([spec(TOPIC, "billing", handler, max_attempts=1)], conf=fast_conf()):
        wait_until(lambda: len(traced.spans(f"process {TOPIC}")) == 2, what="two process spans")
    processed = {s.attributes["messaging.message.id"]: s for s in traced.spans(f"process {TOPIC}") if s.attributes}
    for message_id in ("fwd", "bad"):
        span, producer = processed[message_id], sends[message_id]
        assert span.kind is SpanKind.CONSUMER
        assert span.parent is None  # a trace of its own, linked to the producer
        assert [ids(link.context) for link in span.links] == [ids(producer.context)]
        attributes = dict(span.attributes or {})
        message = Message.objects.get(topic=TOPIC, id=message_id)
        assert attributes == {
            "messaging.system": "sqlqueue",
            "messaging.destination.name": TOPIC,
            "messaging.destination.partition.id": str(message.partition),
            "messaging.consumer.group.name": "billing",
            "messaging.message.id": message_id,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "sqlqueue.message.offset": message.offset,
            "sqlqueue.message.attempt": 1,
            **({"error.type": "builtins.ValueError"} if message_id == "bad" else {}),
        }
    assert processed["fwd"].status.status_code is StatusCode.UNSET
    assert processed["bad"].status.status_code is StatusCode.ERROR
    assert [e.attributes["exception.message"] for e in processed["bad"].events if e.attributes] == ["boom"]
    # The publish inside the handler continues the consumer's trace.
    forwarded = traced.one("send tr.forwarded")
    assert processed["fwd"].context is not None and forwarded.parent is not None
    assert forwarded.parent.span_id == processed["fwd"].context.span_id
    fwd_id = Message.objects.get(topic="tr.forwarded").metadata["traceparent"]
    assert fwd_id == traceparent(forwarded)


def test_a_timed_out_handler_ends_its_span_once_with_the_timeout(
    traced: Traced, caplog: pytest.LogCaptureFixture
) -> None:
    returned = threading.Event()

    def slow(message: Any) -> None:
        time.sleep(1.0)  # over the 0.3 s timeout: the watchdog abandons it, then it returns
        returned.set()

    caplog.set_level(logging.WARNING, logger="opentelemetry")
    publish(TOPIC, {"n": 1}, id="slow")
    with running([spec(TOPIC, "g", slow, timeout=0.3, max_attempts=1)], conf=fast_conf()):
        wait_until(returned.is_set, what="the abandoned handler to return")
    span = traced.one(f"process {TOPIC}")
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["error.type"] == "django_sqlqueue.exceptions.HandlerTimeout"
    assert span.end_time is not None and span.start_time is not None
    assert (span.end_time - span.start_time) / 1e9 < 0.9  # ended by the watchdog, not on return
    # Ended once: the SDK warns of a second end() or of attributes set on an ended span.
    assert [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry")] == []


def test_a_requested_retry_is_not_an_error(traced: Traced) -> None:
    from django_sqlqueue import Retry

    def handler(message: Any) -> None:
        if message.attempt == 1:
            raise Retry(delay=0.05)

    publish(TOPIC, {"n": 1}, id="again")
    with running([spec(TOPIC, "g", handler, max_attempts=3)], conf=fast_conf()):
        wait_until(lambda: len(traced.spans(f"process {TOPIC}")) == 2, what="two attempts")
    first, second = sorted(traced.spans(f"process {TOPIC}"), key=lambda s: s.start_time or 0)
    assert first.attributes is not None and first.attributes["sqlqueue.message.attempt"] == 1
    assert first.status.status_code is StatusCode.UNSET and [e.name for e in first.events] == ["exception"]
    assert second.attributes is not None and second.attributes["sqlqueue.message.attempt"] == 2


# -- django.tasks ------------------------------------------------------------------------------


def test_tasks_are_traced_from_enqueue_to_run(traced: Traced) -> None:
    from tests.support.task_helpers import running_worker, task_settings
    from tests.support.taskapp import tasks

    with task_settings():
        with traced.tracer.start_as_current_span("request"):
            result = tasks.add.enqueue(2, 3)
        send = traced.one("send tasks.default")
        assert (
            send.attributes is not None and send.attributes["sqlqueue.task.name"] == "tests.support.taskapp.tasks.add"
        )
        with running_worker():
            wait_until(lambda: traced.spans("process tasks.default"), what="the task's process span")
        run = traced.one("process tasks.default")
        assert run.attributes is not None
        assert run.attributes["sqlqueue.task.name"] == "tests.support.taskapp.tasks.add"
        assert run.attributes["messaging.message.id"] == result.id
        assert run.attributes["messaging.consumer.group.name"] == "tasks"
        assert [ids(link.context) for link in run.links] == [ids(send.context)]
        assert run.status.status_code is StatusCode.UNSET


# -- without opentelemetry ---------------------------------------------------------------------

NO_OTEL = """
import sys
sys.modules["opentelemetry"] = None  # "import opentelemetry" raises ImportError
import django
django.setup()
from django_sqlqueue import publish, publish_many, tracing
from tests.support.engine_helpers import Calls, fast_conf, running, spec, wait_until
assert not tracing.ENABLED
calls = Calls()
publish("tr.noop", {"n": 1}, metadata={"a": 1})
publish_many("tr.noop", [{"payload": 2}])
with running([spec("tr.noop", "g", lambda m: calls.add(m.metadata))], conf=fast_conf()):
    wait_until(lambda: len(calls) == 2, what="both handled")
print("HANDLED", json.dumps(sorted(calls.list(), key=len)))
"""


def test_without_opentelemetry_publish_and_consume_work() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.support.settings", "DATABASE_URL": database_url()}
    done = subprocess.run(
        [sys.executable, "-c", "import json\n" + NO_OTEL],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("HANDLED "))
    assert json.loads(line.removeprefix("HANDLED ")) == [{}, {"a": 1}]
