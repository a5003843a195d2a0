"""The console's service layer (django_sqlqueue.ops) on a real database."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_sqlqueue import ops, publish
from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.models import (
    ConsumerOffset,
    DeliveryState,
    Message,
    PartitionLease,
    PausedTopic,
    SubscriberHeartbeat,
)
from django_sqlqueue.rules.dlq import REPLAY_KEY, is_for_other_group

from ..support import console_scene
from ..support.console_scene import SETTINGS, build

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]


@pytest.fixture
def scene_settings():
    with override_settings(SQLQUEUE=SETTINGS):
        yield


def wm(group: str, part: int) -> int:
    return ConsumerOffset.objects.get(consumer_group=group, topic="orders", partition=part).offset_acked


# -- topics ---------------------------------------------------------------------------


def test_log_topics_lists_every_topic_with_messages_including_unconsumed():
    build()
    assert ops.log_topics() == ["orders", "orders_dlq", "typo"]


def test_log_topics_skip_scan_finds_neighbouring_names():
    # The skip scan steps from one topic to the next larger one: names that are prefixes
    # of each other, or differ only in case, must all come out (binary collation).
    for topic in ("a", "a.b", "a-", "A", "b_", "zz"):
        publish(topic, {})
    assert ops.log_topics() == ["A", "a", "a-", "a.b", "b_", "zz"]
    # The plan at scale (loose index scan / recursive CTE probes) is shown by bench/console.py.


def test_list_topics_flags_unconsumed_and_dead_letter_topics():
    build()
    topics = {t.topic: t for t in ops.list_topics()}
    assert topics["orders"].consumed_by == ["billing", "retired", "shipping"]
    assert topics["typo"].unconsumed and not topics["typo"].dead_letter_topic
    assert topics["orders_dlq"].unconsumed and topics["orders_dlq"].dead_letter_topic


def test_purge_topic_deletes_messages_moves_watermarks_and_fences_leases():
    scene = build()
    DeliveryState.objects.create(
        consumer_group="billing",
        topic="orders",
        partition=0,
        message_offset=scene.heads[0],
        invisible_until=timezone.now(),
        status=1,
    )
    assert ops.purge_topic("orders", dry_run=True).messages == 20
    assert Message.objects.filter(topic="orders").count() == 20
    done = ops.purge_topic("orders", batch_size=7)
    assert (done.messages, done.delivery_states, done.leases) == (20, 1, 2)
    assert not Message.objects.filter(topic="orders").exists()
    assert Message.objects.filter(topic="typo").count() == 3
    for part, head in scene.heads.items():
        assert wm("retired", part) == head and wm("billing", part) == head


def test_purge_unknown_topic_is_refused():
    with pytest.raises(ops.NotFound, match="nosuch"):
        ops.purge_topic("nosuch")


# -- groups ---------------------------------------------------------------------------


def test_list_groups_lag_and_liveness():
    build()
    rows = {(g.group, g.topic): g for g in ops.list_groups()}
    assert rows[("billing", "orders")].lag == 4 and rows[("billing", "orders")].live_subscribers == 1
    assert rows[("shipping", "orders")].lag == 0
    assert rows[("retired", "orders")].lag == 20 and rows[("retired", "orders")].live_subscribers == 0


def test_group_offsets_per_partition():
    scene = build()
    rows = ops.group_offsets("billing", "orders")
    assert [(r.partition, r.head, r.watermark, r.lag, r.leased_by) for r in rows] == [
        (p, h, h - 2, 2, "w1") for p, h in sorted(scene.heads.items())
    ]
    with pytest.raises(ops.NotFound):
        ops.group_offsets("nobody", "orders")


def test_seek_preview_counts_redelivered_and_skipped_without_writing():
    scene = build()
    plan = ops.plan_seek("shipping", "orders", position="earliest")
    assert plan.redeliver == 20 and plan.skip == 0
    plan = ops.plan_seek("retired", "orders", position="latest")
    assert plan.skip == 20 and plan.redeliver == 0
    assert wm("retired", 0) == 0 and PartitionLease.objects.count() == 2
    # Acked above the watermark: not counted as skipped by a fast-forward.
    DeliveryState.objects.create(
        consumer_group="retired",
        topic="orders",
        partition=0,
        message_offset=1,
        acked=True,
        invisible_until=timezone.now(),
    )
    assert ops.plan_seek("retired", "orders", position="latest", partitions=[0]).skip == scene.heads[0] - 1


def test_seek_to_earliest_creates_a_group_that_does_not_exist():
    """A seek of a group new on the topic writes its watermarks -- even where none moves --
    and says that it creates the group (before, it printed "0 redelivered" and wrote nothing)."""
    scene = build()
    assert not ConsumerOffset.objects.filter(consumer_group="newcomer").exists()
    preview = ops.plan_seek("newcomer", "orders", position="earliest")
    assert preview.created and "will be created" in preview.describe()
    assert not ConsumerOffset.objects.filter(consumer_group="newcomer").exists()
    done = ops.seek("newcomer", "orders", position="earliest")
    assert done.created and "'newcomer' had no watermarks on 'orders' and is created" in done.describe()
    marks = dict(
        ConsumerOffset.objects.filter(consumer_group="newcomer", topic="orders").values_list(
            "partition", "offset_acked"
        )
    )
    assert sorted(marks) == sorted(scene.heads)
    assert all(mark == 0 for mark in marks.values())  # nothing collected yet: everything is delivered
    assert any(g.group == "newcomer" for g in ops.list_groups(topic="orders"))
    # A second seek: the group exists now.
    assert not ops.seek("newcomer", "orders", position="earliest").created


def test_seek_rewind_releases_leases_and_clears_delivery_state():
    scene = build()
    DeliveryState.objects.create(
        consumer_group="billing",
        topic="orders",
        partition=0,
        message_offset=scene.heads[0],
        acked=True,
        invisible_until=timezone.now(),
    )
    plan = ops.seek("billing", "orders", offset=1, partitions=[0])
    assert plan.applied and plan.leases_released == 1
    assert plan.redeliver == (scene.heads[0] - 2 - 1) + 1
    assert wm("billing", 0) == 1 and wm("billing", 1) == scene.heads[1] - 2
    assert not DeliveryState.objects.filter(consumer_group="billing", partition=0).exists()
    assert list(PartitionLease.objects.values_list("partition", flat=True)) == [1]


def test_seek_fast_forward_keeps_state_above_target():
    scene = build()
    head = scene.heads[0]
    DeliveryState.objects.create(
        consumer_group="retired",
        topic="orders",
        partition=0,
        message_offset=head,
        acked=False,
        retry_count=2,
        status=2,
        invisible_until=timezone.now(),
    )
    DeliveryState.objects.create(
        consumer_group="retired",
        topic="orders",
        partition=0,
        message_offset=1,
        acked=False,
        status=1,
        invisible_until=timezone.now(),
    )
    plan = ops.seek("retired", "orders", offset=head - 1, partitions=[0])
    assert plan.skip == head - 1 and wm("retired", 0) == head - 1
    kept = DeliveryState.objects.filter(consumer_group="retired", partition=0)
    assert [(s.message_offset, s.retry_count) for s in kept] == [(head, 2)]


def test_seek_by_time():
    build()
    later = timezone.now() + dt.timedelta(seconds=1)
    plan = ops.plan_seek("shipping", "orders", time=later)
    assert all(p.target == p.head for p in plan.partitions) and plan.skip == 0 and plan.redeliver == 0
    plan = ops.plan_seek("shipping", "orders", time=timezone.now() - dt.timedelta(hours=1))
    assert all(p.target == 0 for p in plan.partitions) and plan.redeliver == 20


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({}, "exactly one"),
        ({"offset": -1}, "integer >= 0"),
        ({"offset": 10_000}, "beyond the head"),
        ({"position": "middle"}, "earliest, latest"),
        ({"position": "latest", "partitions": [99]}, "no partition 99"),
        ({"time": dt.datetime(2020, 1, 1)}, "aware"),
    ],
)
def test_seek_bad_input_is_refused_and_writes_nothing(kwargs, error):
    build()
    before = list(ConsumerOffset.objects.values_list("consumer_group", "partition", "offset_acked"))
    with pytest.raises(ops.OperationError, match=error):
        ops.seek("billing", "orders", **kwargs)
    assert list(ConsumerOffset.objects.values_list("consumer_group", "partition", "offset_acked")) == before
    assert PartitionLease.objects.count() == 2


def test_pause_and_resume():
    build()
    assert ops.pause("billing", "orders", by="alice", reason="bad deploy") is True
    assert ops.pause("billing", "orders") is False
    row = PausedTopic.objects.get()
    assert (row.paused_by, row.reason) == ("alice", "bad deploy")
    assert not PartitionLease.objects.filter(consumer_group="billing").exists()
    assert [p.group for p in ops.paused_topics()] == ["billing"]
    assert ops.resume("billing", "orders") is True and ops.resume("billing", "orders") is False


def test_drop_group_refuses_live_group_and_drops_retired_one():
    build()
    with pytest.raises(ops.OperationError, match="live subscriber"):
        ops.drop_group("billing")
    preview = ops.drop_group("retired", dry_run=True)
    assert preview.rows["queue_offsets"] == 2 and ConsumerOffset.objects.filter(consumer_group="retired").count() == 2
    done = ops.drop_group("retired")
    assert done.total == 2 and not ConsumerOffset.objects.filter(consumer_group="retired").exists()
    forced = ops.drop_group("billing", force=True)
    assert forced.rows == {
        "queue_partition_leases": 2,
        "queue_delivery_state": 0,
        "queue_offsets": 2,
        "queue_subscriber_heartbeats": 1,
        "queue_paused_topics": 0,
    }
    with pytest.raises(ops.NotFound):
        ops.drop_group("retired")


# -- leases and deliveries ------------------------------------------------------------


def test_leases_stale_flag_and_release():
    build()
    PartitionLease.objects.filter(partition=1).update(lease_renewed_at=timezone.now() - dt.timedelta(minutes=5))
    SubscriberHeartbeat.objects.filter(subscriber_name="w2").update(heartbeat_at=timezone.now() - dt.timedelta(hours=1))
    leases = ops.list_leases()
    assert [(lease.partition, lease.stale) for lease in leases] == [(0, False), (1, True)]
    assert [s.name for s in ops.list_subscribers() if s.silent] == ["w2"]
    with pytest.raises(ops.NotFound, match="held by 'other'"):
        ops.release_lease("billing", "orders", 1, holder="other")
    assert ops.release_lease("billing", "orders", 1, holder="w1") == 1
    assert [lease.partition for lease in ops.list_leases()] == [0]


def test_deliveries_list_joins_message_ids():
    scene = build()
    DeliveryState.objects.create(
        consumer_group="billing",
        topic="orders",
        partition=0,
        message_offset=scene.heads[0],
        retry_count=2,
        status=2,
        invisible_until=timezone.now(),
        last_error="builtins.ValueError: nope\nTraceback (most recent call last):\n  ...",
    )
    rows = ops.list_deliveries(status="retrying")
    assert len(rows) == 1 and rows[0].message_id.startswith("o") and rows[0].retry_count == 2
    assert rows[0].error_summary == "builtins.ValueError: nope" and rows[0].last_error.endswith("...")
    assert all(r.last_error is None and r.error_summary == "" for r in ops.list_deliveries(status="in flight"))
    with pytest.raises(ops.NotFound):
        ops.list_deliveries(status="bogus")


# -- overview -------------------------------------------------------------------------


def test_overview_flags_problems():
    build()
    PartitionLease.objects.filter(partition=1).update(lease_renewed_at=timezone.now() - dt.timedelta(minutes=5))
    ops.pause("shipping", "orders", by="bob")
    o = ops.overview()
    text = "\n".join(o.problems)
    assert "group retired has no live subscriber on orders and is 20 message(s) behind" in text
    assert "stale lease: billing:orders[1]" in text
    assert "topic typo is consumed by no group" in text
    assert "dead-letter topic orders_dlq is consumed by no group" in text
    assert "group shipping is paused on orders" in text
    rows = {g.group: g for g in o.groups}
    assert rows["billing"].dead_letters == 3 and rows["shipping"].dead_letters == 1
    assert rows["billing"].oldest_unhandled_at is not None
    topics = {t.info.topic: t for t in o.topics}
    assert topics["orders"].dead_letters == 4 and topics["orders"].unsequenced == 0


def test_overview_counts_messages_waiting_for_the_sequencer():
    build()
    publish("orders", {"late": 1}, key="k1")
    assert {t.info.topic: t.unsequenced for t in ops.overview().topics}["orders"] == 1


# -- messages -------------------------------------------------------------------------


def test_browse_keyset_pages_newest_first():
    build()
    first = ops.browse(ops.MessageFilter(topic="orders"), limit=8)
    second = ops.browse(ops.MessageFilter(topic="orders"), cursor=first.next_cursor, limit=8)
    third = ops.browse(ops.MessageFilter(topic="orders"), cursor=second.next_cursor, limit=8)
    ids = [m.id for m in first.items + second.items + third.items]
    assert ids == [f"o{i}" for i in range(19, -1, -1)] and third.next_cursor is None


def test_browse_filters():
    build()
    by_key = ops.browse(ops.MessageFilter(topic="orders", key="k1"))
    assert {m.id for m in by_key.items} == {f"o{i}" for i in range(0, 20, 4)}
    assert [m.id for m in ops.browse(ops.MessageFilter(topic="orders", id="o5")).items] == ["o5"]
    p0 = ops.browse(ops.MessageFilter(topic="orders", partition=0)).items
    assert p0 and all(m.partition == 0 for m in p0)
    assert ops.browse(ops.MessageFilter(after=timezone.now() + dt.timedelta(minutes=1))).items == []
    assert (
        len(ops.browse(ops.MessageFilter(topic="orders", before=timezone.now() + dt.timedelta(minutes=1))).items) == 20
    )
    assert ops.browse(ops.MessageFilter(topic="orders", before=timezone.now() - dt.timedelta(minutes=1))).items == []
    with pytest.raises(ops.OperationError, match="needs a topic"):
        ops.browse(ops.MessageFilter(id="o5"))


def test_browse_reads_no_count_and_no_distinct():
    build()
    with CaptureQueriesContext(connection) as queries:
        ops.browse(ops.MessageFilter(topic="orders", key="k2"), limit=5)
    sql = " ".join(q["sql"].upper() for q in queries.captured_queries)
    assert "COUNT(" not in sql and "DISTINCT" not in sql


# -- dead letters ---------------------------------------------------------------------


def test_dead_letter_list_filters_and_detail():
    scene = build()
    page = ops.list_dead_letters()
    assert [d.seq for d in page.items] == sorted(scene.dead, reverse=True)
    assert {d.group for d in ops.list_dead_letters(ops.DeadLetterFilter(group="billing")).items} == {"billing"}
    keyerrors = ops.list_dead_letters(ops.DeadLetterFilter(error="KeyError")).items
    assert [d.original_id for d in keyerrors] == ["o7"] and keyerrors[0].error_class == "builtins.KeyError"
    assert ops.count_dead_letters(ops.DeadLetterFilter(topic="orders", error="builtins.ValueError")) == 3
    assert ops.count_dead_letters(ops.DeadLetterFilter(failed_after=timezone.now() + dt.timedelta(minutes=1))) == 0
    d = ops.get_dead_letter(scene.dead[0])
    assert d.group == "billing" and "Traceback" in d.last_error and d.payload == {"order": "o0"}
    with pytest.raises(ops.NotFound):
        ops.get_dead_letter(Message.objects.get(topic="orders", id="o1").seq)  # not a dead letter


def test_replay_copies_to_the_original_topic_for_the_failing_group_only():
    scene = build()
    result = ops.replay([scene.dead[0]], actor="alice")
    assert (result.done, result.missing, result.by_group) == (1, 0, {"billing": 1})
    assert not Message.objects.filter(seq=scene.dead[0]).exists()
    copy = Message.objects.get(topic="orders", id=f"o0@replay{scene.dead[0]}")
    marker = copy.metadata[REPLAY_KEY]
    assert marker["consumer_group"] == "billing" and marker["original_id"] == "o0" and marker["replays"] == 1
    assert copy.metadata["trace"] == "abc" and "dead_letter" not in copy.metadata
    assert copy.payload == {"order": "o0"} and copy.key == "k1" and copy.offset is None
    assert not is_for_other_group(copy.metadata, "billing") and is_for_other_group(copy.metadata, "shipping")
    sequence("orders")  # the copy becomes deliverable like any message
    copy.refresh_from_db()
    assert copy.offset is not None


def test_replay_works_after_the_original_was_collected_and_twice_is_once():
    scene = build()
    Message.objects.filter(topic="orders", id="o1").delete()
    assert ops.replay([scene.dead[1]]).done == 1
    again = ops.replay([scene.dead[1]])
    assert (again.done, again.missing) == (0, 1)
    assert Message.objects.filter(topic="orders", id__startswith="o1@replay").count() == 1


def test_replay_of_a_replayed_message_that_failed_again_keeps_the_first_original_id():
    scene = build()
    ops.replay([scene.dead[0]])
    copy = Message.objects.get(topic="orders", id=f"o0@replay{scene.dead[0]}")
    second = console_scene.dead_letter("billing", copy.id)
    Message.objects.filter(seq=second).update(metadata={**copy.metadata, "dead_letter": {"consumer_group": "billing"}})
    ops.replay([second])
    third = Message.objects.get(topic="orders", id=f"o0@replay{second}")
    assert third.metadata[REPLAY_KEY]["replays"] == 2


def test_bulk_replay_and_purge_matching_in_batches():
    build()
    f = ops.DeadLetterFilter(topic="orders", group="billing")
    assert ops.replay_matching(f, dry_run=True, batch_size=2).done == 3
    assert ops.count_dead_letters(f) == 3
    result = ops.replay_matching(f, batch_size=2, actor="cli")
    assert result.done == 3 and ops.count_dead_letters(f) == 0
    assert Message.objects.filter(topic="orders", id__contains="@replay").count() == 3
    purged = ops.purge_matching(ops.DeadLetterFilter())
    assert purged.done == 1 and ops.count_dead_letters() == 0


def test_bulk_selection_validates_input():
    build()
    with pytest.raises(ops.OperationError, match="no dead letter selected"):
        ops.replay([])
    with pytest.raises(ops.OperationError, match="integers"):
        ops.purge(["x"])
