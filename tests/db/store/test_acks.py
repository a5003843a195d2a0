"""AckStore (``store/acks.py``): watermarks, acks and nacks, fenced by the lease, against
real rows and the database clock."""

from __future__ import annotations

import datetime as dt

import pytest

from django_sqlqueue.models import DeliveryState, Message, PartitionLease

from ...support.engine_helpers import (
    IN_FLIGHT,
    RETRY,
    age_lease,
    db_now,
    delivery_rows,
    fetch_fresh,
    publish_to,
    row,
    sequence,
    store,
    watermark,
)
from ...support.factories import ConsumerOffsetFactory
from .helpers import A, B, C, G, T, deliver, fill, leased

pytestmark = pytest.mark.django_db(transaction=True)


# -- watermarks ------------------------------------------------------------------------


def test_ensure_offsets_starts_just_below_the_oldest_retained_message():
    GCED, GONE, FULL, NONE = 0, 1, 2, 7
    fill(GCED, 5)
    fill(GONE, 2)
    fill(FULL, 4)
    Message.objects.filter(topic=T, partition=GCED, offset__lte=3).delete()  # as GC would
    Message.objects.filter(topic=T, partition=GONE).delete()
    ConsumerOffsetFactory(consumer_group=G, topic=T, partition=FULL, offset_acked=2)
    s = store()
    s.ensure_offsets(G, T, [GCED, GONE, FULL, GCED])
    assert watermark(G, T, GCED) == 3  # next message to consume is offset 4, the oldest kept
    assert watermark(G, T, GONE) == 2  # nothing retained: start at the head
    assert watermark(G, T, FULL) == 2  # an existing watermark is left alone
    s.ensure_offsets("fresh-group", T, [FULL])
    assert watermark("fresh-group", T, FULL) == 0
    s.ensure_offsets(G, T, [NONE])  # no head row: nothing to start from
    assert watermark(G, T, NONE) is None


def test_ensure_offsets_ignores_unsequenced_messages():
    """A message waiting for the sequencer (NULL offset) is not "the oldest retained"."""
    fill(A, 3)
    Message.objects.filter(topic=T, partition=A).delete()
    publish_to(T, A, 2, seq=False)
    store().ensure_offsets(G, T, [A])
    assert watermark(G, T, A) == 3  # the head: the unsequenced ones get offsets 4 and 5
    assert sequence(T) == {A: 5}


# -- outcomes --------------------------------------------------------------------------


def test_nack_sets_retry_and_invisibility():
    fill(A, 3)
    s = store()
    deliver(A, [1, 2, 3])
    s.ack(G, T, "w1", [(A, 3)])
    before = db_now()
    s.nack(G, T, "w1", [(A, 2, 5.5), (A, 1, 0.25), (A, 3, 0)])
    after = db_now()
    r1, r2, r3 = (row(G, T, A, off) for off in (1, 2, 3))
    assert r1.status == r2.status == RETRY
    assert before + dt.timedelta(seconds=0.25) <= r1.invisible_until <= after + dt.timedelta(seconds=0.25)
    assert before + dt.timedelta(seconds=5.5) <= r2.invisible_until <= after + dt.timedelta(seconds=5.5)
    assert r3.acked and r3.status == IN_FLIGHT  # an acked row is not nacked


def test_ack_flags_only_the_given_rows_of_the_group():
    fill(A, 3)
    fill(B, 1)
    s = store()
    deliver(A, [1, 2, 3])
    deliver(B, [1])
    deliver(A, [1, 2, 3], group="analytics")
    s.ack(G, T, "w1", [(A, 3), (B, 1), (A, 1)])
    acked = DeliveryState.objects.filter(acked=True).order_by("partition", "message_offset")
    assert [(r.partition, r.message_offset) for r in acked] == [(A, 1), (A, 3), (B, 1)]
    assert all(r.consumer_group == G for r in DeliveryState.objects.filter(acked=True))
    s.ack(G, T, "w1", [])


def test_ack_contiguous_moves_the_watermark_and_deletes_rows():
    fill(A, 5)
    fill(B, 2)
    s = store()
    s.ensure_offsets(G, T, [A, B])
    deliver(A, [1, 2, 3, 4, 5])
    deliver(B, [1, 2])
    deliver(A, [1, 2, 3], group="analytics")
    assert s.ack_contiguous(G, T, "w1", [(A, 0, 3), (B, 0, 2)]) == []
    assert watermark(G, T, A) == 3 and watermark(G, T, B) == 2
    assert [r.message_offset for r in delivery_rows(G, T, A)] == [4, 5]
    assert delivery_rows(G, T, B) == []
    assert len(delivery_rows("analytics", T, A)) == 3  # the other group's rows stay

    # Compare-and-set: the watermark is 3, not 2 -> the partition is returned, nothing changes.
    assert s.ack_contiguous(G, T, "w1", [(A, 2, 5), (B, 2, 2)]) == [A]
    assert watermark(G, T, A) == 3
    assert [r.message_offset for r in delivery_rows(G, T, A)] == [4, 5]
    leased(C)
    assert s.ack_contiguous(G, T, "w1", [(C, 0, 1)]) == [C]  # held, but no watermark row


def test_advance_watermark_stops_at_first_unacked_or_undelivered_offset():
    fill(A, 8)
    s = store()
    s.ensure_offsets(G, T, [A])
    deliver(A, [1, 2, 3, 4, 5])
    s.ack(G, T, "w1", [(A, 1), (A, 2), (A, 4), (A, 5)])
    assert s.advance_watermark(G, T, "w1", A, 0) == 2  # 3 is not acked
    assert watermark(G, T, A) == 2
    assert [r.message_offset for r in delivery_rows(G, T, A)] == [3, 4, 5]
    assert s.advance_watermark(G, T, "w1", A, 2) == 2  # nothing to do
    s.ack(G, T, "w1", [(A, 3)])
    assert s.advance_watermark(G, T, "w1", A, 2) == 5  # 6 was never delivered
    assert watermark(G, T, A) == 5 and delivery_rows(G, T, A) == []

    deliver(A, [6, 7, 8])
    s.ack(G, T, "w1", [(A, 6), (A, 8)])
    DeliveryState.objects.filter(message_offset=7).delete()  # a hole: offset 7 has no row
    assert s.advance_watermark(G, T, "w1", A, 5) == 6
    assert [r.message_offset for r in delivery_rows(G, T, A)] == [8]
    # A stale watermark (someone moved it meanwhile): the compare-and-set refuses.
    assert s.advance_watermark(G, T, "w1", A, 3) == 3
    assert watermark(G, T, A) == 6


def test_advance_watermark_passes_offsets_whose_messages_were_deleted():
    """A group consuming a DLQ topic: an operator replays or purges dead letters above its
    watermark, leaving holes; the watermark passes them instead of stalling there forever."""
    fill(A, 8)
    s = store()
    s.ensure_offsets(G, T, [A])
    deliver(A, [1, 3, 4, 6])
    s.ack(G, T, "w1", [(A, 1), (A, 3), (A, 4), (A, 6)])
    Message.objects.filter(topic=T, partition=A, offset__in=[2, 5]).delete()
    assert s.advance_watermark(G, T, "w1", A, 0) == 6  # 7 is in the log, not delivered yet
    assert watermark(G, T, A) == 6 and delivery_rows(G, T, A) == []
    (st,) = s.poll_state(G, T, "w1", 30)
    assert not st.advanceable  # the message above the watermark is there
    Message.objects.filter(topic=T, partition=A, offset__in=[7, 8]).delete()  # holes up to the head
    (st,) = s.poll_state(G, T, "w1", 30)
    assert st.advanceable
    assert s.advance_watermark(G, T, "w1", A, 6) == 8
    assert s.poll_state(G, T, "w1", 30) == []  # head == watermark, nothing unsequenced: idle


def test_advance_watermark_converges_over_more_rows_than_one_scan():
    from django_sqlqueue.db.store import ADVANCE_SCAN

    n = ADVANCE_SCAN + 205
    fill(A, n)
    s = store()
    leased(A)
    s.ensure_offsets(G, T, [A])
    s.mark_delivered(G, T, "w1", fetch_fresh(G, T, A, limit=n), [], [], 60)
    DeliveryState.objects.filter(consumer_group=G, topic=T, partition=A).update(acked=True)
    assert s.advance_watermark(G, T, "w1", A, 0) == ADVANCE_SCAN
    assert s.advance_watermark(G, T, "w1", A, ADVANCE_SCAN) == n
    assert watermark(G, T, A) == n and delivery_rows(G, T, A) == []


# -- the lease fence -------------------------------------------------------------------


def test_writes_of_a_subscriber_without_the_lease_change_nothing():
    """Every write of a worker is fenced by its lease: one that does not hold the partition
    (never had it, or lost it to an expiry or an operator) writes nothing of it."""
    fill(A, 4)
    s = store()
    s.ensure_offsets(G, T, [A])
    deliver(A, [1, 2, 3])  # w1 holds A
    fetched = {m.offset: m for m in fetch_fresh(G, T, A)}

    def snapshot():
        rows = [(r.message_offset, r.acked, r.status, r.retry_count, r.invisible_until) for r in delivery_rows(G, T, A)]
        return rows, watermark(G, T, A), Message.objects.filter(topic="orders_dlq").count()

    before = snapshot()
    assert s.mark_delivered(G, T, "w2", [fetched[4]], [], [], 60) == set()
    s.ack(G, T, "w2", [(A, 1), (A, 2)])
    s.nack(G, T, "w2", [(A, 3, 0)])
    assert s.ack_contiguous(G, T, "w2", [(A, 0, 3)]) == []  # not held: neither done nor returned
    s.release_deliveries(G, T, "w2", [(A, 1)])
    assert not s.dead_letter(G, T, "w2", fetched[1], dlq_topic="orders_dlq", attempts=1, error="x")
    assert snapshot() == before

    # An operator deletes w1's lease (to rewind, pause...): w1's late writes are no-ops too.
    s.ack(G, T, "w1", [(A, 1)])
    assert PartitionLease.objects.filter(consumer_group=G, topic=T, partition=A).delete()[0] == 1
    before = snapshot()
    s.ack(G, T, "w1", [(A, 2)])
    assert s.ack_contiguous(G, T, "w1", [(A, 0, 1)]) == []
    s.advance_watermark(G, T, "w1", A, 0)  # its return value: see the next test
    assert s.mark_delivered(G, T, "w1", [fetched[4]], [], [], 60) == set()
    assert snapshot() == before
    # An expired lease still fences nothing by itself: the holder writes until it is taken.
    leased(A, "w1")
    age_lease(G, T, A, 3600)
    s.ack(G, T, "w1", [(A, 2)])
    assert row(G, T, A, 2).acked
    assert s.acquire_leases(G, T, [A], "thief", 30) == [A]
    s.ack(G, T, "w1", [(A, 3)])
    assert not row(G, T, A, 3).acked


def test_advance_watermark_without_the_lease_returns_the_unchanged_watermark():
    fill(A, 2)
    s = store()
    s.ensure_offsets(G, T, [A])
    deliver(A, [1, 2])
    s.ack(G, T, "w1", [(A, 1)])
    s.release_leases(G, T, "w1")
    assert s.advance_watermark(G, T, "w1", A, 0) == 0
    assert watermark(G, T, A) == 0
