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

from django_sqlqueue import Reject, Retry, publish, publish_many
from django_sqlqueue.models import (
    DeliveryState,
    Message,
    PartitionLease,
    SubscriberHeartbeat,
)

from .engine_helpers import (
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
    row,
    running,
    spec,
    store,
    wait_until,
    watermark,
)

pytestmark = pytest.mark.django_db(transaction=True)


def recorder(calls: Calls, fail=None):
    """A handler recording (key, offset, attempt); ``fail(message)`` may raise."""

    def handle(message):
        calls.add((message.partition_key, message.offset, message.attempt))
        if fail is not None:
            fail(message)

    return handle


def in_flight_now(group: str, topic: str, key: str) -> int:
    """Unacked rows of the partition being worked on right now (database clock)."""
    now = db_now()
    return DeliveryState.objects.filter(
        consumer_group=group,
        topic=topic,
        partition_key=key,
        acked=False,
        status=IN_FLIGHT,
        invisible_until__gt=now,
    ).count()


# -- the happy path -------------------------------------------------------------------------


def test_every_message_is_handled_once_in_offset_order_per_partition():
    topic, keys = "w.orders", ["a", "b", "c"]
    published = publish_many(topic, [{"payload": {"i": i}, "partition_key": keys[i % 3]} for i in range(60)])
    calls, payloads = Calls(), Calls()

    def handle(message):
        calls.add((message.partition_key, message.offset, message.attempt))
        payloads.add(
            (
                message.partition_key,
                message.offset,
                message.id,
                message.payload,
                message.group,
            )
        )

    with running([spec(topic, "g", handle, batch_size=7)]) as worker:
        wait_until(lambda: caught_up("g", topic, keys), what="first 60 messages")
        # Published while it runs, including a partition that did not exist at start.
        publish_many(
            topic,
            [{"payload": {"i": i}, "partition_key": ["a", "d"][i % 2]} for i in range(60, 76)],
        )
        wait_until(lambda: caught_up("g", topic, [*keys, "d"]), what="16 more")

    seen = calls.list()
    assert len(seen) == len(set(seen)) == 76
    for key, count in (("a", 28), ("b", 20), ("c", 20), ("d", 8)):
        assert [off for k, off, _ in seen if k == key] == list(range(1, count + 1)), key
    assert {attempt for _, _, attempt in seen} == {1}
    expected = {(m.partition_key, m.offset): (m.id, m.payload) for m in published}
    for key, offset, message_id, payload, group in payloads.list():
        assert group == "g"
        if (key, offset) in expected:
            assert (message_id, payload) == expected[(key, offset)]
    # Watermarks at the heads; every delivery row is gone; the log itself is untouched.
    assert [watermark("g", topic, k) for k in ("a", "b", "c", "d")] == [28, 20, 20, 8]
    assert delivery_rows("g", topic) == []
    assert Message.objects.filter(topic=topic).count() == 76
    assert (worker.stats.delivered, worker.stats.acked, worker.stats.nacked) == (
        76,
        76,
        0,
    )


# -- failures ------------------------------------------------------------------------------


def test_failing_handler_is_retried_then_dead_lettered_after_max_attempts():
    topic = "w.fail"
    ok1 = publish(topic, "ok", partition_key="k")
    bad = publish(topic, "bad", partition_key="k", id="bad-1", metadata={"trace": "t-1"})
    ok2 = publish(topic, "ok", partition_key="k")
    calls = Calls()

    def fail(message):
        if message.payload == "bad":
            raise ValueError(f"boom at offset {message.offset} attempt {message.attempt}")

    with running([spec(topic, "g", recorder(calls, fail), max_attempts=3)]) as worker:
        wait_until(
            lambda: dead_letters("w.fail_dlq") and caught_up("g", topic, ["k"]),
            what="dead letter",
        )

    seen = calls.list()
    assert [attempt for key, off, attempt in seen if off == bad.offset] == [1, 2, 3]
    assert [(off, attempt) for key, off, attempt in seen if off != bad.offset] == [
        (ok1.offset, 1),
        (ok2.offset, 1),
    ]
    (dl,) = dead_letters("w.fail_dlq")
    assert dl.id == "g:bad-1" and dl.payload == "bad" and dl.partition_key == "k"
    assert dl.failure_count == 3 and dl.original_topic == topic
    assert dl.last_error.startswith("builtins.ValueError: boom at offset 2 attempt 3\n")
    assert "Traceback" in dl.last_error and "in fail" in dl.last_error
    assert dl.metadata == {
        "trace": "t-1",
        "dead_letter": {
            "consumer_group": "g",
            "original_offset": 2,
            "original_id": "bad-1",
        },
    }
    assert Message.objects.filter(topic=topic).count() == 3  # the original stays in the log
    assert watermark("g", topic, "k") == 3 and delivery_rows("g", topic) == []
    assert (worker.stats.nacked, worker.stats.dead_lettered) == (2, 1)


def test_retry_with_delay_postpones_redelivery():
    topic = "w.retry"
    publish(topic, "x", partition_key="k")
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
        first_at = attempts.list()[0][1]
        assert first_at + dt.timedelta(seconds=1) <= waiting.invisible_until <= db_now() + dt.timedelta(seconds=1)
        wait_until(lambda: caught_up("g", topic, ["k"]), what="second attempt")

    (a1, t1), (a2, t2) = attempts.list()
    assert (a1, a2) == (1, 2)
    assert t2 - t1 >= dt.timedelta(seconds=1)
    assert dead_letters("w.retry_dlq") == []


def test_retry_counts_towards_max_attempts():
    topic = "w.retry.max"
    publish(topic, "x", partition_key="k", id="r-1")
    calls = Calls()

    def fail(message):
        raise Retry("still down", delay=0)

    with running([spec(topic, "g", recorder(calls, fail), max_attempts=2)]):
        wait_until(lambda: caught_up("g", topic, ["k"]), what="dead letter after 2 Retry")

    assert calls.list() == [("k", 1, 1), ("k", 1, 2)]
    (dl,) = dead_letters("w.retry.max_dlq")
    assert dl.id == "g:r-1" and dl.failure_count == 2
    assert dl.last_error.startswith("django_sqlqueue.exceptions.Retry: still down")


def test_reject_dead_letters_at_once_on_the_first_attempt():
    topic = "w.reject"
    publish(topic, "poison", partition_key="k", id="p-1")
    publish(topic, "fine", partition_key="k")
    calls = Calls()

    def fail(message):
        if message.payload == "poison":
            raise Reject("poison message")

    with running([spec(topic, "g", recorder(calls, fail), max_attempts=5)]):
        wait_until(lambda: caught_up("g", topic, ["k"]), what="both messages done")

    assert calls.list() == [("k", 1, 1), ("k", 2, 1)]
    (dl,) = dead_letters("w.reject_dlq")
    assert dl.id == "g:p-1" and dl.failure_count == 1
    assert dl.last_error.startswith("django_sqlqueue.exceptions.Reject: poison message")
    assert delivery_rows("g", topic) == []


def test_expired_deliveries_are_redelivered_then_dead_lettered_without_another_attempt():
    """Deliveries recorded by a worker that died: redelivered once their visibility ends;
    one delivered max_attempts times already goes to the DLQ without a further attempt."""
    topic = "w.expired"
    publish_many(topic, [{"payload": i, "partition_key": "k", "id": f"m{i}"} for i in (1, 2)])
    s = store()
    s.ensure_offsets("g", topic, ["k"])
    s.mark_delivered("g", topic, fetch_fresh("g", topic, "k"), [], [], 0.3)  # the dead worker's batch
    DeliveryState.objects.filter(message_offset=2).update(retry_count=2)  # its third delivery
    calls = Calls()

    with running([spec(topic, "g", recorder(calls), max_attempts=3, visibility_timeout=30)]):
        wait_until(lambda: caught_up("g", topic, ["k"]), what="expired deliveries")

    assert calls.list() == [("k", 1, 2)]  # second attempt of 1; 2 is never handed out again
    (dl,) = dead_letters("w.expired_dlq")
    assert dl.id == "g:m2" and dl.failure_count == 3
    assert dl.last_error.startswith("delivered 3 times without an ack or nack (visibility timeout 30s expired")


def test_two_groups_on_one_topic_are_independent():
    topic = "w.shared"
    publish_many(
        topic,
        [{"payload": i, "partition_key": f"k{i % 2}", "id": f"m{i}"} for i in range(10)],
    )
    good, bad = Calls(), Calls()

    def always_fail(message):
        raise RuntimeError("this group is broken")

    specs = [
        spec(topic, "good", recorder(good)),
        spec(topic, "bad", recorder(bad, always_fail), max_attempts=2),
    ]
    with running(specs):
        wait_until(
            lambda: caught_up("good", topic, ["k0", "k1"]) and caught_up("bad", topic, ["k0", "k1"]),
            what="both groups",
        )

    everything = {(f"k{i % 2}", i // 2 + 1) for i in range(10)}
    assert sorted(good.list()) == sorted((k, off, 1) for k, off in everything)  # once each
    assert sorted(bad.list()) == sorted((k, off, a) for k, off in everything for a in (1, 2))
    dlq = dead_letters("w.shared_dlq")
    assert sorted(m.id for m in dlq) == sorted(f"bad:m{i}" for i in range(10))
    assert all(m.failure_count == 2 for m in dlq)
    assert not Message.objects.filter(topic="w.shared_dlq", id__startswith="good:").exists()
    assert Message.objects.filter(topic=topic).count() == 10
    assert delivery_rows("good", topic) == [] and delivery_rows("bad", topic) == []


# -- strict serialization ------------------------------------------------------------------


def test_batch_size_one_keeps_one_message_of_a_partition_in_flight():
    topic = "w.strict"
    publish_many(
        topic,
        [{"payload": i, "partition_key": k} for i in range(1, 6) for k in ("a", "b")],
    )
    calls, in_flight = Calls(), Calls()

    def handle(message):
        in_flight.add(in_flight_now("g", topic, message.partition_key))
        calls.add((message.partition_key, message.offset, message.attempt))
        if message.partition_key == "a" and message.offset == 2 and message.attempt == 1:
            raise Retry("later", delay=1.0)

    with running([spec(topic, "g", handle, batch_size=1)]):
        wait_until(lambda: caught_up("g", topic, ["a", "b"]), what="strict partitions")

    assert set(in_flight.list()) == {1}, "a handler saw another message of its partition in flight"
    seen_a = [(off, attempt) for key, off, attempt in calls.list() if key == "a"]
    assert seen_a[:2] == [(1, 1), (2, 1)]
    # The nacked message does not block the next one: 3..5 go while 2 waits for its retry.
    assert seen_a.index((3, 1)) < seen_a.index((2, 2))
    assert sorted(seen_a) == [(1, 1), (2, 1), (2, 2), (3, 1), (4, 1), (5, 1)]
    assert [off for key, off, _ in calls.list() if key == "b"] == [1, 2, 3, 4, 5]


def test_control_larger_batches_have_several_messages_in_flight():
    """The in-flight probe of the strict test does see batches (so it can fail)."""
    topic = "w.batch"
    publish_many(topic, [{"payload": i, "partition_key": "a"} for i in range(5)])
    in_flight = Calls()

    with running(
        [
            spec(
                topic,
                "g",
                lambda m: in_flight.add(in_flight_now("g", topic, "a")),
                batch_size=5,
            )
        ]
    ):
        wait_until(lambda: caught_up("g", topic, ["a"]))

    assert in_flight.list() == [
        5,
        5,
        5,
        5,
        5,
    ]  # the batch is marked in flight before handlers run


# -- time ------------------------------------------------------------------------------------


def test_delayed_message_is_not_delivered_before_its_time():
    topic = "w.delay"
    late = publish(topic, "late", partition_key="k", delay=2)
    publish(topic, "now", partition_key="k")
    calls = Calls()

    def handle(message):
        calls.add((message.payload, message.attempt, db_now(), message.deliver_at))

    with running([spec(topic, "g", handle)]):
        wait_until(
            lambda: [c for c in calls.list() if c[0] == "now"],
            what="the undelayed message",
        )
        parked = row("g", topic, "k", late.offset)
        assert (parked.status, parked.retry_count) == (SCHEDULED, 0)
        assert parked.invisible_until == Message.objects.get(topic=topic, offset=late.offset).deliver_at
        if db_now() < parked.invisible_until:
            assert [c[0] for c in calls.list()] == ["now"]  # before its deliver_at: not yet
        wait_until(lambda: caught_up("g", topic, ["k"]), what="the delayed message")

    stored = Message.objects.get(topic=topic, offset=late.offset)
    assert stored.deliver_at - stored.created_at >= dt.timedelta(seconds=2)
    (now_call, late_call) = calls.list()
    assert now_call[0] == "now" and late_call[0] == "late"
    _payload, attempt, handled_at, deliver_at = late_call
    assert attempt == 1  # parking is not an attempt
    assert deliver_at == stored.deliver_at
    assert handled_at >= stored.deliver_at  # by the database clock


def test_extend_visibility_moves_invisible_until():
    topic = "w.extend"
    publish(topic, "long job", partition_key="k")
    seen = Calls()

    def handle(message):
        before = row("g", topic, "k", message.offset).invisible_until
        called_at = db_now()
        message.extend_visibility(60)
        after = row("g", topic, "k", message.offset)
        seen.add((before, called_at, after.invisible_until, after.retry_count, after.status))

    with running([spec(topic, "g", handle, visibility_timeout=5)]):
        wait_until(lambda: caught_up("g", topic, ["k"]))

    ((before, called_at, after, retry_count, status),) = seen.list()
    assert before <= called_at + dt.timedelta(seconds=5)  # the 5s visibility timeout
    assert after >= called_at + dt.timedelta(seconds=60)
    assert (retry_count, status) == (0, IN_FLIGHT)
    assert delivery_rows("g", topic) == []  # acked afterwards


# -- leases and shutdown ---------------------------------------------------------------------


def test_graceful_stop_releases_leases_and_deregisters():
    topic = "w.stop"
    for key in "ab":
        publish(topic, key, partition_key=key)
    with running([spec(topic, "g", lambda m: None)], name="stopper") as worker:
        wait_until(lambda: caught_up("g", topic, ["a", "b"]))
        leases = PartitionLease.objects.filter(consumer_group="g", topic=topic, leased_by="stopper")
        assert sorted(leases.values_list("partition_key", flat=True)) == ["a", "b"]
        hb = SubscriberHeartbeat.objects.get(consumer_group="g", topic=topic, subscriber_name="stopper")
        assert hb.deregistered_at is None
        worker.stop()
    assert not PartitionLease.objects.filter(topic=topic).exists()
    hb = SubscriberHeartbeat.objects.get(consumer_group="g", topic=topic, subscriber_name="stopper")
    assert hb.deregistered_at is not None and hb.deregistered_at >= hb.heartbeat_at
    assert store().active_subscribers("g", topic, 30) == 0


def test_stop_in_the_middle_of_a_batch_hands_the_rest_back():
    topic = "w.drain"
    publish_many(topic, [{"payload": i, "partition_key": "k"} for i in range(1, 6)])
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
    assert watermark("g", topic, "k") == 1
    rows = delivery_rows("g", topic, "k")
    assert [r.message_offset for r in rows] == [2, 3, 4, 5]
    now = db_now()
    assert all(r.status == SCHEDULED and r.retry_count == 0 and r.invisible_until <= now for r in rows)
    assert not PartitionLease.objects.exists()

    with running([spec(topic, "g", recorder(second), batch_size=5)], name="w2"):
        wait_until(
            lambda: caught_up("g", topic, ["k"]),
            timeout=5,
            what="the next worker, at once",
        )
    assert second.list() == [("k", off, 1) for off in (2, 3, 4, 5)]  # first attempts again


def test_two_workers_share_partitions_and_take_over_on_stop():
    topic = "w.share"
    keys = ["p0", "p1", "p2", "p3"]
    calls = Calls()
    handle = recorder(calls)
    conf_specs = [spec(topic, "g", handle)]
    conf = fast_conf(LEASE_DURATION=10)  # a takeover within 5s is a release, not an expiry
    publish_many(topic, [{"payload": i, "partition_key": k} for k in keys for i in range(3)])

    def holders() -> dict[str, list[str]]:
        result: dict[str, list[str]] = {}
        for key, by in PartitionLease.objects.filter(topic=topic).values_list("partition_key", "leased_by"):
            result.setdefault(by, []).append(key)
        return result

    with running(conf_specs, name="w1", conf=conf):
        wait_until(lambda: len(holders().get("w1", [])) == 4, what="w1 takes every partition")
        with running(conf_specs, name="w2", conf=conf):
            # Fair share: w1 gives back the excess over ceil(4 / 2), w2 takes it.
            wait_until(
                lambda: sorted(map(len, holders().values())) == [2, 2],
                what="a 2/2 split",
            )
            split = holders()
            assert sorted(split["w1"] + split["w2"]) == keys
            publish_many(
                topic,
                [{"payload": i, "partition_key": k} for k in keys for i in range(3, 6)],
            )
            wait_until(lambda: caught_up("g", topic, keys), what="both workers")
        # w2 stopped gracefully: w1 takes its partitions without waiting for expiry.
        wait_until(lambda: len(holders().get("w1", [])) == 4, timeout=5, what="w1 takes over")
        publish_many(topic, [{"payload": 9, "partition_key": k} for k in keys])
        wait_until(lambda: caught_up("g", topic, keys), what="w1 alone")

    seen = calls.list()
    for key in keys:
        offsets = sorted({off for k, off, _ in seen if k == key})
        assert offsets == list(range(1, head(topic, key) + 1))  # at least once each
    assert delivery_rows("g", topic) == []


def test_partition_of_a_dead_worker_is_taken_after_its_lease_expires():
    topic = "w.takeover"
    publish(topic, "x", partition_key="k")
    s = store()
    assert s.acquire_lease("g", topic, "k", "dead-worker", 2.0)  # never renewed again
    calls = Calls()
    with running([spec(topic, "g", recorder(calls))], name="alive"):
        time.sleep(0.5)
        assert len(calls) == 0  # the lease is still valid
        assert PartitionLease.objects.get(topic=topic).leased_by == "dead-worker"
        wait_until(
            lambda: caught_up("g", topic, ["k"]),
            timeout=5,
            what="takeover after expiry",
        )
        lease = PartitionLease.objects.get(topic=topic)
        assert lease.leased_by == "alive"
    assert calls.list() == [("k", 1, 1)]


def test_worker_requires_a_consumer():
    from django_sqlqueue.worker import Worker

    with pytest.raises(ValueError, match="at least one consumer"):
        Worker([], name="nobody")


def test_idle_worker_touches_nothing_but_its_own_rows():
    publish("w.idle.other", "x", partition_key="k")
    with running([spec("w.idle", "g", lambda m: None)], name="idle"):
        wait_until(lambda: SubscriberHeartbeat.objects.filter(subscriber_name="idle").exists())
        time.sleep(0.3)
    assert not PartitionLease.objects.exists()
    assert not DeliveryState.objects.exists()
    assert not Message.objects.filter(~Q(topic="w.idle.other")).exists()


def test_ready_message_behind_many_delayed_ones_is_not_slowed_by_idle_backoff():
    """Delayed messages at the front of a partition are parked a batch per poll. A poll that
    only parked must count as a full batch: otherwise the loop believes it is idle and
    backs off towards POLL_INTERVAL_MAX before every further batch, and a ready message
    behind them waits seconds for nothing."""
    topic = "w.parked"
    publish_many(
        topic,
        [{"payload": "later", "partition_key": "k", "delay": 3600} for _ in range(30)],
    )
    publish(topic, "ready", partition_key="k")
    calls = Calls()
    conf = fast_conf(POLL_INTERVAL=0.01, POLL_INTERVAL_MAX=0.5)
    with running(
        [spec(topic, "g", lambda m: calls.add((m.payload, db_now())), batch_size=3)],
        conf=conf,
    ):
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
    keys = [f"p{i:03d}" for i in range(130)]
    publish_many(
        topic,
        [{"payload": key, "partition_key": key} for key in keys for _ in range(2)],
    )
    calls = Calls()
    with running([spec(topic, "g", recorder(calls))]):
        wait_until(lambda: caught_up("g", topic, keys), timeout=20, what="130 partitions")
    assert sorted(calls.list()) == [(key, off, 1) for key in keys for off in (1, 2)]


def test_worker_that_lost_a_lease_stops_handling_that_partition():
    """A paused worker whose partition was taken over: once its keeper notices, the rest
    of its batch is handed back instead of handled."""
    topic = "w.lost"
    publish_many(topic, [{"payload": i, "partition_key": "k"} for i in range(1, 6)])
    calls = Calls()
    stolen = threading.Event()

    def handle(message):
        calls.add((message.partition_key, message.offset, message.attempt))
        assert stolen.wait(10)

    with running([spec(topic, "g", handle, batch_size=5)], name="paused") as worker:
        wait_until(lambda: len(calls) == 1)
        # Another subscriber took the partition over (as after an expiry during a pause).
        assert PartitionLease.objects.filter(topic=topic, leased_by="paused").update(leased_by="thief") == 1
        wait_until(
            lambda: "k" not in worker.subscriptions[0].held,
            timeout=3,
            what="the keeper to notice",
        )
        stolen.set()
        wait_until(lambda: DeliveryState.objects.filter(topic=topic, status=SCHEDULED).count() == 4)
        time.sleep(0.3)  # it keeps polling: nothing more of k may be handled

    assert calls.list() == [("k", 1, 1)]
    rows = delivery_rows("g", topic, "k")
    assert [(r.message_offset, r.status, r.retry_count) for r in rows] == [(o, SCHEDULED, 0) for o in (2, 3, 4, 5)]
    assert PartitionLease.objects.get(topic=topic).leased_by == "thief"


def test_lease_keeper_gives_back_the_last_partitions_over_its_fair_share():
    """LeaseKeeper.rebalance, one round at a time, without threads."""
    from django_sqlqueue.leasing import LeaseKeeper
    from django_sqlqueue.subscription import Subscription

    topic = "w.fair"
    keys = ["a", "b", "c", "d", "e"]
    publish_many(topic, [{"payload": 0, "partition_key": k} for k in keys])
    conf = fast_conf()
    one = Subscription.create(spec(topic, "g", lambda m: None), "one", conf)
    two = Subscription.create(spec(topic, "g", lambda m: None), "two", conf)
    keeper = LeaseKeeper([one, two], store(), conf)

    keeper.rebalance(one)  # alone: takes everything
    assert one.held == frozenset(keys)
    assert all(watermark("g", topic, k) == 0 for k in keys)  # watermarks created with the leases
    keeper.rebalance(two)  # ceil(5 / 2) = 3 each, but nothing is free yet
    assert two.held == frozenset()
    keeper.rebalance(one)  # gives back the last two in key order
    assert one.held == frozenset("abc")
    keeper.rebalance(two)
    assert two.held == frozenset("de")
    assert dict(PartitionLease.objects.values_list("partition_key", "leased_by")) == {
        "a": "one", "b": "one", "c": "one", "d": "two", "e": "two",
    }  # fmt: skip
    keeper.release_all()
    assert not PartitionLease.objects.exists()
    assert SubscriberHeartbeat.objects.filter(deregistered_at__isnull=False).count() == 2
