"""store/message_reports.py: the grouped reads about messages behind the console, queue_status and the metrics.

Unacked delivery state by status (what in flight and retrying are made of), dead-letter
counts by a group's id prefix, the log's topics, and counts capped at ``cap + 1`` rows.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from django_sqlqueue.db.store.message_reports import MessageReportStore
from django_sqlqueue.db.store.reports import DeliveryCounts

from ...support.engine_helpers import IN_FLIGHT, RETRY, SCHEDULED, fetch_fresh, leased, publish_to, store
from ...support.factories import DeliveryStateFactory

pytestmark = pytest.mark.django_db(transaction=True)

G, T = "billing", "reports"
A, B = 0, 1
HOUR = dt.timedelta(hours=1)


def reports() -> MessageReportStore:
    """The module's store on its own (no other store mixin behind it): what these tests read with."""
    return MessageReportStore("default")


def test_delivery_counts_by_status_split_expired_in_flight_deliveries():
    publish_to(T, A, 10)
    now = timezone.now()
    rows = [(5, IN_FLIGHT, now + HOUR), (6, IN_FLIGHT, now - HOUR), (7, RETRY, now), (8, SCHEDULED, now + HOUR)]
    for offset, status, visible in rows:
        DeliveryStateFactory(consumer_group=G, topic=T, partition=A, message_offset=offset, status=status,
                             invisible_until=visible)  # fmt: skip
    DeliveryStateFactory(consumer_group=G, topic=T, partition=A, message_offset=9, status=IN_FLIGHT, acked=True)
    counts = reports().delivery_counts(G, T)
    assert counts == {(G, T, A): DeliveryCounts(in_flight=1, expired=1, retry=1, scheduled=1)}
    assert (counts[(G, T, A)].in_flight_total, counts[(G, T, A)].retrying_total) == (2, 1)
    assert counts[(G, T, A)] + DeliveryCounts(retry=2) == DeliveryCounts(1, 1, 3, 1)
    (retrying,) = reports().deliveries(G, T, RETRY, limit=10)
    assert (retrying.offset, retrying.message_id is not None) == (7, True)
    assert [d.offset for d in reports().deliveries(None, None, None, limit=2)] == [6, 7]


def test_dead_letter_counts_per_group_use_the_id_prefix_escaped():
    publish_to(T, A, 3)
    leased("g_1", T, A, "w1")
    leased("gx1", T, A, "wx")
    (first, *rest) = fetch_fresh("g_1", T, A, limit=3)
    assert store().dead_letter("g_1", T, "w1", first, dlq_topic="reports_dlq", attempts=1, error="boom")
    for m in rest:
        assert store().dead_letter("gx1", T, "wx", m, dlq_topic="reports_dlq", attempts=1, error="lookalike")
    s = reports()
    assert s.dead_letter_count("reports_dlq", "g_1") == 1  # not gx1's, which LIKE 'g_1:%' unescaped would match
    assert s.dead_letter_count("reports_dlq", "gx1") == 2
    assert s.dead_letter_count("reports_dlq") == 3 and s.dead_letter_count("reports_dlq", cap=1) == 2
    # The same capped ranges, every pair in one statement.
    assert s.dead_letter_counts([("reports_dlq", "g_1"), ("reports_dlq", "gx1"), ("none_dlq", "g_1")], cap=1) == {
        ("reports_dlq", "g_1"): 1,
        ("reports_dlq", "gx1"): 2,
        ("none_dlq", "g_1"): 0,
    }
    assert s.dead_letter_counts([], cap=1) == {}
    assert s.log_topics() == [T, "reports_dlq"]


def test_capped_counts_read_at_most_cap_plus_one_rows():
    publish_to(T, A, 10)
    publish_to(T, B, 2)
    publish_to(T, A, 3, seq=False)  # committed, not numbered yet
    s = reports()
    assert s.unsequenced_capped(cap=1)[T] == 2  # "1+": read at most cap + 1 rows
    assert s.unsequenced_capped(cap=100)[T] == 3
    assert s.capped_count("SELECT 1 FROM queue_messages WHERE topic = %s", [T], 100) == 15
    assert s.capped_count("SELECT 1 FROM queue_messages WHERE topic = %s", [T], 4) == 5
