"""queue_status() on a hand-built state: every number, per partition and per group."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from django_sqlqueue import queue_status
from django_sqlqueue.status import GroupSummary, PartitionStatus, QueueStatus

from .engine_helpers import IN_FLIGHT, RETRY, SCHEDULED, age_lease, fetch_fresh, store
from .factories import DeliveryStateFactory, SubscriberHeartbeatFactory

pytestmark = pytest.mark.django_db(transaction=True)

T = "st"
HOUR = dt.timedelta(hours=1)


def build_state() -> None:
    """Topic ``st``, partitions a (head 10) and b (head 4), consumed by g1, g2 and g_1.

    g1/a: watermark 3; 4 in flight, 5 in flight but expired, 6 nacked, 7 parked, 8 acked,
    9 dead-lettered; 10 not delivered. g1/b: caught up. g2: a live subscriber, no
    watermark rows yet. g_1: watermarks at 0; the DLQ also holds dead letters of a group
    named gx1 (which a LIKE 'g_1:%' without escaping would count as g_1's).
    """
    from django_sqlqueue import publish_many

    publish_many(T, [{"payload": i, "partition_key": "a", "id": f"a{i}"} for i in range(1, 11)])
    publish_many(T, [{"payload": i, "partition_key": "b", "id": f"b{i}"} for i in range(1, 5)])
    s = store()
    s.ensure_offsets("g1", T, ["a", "b"])
    s.ensure_offsets("g_1", T, ["a", "b"])
    assert s.ack_contiguous("g1", T, [("a", 0, 3), ("b", 0, 4)]) == []
    now = timezone.now()
    rows = {
        4: {"status": IN_FLIGHT, "invisible_until": now + HOUR},
        5: {"status": IN_FLIGHT, "invisible_until": now - HOUR},
        6: {"status": RETRY, "invisible_until": now + HOUR, "retry_count": 1},
        7: {"status": SCHEDULED, "invisible_until": now + HOUR},
        8: {"status": IN_FLIGHT, "invisible_until": now + HOUR, "acked": True},
        9: {"status": IN_FLIGHT, "invisible_until": now + HOUR},
    }
    for offset, values in rows.items():
        DeliveryStateFactory(
            consumer_group="g1",
            topic=T,
            partition_key="a",
            message_offset=offset,
            **values,
        )
    (m9,) = fetch_fresh("g1", T, "a", after=8, limit=1)
    s.dead_letter("g1", T, m9, dlq_topic="st_dlq", attempts=5, error="boom")
    for m in fetch_fresh("gx1", T, "a", limit=2):
        s.dead_letter("gx1", T, m, dlq_topic="st_dlq", attempts=1, error="lookalike")
    assert s.acquire_lease("g1", T, "a", "w1", 30)
    assert s.acquire_lease("g1", T, "b", "w2", 30)
    age_lease("g1", T, "b", 3600)
    s.heartbeat("g1", T, "w1")
    SubscriberHeartbeatFactory(consumer_group="g1", topic=T, subscriber_name="w2", heartbeat_at=now - HOUR)
    s.heartbeat("g1", T, "w3")
    s.deregister("g1", T, "w3")
    s.heartbeat("g2", T, "w9")


def test_queue_status_partitions():
    build_state()
    status = queue_status()
    by = {(p.group, p.partition_key): p for p in status.partitions}
    assert sorted(by) == [(g, k) for g in ("g1", "g2", "g_1") for k in ("a", "b")]
    assert by[("g1", "a")] == PartitionStatus(
        group="g1",
        topic=T,
        partition_key="a",
        head=10,
        watermark=3,
        lag=7,
        in_flight=1,  # 4
        retrying=2,  # 5 (expired) and 6 (nacked)
        scheduled=1,  # 7
        dead_letters=1,  # 9
        lease_holder="w1",
        lease_live=True,
    )
    assert by[("g1", "b")] == PartitionStatus("g1", T, "b", 4, 4, 0, 0, 0, 0, 0, "w2", False)
    assert by[("g2", "a")] == PartitionStatus("g2", T, "a", 10, 0, 10, 0, 0, 0, 0, None, False)
    assert by[("g2", "b")] == PartitionStatus("g2", T, "b", 4, 0, 4, 0, 0, 0, 0, None, False)
    assert by[("g_1", "a")] == PartitionStatus("g_1", T, "a", 10, 0, 10, 0, 0, 0, 0, None, False)
    assert by[("g_1", "b")].lag == 4
    # The dead-letter topic is nobody's topic here.
    assert {p.topic for p in status.partitions} == {T}


def test_queue_status_group_summaries():
    build_state()
    groups = {g.group: g for g in queue_status().groups}
    assert list(groups) == ["g1", "g2", "g_1"]
    assert groups["g1"] == GroupSummary(
        group="g1",
        topics=(T,),
        partitions=2,
        lag=7,
        in_flight=1,
        retrying=2,
        dead_letters=1,
        live_subscribers=1,  # w1: w2 is stale, w3 deregistered
    )
    assert groups["g2"] == GroupSummary("g2", (T,), 2, 14, 0, 0, 0, 1)
    assert groups["g_1"] == GroupSummary("g_1", (T,), 2, 14, 0, 0, 0, 0)


def test_queue_status_filters():
    build_state()
    only_g1 = queue_status(group="g1")
    assert {p.group for p in only_g1.partitions} == {"g1"}
    assert [g.group for g in only_g1.groups] == ["g1"]
    assert only_g1.groups[0].lag == 7
    assert queue_status(topic="nothing") == QueueStatus()
    assert queue_status(group="g2", topic=T).groups[0].lag == 14
    assert queue_status(group="nobody") == QueueStatus()


def test_queue_status_of_an_empty_queue():
    assert queue_status() == QueueStatus(partitions=[], groups=[])
