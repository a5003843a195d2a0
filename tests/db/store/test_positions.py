"""store/positions.py: operator writes to a group's positions, fenced by the lease rows.

Real rows on the test database. The fence tests force the interleaving with a row lock
held by a second connection (as ``test_gc.py`` does): a worker's fenced write holds its
lease row's share lock (``lock_held``) while the operator's write waits for it.
"""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass, field

import pytest
from django.db import transaction
from django.utils import timezone

from django_sqlqueue.db.store.positions import GROUP_TABLES
from django_sqlqueue.models import (
    ConsumerOffset,
    DeliveryState,
    Message,
    PartitionLease,
    PausedTopic,
    SubscriberHeartbeat,
)
from django_sqlqueue.spark.options import SparkOptionError
from django_sqlqueue.spark.pipelines import replay_to_group

from ...support.engine_helpers import (
    IN_FLIGHT,
    RETRY,
    head,
    leased,
    lock_waiting,
    publish_to,
    requires_vendor,
    session_id,
    store,
    wait_until,
    watermark,
)
from ...support.factories import DeliveryStateFactory, PausedTopicFactory, SubscriberHeartbeatFactory

pytestmark = pytest.mark.django_db(transaction=True)

G, T = "billing", "positions"
A, B = 0, 1


@dataclass(frozen=True)
class Move:
    partition: int
    watermark: int
    target: int


@dataclass(frozen=True)
class Plan:
    partitions: list[Move] = field(default_factory=list)


def to(target: int, *partitions: int):
    """A ``replan`` for ``seek_to``: every partition to ``target``, from the locked watermarks."""
    return lambda marks: Plan([Move(p, marks.get(p, 0), target) for p in partitions])


def consuming(n: int = 10, wm: int = 5) -> None:
    """Partitions A and B with ``n`` messages each; G's watermark at ``wm``; w1 leases both."""
    publish_to(T, A, n)
    publish_to(T, B, n)
    s = store()
    s.ensure_offsets(G, T, [A, B])
    leased(G, T, A)
    leased(G, T, B)
    assert s.ack_contiguous(G, T, "w1", [(A, 0, wm), (B, 0, wm)]) == []


# -- releasing a lease -------------------------------------------------------------------


def test_release_lease_deletes_only_the_named_holders_lease():
    consuming()
    s = store()
    assert s.release_lease(G, T, A, holder="w2") == 0
    assert s.release_lease(G, T, A, holder="w1") == 1
    assert s.release_lease(G, T, A) == 0
    assert s.release_lease(G, T, B) == 1
    assert not PartitionLease.objects.exists()


def test_a_worker_whose_lease_was_released_can_no_longer_ack():
    consuming()
    store().release_lease(G, T, A)
    assert store().ack_contiguous(G, T, "w1", [(A, 5, 8)], report_skipped=True) == [A]
    assert watermark(G, T, A) == 5


# -- seeking -----------------------------------------------------------------------------


def test_seek_rewind_deletes_leases_and_all_delivery_state_then_writes_the_watermark():
    consuming()
    DeliveryStateFactory(consumer_group=G, topic=T, partition=A, message_offset=7, acked=True)
    DeliveryStateFactory(consumer_group=G, topic=T, partition=B, message_offset=7, acked=True)
    released, plan = store().seek_to(G, T, [A], to(2, A))
    assert released == 1 and plan.partitions == [Move(A, 5, 2)]
    assert watermark(G, T, A) == 2 and watermark(G, T, B) == 5
    assert list(DeliveryState.objects.values_list("partition", flat=True)) == [B]
    assert list(PartitionLease.objects.values_list("partition", flat=True)) == [B]


def test_seek_fast_forward_keeps_delivery_state_above_the_target():
    consuming()
    DeliveryStateFactory(consumer_group=G, topic=T, partition=A, message_offset=6, status=IN_FLIGHT)
    DeliveryStateFactory(consumer_group=G, topic=T, partition=A, message_offset=9, status=RETRY, retry_count=2)
    store().seek_to(G, T, [A], to(8, A))
    assert watermark(G, T, A) == 8
    assert [(r.message_offset, r.retry_count) for r in DeliveryState.objects.all()] == [(9, 2)]


def test_seek_creates_the_watermark_of_a_partition_the_group_never_consumed():
    publish_to(T, A, 4)
    store().seek_to(G, T, [A], to(3, A))
    assert watermark(G, T, A) == 3


def test_seek_plan_inputs_count_messages_and_acked_rows():
    consuming()
    DeliveryStateFactory(consumer_group=G, topic=T, partition=A, message_offset=7, acked=True)
    s = store()
    assert s.group_watermarks(G, T) == {A: 5, B: 5}
    assert s.count_messages(T, A, 2, 5) == (3, True)
    assert s.count_acked(G, T, A, 5, None) == 1 and s.count_acked(G, T, A, 7, None) == 0
    assert s.first_offset(T, A) == 1
    assert s.first_offset(T, A, timezone.now() + dt.timedelta(minutes=1)) is None


@requires_vendor("mysql", "postgresql")
def test_seek_waits_for_a_fenced_worker_write_in_progress_then_the_workers_next_write_is_a_no_op(spawn):
    consuming()
    locked, release = threading.Event(), threading.Event()

    def worker_mid_ack() -> set[int]:
        # A worker's fenced write: share-lock the lease row, then (here) linger before committing.
        with transaction.atomic(), store().connection.cursor() as cursor:
            held = store().lock_held(cursor, G, T, "w1", [A])
            locked.set()
            assert release.wait(10)
        return held

    operator_ids: list[int] = []

    def operator_seek() -> tuple[int, Plan]:
        operator_ids.append(session_id())
        return store().seek_to(G, T, [A], to(0, A))

    worker = spawn(worker_mid_ack, name="worker")
    assert locked.wait(10)
    operator = spawn(operator_seek, name="operator")
    wait_until(lambda: operator_ids and lock_waiting(operator_ids[0]), timeout=5, what="the seek waiting on the lease")
    assert watermark(G, T, A) == 5  # nothing written while it waits
    release.set()
    assert worker.join_ok() == {A}
    released, _ = operator.join_ok()
    assert released == 1 and watermark(G, T, A) == 0
    # The worker's next fenced write finds no lease: the rewound watermark stays put.
    assert store().ack_contiguous(G, T, "w1", [(A, 0, 8)], report_skipped=True) == [A]
    assert watermark(G, T, A) == 0


def test_a_late_ack_after_a_seek_cannot_move_the_rewound_watermark():
    consuming()
    store().seek_to(G, T, [A], to(1, A))
    assert store().ack_contiguous(G, T, "w1", [(A, 1, 9)], report_skipped=True) == [A]
    store().ack(G, T, "w1", [(A, 2)])
    assert watermark(G, T, A) == 1 and not DeliveryState.objects.filter(partition=A).exists()


# -- starting a new group ------------------------------------------------------------------


def test_start_group_places_watermarks_below_the_first_message_since_a_time():
    publish_to(T, A, 6)
    publish_to(T, B, 2)
    old = timezone.now() - dt.timedelta(hours=5)
    Message.objects.filter(topic=T, partition=A, offset__lte=4).update(published_at=old)
    Message.objects.filter(topic=T, partition=B).update(published_at=old)
    marks = store().start_group("audit", T, timezone.now() - dt.timedelta(hours=1))
    assert marks[A] == 4 and marks[B] == head(T, B) == 2
    assert watermark("audit", T, A) == 4 and watermark("audit", T, B) == 2
    assert store().start_group("audit", T, old) is None
    assert watermark("audit", T, A) == 4


def test_replay_to_group_refuses_a_group_that_already_consumes_the_topic():
    publish_to(T, A, 3)
    assert replay_to_group(T, "audit", timezone.now() - dt.timedelta(hours=1))[A] == 0
    with pytest.raises(SparkOptionError, match="already consumes"):
        replay_to_group(T, "audit", timezone.now())


# -- pausing -------------------------------------------------------------------------------


def test_pause_deletes_the_groups_leases_and_inserts_the_row_once():
    consuming()
    s = store()
    assert s.pause(G, T, "alice", "bad deploy") is True
    assert s.pause(G, T, "bob", "") is False
    assert not PartitionLease.objects.exists()
    row = PausedTopic.objects.get()
    assert (row.paused_by, row.reason) == ("alice", "bad deploy")
    assert s.resume(G, T) is True and s.resume(G, T) is False


# -- dropping a group ------------------------------------------------------------------------


def test_drop_group_counts_then_deletes_every_row_of_the_group_leases_first():
    consuming()
    DeliveryStateFactory(consumer_group=G, topic=T, partition=A, message_offset=6)
    SubscriberHeartbeatFactory(consumer_group=G, topic=T, subscriber_name="w1")
    PausedTopicFactory(consumer_group=G, topic="other")
    ConsumerOffset.objects.create(
        consumer_group="keep", topic=T, partition=A, offset_acked=1, updated_at=timezone.now()
    )
    s = store()
    assert list(s.group_rows(G)) == list(GROUP_TABLES) and GROUP_TABLES[0] == "queue_partition_leases"
    assert s.group_rows(G, T)["queue_paused_topics"] == 0 and s.group_rows(G)["queue_paused_topics"] == 1
    assert s.drop_group(G, T) == {
        "queue_partition_leases": 2,
        "queue_delivery_state": 1,
        "queue_offsets": 2,
        "queue_subscriber_heartbeats": 1,
        "queue_paused_topics": 0,
    }
    assert s.drop_group(G)["queue_paused_topics"] == 1
    assert not any(s.group_rows(G).values())
    assert ConsumerOffset.objects.filter(consumer_group="keep").exists()
    assert not SubscriberHeartbeat.objects.filter(consumer_group=G).exists()


# -- purging a topic -------------------------------------------------------------------------


def test_skip_topic_fences_moves_watermarks_to_the_head_and_drops_delivery_state():
    consuming(wm=3)
    DeliveryStateFactory(consumer_group=G, topic=T, partition=A, message_offset=4)
    assert store().skip_topic(T) == (2, 1)
    assert watermark(G, T, A) == head(T, A) and watermark(G, T, B) == head(T, B)
    assert store().ack_contiguous(G, T, "w1", [(A, 10, 12)], report_skipped=True) == [A]


def test_delete_messages_deletes_in_batches_up_to_the_seq_read_at_the_start():
    publish_to(T, A, 7)
    max_seq, count, known = store().topic_extent(T)
    assert count == 7 and not known
    publish_to(T, A, 1)  # published after the purge began: kept
    assert store().delete_messages(T, max_seq, batch_size=3) == 7
    assert Message.objects.filter(topic=T).count() == 1
    assert store().topic_extent("nothing") == (None, 0, False)


@pytest.mark.parametrize("size", [0, -1, True, 2.5])
def test_delete_messages_refuses_a_size_that_would_delete_nothing_or_everything(size):
    """LIMIT 0 deleted nothing while the purge reported success; LIMIT -1 is "no limit" on SQLite."""
    publish_to(T, A, 3)
    max_seq, _, _ = store().topic_extent(T)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        store().delete_messages(T, max_seq, batch_size=size)
    assert Message.objects.filter(topic=T).count() == 3


def test_purge_steps_call_their_hooks_inside_their_transactions():
    """``then`` of skip_topic and ``on_batch`` of delete_messages run in the step's transaction:
    an error there rolls that step back (an audit row written there commits with it)."""
    consuming(n=4, wm=1)
    seen: list[tuple[str, int, int]] = []

    def fence(leases: int, states: int) -> None:
        assert transaction.get_connection().in_atomic_block
        seen.append(("fence", leases, states))
        raise RuntimeError("audit failed")

    with pytest.raises(RuntimeError):
        store().skip_topic(T, then=fence)
    assert watermark(G, T, A) == 1 and PartitionLease.objects.filter(topic=T).count() == 2  # rolled back
    assert store().skip_topic(T, then=lambda leases, states: seen.append(("fence", leases, states))) == (2, 0)

    max_seq, _, _ = store().topic_extent(T)

    def batch(n: int) -> None:
        seen.append(("batch", n, Message.objects.filter(topic=T).count()))
        if len(seen) == 4:
            raise RuntimeError("audit failed")

    with pytest.raises(RuntimeError):
        store().delete_messages(T, max_seq, batch_size=3, on_batch=batch)
    assert Message.objects.filter(topic=T).count() == 5  # the first batch committed, the second rolled back
    assert seen == [("fence", 2, 0), ("fence", 2, 0), ("batch", 3, 5), ("batch", 3, 2)]
    assert store().delete_messages(T, max_seq, batch_size=3) == 5  # a rerun completes
