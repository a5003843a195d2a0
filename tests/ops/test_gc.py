"""gc.collect_garbage(): every topic, every consuming group's watermark, RETENTION."""

from __future__ import annotations

import threading

import pytest
from django.db import transaction
from django.test import override_settings

from django_sqlqueue.models import ConsumerOffset, Message
from django_sqlqueue.ops.gc import collect_garbage

from ..support.engine_helpers import (
    age_messages,
    caught_up,
    fast_conf,
    lock_waiting,
    publish_to,
    requires_vendor,
    running,
    session_id,
    spec,
    store,
    wait_until,
    watermark,
)
from ..support.factories import ConsumerOffsetFactory, SubscriberHeartbeatFactory

pytestmark = pytest.mark.django_db(transaction=True)


#: Two partitions of the default 8.
K, J = 0, 1


def fill(topic: str, partition: int, n: int) -> None:
    """Publish ``n`` messages to ``partition`` of ``topic`` and sequence them."""
    publish_to(topic, partition, n)


def register(*topics: str) -> None:
    """Register topics as the workers consuming them do (GC walks the registry)."""
    for topic in topics:
        assert store().register_topic(topic, 8) == 8


def offsets(topic: str, partition: int) -> list[int]:
    rows = Message.objects.filter(topic=topic, partition=partition).order_by("offset")
    return list(rows.values_list("offset", flat=True))


def test_collect_garbage_over_every_topic():
    fill("gc.a", K, 6)
    fill("gc.b", K, 4)
    fill("gc.b", J, 4)
    fill("gc.lonely", K, 3)
    fill("gc.unregistered", K, 3)
    ConsumerOffsetFactory(consumer_group="g1", topic="gc.unregistered", partition=K, offset_acked=3)
    register("gc.a", "gc.b", "gc.lonely")
    ConsumerOffsetFactory(consumer_group="g1", topic="gc.a", partition=K, offset_acked=4)
    ConsumerOffsetFactory(consumer_group="g2", topic="gc.a", partition=K, offset_acked=6)
    ConsumerOffsetFactory(consumer_group="g1", topic="gc.b", partition=K, offset_acked=4)
    ConsumerOffsetFactory(consumer_group="g1", topic="gc.b", partition=J, offset_acked=1)
    ConsumerOffsetFactory(consumer_group="g3", topic="gc.b", partition=K, offset_acked=2)
    # g3 consumes gc.b but has no watermark for j: j keeps everything.
    assert collect_garbage() == {"gc.a": 4, "gc.b": 2, "gc.lonely": 0}
    assert offsets("gc.a", K) == [5, 6]
    assert offsets("gc.b", K) == [3, 4]
    assert offsets("gc.b", J) == [1, 2, 3, 4]
    assert offsets("gc.lonely", K) == [1, 2, 3]
    # Only registered topics are walked (every consumed topic is: its workers register it).
    assert offsets("gc.unregistered", K) == [1, 2, 3]
    assert collect_garbage(topics=["gc.unregistered"]) == {"gc.unregistered": 3}
    assert collect_garbage() == {"gc.a": 0, "gc.b": 0, "gc.lonely": 0}


def test_collect_garbage_of_chosen_topics():
    fill("gc.a", K, 3)
    fill("gc.b", K, 3)
    for topic in ("gc.a", "gc.b"):
        ConsumerOffsetFactory(consumer_group="g", topic=topic, partition=K, offset_acked=3)
    assert collect_garbage(topics=["gc.b"]) == {"gc.b": 3}
    assert offsets("gc.a", K) == [1, 2, 3]
    assert collect_garbage(topics=[]) == {}


def test_a_paced_collection_deletes_the_same_and_a_bad_pace_deletes_nothing():
    from django.core.management import CommandError, call_command

    from django_sqlqueue.ops.base import OperationError

    fill("gc.a", K, 5)
    fill("gc.a", J, 5)
    ConsumerOffsetFactory(consumer_group="g", topic="gc.a", partition=K, offset_acked=4)
    ConsumerOffsetFactory(consumer_group="g", topic="gc.a", partition=J, offset_acked=2)
    for bad in (-1, 101, float("nan"), "1", True, None):
        with pytest.raises(OperationError, match="pace must be a number from 0 to 100"):
            collect_garbage(topics=["gc.a"], pace=bad)  # type: ignore[arg-type]
    with pytest.raises(CommandError, match="--pace: must be a number from 0 to 100"):
        call_command("queue_gc", "--topic", "gc.a", "--pace", "-1")
    assert offsets("gc.a", K) == [1, 2, 3, 4, 5]  # nothing deleted by a refused call
    assert collect_garbage(topics=["gc.a"], pace=0.5) == {"gc.a": 6}
    assert offsets("gc.a", K) == [5] and offsets("gc.a", J) == [3, 4, 5]


def test_collect_garbage_waits_for_a_group_that_only_sent_heartbeats():
    fill("gc.a", K, 5)
    register("gc.a")
    ConsumerOffsetFactory(consumer_group="g1", topic="gc.a", partition=K, offset_acked=5)
    SubscriberHeartbeatFactory(consumer_group="late", topic="gc.a")
    assert collect_garbage() == {"gc.a": 0}
    assert offsets("gc.a", K) == [1, 2, 3, 4, 5]


def test_collect_garbage_honours_retention_setting():
    fill("gc.a", K, 5)
    register("gc.a")
    ConsumerOffsetFactory(consumer_group="g", topic="gc.a", partition=K, offset_acked=5)
    age_messages("gc.a", K, [1, 2, 3], 7200)
    with override_settings(SQLQUEUE={"RETENTION": 3600}):
        assert collect_garbage() == {"gc.a": 3}
        assert offsets("gc.a", K) == [4, 5]
        assert collect_garbage() == {"gc.a": 0}
    with override_settings(SQLQUEUE={"RETENTION": 0}):
        assert collect_garbage() == {"gc.a": 2}


def test_new_group_after_gc_starts_at_the_oldest_retained_message():
    fill("gc.a", K, 6)
    register("gc.a")
    ConsumerOffsetFactory(consumer_group="old", topic="gc.a", partition=K, offset_acked=4)
    assert collect_garbage() == {"gc.a": 4}
    store().ensure_offsets("new", "gc.a", [K])
    assert watermark("new", "gc.a", K) == 4
    # ... and from now on the newcomer holds GC back too.
    ConsumerOffset.objects.filter(consumer_group="old").update(offset_acked=6)
    assert collect_garbage() == {"gc.a": 0}
    ConsumerOffset.objects.filter(consumer_group="new").update(offset_acked=6)
    assert collect_garbage() == {"gc.a": 2}


def test_worker_collects_garbage_of_its_partitions():
    fill("gc.w", K, 5)
    fill("gc.w", J, 5)
    conf = fast_conf(GC_INTERVAL=0.3)
    with running([spec("gc.w", "g", lambda m: None)], conf=conf):
        wait_until(
            lambda: not Message.objects.filter(topic="gc.w").exists(),
            what="the worker's GC",
        )
    assert watermark("g", "gc.w", K) == watermark("g", "gc.w", J) == 5


@requires_vendor("mysql", "postgresql")
def test_new_group_joining_while_gc_deletes_is_not_stranded_below_a_hole(spawn):
    """GC computes its floor from the groups it sees, then deletes. A group that creates its
    watermark in between (from the oldest message still there) must not end up with
    deleted offsets above its watermark: nothing would ever fill that hole, its watermark
    would never move, and its lag -- and GC of the partition for every group -- would be
    stuck for good.

    The interleaving is forced with a row lock (data, no mock): GC's DELETE waits on
    offset 5 while the new group starts.
    """
    fill("race", K, 10)
    ConsumerOffsetFactory(consumer_group="old", topic="race", partition=K, offset_acked=5)
    locked, release = threading.Event(), threading.Event()

    def hold_offset_5() -> None:
        with transaction.atomic():
            list(Message.objects.select_for_update().filter(topic="race", partition=K, offset=5))
            locked.set()
            assert release.wait(10)

    def gc() -> tuple[int, int]:
        gc_ids.append(session_id())
        return store().collect_garbage("race", None, 0)

    gc_ids: list[int] = []
    holder = spawn(hold_offset_5, name="holder")
    assert locked.wait(10)
    collector = spawn(gc, name="gc")
    wait_until(
        lambda: gc_ids and lock_waiting(gc_ids[0]),
        timeout=5,
        what="GC's DELETE waiting on offset 5",
    )
    store().ensure_offsets("new", "race", [K])  # the new group's first lease
    release.set()
    holder.join_ok()
    assert collector.join_ok() == 5  # offsets 1..5, acked by "old", the only group GC saw

    retained = offsets("race", K)
    start = watermark("new", "race", K)
    with running([spec("race", "new", lambda m: None)], name="new-worker"):
        try:
            wait_until(
                lambda: caught_up("new", "race", [K]),
                timeout=3,
                what="the new group to catch up",
            )
        except AssertionError:
            pytest.fail(
                f"the new group's watermark is stuck at {watermark('new', 'race', 'k')} (head 10): it started at "
                f"{start}, but GC deleted offsets {sorted(set(range(start + 1, 11)) - set(retained))} above it "
                f"(retained: {retained}); advance_watermark stops at the first offset without a row"
            )
