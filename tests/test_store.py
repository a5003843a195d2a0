"""QueueStore: every consumer-side statement, against real rows and the database clock."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.db import transaction

from django_sqlqueue import publish, publish_many
from django_sqlqueue.models import (
    ConsumerOffset,
    DeliveryState,
    Message,
    PartitionLease,
    SubscriberHeartbeat,
)
from django_sqlqueue.store import FetchPlan

from .engine_helpers import (
    IN_FLIGHT,
    RETRY,
    SCHEDULED,
    age_lease,
    age_messages,
    db_now,
    delivery_rows,
    execute,
    fetch_due,
    fetch_fresh,
    now_minus,
    row,
    store,
    watermark,
)
from .factories import ConsumerOffsetFactory, SubscriberHeartbeatFactory

pytestmark = pytest.mark.django_db(transaction=True)

G, T = "billing", "orders"


def fill(key: str, n: int, topic: str = T) -> list[Message]:
    return publish_many(
        topic,
        [{"payload": {"key": key, "i": i}, "partition_key": key} for i in range(1, n + 1)],
    )


def stored_offsets(**filters: object) -> list[int]:
    """Offsets of the stored messages matching ``filters``, in offset order."""
    return list(Message.objects.filter(**filters).order_by("offset").values_list("offset", flat=True))


def deliver(
    key: str,
    offsets: list[int],
    *,
    group: str = G,
    topic: str = T,
    visibility: float = 60,
) -> None:
    """Record fresh deliveries of ``offsets`` (they must never have been delivered)."""
    fetched = [m for m in fetch_fresh(group, topic, key) if m.offset in offsets]
    assert sorted(m.offset for m in fetched) == sorted(offsets)
    store().mark_delivered(group, topic, fetched, [], [], visibility)


def leased(key: str, name: str = "w1", group: str = G, topic: str = T, duration: float = 30) -> None:
    assert store().acquire_lease(group, topic, key, name, duration)


# -- heartbeats ------------------------------------------------------------------------


def test_heartbeat_deregister_and_active_subscribers():
    s = store()
    s.heartbeat(G, T, "w1")
    s.heartbeat(G, T, "w2")
    s.heartbeat("other", T, "w3")
    assert s.active_subscribers(G, T, 30) == 2
    s.deregister(G, T, "w2")
    assert SubscriberHeartbeat.objects.get(subscriber_name="w2").deregistered_at is not None
    assert s.active_subscribers(G, T, 30) == 1
    s.heartbeat(G, T, "w2")  # back again: no longer deregistered
    assert SubscriberHeartbeat.objects.get(subscriber_name="w2").deregistered_at is None
    ago, ago_params = now_minus(60)
    sql = f"UPDATE queue_subscriber_heartbeats SET heartbeat_at = {ago} WHERE subscriber_name = 'w1'"
    assert execute(sql, ago_params) == 1
    assert s.active_subscribers(G, T, 30) == 1
    assert s.forget_subscribers(T, 45) == 1
    assert set(SubscriberHeartbeat.objects.values_list("subscriber_name", flat=True)) == {"w2", "w3"}


# -- leases ------------------------------------------------------------------------------


def test_poll_state_returns_only_partitions_validly_leased_by_the_subscriber():
    for key in "abcdef":
        fill(key, 3)
    s = store()
    leased("a")
    leased("b")
    leased("c", name="w2")  # someone else's
    leased("d")
    age_lease(G, T, "d", 31)  # ours, but expired
    leased("e")
    ConsumerOffsetFactory(consumer_group=G, topic=T, partition_key="e", offset_acked=3)  # caught up
    leased("f", group="analytics")  # another group's lease by the same name
    s.ensure_offsets(G, T, ["a"])

    states = s.poll_state(G, T, "w1", 30)
    assert [st.partition_key for st in states] == ["a", "b"]
    a, b = states
    assert (a.head, a.watermark, a.has_offsets_row) == (3, 0, True)
    assert (b.head, b.watermark, b.has_offsets_row) == (3, 0, False)
    for st in states:
        assert st.delivered_max is None and st.next_due is None
        assert st.in_flight == 0 and not st.advanceable
    assert [st.partition_key for st in s.poll_state(G, T, "w2", 30)] == ["c"]
    assert s.poll_state(G, T, "nobody", 30) == []


def test_poll_state_reports_deliveries_of_a_partition():
    fill("a", 6)
    s = store()
    leased("a")
    s.ensure_offsets(G, T, ["a"])
    before = db_now()
    deliver("a", [1, 2, 3, 4], visibility=60)
    (st,) = s.poll_state(G, T, "w1", 30)
    assert st.delivered_max == 4 and st.in_flight == 4 and not st.advanceable
    assert st.next_due >= before + dt.timedelta(seconds=60)
    assert st.now >= before

    s.ack(G, T, [("a", 1)])
    s.nack(G, T, [("a", 3, 0)])
    (st,) = s.poll_state(G, T, "w1", 30)
    assert st.advanceable  # the row right after the watermark is acked
    assert st.in_flight == 2  # 2 and 4: the acked and the nacked rows are not in flight
    assert st.next_due <= st.now  # the nacked row is due
    assert st.delivered_max == 4


def test_acquire_lease_takes_a_missing_lease_and_refuses_a_live_one():
    fill("a", 1)
    s = store()
    before = db_now()
    assert s.acquire_lease(G, T, "a", "w1", 30)
    assert not s.acquire_lease(G, T, "a", "w2", 30)
    assert s.acquire_lease(G, T, "a", "w2", 30) is False
    lease = PartitionLease.objects.get(consumer_group=G, topic=T, partition_key="a")
    assert lease.leased_by == "w1" and lease.lease_renewed_at >= before
    # Leases are per group: another group takes the same partition.
    assert s.acquire_lease("analytics", T, "a", "w2", 30)
    assert PartitionLease.objects.count() == 2


def test_acquire_lease_steals_only_an_expired_lease():
    fill("a", 1)
    s = store()
    leased("a", "w1")
    age_lease(G, T, "a", 10)
    assert not s.acquire_lease(G, T, "a", "w2", 30)  # 10s old: still live for a 30s lease
    assert PartitionLease.objects.get(partition_key="a").leased_by == "w1"
    age_lease(G, T, "a", 31)
    before = db_now()
    assert s.acquire_lease(G, T, "a", "w2", 30)
    lease = PartitionLease.objects.get(partition_key="a")
    assert lease.leased_by == "w2"
    assert lease.leased_at >= before and lease.lease_renewed_at >= before
    # The former holder learns it on renewal: the partition is not renewed nor returned.
    assert s.renew_leases(G, T, "w1") == []
    assert s.renew_leases(G, T, "w2") == ["a"]


def test_acquire_lease_insert_race_loses_cleanly(spawn):
    """Two subscribers insert the same missing lease; the loser gets False, not an error."""
    fill("a", 1)
    inserted, release = threading.Event(), threading.Event()

    def first() -> bool:
        with transaction.atomic():
            got = store().acquire_lease(G, T, "a", "w1", 30)
            inserted.set()
            assert release.wait(10)
        return got

    holder = spawn(first, name="first")
    assert inserted.wait(10)
    second = spawn(lambda: store().acquire_lease(G, T, "a", "w2", 30), name="second")
    second.join(0.5)
    assert second.is_alive(), "the second INSERT must wait for the first one's uncommitted row"
    release.set()
    assert holder.join_ok() is True
    assert second.join_ok() is False
    assert list(PartitionLease.objects.values_list("leased_by", flat=True)) == ["w1"]


def test_renew_leases_renews_and_returns_only_leases_still_held():
    for key in "abc":
        fill(key, 1)
    s = store()
    leased("a")
    leased("b")
    leased("c", "w2")
    age_lease(G, T, "a", 20)
    age_lease(G, T, "b", 20)
    before = db_now()
    assert s.renew_leases(G, T, "w1") == ["a", "b"]
    for key in "ab":
        assert PartitionLease.objects.get(partition_key=key).lease_renewed_at >= before
    # b expires and is stolen by w3: w1 renews only a from now on.
    age_lease(G, T, "b", 31)
    assert s.acquire_lease(G, T, "b", "w3", 30)
    assert s.renew_leases(G, T, "w1") == ["a"]
    assert s.held_partitions(G, T, "w1") == ["a"]
    assert s.renew_leases(G, T, "w2") == ["c"]


def test_release_leases_all_or_some():
    for key in "abcd":
        fill(key, 1)
    s = store()
    for key in "abc":
        leased(key)
    leased("d", "w2")
    assert s.release_leases(G, T, "w1", ["b"]) == 1
    assert s.held_partitions(G, T, "w1") == ["a", "c"]
    assert s.release_leases(G, T, "w1", []) == 0
    assert s.release_leases(G, T, "w1", ["d"]) == 0  # not ours
    assert s.release_leases(G, T, "w1") == 2
    assert list(PartitionLease.objects.values_list("partition_key", "leased_by")) == [("d", "w2")]


def test_free_partitions_lists_unleased_and_expired_partitions():
    for key in "abcd":
        fill(key, 1)
    fill("x", 1, topic="other.topic")
    s = store()
    leased("a")
    leased("b")
    age_lease(G, T, "b", 31)
    leased("c", group="analytics")  # another group's lease does not count
    assert s.free_partitions(G, T, 30) == ["b", "c", "d"]
    assert s.free_partitions(G, T, 60) == ["c", "d"]  # b is live for a 60s lease
    assert s.partitions(T) == ["a", "b", "c", "d"]


# -- watermarks -------------------------------------------------------------------------


def test_ensure_offsets_starts_just_below_the_oldest_retained_message():
    fill("gc", 5)
    fill("gone", 2)
    fill("full", 4)
    Message.objects.filter(topic=T, partition_key="gc", offset__lte=3).delete()  # as GC would
    Message.objects.filter(topic=T, partition_key="gone").delete()
    ConsumerOffsetFactory(consumer_group=G, topic=T, partition_key="full", offset_acked=2)
    s = store()
    s.ensure_offsets(G, T, ["gc", "gone", "full", "gc"])
    assert watermark(G, T, "gc") == 3  # next message to consume is offset 4, the oldest kept
    assert watermark(G, T, "gone") == 2  # nothing retained: start at the head
    assert watermark(G, T, "full") == 2  # an existing watermark is left alone
    s.ensure_offsets("fresh-group", T, ["full"])
    assert watermark("fresh-group", T, "full") == 0
    s.ensure_offsets(G, T, ["no-such-partition"])
    assert watermark(G, T, "no-such-partition") is None


# -- fetching -------------------------------------------------------------------------------


def test_fetch_returns_fresh_and_due_messages():
    published = fill("a", 5)
    publish(T, {"other": True}, partition_key="b", id="b-1", metadata={"m": 1})
    s = store()
    s.ensure_offsets(G, T, ["a", "b"])
    deliver("a", [1, 2, 3])
    s.nack(G, T, [("a", 2, 0), ("a", 3, 60)])  # 2 due now, 3 in a minute

    got = s.fetch(G, T, [FetchPlan("a", 3, True), FetchPlan("b", 0, False)], 10)
    by_pos = {(m.partition_key, m.offset): m for m in got}
    assert sorted(by_pos) == [("a", 2), ("a", 4), ("a", 5), ("b", 1)]
    due = by_pos[("a", 2)]
    assert (due.retry_count, due.status) == (0, RETRY)
    assert all(by_pos[k].retry_count is None and by_pos[k].status is None for k in [("a", 4), ("a", 5), ("b", 1)])
    stored = Message.objects.get(topic=T, partition_key="a", offset=4)
    m4 = by_pos[("a", 4)]
    assert (m4.id, m4.payload, m4.metadata) == (
        published[3].id,
        {"key": "a", "i": 4},
        {},
    )
    assert (m4.created_at, m4.deliver_at) == (stored.created_at, stored.deliver_at)
    b1 = by_pos[("b", 1)]
    assert (b1.id, b1.payload, b1.metadata) == ("b-1", {"other": True}, {"m": 1})

    assert [m.offset for m in s.fetch(G, T, [FetchPlan("a", 3, False)], 1)] == [4]  # limit per branch
    assert [m.offset for m in s.fetch(G, T, [FetchPlan("a", None, True)], 10)] == [2]
    assert s.fetch(G, T, [FetchPlan("a", 5, False)], 10) == []
    # Another group's delivery rows are not this group's due messages.
    assert s.fetch("analytics", T, [FetchPlan("a", None, True)], 10) == []


def test_fetch_is_not_blocked_by_a_nacked_message_with_many_rows_behind_it():
    """The RFC's ``offset > watermark LIMIT n`` would return only offsets 1..10 here,
    none of them deliverable, and the partition would stall behind the nack."""
    fill("a", 40)
    s = store()
    leased("a")
    s.ensure_offsets(G, T, ["a"])
    deliver("a", list(range(1, 27)))
    s.nack(G, T, [("a", 1, 0)])  # watermark+1 waits for its retry, due now
    s.ack(G, T, [("a", off) for off in range(2, 14)])  # 12 acked rows behind it
    # ... and 13 in flight (14..26): 25 rows between the nack and the fresh messages.
    (st,) = s.poll_state(G, T, "w1", 30)
    assert (st.watermark, st.delivered_max, st.in_flight, st.advanceable) == (
        0,
        26,
        13,
        False,
    )
    assert st.next_due <= st.now
    plan = FetchPlan("a", max(st.watermark, st.delivered_max), True)
    got = s.fetch(G, T, [plan], 10)
    assert sorted(m.offset for m in got) == [1, *range(27, 37)]
    assert [m.retry_count for m in got if m.offset == 1] == [0]


# -- recording deliveries ------------------------------------------------------------------


def test_mark_delivered_fresh_redelivered_and_parked():
    fill("a", 3)
    delayed = publish(T, "later", partition_key="a", delay=3600)
    s = store()
    s.ensure_offsets(G, T, ["a"])
    fetched = {m.offset: m for m in fetch_fresh(G, T, "a")}
    before = db_now()
    s.mark_delivered(G, T, [fetched[1], fetched[2], fetched[3]], [], [fetched[delayed.offset]], 30)
    after = db_now()
    for off in (1, 2, 3):
        r = row(G, T, "a", off)
        assert (r.status, r.retry_count, r.acked) == (IN_FLIGHT, 0, False)
        assert before + dt.timedelta(seconds=30) <= r.invisible_until <= after + dt.timedelta(seconds=30)
    parked = row(G, T, "a", delayed.offset)
    assert (parked.status, parked.retry_count, parked.acked) == (SCHEDULED, 0, False)
    assert parked.invisible_until == Message.objects.get(topic=T, partition_key="a", offset=4).deliver_at

    # 1 is nacked, 2's visibility expires, the parked 4 comes due (data, not the clock).
    s.nack(G, T, [("a", 1, 0)])
    ago, ago_params = now_minus(1)
    where = "partition_key = 'a' AND message_offset IN (2, 4)"
    assert execute(f"UPDATE queue_delivery_state SET invisible_until = {ago} WHERE {where}", ago_params) == 2
    due = {m.offset: m for m in fetch_due(G, T, "a")}
    assert sorted(due) == [1, 2, 4]
    before = db_now()
    s.mark_delivered(G, T, [], list(due.values()), [], 10)
    after = db_now()
    counts = {off: row(G, T, "a", off).retry_count for off in (1, 2, 3, 4)}
    # A nacked or expired delivery counts a retry; a parked message's first delivery does not.
    assert counts == {1: 1, 2: 1, 3: 0, 4: 0}
    for off in (1, 2, 4):
        r = row(G, T, "a", off)
        assert r.status == IN_FLIGHT
        assert before + dt.timedelta(seconds=10) <= r.invisible_until <= after + dt.timedelta(seconds=10)
    assert DeliveryState.objects.count() == 4


def test_mark_delivered_leaves_an_existing_row_alone():
    fill("a", 2)
    s = store()
    (m1, m2) = fetch_fresh(G, T, "a")
    s.mark_delivered(G, T, [m1], [], [], 60)
    s.nack(G, T, [("a", 1, 120)])
    # A racing former lease holder delivers 1 again as fresh: the row keeps its state.
    s.mark_delivered(G, T, [m1, m2], [], [], 5)
    r1 = row(G, T, "a", 1)
    assert (r1.status, r1.retry_count) == (RETRY, 0)
    assert r1.invisible_until > db_now() + dt.timedelta(seconds=100)
    assert row(G, T, "a", 2).status == IN_FLIGHT


def test_mark_delivered_redelivery_skips_acked_rows():
    fill("a", 1)
    s = store()
    (m1,) = fetch_fresh(G, T, "a")
    s.mark_delivered(G, T, [m1], [], [], 60)
    s.nack(G, T, [("a", 1, 0)])
    (due,) = fetch_due(G, T, "a")
    s.ack(G, T, [("a", 1)])  # acked meanwhile (e.g. by a former holder)
    s.mark_delivered(G, T, [], [due], [], 60)
    r = row(G, T, "a", 1)
    assert r.acked and r.retry_count == 0 and r.status == RETRY


def test_release_deliveries_restores_retry_count_and_makes_them_due():
    fill("a", 3)
    s = store()
    fetched = fetch_fresh(G, T, "a")
    s.mark_delivered(G, T, fetched, [], [], 60)
    s.nack(G, T, [("a", 2, 0)])
    (due,) = fetch_due(G, T, "a")
    s.mark_delivered(G, T, [], [due], [], 60)  # 2 is on its second attempt
    assert row(G, T, "a", 2).retry_count == 1
    s.nack(G, T, [("a", 3, 60)])  # 3 waits for a retry: not in flight, left alone

    s.release_deliveries(G, T, [("a", 1), ("a", 2), ("a", 3)])
    now = db_now()
    r1, r2, r3 = (row(G, T, "a", off) for off in (1, 2, 3))
    assert (r1.status, r1.retry_count) == (
        SCHEDULED,
        0,
    )  # never really delivered: attempt 1 again
    assert (r2.status, r2.retry_count) == (RETRY, 0)  # the second attempt is given back
    assert r1.invisible_until <= now and r2.invisible_until <= now
    assert (r3.status, r3.retry_count) == (
        RETRY,
        0,
    ) and r3.invisible_until > now + dt.timedelta(seconds=50)
    # Redelivered after the release, they come back with the same attempt numbers.
    again = {m.offset: m for m in fetch_due(G, T, "a")}
    assert sorted(again) == [1, 2]
    s.mark_delivered(G, T, [], list(again.values()), [], 60)
    assert row(G, T, "a", 1).retry_count == 0 and row(G, T, "a", 2).retry_count == 1
    s.release_deliveries(G, T, [])  # nothing to do


# -- outcomes ----------------------------------------------------------------------------------


def test_nack_sets_retry_and_invisibility():
    fill("a", 3)
    s = store()
    deliver("a", [1, 2, 3])
    s.ack(G, T, [("a", 3)])
    before = db_now()
    s.nack(G, T, [("a", 2, 5.5), ("a", 1, 0.25), ("a", 3, 0)])
    after = db_now()
    r1, r2, r3 = (row(G, T, "a", off) for off in (1, 2, 3))
    assert r1.status == r2.status == RETRY
    assert before + dt.timedelta(seconds=0.25) <= r1.invisible_until <= after + dt.timedelta(seconds=0.25)
    assert before + dt.timedelta(seconds=5.5) <= r2.invisible_until <= after + dt.timedelta(seconds=5.5)
    assert r3.acked and r3.status == IN_FLIGHT  # an acked row is not nacked


def test_ack_flags_only_the_given_rows_of_the_group():
    fill("a", 3)
    fill("b", 1)
    s = store()
    deliver("a", [1, 2, 3])
    deliver("b", [1])
    deliver("a", [1, 2, 3], group="analytics")
    s.ack(G, T, [("a", 3), ("b", 1), ("a", 1)])
    acked = DeliveryState.objects.filter(acked=True).order_by("partition_key", "message_offset")
    assert [(r.partition_key, r.message_offset) for r in acked] == [
        ("a", 1),
        ("a", 3),
        ("b", 1),
    ]
    assert all(r.consumer_group == G for r in DeliveryState.objects.filter(acked=True))
    s.ack(G, T, [])


def test_ack_contiguous_moves_the_watermark_and_deletes_rows():
    fill("a", 5)
    fill("b", 2)
    s = store()
    s.ensure_offsets(G, T, ["a", "b"])
    deliver("a", [1, 2, 3, 4, 5])
    deliver("b", [1, 2])
    deliver("a", [1, 2, 3], group="analytics")
    assert s.ack_contiguous(G, T, [("a", 0, 3), ("b", 0, 2)]) == []
    assert watermark(G, T, "a") == 3 and watermark(G, T, "b") == 2
    assert [r.message_offset for r in delivery_rows(G, T, "a")] == [4, 5]
    assert delivery_rows(G, T, "b") == []
    assert len(delivery_rows("analytics", T, "a")) == 3  # the other group's rows stay

    # Compare-and-set: the watermark is 3, not 2 -> the key is returned, nothing changes.
    assert s.ack_contiguous(G, T, [("a", 2, 5), ("b", 2, 2)]) == ["a"]
    assert watermark(G, T, "a") == 3
    assert [r.message_offset for r in delivery_rows(G, T, "a")] == [4, 5]
    assert s.ack_contiguous(G, T, [("no-row", 0, 1)]) == ["no-row"]


def test_advance_watermark_stops_at_first_unacked_or_undelivered_offset():
    fill("a", 8)
    s = store()
    s.ensure_offsets(G, T, ["a"])
    deliver("a", [1, 2, 3, 4, 5])
    s.ack(G, T, [("a", 1), ("a", 2), ("a", 4), ("a", 5)])
    assert s.advance_watermark(G, T, "a", 0) == 2  # 3 is not acked
    assert watermark(G, T, "a") == 2
    assert [r.message_offset for r in delivery_rows(G, T, "a")] == [3, 4, 5]
    assert s.advance_watermark(G, T, "a", 2) == 2  # nothing to do
    s.ack(G, T, [("a", 3)])
    assert s.advance_watermark(G, T, "a", 2) == 5  # 6 was never delivered
    assert watermark(G, T, "a") == 5 and delivery_rows(G, T, "a") == []

    deliver("a", [6, 7, 8])
    s.ack(G, T, [("a", 6), ("a", 8)])
    DeliveryState.objects.filter(message_offset=7).delete()  # a hole: offset 7 has no row
    assert s.advance_watermark(G, T, "a", 5) == 6
    assert [r.message_offset for r in delivery_rows(G, T, "a")] == [8]
    # A stale watermark (someone moved it meanwhile): the compare-and-set refuses.
    assert s.advance_watermark(G, T, "a", 3) == 3
    assert watermark(G, T, "a") == 6


def test_dead_letter_copies_to_the_dlq_and_acks_for_the_group_only():
    original = publish(T, {"n": 1}, partition_key="k", id="o-1", metadata={"trace": "x"})
    s = store()
    deliver("k", [1])
    deliver("k", [1], group="analytics")
    (m,) = fetch_fresh(G, T, "k")
    before = db_now()
    s.dead_letter(G, T, m, dlq_topic="orders_dlq", attempts=3, error="builtins.ValueError: boom")
    after = db_now()
    s.dead_letter(G, T, m, dlq_topic="orders_dlq", attempts=3, error="again")  # a retried call: no copy

    (dl,) = Message.objects.filter(topic="orders_dlq")
    stored = Message.objects.get(topic=T, partition_key="k", offset=1)
    assert (dl.partition_key, dl.offset, dl.id) == ("k", 1, "billing:o-1")
    assert dl.payload == {"n": 1}
    assert dl.metadata == {
        "trace": "x",
        "dead_letter": {
            "consumer_group": G,
            "original_offset": 1,
            "original_id": "o-1",
        },
    }
    assert (dl.failure_count, dl.last_error, dl.original_topic) == (
        3,
        "builtins.ValueError: boom",
        T,
    )
    assert before <= dl.failed_at <= after
    assert dl.created_at == stored.created_at == original.created_at
    assert dl.published_at >= before and dl.is_dead_letter
    # The original stays in the log, acked for billing only.
    assert stored.id == "o-1" and not stored.is_dead_letter
    assert row(G, T, "k", 1).acked
    assert not row("analytics", T, "k", 1).acked

    s.dead_letter("analytics", T, m, dlq_topic="orders_dlq", attempts=1, error="x")
    assert sorted(Message.objects.filter(topic="orders_dlq").values_list("id", flat=True)) == [
        "analytics:o-1",
        "billing:o-1",
    ]


# -- garbage collection --------------------------------------------------------------------


def test_collect_garbage_never_deletes_above_the_lowest_watermark():
    fill("a", 10)
    fill("b", 10)
    for key, g1, g2 in (("a", 7, 5), ("b", 10, 3)):
        ConsumerOffsetFactory(consumer_group="g1", topic=T, partition_key=key, offset_acked=g1)
        ConsumerOffsetFactory(consumer_group="g2", topic=T, partition_key=key, offset_acked=g2)
    s = store()
    assert s.consuming_groups(T) == {"g1", "g2"}
    assert s.collect_garbage(T, None, 0) == 8
    assert stored_offsets(partition_key="a") == list(range(6, 11))
    assert stored_offsets(partition_key="b") == list(range(4, 11))
    assert s.collect_garbage(T, None, 0) == 0

    ConsumerOffset.objects.filter(consumer_group="g2", partition_key="a").update(offset_acked=9)
    assert s.collect_garbage(T, ["b"], 0) == 0  # only b is looked at
    assert s.collect_garbage(T, [], 0) == 0
    assert s.collect_garbage(T, ["a"], 0) == 2  # 6, 7: g1 is at 7
    assert Message.objects.filter(partition_key="a").count() == 3


def test_collect_garbage_counts_a_group_without_watermark_rows_as_zero():
    fill("a", 5)
    ConsumerOffsetFactory(consumer_group="g1", topic=T, partition_key="a", offset_acked=5)
    SubscriberHeartbeatFactory(consumer_group="g2", topic=T)  # g2 consumes, no watermark yet
    s = store()
    assert s.consuming_groups(T) == {"g1", "g2"}
    assert s.collect_garbage(T, None, 0) == 0
    assert Message.objects.count() == 5
    ConsumerOffsetFactory(consumer_group="g2", topic=T, partition_key="a", offset_acked=2)
    assert s.collect_garbage(T, None, 0) == 2


def test_collect_garbage_keeps_every_message_of_a_topic_nobody_consumes():
    fill("a", 5, topic="lonely")
    fill("a", 5)
    ConsumerOffsetFactory(consumer_group="g1", topic=T, partition_key="a", offset_acked=5)
    s = store()
    assert s.consuming_groups("lonely") == set()
    assert s.collect_garbage("lonely", None, 0) == 0
    assert Message.objects.filter(topic="lonely").count() == 5
    assert s.collect_garbage(T, None, 0) == 5


def test_collect_garbage_honours_retention():
    fill("a", 6)
    ConsumerOffsetFactory(consumer_group="g1", topic=T, partition_key="a", offset_acked=5)
    age_messages(T, "a", [1, 2, 6], 7200)
    s = store()
    assert s.collect_garbage(T, None, 3600) == 2  # 1 and 2; 3..5 are too young, 6 not acked
    assert stored_offsets() == [3, 4, 5, 6]
    assert s.collect_garbage(T, None, 0) == 3
    assert stored_offsets() == [6]


def test_fetch_spans_more_partitions_than_one_statement_holds():
    from django_sqlqueue.store import FETCH_CHUNK

    keys = [f"p{i:03d}" for i in range(FETCH_CHUNK + 30)]
    publish_many(T, [{"payload": key, "partition_key": key} for key in keys for _ in range(2)])
    got = store().fetch(G, T, [FetchPlan(key, 0, True) for key in keys], 1)
    assert sorted((m.partition_key, m.offset) for m in got) == [(key, 1) for key in keys]
    assert all(m.payload == m.partition_key for m in got)


def test_advance_watermark_converges_over_more_rows_than_one_scan():
    from django_sqlqueue.store import ADVANCE_SCAN

    n = ADVANCE_SCAN + 205
    fill("a", n)
    s = store()
    s.ensure_offsets(G, T, ["a"])
    s.mark_delivered(G, T, fetch_fresh(G, T, "a", limit=n), [], [], 60)
    DeliveryState.objects.filter(consumer_group=G, topic=T, partition_key="a").update(acked=True)
    assert s.advance_watermark(G, T, "a", 0) == ADVANCE_SCAN
    assert s.advance_watermark(G, T, "a", ADVANCE_SCAN) == n
    assert watermark(G, T, "a") == n and delivery_rows(G, T, "a") == []
