"""The worker in-process: Worker.run() on a thread against the real database.

Specs are built directly (no registry); settings are fast (``engine_helpers.FAST``).
Handlers record what they saw; assertions are on the queue's rows.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from django.db.models import Q
from django.test import override_settings

from django_sqlqueue import ConfigurationError, Reject, Retry, publish, publish_many
from django_sqlqueue.models import DeliveryState, Message, Partition, PartitionLease, SubscriberHeartbeat, Topic

from ..support.engine_helpers import (
    IN_FLIGHT,
    RETRY,
    SCHEDULED,
    Calls,
    caught_up,
    db_now,
    dead_letters,
    delivery_rows,
    fast_conf,
    fetch_fresh,
    head,
    key_for_partition,
    leased,
    offset_of,
    row,
    running,
    sequence,
    spec,
    store,
    wait_until,
    watermark,
)

pytestmark = pytest.mark.django_db(transaction=True)

#: A key of partition 0 of a topic with the default 8 partitions.
K = key_for_partition(0)


def recorder(calls: Calls, fail=None):
    """A handler recording (partition, offset, attempt); ``fail(message)`` may raise."""

    def handle(message):
        calls.add((message.partition, message.offset, message.attempt))
        if fail is not None:
            fail(message)

    return handle


def in_flight_now(group: str, topic: str, partition: int) -> int:
    """Unacked rows of the partition being worked on right now (database clock)."""
    now = db_now()
    return DeliveryState.objects.filter(
        consumer_group=group,
        topic=topic,
        partition=partition,
        acked=False,
        status=IN_FLIGHT,
        invisible_until__gt=now,
    ).count()


# -- the happy path -------------------------------------------------------------------------


def test_every_message_is_handled_once_in_offset_order_per_partition():
    topic, parts = "w.orders", [0, 1, 2]
    keys = {p: key_for_partition(p) for p in range(4)}
    items = [{"payload": {"i": i}, "key": keys[i % 3]} for i in range(60)]
    published = publish_many(topic, items)
    calls, payloads = Calls(), Calls()

    def handle(message):
        calls.add((message.partition, message.offset, message.attempt))
        payloads.add((message.partition, message.offset, message.key, message.id, message.payload, message.group))

    with running([spec(topic, "g", handle, batch_size=7)]) as worker:
        wait_until(lambda: caught_up("g", topic, parts), what="first 60 messages")
        # Published while it runs, including to a partition that had no message at start.
        later = publish_many(topic, [{"payload": {"i": i}, "key": keys[[0, 3][i % 2]]} for i in range(60, 76)])
        wait_until(lambda: caught_up("g", topic, [*parts, 3]), what="16 more")

    seen = calls.list()
    assert len(seen) == len(set(seen)) == 76
    for p, count in ((0, 28), (1, 20), (2, 20), (3, 8)):
        assert [off for q, off, _ in seen if q == p] == list(range(1, count + 1)), p
    assert {attempt for _, _, attempt in seen} == {1}
    # Each message arrives with what it was published with; per key in publish order.
    expected = {m.id: (m.partition, m.key, item["payload"]) for m, item in zip(published, items, strict=True)}
    expected.update({m.id: (m.partition, m.key, {"i": 60 + n}) for n, m in enumerate(later)})
    order: dict[int, list[int]] = {}
    for partition, _offset, key, message_id, payload, group in sorted(payloads.list()):
        assert group == "g"
        assert expected[message_id] == (partition, key, payload)
        order.setdefault(partition, []).append(payload["i"])
    assert all(o == sorted(o) for o in order.values()), order
    # Watermarks at the heads; every delivery row is gone; the log itself is untouched.
    assert [watermark("g", topic, p) for p in (0, 1, 2, 3)] == [28, 20, 20, 8]
    assert [head(topic, p) for p in (0, 1, 2, 3)] == [28, 20, 20, 8]
    assert delivery_rows("g", topic) == []
    assert Message.objects.filter(topic=topic).count() == 76
    assert (worker.stats.delivered, worker.stats.acked, worker.stats.nacked) == (76, 76, 0)


# -- failures ------------------------------------------------------------------------------


def test_failing_handler_is_retried_then_dead_lettered_after_max_attempts():
    topic = "w.fail"
    ok1 = publish(topic, "ok", key=K)
    publish(topic, "bad", key=K, id="bad-1", metadata={"trace": "t-1"})
    ok2 = publish(topic, "ok", key=K)
    calls = Calls()

    def fail(message):
        if message.payload == "bad":
            raise ValueError(f"boom at offset {message.offset} attempt {message.attempt}")

    with running([spec(topic, "g", recorder(calls, fail), max_attempts=3)]) as worker:
        wait_until(
            lambda: dead_letters("w.fail_dlq") and caught_up("g", topic),
            what="dead letter",
        )

    bad = offset_of(topic, "bad-1")
    assert bad == 2  # sequenced in publish order
    seen = calls.list()
    assert [attempt for _, off, attempt in seen if off == bad] == [1, 2, 3]
    assert [(off, attempt) for _, off, attempt in seen if off != bad] == [
        (offset_of(topic, ok1.id), 1),
        (offset_of(topic, ok2.id), 1),
    ]
    (dl,) = dead_letters("w.fail_dlq")
    assert dl.id == "g:bad-1" and dl.payload == "bad" and dl.key == K
    assert dl.failure_count == 3 and dl.original_topic == topic
    assert dl.last_error.startswith("builtins.ValueError: boom at offset 2 attempt 3\n")
    assert "Traceback" in dl.last_error and "in fail" in dl.last_error
    assert dl.metadata == {
        "trace": "t-1",
        "dead_letter": {
            "consumer_group": "g",
            "original_partition": 0,
            "original_offset": 2,
            "original_id": "bad-1",
        },
    }
    assert Message.objects.filter(topic=topic).count() == 3  # the original stays in the log
    assert watermark("g", topic, 0) == 3 and delivery_rows("g", topic) == []
    assert (worker.stats.nacked, worker.stats.dead_lettered) == (2, 1)


def test_retry_with_delay_postpones_redelivery():
    topic = "w.retry"
    publish(topic, "x", key=K)
    attempts = Calls()

    def handle(message):
        attempts.add((message.attempt, db_now()))
        if message.attempt == 1:
            raise Retry("not yet", delay=1.0)

    with running([spec(topic, "g", handle)]):
        wait_until(lambda: len(attempts) == 1)
        waiting = wait_until(
            lambda: DeliveryState.objects.filter(status=RETRY).first(),
            what="nacked row",
        )
        assert waiting.retry_count == 0 and not waiting.acked
        assert waiting.last_error.startswith("django_sqlqueue.exceptions.Retry: not yet\n")
        assert "Traceback (most recent call last)" in waiting.last_error and "in handle" in waiting.last_error
        first_at = attempts.list()[0][1]
        assert first_at + dt.timedelta(seconds=1) <= waiting.invisible_until <= db_now() + dt.timedelta(seconds=1)
        wait_until(lambda: caught_up("g", topic), what="second attempt")

    (a1, t1), (a2, t2) = attempts.list()
    assert (a1, a2) == (1, 2)
    assert t2 - t1 >= dt.timedelta(seconds=1)
    assert dead_letters("w.retry_dlq") == []


def test_retry_counts_towards_max_attempts():
    topic = "w.retry.max"
    publish(topic, "x", key=K, id="r-1")
    calls = Calls()

    def fail(message):
        raise Retry("still down", delay=0)

    with running([spec(topic, "g", recorder(calls, fail), max_attempts=2)]):
        wait_until(lambda: caught_up("g", topic), what="dead letter after 2 Retry")

    assert calls.list() == [(0, 1, 1), (0, 1, 2)]
    (dl,) = dead_letters("w.retry.max_dlq")
    assert dl.id == "g:r-1" and dl.failure_count == 2
    assert dl.last_error.startswith("django_sqlqueue.exceptions.Retry: still down")


def test_reject_dead_letters_at_once_on_the_first_attempt():
    topic = "w.reject"
    publish(topic, "poison", key=K, id="p-1")
    publish(topic, "fine", key=K)
    calls = Calls()

    def fail(message):
        if message.payload == "poison":
            raise Reject("poison message")

    with running([spec(topic, "g", recorder(calls, fail), max_attempts=5)]):
        wait_until(lambda: caught_up("g", topic), what="both messages done")

    assert calls.list() == [(0, 1, 1), (0, 2, 1)]
    (dl,) = dead_letters("w.reject_dlq")
    assert dl.id == "g:p-1" and dl.failure_count == 1
    assert dl.last_error.startswith("django_sqlqueue.exceptions.Reject: poison message")
    assert delivery_rows("g", topic) == []


def test_expired_deliveries_are_redelivered_then_dead_lettered_without_another_attempt():
    """Deliveries recorded by a worker that died: redelivered once their visibility ends;
    one delivered max_attempts times already goes to the DLQ without a further attempt."""
    topic = "w.expired"
    publish_many(topic, [{"payload": i, "key": K, "id": f"m{i}"} for i in (1, 2)])
    sequence(topic)
    s = store()
    s.ensure_offsets("g", topic, [0])
    leased("g", topic, 0, "dead-worker")
    s.mark_delivered("g", topic, "dead-worker", fetch_fresh("g", topic, 0), [], [], 0.3)  # its batch
    DeliveryState.objects.filter(message_offset=2).update(retry_count=2)  # its third delivery
    PartitionLease.objects.filter(leased_by="dead-worker").delete()  # its lease is gone
    calls = Calls()

    with running([spec(topic, "g", recorder(calls), max_attempts=3, visibility_timeout=30)]):
        wait_until(lambda: caught_up("g", topic), what="expired deliveries")

    assert calls.list() == [(0, 1, 2)]  # second attempt of 1; 2 is never handed out again
    (dl,) = dead_letters("w.expired_dlq")
    assert dl.id == "g:m2" and dl.failure_count == 3
    assert dl.last_error.startswith("delivered 3 times without an ack or nack (visibility timeout 30s expired")


def test_two_groups_on_one_topic_are_independent():
    topic = "w.shared"
    publish_many(topic, [{"payload": i, "key": key_for_partition(i % 2), "id": f"m{i}"} for i in range(10)])
    good, bad = Calls(), Calls()

    def always_fail(message):
        raise RuntimeError("this group is broken")

    specs = [
        spec(topic, "good", recorder(good)),
        spec(topic, "bad", recorder(bad, always_fail), max_attempts=2),
    ]
    with running(specs):
        wait_until(
            lambda: caught_up("good", topic, [0, 1]) and caught_up("bad", topic, [0, 1]),
            what="both groups",
        )

    everything = {(i % 2, i // 2 + 1) for i in range(10)}
    assert sorted(good.list()) == sorted((p, off, 1) for p, off in everything)  # once each
    assert sorted(bad.list()) == sorted((p, off, a) for p, off in everything for a in (1, 2))
    dlq = dead_letters("w.shared_dlq")
    assert sorted(m.id for m in dlq) == sorted(f"bad:m{i}" for i in range(10))
    assert all(m.failure_count == 2 for m in dlq)
    assert not Message.objects.filter(topic="w.shared_dlq", id__startswith="good:").exists()
    assert Message.objects.filter(topic=topic).count() == 10
    assert delivery_rows("good", topic) == [] and delivery_rows("bad", topic) == []


# -- strict serialization ------------------------------------------------------------------


def test_batch_size_one_keeps_one_message_of_a_partition_in_flight():
    topic = "w.strict"
    publish_many(topic, [{"payload": i, "key": key_for_partition(p)} for i in range(1, 6) for p in (0, 1)])
    calls, in_flight = Calls(), Calls()

    def handle(message):
        in_flight.add(in_flight_now("g", topic, message.partition))
        calls.add((message.partition, message.offset, message.attempt))
        if message.partition == 0 and message.offset == 2 and message.attempt == 1:
            raise Retry("later", delay=1.0)

    with running([spec(topic, "g", handle, batch_size=1)]):
        wait_until(lambda: caught_up("g", topic, [0, 1]), what="strict partitions")

    assert set(in_flight.list()) == {1}, "a handler saw another message of its partition in flight"
    seen_a = [(off, attempt) for p, off, attempt in calls.list() if p == 0]
    assert seen_a[:2] == [(1, 1), (2, 1)]
    # The nacked message does not block the next one: 3..5 go while 2 waits for its retry.
    assert seen_a.index((3, 1)) < seen_a.index((2, 2))
    assert sorted(seen_a) == [(1, 1), (2, 1), (2, 2), (3, 1), (4, 1), (5, 1)]
    assert [off for p, off, _ in calls.list() if p == 1] == [1, 2, 3, 4, 5]


def test_control_larger_batches_have_several_messages_in_flight():
    """The in-flight probe of the strict test does see batches (so it can fail)."""
    topic = "w.batch"
    publish_many(topic, [{"payload": i, "key": K} for i in range(5)])
    in_flight = Calls()

    with running([spec(topic, "g", lambda m: in_flight.add(in_flight_now("g", topic, 0)), batch_size=5)]):
        wait_until(lambda: caught_up("g", topic, [0]))

    assert in_flight.list() == [5, 5, 5, 5, 5]  # the batch is marked in flight before handlers run


# -- time ------------------------------------------------------------------------------------


def test_delayed_message_is_not_delivered_before_its_time():
    topic = "w.delay"
    late = publish(topic, "late", key=K, delay=2)
    publish(topic, "now", key=K)
    calls = Calls()

    def handle(message):
        calls.add((message.payload, message.attempt, db_now(), message.deliver_at))

    with running([spec(topic, "g", handle)]):
        wait_until(
            lambda: [c for c in calls.list() if c[0] == "now"],
            what="the undelayed message",
        )
        late_offset = offset_of(topic, late.id)
        assert late_offset == 1  # sequenced at once; only its delivery waits
        parked = row("g", topic, 0, late_offset)
        assert (parked.status, parked.retry_count) == (SCHEDULED, 0)
        assert parked.invisible_until == Message.objects.get(topic=topic, offset=late_offset).deliver_at
        if db_now() < parked.invisible_until:
            assert [c[0] for c in calls.list()] == ["now"]  # before its deliver_at: not yet
        wait_until(lambda: caught_up("g", topic), what="the delayed message")

    stored = Message.objects.get(topic=topic, id=late.id)
    assert stored.deliver_at - stored.created_at >= dt.timedelta(seconds=2)
    (now_call, late_call) = calls.list()
    assert now_call[0] == "now" and late_call[0] == "late"
    _payload, attempt, handled_at, deliver_at = late_call
    assert attempt == 1  # parking is not an attempt
    assert deliver_at == stored.deliver_at
    assert handled_at >= stored.deliver_at  # by the database clock


def test_extend_visibility_moves_invisible_until():
    topic = "w.extend"
    publish(topic, "long job", key=K)
    seen = Calls()

    def handle(message):
        before = row("g", topic, message.partition, message.offset).invisible_until
        called_at = db_now()
        message.extend_visibility(60)
        after = row("g", topic, message.partition, message.offset)
        seen.add((before, called_at, after.invisible_until, after.retry_count, after.status))

    with running([spec(topic, "g", handle, visibility_timeout=5)]):
        wait_until(lambda: caught_up("g", topic))

    ((before, called_at, after, retry_count, status),) = seen.list()
    assert before <= called_at + dt.timedelta(seconds=5)  # the 5s visibility timeout
    assert after >= called_at + dt.timedelta(seconds=60)
    assert (retry_count, status) == (0, IN_FLIGHT)
    assert delivery_rows("g", topic) == []  # acked afterwards


# -- leases and shutdown ---------------------------------------------------------------------


def test_graceful_stop_releases_leases_and_deregisters():
    topic = "w.stop"
    for p in (0, 1):
        publish(topic, p, key=key_for_partition(p))
    with running([spec(topic, "g", lambda m: None)], name="stopper") as worker:
        wait_until(lambda: caught_up("g", topic, [0, 1]))
        leases = PartitionLease.objects.filter(consumer_group="g", topic=topic, leased_by="stopper")
        assert sorted(leases.values_list("partition", flat=True)) == list(range(8))  # alone: every partition
        hb = SubscriberHeartbeat.objects.get(consumer_group="g", topic=topic, subscriber_name="stopper")
        assert hb.deregistered_at is None
        worker.stop()
    assert not PartitionLease.objects.filter(topic=topic).exists()
    hb = SubscriberHeartbeat.objects.get(consumer_group="g", topic=topic, subscriber_name="stopper")
    assert hb.deregistered_at is not None and hb.deregistered_at >= hb.heartbeat_at
    assert store().active_subscribers("g", topic, 30) == 0


def test_stop_in_the_middle_of_a_batch_hands_the_rest_back():
    topic = "w.drain"
    publish_many(topic, [{"payload": i, "key": K} for i in range(1, 6)])
    first, second = Calls(), Calls()
    holder = {}

    def stop_after_first(message):
        first.add((message.offset, message.attempt))
        wait_until(lambda: "worker" in holder, timeout=5)
        holder["worker"].stop()

    with running([spec(topic, "g", stop_after_first, batch_size=5)], name="w1") as worker:
        holder["worker"] = worker
        wait_until(lambda: len(first) == 1)
        worker.stop()
    assert first.list() == [(1, 1)]
    assert watermark("g", topic, 0) == 1
    rows = delivery_rows("g", topic, 0)
    assert [r.message_offset for r in rows] == [2, 3, 4, 5]
    now = db_now()
    assert all(r.status == SCHEDULED and r.retry_count == 0 and r.invisible_until <= now for r in rows)
    assert not PartitionLease.objects.exists()

    with running([spec(topic, "g", recorder(second), batch_size=5)], name="w2"):
        wait_until(
            lambda: caught_up("g", topic),
            timeout=5,
            what="the next worker, at once",
        )
    assert second.list() == [(0, off, 1) for off in (2, 3, 4, 5)]  # first attempts again


def test_two_workers_share_partitions_and_take_over_on_stop():
    topic = "w.share"
    parts = [0, 1, 2, 3]
    keys = [key_for_partition(p, 4) for p in parts]
    topics = {topic: {"partitions": 4}}
    calls = Calls()
    handle = recorder(calls)
    conf_specs = [spec(topic, "g", handle)]
    conf = fast_conf(LEASE_DURATION=10, TOPICS=topics)  # a takeover within 5s is a release, not an expiry

    def holders() -> dict[str, list[int]]:
        result: dict[str, list[int]] = {}
        for p, by in PartitionLease.objects.filter(topic=topic).values_list("partition", "leased_by"):
            result.setdefault(by, []).append(p)
        return result

    with override_settings(SQLQUEUE={"TOPICS": topics}):
        publish_many(topic, [{"payload": i, "key": k} for k in keys for i in range(3)])
        with running(conf_specs, name="w1", conf=conf):
            wait_until(lambda: len(holders().get("w1", [])) == 4, what="w1 takes every partition")
            with running(conf_specs, name="w2", conf=conf):
                # Fair share: w1 gives back the excess over ceil(4 / 2), w2 takes it.
                wait_until(lambda: sorted(map(len, holders().values())) == [2, 2], what="a 2/2 split")
                split = holders()
                assert sorted(split["w1"] + split["w2"]) == parts
                publish_many(topic, [{"payload": i, "key": k} for k in keys for i in range(3, 6)])
                wait_until(lambda: caught_up("g", topic, parts), what="both workers")
            # w2 stopped gracefully: w1 takes its partitions without waiting for expiry.
            wait_until(lambda: len(holders().get("w1", [])) == 4, timeout=5, what="w1 takes over")
            publish_many(topic, [{"payload": 9, "key": k} for k in keys])
            wait_until(lambda: caught_up("g", topic, parts), what="w1 alone")

    seen = calls.list()
    for p in parts:
        offsets = sorted({off for q, off, _ in seen if q == p})
        assert offsets == list(range(1, head(topic, p) + 1)) == list(range(1, 8))  # at least once each
    assert delivery_rows("g", topic) == []


def test_partition_of_a_dead_worker_is_taken_after_its_lease_expires():
    topic = "w.takeover"
    publish(topic, "x", key=K)
    leased("g", topic, 0, "dead-worker", duration=2.0)  # never renewed again
    calls = Calls()
    with running([spec(topic, "g", recorder(calls))], name="alive"):
        time.sleep(0.5)
        assert len(calls) == 0  # the lease is still valid
        assert PartitionLease.objects.get(topic=topic, partition=0).leased_by == "dead-worker"
        wait_until(
            lambda: caught_up("g", topic),
            timeout=5,
            what="takeover after expiry",
        )
        lease = PartitionLease.objects.get(topic=topic, partition=0)
        assert lease.leased_by == "alive"
    assert calls.list() == [(0, 1, 1)]


def test_worker_requires_a_consumer():
    from django_sqlqueue.worker.loop import Worker

    with pytest.raises(ValueError, match="at least one consumer"):
        Worker([], name="nobody")


def test_the_first_thread_reported_dead_is_the_one_the_worker_exits_with():
    """Side threads, handler threads and the watchdog may report at once; the first report
    is kept (set once, under a lock) and every report stops the worker."""
    from django_sqlqueue.worker.loop import Worker
    from django_sqlqueue.worker.threads.executor import DeadThread

    worker = Worker([spec("w.crash", "g", lambda m: None)], name="crash", conf=fast_conf(NOTIFY=False))
    first = DeadThread("handler first", RuntimeError("first"))
    worker._service_died(first)
    assert worker.crashed is first and worker.stop_event.is_set()
    gate = threading.Barrier(8)

    def report(i: int) -> None:
        gate.wait()
        worker._service_died(DeadThread(f"handler {i}", RuntimeError(str(i))))

    threads = [threading.Thread(target=report, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert worker.crashed is first


def test_idle_worker_touches_nothing_but_its_own_rows():
    publish("w.idle.other", "x", key=K)
    with running([spec("w.idle", "g", lambda m: None)], name="idle"):
        wait_until(lambda: SubscriberHeartbeat.objects.filter(subscriber_name="idle").exists())
        wait_until(lambda: PartitionLease.objects.filter(leased_by="idle").count() == 8)
        time.sleep(0.3)
    assert not PartitionLease.objects.exists()
    assert not DeliveryState.objects.exists()
    assert not Message.objects.filter(~Q(topic="w.idle.other")).exists()
    # It registered its own topic only, and did not sequence another topic's message.
    assert list(Topic.objects.values_list("topic", "partitions")) == [("w.idle", 8)]
    assert set(Partition.objects.values_list("topic", flat=True)) == {"w.idle"}
    assert Message.objects.get(topic="w.idle.other").offset is None


def test_ready_message_behind_many_delayed_ones_is_not_slowed_by_idle_backoff():
    """Delayed messages at the front of a partition are parked a batch per poll. A poll that
    only parked must count as a full batch: otherwise the loop believes it is idle and
    backs off towards POLL_INTERVAL_MAX before every further batch, and a ready message
    behind them waits seconds for nothing."""
    topic = "w.parked"
    publish_many(topic, [{"payload": "later", "key": K, "delay": 3600} for _ in range(30)])
    publish(topic, "ready", key=K)
    calls = Calls()
    conf = fast_conf(POLL_INTERVAL=0.01, POLL_INTERVAL_MAX=0.5)
    with running(
        [spec(topic, "g", lambda m: calls.add((m.payload, db_now())), batch_size=3)],
        conf=conf,
    ):
        # Counted from the first poll that sees the messages numbered (startup is not the point).
        wait_until(lambda: DeliveryState.objects.filter(status=SCHEDULED).exists(), what="the first parked batch")
        started = db_now()
        wait_until(lambda: len(calls), timeout=10, what="the ready message")
    ((payload, handled_at),) = calls.list()
    assert payload == "ready"
    assert DeliveryState.objects.filter(status=SCHEDULED).count() == 30  # all parked, none delivered
    waited = (handled_at - started).total_seconds()
    # 10 polls park 3 each; without backoff in between they take well under a second.
    assert waited < 1.0, f"the ready message waited {waited:.2f}s behind 30 parked messages"


def test_many_partitions_are_polled_in_chunks():
    topic = "w.wide"
    n = 130
    topics = {topic: {"partitions": n}}
    with override_settings(SQLQUEUE={"TOPICS": topics}):
        publish_many(topic, [{"payload": p, "key": key_for_partition(p, n)} for p in range(n) for _ in range(2)])
    calls = Calls()
    with running([spec(topic, "g", recorder(calls))], conf=fast_conf(TOPICS=topics)):
        wait_until(lambda: caught_up("g", topic, list(range(n))), timeout=20, what="130 partitions")
    assert sorted(calls.list()) == [(p, off, 1) for p in range(n) for off in (1, 2)]


def test_worker_that_lost_a_lease_stops_handling_that_partition():
    """A stalled worker whose partition was taken over: once its keeper notices, the rest
    of its batch is not handled, and its late writes (acks, hand-backs) are fenced off."""
    topic = "w.lost"
    publish_many(topic, [{"payload": i, "key": K} for i in range(1, 6)])
    calls = Calls()
    stolen = threading.Event()

    def handle(message):
        calls.add((message.partition, message.offset, message.attempt))
        assert stolen.wait(10)

    with running([spec(topic, "g", handle, batch_size=5)], name="stalled") as worker:
        wait_until(lambda: len(calls) == 1)
        # Another subscriber took the partition over (as after an expiry during a stall).
        mine = PartitionLease.objects.filter(topic=topic, partition=0, leased_by="stalled")
        assert mine.update(leased_by="thief") == 1
        wait_until(
            lambda: 0 not in worker.subscriptions[0].held,
            timeout=3,
            what="the keeper to notice",
        )
        stolen.set()
        wait_until(lambda: worker.stats.acked == 1, what="the batch to complete")
        time.sleep(0.3)  # it keeps polling: nothing more of partition 0 may be handled

    assert calls.list() == [(0, 1, 1)]
    # The thief holds the partition: the former holder's ack of 1 and its hand-back of 2..5
    # were not written; they stay in flight until their visibility timeout, for the thief.
    rows = delivery_rows("g", topic, 0)
    assert [(r.message_offset, r.acked, r.status, r.retry_count) for r in rows] == [
        (o, False, IN_FLIGHT, 0) for o in (1, 2, 3, 4, 5)
    ]
    assert watermark("g", topic, 0) == 0
    assert PartitionLease.objects.get(topic=topic, partition=0).leased_by == "thief"


def test_paused_worker_delivers_nothing_until_resumed():
    from django_sqlqueue.models import PausedTopic

    from ..support.factories import PausedTopicFactory

    topic = "w.paused"
    PausedTopicFactory(consumer_group="g", topic=topic)
    publish_many(topic, [{"payload": i, "key": K} for i in range(3)])
    calls = Calls()
    with running([spec(topic, "g", recorder(calls))]):
        wait_until(lambda: SubscriberHeartbeat.objects.filter(topic=topic).exists())
        time.sleep(0.5)
        assert len(calls) == 0 and not PartitionLease.objects.filter(topic=topic).exists()
        PausedTopic.objects.filter(consumer_group="g", topic=topic).delete()
        wait_until(lambda: caught_up("g", topic), timeout=5, what="resumed consumption")
    assert calls.list() == [(0, off, 1) for off in (1, 2, 3)]


def test_worker_refuses_a_partition_count_other_than_the_registered_one():
    from django_sqlqueue.worker.loop import Worker

    topic = "w.registered"
    assert store().register_topic(topic, 4) == 4
    worker = Worker([spec(topic, "g", lambda m: None)], name="w", conf=fast_conf(TOPICS={topic: {"partitions": 6}}))
    with pytest.raises(ConfigurationError, match=r"registered with 4 partitions, but SQLQUEUE gives it 6 partitions"):
        worker.register_topics()
    assert store().registered_partitions(topic) == (True, 4)
    per_key = Worker([spec(topic, "g", lambda m: None)], name="w", conf=fast_conf(TOPICS={topic: {"per_key": True}}))
    with pytest.raises(ConfigurationError, match="one partition per key"):
        per_key.register_topics()


def test_per_key_topic_gives_every_key_its_own_partition():
    topic = "w.perkey"
    topics = {topic: {"per_key": True}}
    keys = ["tenant-a", "tenant-b", "tenant-c"]
    calls = Calls()
    with override_settings(SQLQUEUE={"TOPICS": topics}):
        published = publish_many(topic, [{"payload": i, "key": k} for i in range(4) for k in keys])
        handler = spec(topic, "g", lambda m: calls.add((m.key, m.partition, m.payload)), batch_size=1)
        with running([handler], conf=fast_conf(TOPICS=topics)):
            wait_until(lambda: caught_up("g", topic), what="three keys")
            # A key that appears while the worker runs is discovered too.
            late = publish(topic, 9, key="tenant-new")
            wait_until(lambda: caught_up("g", topic), what="the new key")
    partitions = {m.key: m.partition for m in published}
    assert len(set(partitions.values())) == 3
    for k in keys:
        assert [pl for key, p, pl in calls.list() if key == k] == [0, 1, 2, 3]
        assert {p for key, p, _ in calls.list() if key == k} == {partitions[k]}
        assert head(topic, partitions[k]) == 4
    assert [(key, p) for key, p, pl in calls.list() if pl == 9] == [("tenant-new", late.partition)]
