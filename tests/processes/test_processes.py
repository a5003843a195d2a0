"""Concurrency claims proven with real ``manage.py runconsumer`` processes.

Workers run ``tests/support/consumerapp/consumers.py`` with fast clocks (tests/support/process_settings.py:
3 s leases renewed every 0.5 s, 4 s visibility timeouts). They record every handler call
in ``Handled``; assertions read the database. Nothing is mocked: processes are started,
SIGTERMed, SIGSTOPped and ``kill -9``ed for real.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter, defaultdict

import pytest
from django.core.management import call_command
from django.db.models import Max, Min

from django_sqlqueue import publish, publish_many
from django_sqlqueue.models import ConsumerOffset, Message, Partition, PartitionLease, SubscriberHeartbeat
from django_sqlqueue.ops.status import queue_status
from tests.support.consumerapp.models import Handled
from tests.support.engine_helpers import key_for_partition
from tests.support.processes import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TOPIC = "proc.events"
LEASE_DURATION = 3
VISIBILITY_TIMEOUT = 4


@pytest.fixture
def partitions(settings, monkeypatch):
    """Give TOPIC ``n`` partitions in this process (publishers) and in the workers started after."""

    def use(n: int) -> None:
        topics = {TOPIC: {"partitions": n}}
        settings.SQLQUEUE = {**settings.SQLQUEUE, "TOPICS": topics}
        monkeypatch.setenv("SQLQUEUE_TEST_TOPICS", json.dumps(topics))

    return use


@pytest.fixture
def workers(runconsumer):
    """Start runconsumer processes with the default test settings (the conftest fixture)."""
    return runconsumer


def leases(group: str, topic: str = TOPIC) -> dict[str, int]:
    return dict(
        Counter(PartitionLease.objects.filter(consumer_group=group, topic=topic).values_list("leased_by", flat=True))
    )


def heartbeats() -> list[tuple[str, object]]:
    return list(SubscriberHeartbeat.objects.values_list("subscriber_name", "heartbeat_at"))


def lag(group: str, topic: str = TOPIC) -> int:
    """Messages of ``topic`` not acked by ``group``, counting those not sequenced yet.

    Three reads, not one snapshot, so their order matters: unsequenced messages first, then
    the heads, then the watermarks. A message sequenced between two reads is then counted
    (in the first, or below the head) and never missed; the other order read a head from
    before a sequencing round and the unsequenced count from after it, and answered 0 while
    those messages were still to be handled. Over-counting only makes a wait longer.
    """
    unsequenced = Message.objects.filter(topic=topic, offset__isnull=True).count()
    heads = dict(Partition.objects.filter(topic=topic).values_list("partition", "head_offset"))
    marks = dict(
        ConsumerOffset.objects.filter(consumer_group=group, topic=topic).values_list("partition", "offset_acked")
    )
    return sum(head - marks.get(p, 0) for p, head in heads.items()) + unsequenced


def offset_of(message_id: str, topic: str = TOPIC) -> int | None:
    return Message.objects.get(topic=topic, id=message_id).offset


def publish_partitions(n: int, topic: str = TOPIC, per_partition: int = 1, **payload) -> None:
    """One message (or ``per_partition``) in each of the ``n`` partitions of the topic."""
    publish_many(
        topic,
        [{"payload": payload, "key": key_for_partition(p, n)} for _ in range(per_partition) for p in range(n)],
    )


#: A key of partition 0 of a topic with the default 8 partitions.
K = key_for_partition(0)


def test_fair_share_rebalance_and_graceful_shutdown(workers, partitions):
    """3 workers, 12 partitions: 4 each; stop one gracefully: its leases are free at once, then 6 each."""
    partitions(12)
    publish_partitions(12)
    procs = [workers(f"w{i}", "--group", "g1", "--topic", TOPIC) for i in range(3)]
    wait_until(lambda: leases("g1") == {"w0": 4, "w1": 4, "w2": 4}, 20, "4 partitions each")
    assert lag("g1") == 0 or wait_until(lambda: lag("g1") == 0, 10, "the 12 messages consumed")

    assert procs[2].terminate() == 0
    # Released before the process exited: no waiting for lease expiry.
    assert "w2" not in leases("g1")
    heartbeat = SubscriberHeartbeat.objects.get(consumer_group="g1", topic=TOPIC, subscriber_name="w2")
    assert heartbeat.deregistered_at is not None
    started = time.monotonic()
    wait_until(lambda: leases("g1") == {"w0": 6, "w1": 6}, 10, "6 partitions each")
    assert time.monotonic() - started < LEASE_DURATION, "takeover must not wait for the lease to expire"
    assert "released all leases" in procs[2].log()


def test_kill9_failover_redelivers_in_flight_message_after_visibility_timeout(workers, partitions):
    """kill -9 mid-handler: partitions are stolen after the lease expires, and the
    in-flight message is redelivered to the other worker after its visibility timeout."""
    partitions(4)
    publish_partitions(4)
    a = workers("a", "--group", "g1", "--topic", TOPIC)
    wait_until(lambda: leases("g1") == {"a": 4}, 15, "a holds every partition")
    wait_until(lambda: lag("g1") == 0, 10, "first messages consumed")
    b = workers("b", "--group", "g1", "--topic", TOPIC)
    wait_until(lambda: leases("g1") == {"a": 2, "b": 2}, 15, "2 partitions each")
    a_parts = sorted(
        PartitionLease.objects.filter(consumer_group="g1", leased_by="a").values_list("partition", flat=True)
    )

    victim = publish(TOPIC, {"sleep_first": 60}, key=key_for_partition(a_parts[0], 4))
    wait_until(lambda: Handled.objects.filter(message_id=victim.id, worker="a").exists(), 10, "a starts the message")
    a.kill9()
    killed_at = time.monotonic()

    redelivery = wait_until(
        lambda: Handled.objects.filter(message_id=victim.id, worker="b").first(), 30, "redelivery to b"
    )
    first = Handled.objects.get(message_id=victim.id, worker="a")
    assert redelivery.attempt == 2 and first.attempt == 1
    assert (redelivery.handled_at - first.handled_at).total_seconds() >= VISIBILITY_TIMEOUT - 0.1
    wait_until(lambda: leases("g1") == {"b": 4}, 10, "b holds every partition")
    assert time.monotonic() - killed_at >= LEASE_DURATION - 1  # the lease was stolen, not handed over
    wait_until(lambda: lag("g1") == 0, 15, "everything acked")
    assert not b.log().count("Traceback"), b.log()


def test_every_group_processes_every_message_in_partition_order(workers, partitions):
    """Two groups, three workers each running both; publishing while they run. Every
    message is handled once per group, each partition in offset order, each key in
    publish order."""
    partitions(6)
    keys = [key_for_partition(p, 6) for p in range(6)]
    published = publish_many(TOPIC, [{"payload": {}, "key": keys[p]} for p in range(6)])
    procs = [workers(f"w{i}", "--topic", TOPIC) for i in range(3)]
    wait_until(lambda: leases("g1") == {"w0": 2, "w1": 2, "w2": 2}, 20, "g1 balanced")
    wait_until(lambda: leases("g2") == {"w0": 2, "w1": 2, "w2": 2}, 20, "g2 balanced")
    for batch in range(10):
        published += publish_many(TOPIC, [{"payload": {"batch": batch}, "key": keys[i % 6]} for i in range(60)])
        published.append(publish(TOPIC, {"single": batch}, key=keys[batch % 6]))
    wait_until(lambda: lag("g1") == 0 and lag("g2") == 0, 60, "both groups drained")

    assert len({m.id for m in published}) == 6 + 610
    in_publish_order: dict[str, list[str]] = defaultdict(list)
    for m in published:
        in_publish_order[m.key].append(m.id)
    for group in ("g1", "g2"):
        rows = list(
            Handled.objects.filter(group=group).values_list("partition", "key", "offset", "message_id", "attempt")
        )
        assert sorted(r[3] for r in rows) == sorted(m.id for m in published)  # each once
        assert all(attempt == 1 for *_, attempt in rows)  # no failure, no redelivery
        by_partition: dict[int, list[int]] = defaultdict(list)
        by_key: dict[str, list[str]] = defaultdict(list)
        for partition, key, offset, message_id, _ in rows:  # Handled ids follow the order handlers ran in
            by_partition[partition].append(offset)
            by_key[key].append(message_id)
        for partition, offsets in by_partition.items():
            assert offsets == list(range(1, len(offsets) + 1)), f"{group} partition {partition} out of order"
        assert by_key == in_publish_order, f"{group}: a key's messages were not handled in publish order"
    for p in procs:
        assert p.terminate() == 0


def test_failing_message_is_dead_lettered_for_its_group_only(workers):
    publish(TOPIC, {"fail": ["g1"]}, key=K, id="bad-1")
    fine = publish(TOPIC, {"ok": True}, key=K)
    workers("w", "--topic", TOPIC)
    wait_until(lambda: lag("g1") == 0 and lag("g2") == 0, 30, "both groups done")

    dead = Message.objects.get(topic=f"{TOPIC}_dlq")
    assert dead.id == "g1:bad-1" and dead.key == K
    assert dead.original_topic == TOPIC and dead.failure_count == 3 and dead.failed_at is not None
    assert "ScriptedFailure: scripted failure of bad-1 in g1" in dead.last_error
    assert dead.payload == {"fail": ["g1"]}
    assert dead.metadata["dead_letter"] == {
        "consumer_group": "g1",
        "original_partition": 0,
        "original_offset": offset_of("bad-1"),
        "original_id": "bad-1",
    }
    assert list(Handled.objects.filter(group="g1", message_id="bad-1").values_list("attempt", flat=True)) == [1, 2, 3]
    # g2 got it once, succeeded; the original is still in the log for it; the other message flowed.
    assert list(Handled.objects.filter(group="g2", message_id="bad-1").values_list("attempt", flat=True)) == [1]
    assert Handled.objects.filter(message_id=fine.id).count() == 2
    status = {s.group: s for s in queue_status(topic=TOPIC).groups}
    assert status["g1"].dead_letters == 1 and status["g2"].dead_letters == 0


def test_nacked_head_does_not_block_more_than_a_batch_of_later_messages(workers):
    """The RFC's fetch (offset > watermark LIMIT batch_size) stalls here; ours must not."""
    head = publish(TOPIC, {"retry": ["g1"], "delay": 60}, key=K)
    worker = workers("w", "--group", "g1", "--topic", TOPIC)
    wait_until(lambda: Handled.objects.filter(message_id=head.id).exists(), 15, "the head delivered and nacked")
    head_offset = offset_of(head.id)
    later = publish_many(TOPIC, [{"payload": {"n": i}, "key": K} for i in range(35)])  # > 3 batches
    started = time.monotonic()
    wait_until(
        lambda: Handled.objects.filter(group="g1", offset__gt=head_offset).count() == 35, 15, "35 later messages"
    )
    assert time.monotonic() - started < 10
    assert Handled.objects.filter(message_id=head.id).count() == 1  # still waiting for its retry
    assert ConsumerOffset.objects.get(consumer_group="g1", partition=0).offset_acked == head_offset - 1
    (partition,) = [p for p in queue_status(group="g1", topic=TOPIC).partitions if p.partition == 0]
    assert partition.retrying == 1 and partition.lag == 36 and partition.in_flight == 0
    assert [offset_of(m.id) for m in later] == list(range(head_offset + 1, head_offset + 36))
    assert worker.terminate() == 0


def test_strict_serialization_with_batch_size_one(workers):
    """batch_size=1: one message of a partition at a time, in order, across two workers."""
    publish_many("proc.strict", [{"payload": {"sleep": 0.02}, "key": key_for_partition(i % 2)} for i in range(40)])
    workers("x", "--group", "strict")
    workers("y", "--group", "strict")
    wait_until(lambda: lag("strict", "proc.strict") == 0, 40, "strict topic drained")
    rows = list(Handled.objects.filter(group="strict").values_list("partition", "offset", "attempt"))
    for partition in (0, 1):
        offsets = [o for p, o, _ in rows if p == partition]
        assert offsets == list(range(1, 21))


def test_gc_never_deletes_what_a_group_has_not_acked(workers):
    """g1 is fast; g2 is slow and then killed with -9: GC keeps everything above g2's watermark."""
    publish_many(TOPIC, [{"payload": {"sleep_in": {"g2": 0.1}}, "key": K} for _ in range(120)])
    fast = workers("fast", "--group", "g1", "--topic", TOPIC)
    slow = workers("slow", "--group", "g2", "--topic", TOPIC)
    wait_until(lambda: lag("g1") == 0, 30, "g1 drained")
    # (filter, not get: g2's watermark row appears only once its worker leased the partition)
    wait_until(
        lambda: ConsumerOffset.objects.filter(consumer_group="g2", partition=0, offset_acked__gt=5).exists(),
        20,
        "g2 started",
    )
    slow.kill9()
    for _ in range(3):
        call_command("queue_gc", verbosity=0)
        time.sleep(1.2)  # the fast worker's own GC runs every second too
        g2_mark = ConsumerOffset.objects.get(consumer_group="g2", partition=0).offset_acked
        remaining = Message.objects.filter(topic=TOPIC, partition=0).aggregate(lo=Min("offset"), hi=Max("offset"))
        assert remaining["hi"] == 120
        assert remaining["lo"] == g2_mark + 1, "GC must delete exactly what every group acked"
    assert Message.objects.filter(topic=TOPIC).count() == 120 - g2_mark
    # g2 comes back: it gets the rest, then GC removes everything.
    workers("slow2", "--group", "g2", "--topic", TOPIC)
    wait_until(lambda: lag("g2") == 0, 40, "g2 drained")
    wait_until(lambda: not Message.objects.filter(topic=TOPIC).exists(), 10, "GC after both groups acked")
    handled_by_g2 = set(Handled.objects.filter(group="g2").values_list("offset", flat=True))
    assert handled_by_g2 == set(range(1, 121))
    assert fast.terminate() == 0


def test_stopped_worker_loses_its_leases_and_stops_taking_messages(workers, partitions):
    """SIGSTOP past the lease: another worker steals; on SIGCONT the stopped one notices."""
    partitions(2)
    publish_partitions(2)
    a = workers("a", "--group", "g1", "--topic", TOPIC)
    wait_until(lambda: leases("g1") == {"a": 2}, 15, "a holds both partitions")
    wait_until(lambda: lag("g1") == 0, 10, "first messages consumed")
    a.signal(signal.SIGSTOP)
    try:
        b = workers("b", "--group", "g1", "--topic", TOPIC)
        wait_until(
            lambda: leases("g1") == {"b": 2},
            20,
            "b steals both after the lease expires",
            show=lambda: (leases("g1"), heartbeats()),
        )
        during = publish_many(TOPIC, [{"payload": {"n": i}, "key": key_for_partition(i % 2, 2)} for i in range(10)])
        wait_until(lambda: lag("g1") == 0, 15, "b consumes what was published during the pause")
        a.signal(signal.SIGCONT)
        wait_until(lambda: "lost leases" in a.log(), 10, "a notices on its next renewal")
        after = publish_many(TOPIC, [{"payload": {"n": i}, "key": key_for_partition(i % 2, 2)} for i in range(20)])
        wait_until(lambda: lag("g1") == 0, 15, "messages published after the pause consumed")
    finally:
        a.signal(signal.SIGCONT)
    assert not Handled.objects.filter(worker="a", message_id__in=[m.id for m in during]).exists()
    # Whoever owns a partition after the rebalance, no message is handled twice.
    handled_after = Counter(
        Handled.objects.filter(message_id__in=[m.id for m in after]).values_list("message_id", flat=True)
    )
    assert set(handled_after.values()) == {1} and len(handled_after) == 20
    assert a.terminate() == 0 and b.terminate() == 0


def test_second_signal_exits_at_once(workers):
    publish(TOPIC, {"sleep": 60}, key=K)
    w = workers("w", "--group", "g1", "--topic", TOPIC)
    wait_until(lambda: Handled.objects.exists(), 15, "handler running")
    w.signal(signal.SIGTERM)
    time.sleep(0.5)
    assert w.alive(), "the first signal waits for the message in hand"
    w.signal(signal.SIGTERM)
    assert w.proc.wait(5) == 143


def test_newcomer_gets_its_share_before_the_next_renewal(workers, settings):
    """With a 6 s renew interval, a second worker still gets half the partitions within a few
    seconds: the holder's membership check (every second) sees the newcomer and releases."""
    publish_partitions(8)
    slow_renewal = ("--settings", "tests.support.process_settings_slow_renewal")
    workers("a", "--group", "g1", "--topic", TOPIC, *slow_renewal)
    wait_until(lambda: leases("g1") == {"a": 8}, 15, "a holds every partition")
    started = time.monotonic()
    workers("b", "--group", "g1", "--topic", TOPIC, *slow_renewal)
    wait_until(lambda: leases("g1") == {"a": 4, "b": 4}, 15, "4 partitions each")
    assert time.monotonic() - started < 5, "the rebalance waited for a renewal round"
