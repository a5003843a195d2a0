"""Push wake-ups on PostgreSQL (django_sqlqueue/worker/threads/listener.py), with real processes.

A worker whose poll intervals are 300 s handles a message within seconds only if a
notification woke it; a worker whose listener connection is killed goes on (polling finds
the message) and listens again; a rolled-back publish notifies nobody.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection, transaction

from django_sqlqueue import publish
from django_sqlqueue.rules.notify_channels import MAX_CHANNEL_BYTES, channel_for
from tests.support.consumerapp.models import Handled
from tests.support.processes import wait_until

TOPIC = "proc.events"

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="notifications are PostgreSQL's (LISTEN/NOTIFY)"
)


def test_channel_names_fit_postgresql_identifiers_and_differ_per_topic():
    assert channel_for("orders") == "sqlqueue.orders"
    long_a, long_b = "a" * 100 + ".x", "a" * 100 + ".y"
    assert len(channel_for(long_a).encode()) <= MAX_CHANNEL_BYTES
    assert channel_for(long_a) != channel_for(long_b)
    assert channel_for(long_a).startswith("sqlqueue." + "a" * 30)


def listeners() -> list[tuple[int, str]]:
    """(pid, application_name) of the workers' listener connections that are listening now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, application_name FROM pg_stat_activity "
            "WHERE application_name LIKE 'sqlqueue-listener %%' AND query LIKE 'LISTEN%%'"
        )
        return cursor.fetchall()


def handled(message_id: str) -> bool:
    return Handled.objects.filter(message_id=message_id).exists()


def leased(name: str) -> bool:
    from django_sqlqueue.models import PartitionLease

    return PartitionLease.objects.filter(consumer_group="g1", topic=TOPIC, leased_by=name).count() == 8


def listening_worker(runconsumer: Any, *, poll: float) -> tuple[Any, int]:
    """A worker ``w1`` polling every ``poll`` seconds at most 1 s apart, once it holds every
    partition and listens; and its listener's backend pid."""
    worker = runconsumer(
        "w1",
        "--group",
        "g1",
        settings="tests.support.process_settings_notify",
        env={"SQLQUEUE_TEST_POLL": str(poll), "SQLQUEUE_TEST_POLL_MAX": "1"},
    )
    wait_until(lambda: leased("w1"), 20, "w1 holds every partition", show=worker.log)
    (pid, _), *_ = wait_until(listeners, 20, "the listener's LISTEN", show=worker.log)
    return worker, pid


@postgresql_only
@pytest.mark.slow
def test_a_notification_wakes_a_worker_sleeping_on_a_long_interval(runconsumer):
    worker = runconsumer("w1", "--group", "g1", settings="tests.support.process_settings_notify")
    wait_until(lambda: leased("w1"), 20, "w1 holds every partition", show=worker.log)
    wait_until(listeners, 20, "the listener's LISTEN", show=worker.log)
    time.sleep(1.0)  # its first poll rounds are over: the next look is 300 s away
    for i in range(3):
        sent = time.monotonic()
        message = publish(TOPIC, {"n": i}, key=f"k{i}")
        wait_until(lambda m=message: handled(m.id), 5, f"message {i} handled", interval=0.02, show=worker.log)
        # Far below any wait of the 300 s cadence (its shortest look is 300 / 8 = 37.5 s).
        assert time.monotonic() - sent < 5
        time.sleep(0.5)
    assert "listening for new messages" in worker.log()


@postgresql_only
@pytest.mark.slow
def test_a_lost_listener_is_healed_by_polling_and_listens_again(runconsumer):
    worker, pid = listening_worker(runconsumer, poll=0.2)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    # Published while nobody listens: its notification is lost, the worker's polls find it.
    message = publish(TOPIC, {"n": 1}, key="k1")
    wait_until(lambda: handled(message.id), 20, "the message handled by polling", show=worker.log)
    wait_until(lambda: "listener lost its connection" in worker.log(), 10, "the loss logged", show=worker.log)
    again = wait_until(lambda: [p for p, _ in listeners() if p != pid], 20, "a new LISTEN", show=worker.log)
    assert again and worker.alive()
    second = publish(TOPIC, {"n": 2}, key="k2")
    wait_until(lambda: handled(second.id), 20, "a later message handled", show=worker.log)


@postgresql_only
@pytest.mark.slow
def test_a_message_whose_notification_is_lost_is_found_by_polling(runconsumer, settings):
    """While its listener is connected, a worker that delivered something waits for the next
    notification instead of polling again at once (cadence.py). A message whose notification
    never comes (here: published with NOTIFY off, as by the Spark writer) is still handled,
    by the look ``POLL_INTERVAL`` later -- not by a reconnect: the listener stays the same."""
    worker, pid = listening_worker(runconsumer, poll=0.5)
    first = publish(TOPIC, {"n": 1}, key="k1")
    wait_until(lambda: handled(first.id), 5, "the notified message handled", interval=0.02, show=worker.log)
    settings.SQLQUEUE = {**settings.SQLQUEUE, "NOTIFY": False}
    silent = publish(TOPIC, {"n": 2}, key="k1")
    wait_until(lambda: handled(silent.id), 10, "the message without a notification handled", show=worker.log)
    assert [p for p, _ in listeners()] == [pid]  # found by polling, not by a new listener
    assert "listener lost its connection" not in worker.log()


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_only_a_committed_publish_notifies_its_topic_channel():
    import psycopg

    raw = psycopg.connect(**connection.get_connection_params(), autocommit=True)
    try:
        raw.execute(f'LISTEN "{channel_for(TOPIC)}"')

        class RolledBack(Exception):
            pass

        with pytest.raises(RolledBack), transaction.atomic():
            publish(TOPIC, {"n": 1}, key="k1")
            raise RolledBack
        assert [n.channel for n in raw.notifies(timeout=0.5)] == []
        with transaction.atomic():
            # One transaction, ten messages: one notification per partition, its payload.
            sent = [publish(TOPIC, {"n": i}, key=f"k{i % 5}") for i in range(10)]
            publish("other.topic", {"n": 0})
        notices = list(raw.notifies(timeout=0.5))
        assert {n.channel for n in notices} == {channel_for(TOPIC)}
        assert sorted(int(n.payload) for n in notices) == sorted({m.partition for m in sent})
    finally:
        raw.close()


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_notify_false_publishes_without_notifying(settings):
    import psycopg

    settings.SQLQUEUE = {**settings.SQLQUEUE, "NOTIFY": False}
    raw = psycopg.connect(**connection.get_connection_params(), autocommit=True)
    try:
        raw.execute(f'LISTEN "{channel_for(TOPIC)}"')
        publish(TOPIC, {"n": 1}, key="k1")
        assert [n.channel for n in raw.notifies(timeout=0.5)] == []
    finally:
        raw.close()


@postgresql_only
@pytest.mark.slow
def test_a_worker_is_woken_only_for_the_partitions_it_leases(runconsumer):
    from django_sqlqueue.models import PartitionLease

    w1 = runconsumer("w1", "--group", "g1", settings="tests.support.process_settings_notify")
    runconsumer("w2", "--group", "g1", settings="tests.support.process_settings_notify")

    def balanced() -> bool:
        leases = PartitionLease.objects.filter(consumer_group="g1", topic=TOPIC)
        owners = list(leases.values_list("leased_by", flat=True))
        return len(owners) == 8 and owners.count("w1") == 4

    wait_until(balanced, 40, "4 partitions each", show=w1.log)
    wait_until(lambda: len(listeners()) == 2, 20, "both listeners", show=w1.log)
    time.sleep(1.0)
    for i in range(6):
        message = publish(TOPIC, {"n": i}, key=f"k{i}")
        # Woken at once whoever leases it (the other worker ignores the notification).
        wait_until(lambda m=message: handled(m.id), 5, f"message {i} handled", interval=0.02, show=w1.log)


def test_the_listener_wakes_its_worker_only_for_the_partitions_it_wants():
    from django_sqlqueue.worker.outage import OutageReporter
    from django_sqlqueue.worker.threads.listener import Listener

    woke: list[int] = []
    listener = Listener(
        ["t"],
        using="default",
        outage=OutageReporter(alias="default", report_interval=30),
        wake=lambda: woke.append(1),
        on_connected=lambda connected: None,
        wanted=lambda channel, partition: channel == "sqlqueue.t" and partition in {1, 3},
        name="w",
        reconnect_interval=1,
    )
    try:
        assert listener._wants(b"sqlqueue.t", b"3")
        assert not listener._wants(b"sqlqueue.t", b"2")
        assert listener._wants(b"sqlqueue.t", b"")  # an older publisher's empty payload: wake
    finally:
        listener.stop()
