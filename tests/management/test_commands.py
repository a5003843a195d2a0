"""manage.py queue_status, queue_gc and runconsumer, through call_command (in-process)."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import override_settings

from django_sqlqueue import consumer, publish_many
from django_sqlqueue.consumers import registry
from django_sqlqueue.models import Message, PartitionLease, SubscriberHeartbeat

from ..ops.test_status import build_state
from ..support.engine_helpers import FAST, Calls, caught_up, key_for_partition, publish_to, store, wait_until
from ..support.factories import ConsumerOffsetFactory

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


# -- queue_status ----------------------------------------------------------------------------


def test_queue_status_table():
    build_state()
    lines = run("queue_status").splitlines()
    assert lines[0].split() == [
        "group", "topic", "partition", "head", "watermark", "unsequenced", "lag", "in", "flight", "retrying", "leased",
        "by",
    ]  # fmt: skip
    cells = [line.split() for line in lines[1:7]]
    assert cells == [
        ["g1", "st", "0", "10", "3", "0", "7", "2", "1", "w1"],
        ["g1", "st", "1", "4", "4", "2", "2", "0", "0", "w2", "(expired)"],
        ["g2", "st", "0", "10", "0", "0", "10", "0", "0", "-"],
        ["g2", "st", "1", "4", "0", "2", "6", "0", "0", "-"],
        ["g_1", "st", "0", "10", "0", "0", "10", "0", "0", "-"],
        ["g_1", "st", "1", "4", "0", "2", "6", "0", "0", "-"],
    ]
    assert lines[7] == ""
    assert lines[8:] == [
        (
            "group g1: 1 topic(s), 2 partition(s), lag 9, waiting for the sequencer 2, in flight 2, retrying 1, "
            "dead letters 1, live subscribers 1"
        ),
        (
            "group g2: 1 topic(s), 2 partition(s), lag 16, waiting for the sequencer 2, in flight 0, retrying 0, "
            "dead letters 0, live subscribers 1"
        ),
        (
            "group g_1: 1 topic(s), 2 partition(s), lag 16, waiting for the sequencer 2, in flight 0, retrying 0, "
            "dead letters 0, live subscribers 0"
        ),
        "dead-letter topics (kept until replayed or purged): st_dlq",
    ]
    # Columns are aligned: every row starts its "head" column at the same position.
    starts = {line.index(" 10 ") if " 10 " in line else line.index(" 4 ") for line in lines[1:7]}
    assert len(starts) == 1


def test_queue_status_table_filters_and_empty():
    assert run("queue_status").strip() == "no consumer group has consumed anything yet"
    build_state()
    out = run("queue_status", "--group", "g2")
    assert "g1" not in out and "group g2:" in out
    assert run("queue_status", "--topic", "other").startswith("no consumer group has consumed anything yet")


def test_queue_status_json():
    build_state()
    data = json.loads(run("queue_status", "--json"))
    assert set(data) == {"database", "partitions", "groups", "atomic_consumers"}
    assert data["database"] == "default"
    g1a = next(p for p in data["partitions"] if p["group"] == "g1" and p["partition"] == 0)
    assert g1a == {
        "group": "g1",
        "topic": "st",
        "partition": 0,
        "head": 10,
        "watermark": 3,
        "unsequenced": 0,
        "lag": 7,
        "in_flight": 2,
        "retrying": 1,
        "scheduled": 1,
        "lease_holder": "w1",
        "lease_live": True,
    }
    assert [g["group"] for g in data["groups"]] == ["g1", "g2", "g_1"]
    assert data["groups"][1] == {
        "group": "g2",
        "topics": ["st"],
        "partitions": 2,
        "lag": 16,
        "in_flight": 0,
        "retrying": 0,
        "dead_letters": 0,
        "live_subscribers": 1,
        "unsequenced": 2,
    }
    assert json.loads(run("queue_status", "--json", "--group", "nobody")) == {
        "database": "default",
        "partitions": [],
        "groups": [],
        "atomic_consumers": [],
    }


# -- queue_gc ----------------------------------------------------------------------------------


def test_queue_gc_command():
    for topic in ("cmd.a", "cmd.b"):
        publish_to(topic, 0, 5)
        store().register_topic(topic, 8)  # as its workers do: queue_gc walks the registry
    ConsumerOffsetFactory(consumer_group="g", topic="cmd.a", partition=0, offset_acked=3)
    ConsumerOffsetFactory(consumer_group="g", topic="cmd.b", partition=0, offset_acked=5)
    out = run("queue_gc", "--topic", "cmd.a")
    assert out.splitlines() == [
        "cmd.a: deleted 3 message(s)",
        "deleted 3 message(s) in 1 topic(s)",
    ]
    assert Message.objects.filter(topic="cmd.a").count() == 2
    assert Message.objects.filter(topic="cmd.b").count() == 5
    out = run("queue_gc")
    assert out.splitlines() == [
        "cmd.b: deleted 5 message(s)",
        "deleted 5 message(s) in 2 topic(s)",
    ]
    out = run("queue_gc", "--verbosity", "2")
    assert out.splitlines() == [
        "cmd.a: deleted 0 message(s)",
        "cmd.b: deleted 0 message(s)",
        "deleted 0 message(s) in 2 topic(s)",
    ]
    assert Message.objects.count() == 2


# -- runconsumer ----------------------------------------------------------------------------------


def test_runconsumer_without_a_matching_consumer_names_the_registered_pairs():
    with pytest.raises(CommandError) as info:
        call_command("runconsumer", "--group", "nobody", "--topic", "nothing")
    text = str(info.value)
    assert "no registered consumer matches --group ['nobody'] --topic ['nothing']" in text
    # The test project's consumers are discovered and listed.
    assert "registered group:topic pairs:" in text
    assert "analytics:orders.created" in text and "billing:orders.created" in text


@pytest.fixture
def restore_logger():
    logger = logging.getLogger("django_sqlqueue")
    level, handlers, propagate = logger.level, list(logger.handlers), logger.propagate
    yield
    logger.setLevel(level)
    logger.handlers[:] = handlers
    logger.propagate = propagate


def test_runconsumer_runs_matching_consumers_until_sigterm(restore_logger):
    """In this process: the command runs the worker on the main thread; a SIGTERM from a
    helper thread drains it once every message is handled."""
    calls = Calls()

    @consumer("cmd.run", group="cmd-g", batch_size=3)
    def handle(message):
        calls.add((message.partition, message.offset))

    try:
        publish_many(
            "cmd.run",
            [{"payload": i, "key": key_for_partition(p)} for i in range(4) for p in (0, 1)],
        )
        previous = signal.getsignal(signal.SIGTERM)
        errors: list[BaseException] = []

        def stop_when_done() -> None:
            try:
                wait_until(lambda: caught_up("cmd-g", "cmd.run", [0, 1]), timeout=15)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            finally:
                connections.close_all()
                # Only while runconsumer's handler is installed: the default one would end pytest.
                if signal.getsignal(signal.SIGTERM) is not previous:
                    os.kill(os.getpid(), signal.SIGTERM)

        helper = threading.Thread(target=stop_when_done, daemon=True)
        with override_settings(SQLQUEUE=FAST):
            helper.start()
            call_command(
                "runconsumer",
                "--group",
                "cmd-g",
                "--name",
                "cmd-worker",
                "--verbosity",
                "0",
            )
        helper.join(5)
        assert not errors, errors
        assert signal.getsignal(signal.SIGTERM) is previous  # handlers restored
    finally:
        registry.unregister("cmd-g", "cmd.run")

    assert sorted(calls.list()) == [(p, off) for p in (0, 1) for off in range(1, 5)]
    assert not PartitionLease.objects.exists()
    hb = SubscriberHeartbeat.objects.get(consumer_group="cmd-g", subscriber_name="cmd-worker")
    assert hb.deregistered_at is not None
    # Only the selected group ran: the test project's consumers saw nothing.
    assert not SubscriberHeartbeat.objects.exclude(consumer_group="cmd-g").exists()
