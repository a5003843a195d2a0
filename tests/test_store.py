"""QueueStore: every consumer-side statement, against real rows and the database clock.

Messages are published through keys chosen for their hash (``key_for_partition``) and
sequenced before the consumer side reads them; every write of a subscriber is fenced by
its lease, so the tests lease the partitions they write.
"""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.db import transaction
from django.test import override_settings

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
    key_for_partition,
    now_minus,
    offset_of,
    publish_to,
    row,
    sequence,
    store,
    watermark,
)
from .engine_helpers import leased as lease
from .factories import ConsumerOffsetFactory, SubscriberHeartbeatFactory

pytestmark = pytest.mark.django_db(transaction=True)

G, T = "billing", "orders"
#: Partitions of T (the default count) used by the tests, by name.
A, B, C, D, E, F = range(6)


def fill(partition: int, n: int, topic: str = T):
    """Publish ``n`` messages to ``partition`` of ``topic`` and sequence them (offsets 1..n)."""
    return publish_to(topic, partition, n)


def stored_offsets(**filters: object) -> list[int]:
    """Offsets of the stored messages matching ``filters``, in offset order."""
    return list(Message.objects.filter(**filters).order_by("offset").values_list("offset", flat=True))


def leased(partition: int, name: str = "w1", group: str = G, topic: str = T, duration: float = 30) -> None:
    lease(group, topic, partition, name, duration)


def deliver(
    partition: int,
    offsets: list[int],
    *,
    group: str = G,
    topic: str = T,
    name: str = "w1",
    visibility: float = 60,
) -> None:
    """Lease the partition to ``name`` and record fresh deliveries of ``offsets``."""
    leased(partition, name, group, topic)
    fetched = [m for m in fetch_fresh(group, topic, partition) if m.offset in offsets]
    assert sorted(m.offset for m in fetched) == sorted(offsets)
    assert store().mark_delivered(group, topic, name, fetched, [], [], visibility) == {partition}


# -- heartbeats ------------------------------------------------------------------------


def test_heartbeat_deregister_and_active_subscribers():
    s = store()
    s.heartbeat(G, T, "w1")
    s.heartbeat(G, T, "w2")
    s.heartbeat("other", T, "w3")
    assert s.active_subscribers(G, T, 30) == 2
    assert s.active_subscriber_names(G, T, 30) == ["w1", "w2"]
    s.deregister(G, T, "w2")
    assert SubscriberHeartbeat.objects.get(subscriber_name="w2").deregistered_at is not None
    assert s.active_subscribers(G, T, 30) == 1
    s.heartbeat(G, T, "w2")  # back again: no longer deregistered
    assert SubscriberHeartbeat.objects.get(subscriber_name="w2").deregistered_at is None
    ago, ago_params = now_minus(60)
    sql = f"UPDATE queue_subscriber_heartbeats SET heartbeat_at = {ago} WHERE subscriber_name = 'w1'"
    assert execute(sql, ago_params) == 1
    assert s.active_subscribers(G, T, 30) == 1
    assert s.active_subscriber_names(G, T, 30) == ["w2"]
    assert s.forget_subscribers(T, 45) == 1
    assert set(SubscriberHeartbeat.objects.values_list("subscriber_name", flat=True)) == {"w2", "w3"}


# -- leases ------------------------------------------------------------------------------


def test_poll_state_returns_only_partitions_validly_leased_by_the_subscriber():
    for p in (A, B, C, D, E, F):
        fill(p, 3)
    s = store()
    leased(A)
    leased(B)
    leased(C, name="w2")  # someone else's
    leased(D)
    age_lease(G, T, D, 31)  # ours, but expired
    leased(E)
    ConsumerOffsetFactory(consumer_group=G, topic=T, partition=E, offset_acked=3)  # caught up
    leased(F, group="analytics")  # another group's lease by the same name
    s.ensure_offsets(G, T, [A])

    states = s.poll_state(G, T, "w1", 30)
    assert [st.partition for st in states] == [A, B]
    a, b = states
    assert (a.head, a.watermark, a.has_offsets_row) == (3, 0, True)
    assert (b.head, b.watermark, b.has_offsets_row) == (3, 0, False)
    for st in states:
        assert st.delivered_max is None and st.next_due is None
        assert st.in_flight == 0 and not st.advanceable and not st.unsequenced
    assert [st.partition for st in s.poll_state(G, T, "w2", 30)] == [C]
    assert s.poll_state(G, T, "nobody", 30) == []


def test_poll_state_reports_partitions_with_unsequenced_messages():
    """A caught-up partition is skipped unless committed messages wait for the sequencer."""
    fill(A, 2)
    s = store()
    leased(A)
    s.ensure_offsets(G, T, [A])
    assert s.ack_contiguous(G, T, "w1", [(A, 0, 2)]) == []
    assert s.poll_state(G, T, "w1", 30) == []  # head 2 = watermark 2: idle
    publish_to(T, A, 3, seq=False)
    (st,) = s.poll_state(G, T, "w1", 30)
    assert (st.partition, st.head, st.watermark, st.unsequenced) == (A, 2, 2, True)
    assert sequence(T) == {A: 5}
    (st,) = s.poll_state(G, T, "w1", 30)
    assert (st.head, st.unsequenced) == (5, False)


def test_poll_state_reports_deliveries_of_a_partition():
    fill(A, 6)
    s = store()
    leased(A)
    s.ensure_offsets(G, T, [A])
    before = db_now()
    deliver(A, [1, 2, 3, 4], visibility=60)
    (st,) = s.poll_state(G, T, "w1", 30)
    assert st.delivered_max == 4 and st.in_flight == 4 and not st.advanceable
    assert st.next_due >= before + dt.timedelta(seconds=60)
    assert st.now >= before

    s.ack(G, T, "w1", [(A, 1)])
    s.nack(G, T, "w1", [(A, 3, 0)], {(A, 3): "builtins.ValueError: x" + "y" * 9000})
    (st,) = s.poll_state(G, T, "w1", 30)
    assert st.advanceable  # the row right after the watermark is acked
    assert st.in_flight == 2  # 2 and 4: the acked and the nacked rows are not in flight
    assert st.next_due <= st.now  # the nacked row is due
    assert st.delivered_max == 4
    errors = dict(DeliveryState.objects.filter(consumer_group=G, topic=T).values_list("message_offset", "last_error"))
    assert errors[3].startswith("builtins.ValueError: xyy") and len(errors[3]) == 8000  # cut to MAX_ERROR_LENGTH
    assert errors[2] is errors[4] is None  # in flight, never failed


def test_acquire_leases_takes_missing_leases_and_refuses_live_ones():
    fill(A, 1)
    s = store()
    before = db_now()
    assert s.acquire_leases(G, T, [A], "w1", 30) == [A]
    assert s.acquire_leases(G, T, [A], "w2", 30) == []
    lease_row = PartitionLease.objects.get(consumer_group=G, topic=T, partition=A)
    assert lease_row.leased_by == "w1" and lease_row.lease_renewed_at >= before
    # Several at once: the live one is skipped, the missing ones are taken.
    assert s.acquire_leases(G, T, [C, A, B], "w2", 30) == [B, C]
    assert s.acquire_leases(G, T, [], "w2", 30) == []
    # Leases are per group: another group takes the same partition.
    assert s.acquire_leases("analytics", T, [A], "w2", 30) == [A]
    assert PartitionLease.objects.count() == 4


def test_acquire_leases_steals_only_expired_leases():
    fill(A, 1)
    s = store()
    leased(A, "w1")
    leased(B, "w1")
    age_lease(G, T, A, 10)
    assert s.acquire_leases(G, T, [A], "w2", 30) == []  # 10s old: still live for a 30s lease
    assert PartitionLease.objects.get(partition=A).leased_by == "w1"
    age_lease(G, T, A, 31)
    before = db_now()
    assert s.acquire_leases(G, T, [A, B], "w2", 30) == [A]  # B is live
    lease_row = PartitionLease.objects.get(partition=A)
    assert lease_row.leased_by == "w2"
    assert lease_row.leased_at >= before and lease_row.lease_renewed_at >= before
    # The former holder learns it on renewal: the partition is not renewed nor returned.
    assert s.renew_leases(G, T, "w1") == [B]
    assert s.renew_leases(G, T, "w2") == [A]


def test_acquire_leases_insert_race_loses_cleanly(spawn):
    """Two subscribers insert the same missing lease; the loser gets nothing, not an error."""
    fill(A, 1)
    inserted, release = threading.Event(), threading.Event()

    def first() -> list[int]:
        with transaction.atomic():
            got = store().acquire_leases(G, T, [A], "w1", 30)
            inserted.set()
            assert release.wait(10)
        return got

    holder = spawn(first, name="first")
    assert inserted.wait(10)
    second = spawn(lambda: store().acquire_leases(G, T, [A], "w2", 30), name="second")
    second.join(0.5)
    assert second.is_alive(), "the second INSERT must wait for the first one's uncommitted row"
    release.set()
    assert holder.join_ok() == [A]
    assert second.join_ok() == []
    assert list(PartitionLease.objects.values_list("leased_by", flat=True)) == ["w1"]


def test_renew_leases_renews_and_returns_only_leases_still_held():
    for p in (A, B, C):
        fill(p, 1)
    s = store()
    leased(A)
    leased(B)
    leased(C, "w2")
    age_lease(G, T, A, 20)
    age_lease(G, T, B, 20)
    before = db_now()
    assert s.renew_leases(G, T, "w1") == [A, B]
    for p in (A, B):
        assert PartitionLease.objects.get(partition=p).lease_renewed_at >= before
    # B expires and is stolen by w3: w1 renews only A from now on.
    age_lease(G, T, B, 31)
    assert s.acquire_leases(G, T, [B], "w3", 30) == [B]
    assert s.renew_leases(G, T, "w1") == [A]
    assert s.held_partitions(G, T, "w1") == [A]
    assert s.renew_leases(G, T, "w2") == [C]


def test_release_leases_all_or_some():
    for p in (A, B, C, D):
        fill(p, 1)
    s = store()
    for p in (A, B, C):
        leased(p)
    leased(D, "w2")
    assert s.release_leases(G, T, "w1", [B]) == 1
    assert s.held_partitions(G, T, "w1") == [A, C]
    assert s.release_leases(G, T, "w1", []) == 0
    assert s.release_leases(G, T, "w1", [D]) == 0  # not ours
    assert s.release_leases(G, T, "w1") == 2
    assert list(PartitionLease.objects.values_list("partition", "leased_by")) == [(D, "w2")]


def test_free_partitions_lists_unleased_and_expired_partitions():
    for p in (A, B, C, D):
        fill(p, 1)
    fill(A, 1, topic="other.topic")
    s = store()
    leased(A)
    leased(B)
    age_lease(G, T, B, 31)
    leased(C, group="analytics")  # another group's lease does not count
    assert s.free_partitions(G, T, 30) == [B, C, D]
    assert s.free_partitions(G, T, 60) == [C, D]  # B is live for a 60s lease
    assert s.partitions(T) == [A, B, C, D]  # head rows the sequencer created


# -- the topic registry -----------------------------------------------------------------


def test_register_topic_creates_head_rows_and_keeps_the_first_count():
    s = store()
    assert s.registered_partitions("reg") == (False, None)
    assert s.register_topic("reg", 3) == 3
    assert s.partitions("reg") == [0, 1, 2]
    assert s.register_topic("reg", 5) == 3  # registered already: the caller compares
    assert s.partitions("reg") == [0, 1, 2]
    assert s.repartition("reg", 5) == (3, 5)
    assert s.registered_partitions("reg") == (True, 5)
    assert s.partitions("reg") == [0, 1, 2, 3, 4]
    # One partition per key: no fixed head rows; they appear as keys do.
    assert s.register_topic("perkey", None) is None
    assert s.registered_partitions("perkey") == (True, None)
    assert s.partitions("perkey") == []
    with override_settings(SQLQUEUE={"TOPICS": {"perkey": {"per_key": True}}}):
        published = publish_many("perkey", [{"payload": i, "key": k} for i, k in enumerate(["x", "y", "x"])])
    assert s.discover_partitions("perkey") == 2
    assert s.discover_partitions("perkey") == 0
    assert s.partitions("perkey") == sorted({m.partition for m in published})


def test_paused_reads_the_operator_pause_row():
    from .factories import PausedTopicFactory

    s = store()
    assert not s.paused(G, T)
    PausedTopicFactory(consumer_group=G, topic=T)
    assert s.paused(G, T)
    assert not s.paused("analytics", T)


# -- watermarks -------------------------------------------------------------------------


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


# -- fetching -------------------------------------------------------------------------------


def test_fetch_returns_fresh_and_due_messages():
    published = fill(A, 5)
    publish(T, {"other": True}, key=key_for_partition(B), id="b-1", metadata={"m": 1})
    sequence(T)
    s = store()
    s.ensure_offsets(G, T, [A, B])
    deliver(A, [1, 2, 3])
    s.nack(G, T, "w1", [(A, 2, 0), (A, 3, 60)])  # 2 due now, 3 in a minute

    got = s.fetch(G, T, [FetchPlan(A, 3, True), FetchPlan(B, 0, False)], 10)
    by_pos = {(m.partition, m.offset): m for m in got}
    assert sorted(by_pos) == [(A, 2), (A, 4), (A, 5), (B, 1)]
    due = by_pos[(A, 2)]
    assert (due.retry_count, due.status) == (0, RETRY)
    assert all(by_pos[k].retry_count is None and by_pos[k].status is None for k in [(A, 4), (A, 5), (B, 1)])
    stored = Message.objects.get(topic=T, partition=A, offset=4)
    m4 = by_pos[(A, 4)]
    assert (m4.id, m4.key, m4.payload, m4.metadata) == (
        published[3].id,
        key_for_partition(A),
        {"p": A, "i": 4},
        {},
    )
    assert (m4.created_at, m4.deliver_at) == (stored.created_at, stored.deliver_at)
    b1 = by_pos[(B, 1)]
    assert (b1.id, b1.key, b1.payload, b1.metadata) == ("b-1", key_for_partition(B), {"other": True}, {"m": 1})

    assert [m.offset for m in s.fetch(G, T, [FetchPlan(A, 3, False)], 1)] == [4]  # limit per branch
    assert [m.offset for m in s.fetch(G, T, [FetchPlan(A, None, True)], 10)] == [2]
    assert s.fetch(G, T, [FetchPlan(A, 5, False)], 10) == []
    # Another group's delivery rows are not this group's due messages.
    assert s.fetch("analytics", T, [FetchPlan(A, None, True)], 10) == []


def test_fetch_never_returns_unsequenced_messages():
    fill(A, 2)
    publish_to(T, A, 3, seq=False)
    assert [m.offset for m in fetch_fresh(G, T, A)] == [1, 2]
    sequence(T)
    assert [m.offset for m in fetch_fresh(G, T, A)] == [1, 2, 3, 4, 5]


def test_fetch_is_not_blocked_by_a_nacked_message_with_many_rows_behind_it():
    """The RFC's ``offset > watermark LIMIT n`` would return only offsets 1..10 here,
    none of them deliverable, and the partition would stall behind the nack."""
    fill(A, 40)
    s = store()
    leased(A)
    s.ensure_offsets(G, T, [A])
    deliver(A, list(range(1, 27)))
    s.nack(G, T, "w1", [(A, 1, 0)])  # watermark+1 waits for its retry, due now
    s.ack(G, T, "w1", [(A, off) for off in range(2, 14)])  # 12 acked rows behind it
    # ... and 13 in flight (14..26): 25 rows between the nack and the fresh messages.
    (st,) = s.poll_state(G, T, "w1", 30)
    assert (st.watermark, st.delivered_max, st.in_flight, st.advanceable) == (
        0,
        26,
        13,
        False,
    )
    assert st.next_due <= st.now
    plan = FetchPlan(A, max(st.watermark, st.delivered_max), True)
    got = s.fetch(G, T, [plan], 10)
    assert sorted(m.offset for m in got) == [1, *range(27, 37)]
    assert [m.retry_count for m in got if m.offset == 1] == [0]


# -- recording deliveries ------------------------------------------------------------------


def test_mark_delivered_fresh_redelivered_and_parked():
    fill(A, 3)
    delayed = publish(T, "later", key=key_for_partition(A), delay=3600)
    sequence(T)
    later = offset_of(T, delayed.id)
    assert later == 4
    s = store()
    leased(A)
    s.ensure_offsets(G, T, [A])
    fetched = {m.offset: m for m in fetch_fresh(G, T, A)}
    before = db_now()
    assert s.mark_delivered(G, T, "w1", [fetched[1], fetched[2], fetched[3]], [], [fetched[later]], 30) == {A}
    after = db_now()
    for off in (1, 2, 3):
        r = row(G, T, A, off)
        assert (r.status, r.retry_count, r.acked) == (IN_FLIGHT, 0, False)
        assert before + dt.timedelta(seconds=30) <= r.invisible_until <= after + dt.timedelta(seconds=30)
    parked = row(G, T, A, later)
    assert (parked.status, parked.retry_count, parked.acked) == (SCHEDULED, 0, False)
    assert parked.invisible_until == Message.objects.get(topic=T, partition=A, offset=4).deliver_at

    # 1 is nacked, 2's visibility expires, the parked 4 comes due (data, not the clock).
    s.nack(G, T, "w1", [(A, 1, 0)])
    ago, ago_params = now_minus(1)
    where = "message_offset IN (2, 4)"
    assert execute(f"UPDATE queue_delivery_state SET invisible_until = {ago} WHERE {where}", ago_params) == 2
    due = {m.offset: m for m in fetch_due(G, T, A)}
    assert sorted(due) == [1, 2, 4]
    before = db_now()
    s.mark_delivered(G, T, "w1", [], list(due.values()), [], 10)
    after = db_now()
    counts = {off: row(G, T, A, off).retry_count for off in (1, 2, 3, 4)}
    # A nacked or expired delivery counts a retry; a parked message's first delivery does not.
    assert counts == {1: 1, 2: 1, 3: 0, 4: 0}
    for off in (1, 2, 4):
        r = row(G, T, A, off)
        assert r.status == IN_FLIGHT
        assert before + dt.timedelta(seconds=10) <= r.invisible_until <= after + dt.timedelta(seconds=10)
    assert DeliveryState.objects.count() == 4


def test_mark_delivered_leaves_an_existing_row_alone():
    fill(A, 2)
    s = store()
    leased(A)
    (m1, m2) = fetch_fresh(G, T, A)
    s.mark_delivered(G, T, "w1", [m1], [], [], 60)
    s.nack(G, T, "w1", [(A, 1, 120)])
    # A racing former lease holder delivers 1 again as fresh: the row keeps its state.
    s.mark_delivered(G, T, "w1", [m1, m2], [], [], 5)
    r1 = row(G, T, A, 1)
    assert (r1.status, r1.retry_count) == (RETRY, 0)
    assert r1.invisible_until > db_now() + dt.timedelta(seconds=100)
    assert row(G, T, A, 2).status == IN_FLIGHT


def test_mark_delivered_redelivery_skips_acked_rows():
    fill(A, 1)
    s = store()
    leased(A)
    (m1,) = fetch_fresh(G, T, A)
    s.mark_delivered(G, T, "w1", [m1], [], [], 60)
    s.nack(G, T, "w1", [(A, 1, 0)])
    (due,) = fetch_due(G, T, A)
    s.ack(G, T, "w1", [(A, 1)])  # acked meanwhile
    s.mark_delivered(G, T, "w1", [], [due], [], 60)
    r = row(G, T, A, 1)
    assert r.acked and r.retry_count == 0 and r.status == RETRY


def test_release_deliveries_restores_retry_count_and_makes_them_due():
    fill(A, 3)
    s = store()
    leased(A)
    fetched = fetch_fresh(G, T, A)
    s.mark_delivered(G, T, "w1", fetched, [], [], 60)
    s.nack(G, T, "w1", [(A, 2, 0)])
    (due,) = fetch_due(G, T, A)
    s.mark_delivered(G, T, "w1", [], [due], [], 60)  # 2 is on its second attempt
    assert row(G, T, A, 2).retry_count == 1
    s.nack(G, T, "w1", [(A, 3, 60)])  # 3 waits for a retry: not in flight, left alone

    s.release_deliveries(G, T, "w1", [(A, 1), (A, 2), (A, 3)])
    now = db_now()
    r1, r2, r3 = (row(G, T, A, off) for off in (1, 2, 3))
    assert (r1.status, r1.retry_count) == (SCHEDULED, 0)  # never really delivered: attempt 1 again
    assert (r2.status, r2.retry_count) == (RETRY, 0)  # the second attempt is given back
    assert r1.invisible_until <= now and r2.invisible_until <= now
    assert (r3.status, r3.retry_count) == (RETRY, 0) and r3.invisible_until > now + dt.timedelta(seconds=50)
    # Redelivered after the release, they come back with the same attempt numbers.
    again = {m.offset: m for m in fetch_due(G, T, A)}
    assert sorted(again) == [1, 2]
    s.mark_delivered(G, T, "w1", [], list(again.values()), [], 60)
    assert row(G, T, A, 1).retry_count == 0 and row(G, T, A, 2).retry_count == 1
    s.release_deliveries(G, T, "w1", [])  # nothing to do


# -- outcomes ----------------------------------------------------------------------------------


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


def test_dead_letter_copies_to_the_dlq_and_acks_for_the_group_only():
    key = key_for_partition(A)
    original = publish(T, {"n": 1}, key=key, id="o-1", metadata={"trace": "x"})
    sequence(T)
    s = store()
    deliver(A, [1])
    deliver(A, [1], group="analytics")
    (m,) = fetch_fresh(G, T, A)
    before = db_now()
    assert s.dead_letter(G, T, "w1", m, dlq_topic="orders_dlq", attempts=3, error="builtins.ValueError: boom")
    after = db_now()
    # A retried call: no second copy, the first one is kept as it is.
    assert s.dead_letter(G, T, "w1", m, dlq_topic="orders_dlq", attempts=3, error="again")

    (dl,) = Message.objects.filter(topic="orders_dlq")
    stored = Message.objects.get(topic=T, partition=A, offset=1)
    assert (dl.key, dl.partition, dl.offset, dl.id) == (key, original.partition, None, "billing:o-1")
    assert dl.payload == {"n": 1}
    assert dl.metadata == {
        "trace": "x",
        "dead_letter": {
            "consumer_group": G,
            "original_partition": A,
            "original_offset": 1,
            "original_id": "o-1",
        },
    }
    assert (dl.failure_count, dl.last_error, dl.original_topic) == (3, "builtins.ValueError: boom", T)
    assert before <= dl.failed_at <= after
    assert dl.created_at == stored.created_at
    assert dl.published_at >= before and dl.is_dead_letter
    # The original stays in the log, acked for billing only.
    assert stored.id == "o-1" and not stored.is_dead_letter
    assert row(G, T, A, 1).acked
    assert not row("analytics", T, A, 1).acked

    assert s.dead_letter("analytics", T, "w1", m, dlq_topic="orders_dlq", attempts=1, error="x")
    assert sorted(Message.objects.filter(topic="orders_dlq").values_list("id", flat=True)) == [
        "analytics:o-1",
        "billing:o-1",
    ]
    # The dead letters are sequenced like any message when someone consumes the DLQ.
    sequence("orders_dlq")
    assert sorted(Message.objects.filter(topic="orders_dlq").values_list("offset", flat=True)) == [1, 2]


# -- the lease fence ---------------------------------------------------------------------------


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


# -- garbage collection --------------------------------------------------------------------


def test_collect_garbage_never_deletes_above_the_lowest_watermark():
    fill(A, 10)
    fill(B, 10)
    for p, g1, g2 in ((A, 7, 5), (B, 10, 3)):
        ConsumerOffsetFactory(consumer_group="g1", topic=T, partition=p, offset_acked=g1)
        ConsumerOffsetFactory(consumer_group="g2", topic=T, partition=p, offset_acked=g2)
    s = store()
    assert s.consuming_groups(T) == {"g1", "g2"}
    assert s.collect_garbage(T, None, 0) == 8
    assert stored_offsets(partition=A) == list(range(6, 11))
    assert stored_offsets(partition=B) == list(range(4, 11))
    assert s.collect_garbage(T, None, 0) == 0

    ConsumerOffset.objects.filter(consumer_group="g2", partition=A).update(offset_acked=9)
    assert s.collect_garbage(T, [B], 0) == 0  # only B is looked at
    assert s.collect_garbage(T, [], 0) == 0
    assert s.collect_garbage(T, [A], 0) == 2  # 6, 7: g1 is at 7
    assert Message.objects.filter(partition=A).count() == 3


def test_collect_garbage_never_deletes_unsequenced_messages():
    fill(A, 3)
    publish_to(T, A, 2, seq=False)
    ConsumerOffsetFactory(consumer_group="g1", topic=T, partition=A, offset_acked=3)
    assert store().collect_garbage(T, None, 0) == 3
    assert list(Message.objects.filter(topic=T).values_list("offset", flat=True)) == [None, None]
    assert sequence(T) == {A: 5}


def test_collect_garbage_counts_a_group_without_watermark_rows_as_zero():
    fill(A, 5)
    ConsumerOffsetFactory(consumer_group="g1", topic=T, partition=A, offset_acked=5)
    SubscriberHeartbeatFactory(consumer_group="g2", topic=T)  # g2 consumes, no watermark yet
    s = store()
    assert s.consuming_groups(T) == {"g1", "g2"}
    assert s.collect_garbage(T, None, 0) == 0
    assert Message.objects.count() == 5
    ConsumerOffsetFactory(consumer_group="g2", topic=T, partition=A, offset_acked=2)
    assert s.collect_garbage(T, None, 0) == 2


def test_collect_garbage_keeps_every_message_of_a_topic_nobody_consumes():
    fill(A, 5, topic="lonely")
    fill(A, 5)
    ConsumerOffsetFactory(consumer_group="g1", topic=T, partition=A, offset_acked=5)
    s = store()
    assert s.consuming_groups("lonely") == set()
    assert s.collect_garbage("lonely", None, 0) == 0
    assert Message.objects.filter(topic="lonely").count() == 5
    assert s.collect_garbage(T, None, 0) == 5


def test_collect_garbage_honours_retention():
    fill(A, 6)
    ConsumerOffsetFactory(consumer_group="g1", topic=T, partition=A, offset_acked=5)
    age_messages(T, A, [1, 2, 6], 7200)
    s = store()
    assert s.collect_garbage(T, None, 3600) == 2  # 1 and 2; 3..5 are too young, 6 not acked
    assert stored_offsets() == [3, 4, 5, 6]
    assert s.collect_garbage(T, None, 0) == 3
    assert stored_offsets() == [6]


def test_fetch_spans_more_partitions_than_one_statement_holds():
    from django_sqlqueue.store import FETCH_CHUNK

    n = FETCH_CHUNK + 30
    with override_settings(SQLQUEUE={"TOPICS": {T: {"partitions": n}}}):
        publish_many(
            T,
            [{"payload": p, "key": key_for_partition(p, n)} for p in range(n) for _ in range(2)],
        )
    sequence(T)
    got = store().fetch(G, T, [FetchPlan(p, 0, True) for p in range(n)], 1)
    assert sorted((m.partition, m.offset) for m in got) == [(p, 1) for p in range(n)]
    assert all(m.payload == m.partition for m in got)


def test_advance_watermark_converges_over_more_rows_than_one_scan():
    from django_sqlqueue.store import ADVANCE_SCAN

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
