"""Django signals (django_sqlqueue/signals.py): sent on commit, by a real in-process worker,
and a receiver that raises never breaks a publish or a delivery."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction

from django_sqlqueue import Reject, publish, publish_many, signals
from django_sqlqueue.exceptions import HandlerTimeout
from django_sqlqueue.worker.loop import Worker

from .support.engine_helpers import caught_up, dead_letters, fast_conf, publish_to, running, spec, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "sig.events"


class Received:
    """Records (signal name, sender, kwargs) of every signal of the module (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[str, Any, dict[str, Any]]] = []

    def of(self, name: str) -> list[tuple[Any, dict[str, Any]]]:
        with self.lock:
            return [(sender, kwargs) for n, sender, kwargs in self.items if n == name]


@pytest.fixture
def received() -> Iterator[Received]:
    got = Received()
    names = [
        "message_published",
        "message_processed",
        "message_failed",
        "message_dead_lettered",
        "worker_started",
        "worker_stopping",
    ]
    receivers = {}
    for name in names:

        def receiver(sender: Any, signal: Any = None, _name: str = name, **kwargs: Any) -> None:
            with got.lock:
                got.items.append((_name, sender, kwargs))

        receivers[name] = receiver
        getattr(signals, name).connect(receiver, weak=False)
    yield got
    for name, receiver in receivers.items():
        getattr(signals, name).disconnect(receiver)


def test_published_is_sent_on_commit_and_never_for_a_rollback(received):
    with transaction.atomic():
        kept = publish(TOPIC, {"n": 1}, key="a")
        assert received.of("message_published") == []  # not before the commit
    ((sender, kwargs),) = received.of("message_published")
    assert sender == TOPIC and kwargs["message"] == kept

    with pytest.raises(RuntimeError), transaction.atomic():
        publish(TOPIC, {"n": 2}, key="a")
        raise RuntimeError("roll back")
    assert len(received.of("message_published")) == 1

    publish(TOPIC, {"n": 1}, key="a", id=kept.id)  # a re-publish that stores nothing
    assert len(received.of("message_published")) == 1
    many = publish_many(TOPIC, [{"payload": i, "key": "b"} for i in range(3)])  # outside a transaction: at once
    assert [kw["message"] for _, kw in received.of("message_published")[1:]] == many


def test_a_receiver_that_raises_breaks_neither_a_publish_nor_a_delivery(caplog):
    def broken(sender: Any, **kwargs: Any) -> None:
        raise ValueError("receiver bug")

    signals.message_published.connect(broken, weak=False)
    signals.message_processed.connect(broken, weak=False)
    try:
        with caplog.at_level(logging.ERROR, logger="django_sqlqueue.signals"):
            publish_to(TOPIC, 0, 2)
            with running([spec(TOPIC, "g", lambda m: None)], allow_errors=True):
                wait_until(lambda: caught_up("g", TOPIC), 10, "both acked")
    finally:
        signals.message_published.disconnect(broken)
        signals.message_processed.disconnect(broken)
    errors = [r for r in caplog.records if r.name == "django_sqlqueue.signals"]
    assert len(errors) == 4  # two publishes, two deliveries
    assert "ValueError: receiver bug (ignored)" in errors[0].getMessage() and errors[0].exc_info


def test_a_worker_sends_processed_failed_dead_lettered_started_and_stopping(received):
    publish_to(TOPIC, 0, 1, payload=lambda i: {"ok": True})
    publish_to(TOPIC, 1, 1, payload=lambda i: {"fail": True})
    publish_to(TOPIC, 2, 1, payload=lambda i: {"reject": True})

    def handler(message):
        if message.payload.get("fail"):
            raise ValueError("boom")
        if message.payload.get("reject"):
            raise Reject("poison")

    with running([spec(TOPIC, "g", handler, max_attempts=2)], name="sig-w") as worker:
        wait_until(lambda: len(dead_letters(f"{TOPIC}_dlq")) == 2, 15, "two dead letters")
        wait_until(lambda: caught_up("g", TOPIC), 10, "everything acked")
    ((sender, started),) = received.of("worker_started")
    assert sender is Worker and started["worker"] is worker and started["name"] == "sig-w"
    assert [kw["name"] for _, kw in received.of("worker_stopping")] == ["sig-w"]

    ((sender, processed),) = received.of("message_processed")
    assert sender == TOPIC and processed["message"].payload == {"ok": True} and processed["duration"] >= 0
    assert processed["message"].group == "g" and processed["message"].partition == 0

    failed = [
        (kw["message"].partition, kw["message"].attempt, type(kw["error"]).__name__, kw["final"])
        for _, kw in received.of("message_failed")
    ]
    assert sorted(failed) == [(1, 1, "ValueError", False), (1, 2, "ValueError", True), (2, 1, "Reject", True)]

    dead = sorted((kw["partition"], kw["attempts"], kw["error"]) for _, kw in received.of("message_dead_lettered"))
    assert dead == [(1, 2, "builtins.ValueError: boom"), (2, 1, "django_sqlqueue.exceptions.Reject: poison")]
    assert {kw["dlq_topic"] for _, kw in received.of("message_dead_lettered")} == {f"{TOPIC}_dlq"}


def test_a_timed_out_handler_is_a_failed_attempt_signal(received):
    release = threading.Event()
    publish_to(TOPIC, 0, 1)
    conf = fast_conf(MAX_ATTEMPTS=5, BACKOFF_MIN=30, BACKOFF_MAX=30)
    try:
        with running([spec(TOPIC, "g", lambda m: release.wait(), timeout=0.3)], conf=conf):
            wait_until(lambda: received.of("message_failed"), 10, "the failed attempt")
    finally:
        release.set()
    ((sender, kwargs),) = received.of("message_failed")
    assert sender == TOPIC and isinstance(kwargs["error"], HandlerTimeout) and kwargs["final"] is False
    assert kwargs["duration"] >= 0.3 and kwargs["message"].attempt == 1
    assert received.of("message_processed") == []
