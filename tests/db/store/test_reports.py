"""store/reports.py: the grouped reads of groups and partitions behind queue_status, the console and Spark's report.

One definition of lag (messages published and committed that the group has not acked,
unsequenced ones included), so every page reports the same number. The reads about
messages (deliveries, dead letters, counters) are tested in test_message_reports.py.
"""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.db import connection, connections
from django.utils import timezone

from django_sqlqueue import ops, queue_status
from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.db.store.reports import DeliveryCounts, PartitionLag, ReportStore, lag

from ...support.engine_helpers import age_lease, head, leased, publish_to, store
from ...support.factories import PausedTopicFactory, SubscriberHeartbeatFactory

pytestmark = pytest.mark.django_db(transaction=True)

G, T = "billing", "reports"
A, B = 0, 1
HOUR = dt.timedelta(hours=1)


def reports() -> ReportStore:
    """The module's store on its own (no other store mixin behind it): what these tests read with."""
    return ReportStore("default")


def behind_with_unsequenced() -> None:
    """G on T: A has 10 sequenced, watermark 4, plus 3 committed but unsequenced; B has 2, caught up."""
    publish_to(T, A, 10)
    publish_to(T, B, 2)
    s = store()
    s.ensure_offsets(G, T, [A, B])
    leased(G, T, A)
    leased(G, T, B)
    assert s.ack_contiguous(G, T, "w1", [(A, 0, 4), (B, 0, 2)]) == []
    s.heartbeat(G, T, "w1")
    publish_to(T, A, 3, seq=False)


def test_lag_counts_sequenced_messages_above_the_watermark_and_unsequenced_ones():
    assert lag(head=10, watermark=4, unsequenced=3) == 9
    assert lag(head=4, watermark=4, unsequenced=0) == 0
    # A watermark above the head (the head row was recreated) is not negative lag.
    assert lag(head=2, watermark=5, unsequenced=1) == 1


def test_in_flight_includes_expired_deliveries_and_retrying_is_nacked_ones_only():
    """The one definition every operator surface shows (the module docstring of store/reports.py)."""
    c = DeliveryCounts(in_flight=1, expired=2, retry=4, scheduled=8)
    assert (c.in_flight_total, c.retrying_total) == (3, 4)
    assert ((c + c).in_flight_total, (c + c).retrying_total) == (6, 8)
    assert (DeliveryCounts().in_flight_total, DeliveryCounts().retrying_total) == (0, 0)


def test_lags_per_partition_with_a_head_row():
    behind_with_unsequenced()
    SubscriberHeartbeatFactory(consumer_group="new", topic=T, subscriber_name="w9")
    rows = reports().lags([(G, T), ("new", T)])
    assert rows == [
        PartitionLag(G, T, A, 10, 4, 3),
        PartitionLag(G, T, B, 2, 2, 0),
        PartitionLag("new", T, A, 10, 0, 3),
        PartitionLag("new", T, B, 2, 0, 0),
    ]
    assert [r.lag for r in rows] == [9, 0, 13, 2]


def test_a_sequencing_round_between_the_lag_reads_is_counted_not_hidden():
    """lags() reads unsequenced messages, heads and watermarks in three statements; a sequencer
    numbering the backlog between them (here: in another connection, right after the first
    read) may make the lag over-count for a moment, never read lower than what is left."""
    behind_with_unsequenced()  # A: head 10, watermark 4, 3 committed but unsequenced: lag 9
    reads: list[str] = []

    def sequence_elsewhere() -> None:
        try:
            sequence(T)
        finally:
            connections.close_all()

    def a_round_after_the_first_read(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        reads.append(sql)
        if len(reads) == 1:
            thread = threading.Thread(target=sequence_elsewhere)
            thread.start()
            thread.join()
        return result

    with connection.execute_wrapper(a_round_after_the_first_read):
        (row_a, _) = reports().lags([(G, T)])
    assert len(reads) >= 3 and head(T, A) == 13, "the round ran between the reads"
    assert row_a.lag >= 9


def test_queue_status_and_the_console_report_the_same_lag_for_a_group_with_unsequenced_messages():
    behind_with_unsequenced()
    expected = 6 + 3
    (status,) = queue_status(group=G).groups
    (listed,) = ops.list_groups(G, T)
    partitions = ops.group_offsets(G, T)
    (overview_row,) = [g for g in ops.overview().groups if g.group == G]
    assert status.lag == listed.lag == sum(p.lag for p in partitions) == overview_row.lag == expected
    assert [(p.partition, p.unsequenced, p.lag) for p in partitions] == [(A, 3, 9), (B, 0, 0)]


def test_heads_watermarks_and_unsequenced_counts():
    behind_with_unsequenced()
    s = reports()
    assert s.heads([T]) == {(T, A): 10, (T, B): 2} and s.heads([]) == {}
    assert {(w.partition, w.offset) for w in s.watermarks(G, T)} == {(A, 4), (B, 2)}
    assert all(w.updated_at is not None for w in s.watermarks(G))
    assert s.watermarks("nobody") == []
    assert s.unsequenced([T, "other"]) == {(T, A): 3}


@pytest.mark.parametrize("via_heads", [False, True], ids=["offset-is-null", "via-head-rows"])
def test_both_ways_to_the_sequencers_backlog_agree_on_partitions_with_a_head_row(via_heads, monkeypatch):
    """``Dialect.unsequenced_via_heads`` (MySQL's: one index range per head row, issue 15's scrape
    cost) reads the same backlog as the plain ``offset IS NULL``, except in a partition that has
    no head row yet, which only the plain condition sees (and the lag never counts)."""
    behind_with_unsequenced()
    s = reports()
    monkeypatch.setattr(type(s.dialect), "unsequenced_via_heads", via_heads)
    assert s.unsequenced([T, "other"]) == {(T, A): 3}
    (oldest,) = s.oldest_unsequenced([T]).values()
    assert s.oldest_unsequenced() == {T: oldest} and s.oldest_unsequenced([]) == {}
    assert timezone.now() - HOUR < oldest <= timezone.now()
    publish_to("fresh", A, 2, seq=False)  # no worker registered it, never sequenced: no head row
    assert s.heads(["fresh"]) == {}
    assert s.unsequenced(["fresh"]) == ({} if via_heads else {("fresh", A): 2})
    assert ("fresh" in s.oldest_unsequenced()) is not via_heads


def test_consumer_pairs_are_groups_with_a_watermark_or_a_heartbeat():
    behind_with_unsequenced()
    SubscriberHeartbeatFactory(consumer_group="new", topic="elsewhere", subscriber_name="w9")
    PausedTopicFactory(consumer_group="paused-only", topic=T)
    s = reports()
    assert s.consumer_pairs() == [(G, T), ("new", "elsewhere")]
    assert s.consumer_pairs(topic=T) == [(G, T)]
    assert s.consumer_pairs(group="new") == [("new", "elsewhere")]
    assert [(p.group, p.topic) for p in s.paused_topics()] == [("paused-only", T)]


def test_leases_and_subscribers_are_live_within_the_lease_duration():
    behind_with_unsequenced()
    age_lease(G, T, B, 3600)
    SubscriberHeartbeatFactory(consumer_group=G, topic=T, subscriber_name="w2", heartbeat_at=timezone.now() - HOUR)
    store().heartbeat(G, T, "w3")
    store().deregister(G, T, "w3")
    s = reports()
    assert [(lease.partition, lease.stale) for lease in s.leases(G, T, 30)] == [(A, False), (B, True)]
    assert [lease.partition for lease in s.leases(None, None, 30, stale_only=True)] == [B]
    assert [(sub.name, sub.live) for sub in s.subscribers(G, None, 30)] == [("w1", True), ("w2", False), ("w3", False)]


def test_oldest_unhandled_is_the_message_right_after_the_watermark():
    behind_with_unsequenced()
    oldest = reports().oldest_unhandled()
    assert set(oldest) == {(G, T)} and oldest[(G, T)] <= timezone.now()
