"""queue_status() on a hand-built state: every number, per partition and per group."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from django_sqlqueue import queue_status
from django_sqlqueue.ops.status import GroupSummary, PartitionStatus, QueueStatus

from ..support.engine_helpers import IN_FLIGHT, RETRY, SCHEDULED, age_lease, fetch_fresh, leased, publish_to, store
from ..support.factories import DeliveryStateFactory, SubscriberHeartbeatFactory

pytestmark = pytest.mark.django_db(transaction=True)

T = "st"
#: Two partitions of ``st`` (of the default 8).
A, B = 0, 1
HOUR = dt.timedelta(hours=1)


def build_state() -> None:
    """Topic ``st``, partitions A (head 10) and B (head 4, and 2 messages waiting for the
    sequencer), consumed by g1, g2 and g_1.

    g1/A: watermark 3; 4 in flight, 5 in flight but expired, 6 nacked, 7 parked, 8 acked,
    9 dead-lettered; 10 not delivered. g1/B: caught up with what is sequenced. g2: a live
    subscriber, no watermark rows yet. g_1: watermarks at 0; the DLQ also holds dead
    letters of a group named gx1 (which a LIKE 'g_1:%' without escaping would count as
    g_1's).
    """
    publish_to(T, A, 10, id=lambda i: f"a{i}")
    publish_to(T, B, 4, id=lambda i: f"b{i}")
    s = store()
    s.ensure_offsets("g1", T, [A, B])
    s.ensure_offsets("g_1", T, [A, B])
    leased("g1", T, A, "w1")
    leased("g1", T, B, "w2")
    assert s.ack_contiguous("g1", T, "w1", [(A, 0, 3)]) == []
    assert s.ack_contiguous("g1", T, "w2", [(B, 0, 4)]) == []
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
        DeliveryStateFactory(consumer_group="g1", topic=T, partition=A, message_offset=offset, **values)
    (m9,) = fetch_fresh("g1", T, A, after=8, limit=1)
    assert s.dead_letter("g1", T, "w1", m9, dlq_topic="st_dlq", attempts=5, error="boom")
    leased("gx1", T, A, "wx")
    for m in fetch_fresh("gx1", T, A, limit=2):
        assert s.dead_letter("gx1", T, "wx", m, dlq_topic="st_dlq", attempts=1, error="lookalike")
    s.release_leases("gx1", T, "wx")
    age_lease("g1", T, B, 3600)
    s.heartbeat("g1", T, "w1")
    SubscriberHeartbeatFactory(consumer_group="g1", topic=T, subscriber_name="w2", heartbeat_at=now - HOUR)
    s.heartbeat("g1", T, "w3")
    s.deregister("g1", T, "w3")
    s.heartbeat("g2", T, "w9")
    publish_to(T, B, 2, seq=False)  # committed, not numbered yet


def test_queue_status_partitions():
    build_state()
    status = queue_status()
    by = {(p.group, p.partition): p for p in status.partitions}
    assert sorted(by) == [(g, p) for g in ("g1", "g2", "g_1") for p in (A, B)]
    assert by[("g1", A)] == PartitionStatus(
        group="g1",
        topic=T,
        partition=A,
        head=10,
        watermark=3,
        unsequenced=0,
        lag=7,
        in_flight=2,  # 4, and 5 (expired: in flight until a poll redelivers it)
        retrying=1,  # 6 (nacked)
        scheduled=1,  # 7
        lease_holder="w1",
        lease_live=True,
    )
    # B: 2 messages wait for the sequencer: they are lag already.
    assert by[("g1", B)] == PartitionStatus("g1", T, B, 4, 4, 2, 2, 0, 0, 0, "w2", False)
    assert by[("g2", A)] == PartitionStatus("g2", T, A, 10, 0, 0, 10, 0, 0, 0, None, False)
    assert by[("g2", B)] == PartitionStatus("g2", T, B, 4, 0, 2, 6, 0, 0, 0, None, False)
    assert by[("g_1", A)] == PartitionStatus("g_1", T, A, 10, 0, 0, 10, 0, 0, 0, None, False)
    assert by[("g_1", B)].lag == 6
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
        lag=9,
        in_flight=2,
        retrying=1,
        dead_letters=1,  # 9; not gx1's two
        live_subscribers=1,  # w1: w2 is stale, w3 deregistered
        unsequenced=2,
    )
    assert groups["g2"] == GroupSummary("g2", (T,), 2, 16, 0, 0, 0, 1, 2)
    assert groups["g_1"] == GroupSummary("g_1", (T,), 2, 16, 0, 0, 0, 0, 2)


def test_queue_status_filters():
    build_state()
    only_g1 = queue_status(group="g1")
    assert {p.group for p in only_g1.partitions} == {"g1"}
    assert [g.group for g in only_g1.groups] == ["g1"]
    assert only_g1.groups[0].lag == 9
    assert queue_status(topic="nothing") == QueueStatus()
    assert queue_status(group="g2", topic=T).groups[0].lag == 16
    assert queue_status(group="nobody") == QueueStatus()


def test_queue_status_of_an_empty_queue():
    status = queue_status()
    # (status.consumers lists the consumers the test apps declare: code, not queue state.)
    assert (status.partitions, status.groups) == ([], [])


def test_an_expired_delivery_is_in_flight_for_queue_status_the_console_and_the_metrics():
    """One definition of in flight and retrying (``DeliveryCounts.in_flight_total`` and
    ``retrying_total``): a delivery whose visibility timeout ended -- recorded by
    ``mark_delivered`` with a short timeout, its worker gone -- is still in flight, and only a
    nack makes a delivery retrying, in ``queue_status``, the console's overview and group
    pages, and the metrics alike."""
    from prometheus_client.core import Metric

    from django_sqlqueue import ops
    from django_sqlqueue.metrics.gauges import QueueCollector, read_snapshot

    from ..support.engine_helpers import wait_until

    publish_to(T, A, 3)
    s = store()
    s.ensure_offsets("g1", T, [A])
    leased("g1", T, A, "w1")
    expiring, running, nacked = fetch_fresh("g1", T, A, limit=3)
    assert s.mark_delivered("g1", T, "w1", [expiring], [], [], 0.2) == {A}
    assert s.mark_delivered("g1", T, "w1", [running, nacked], [], [], 3600) == {A}
    s.nack("g1", T, "w1", [(A, nacked.offset, 3600)])
    counts = wait_until(
        lambda: (c := s.delivery_counts("g1", T)[("g1", T, A)]).expired == 1 and c,
        what="the short visibility timeout to end (database clock)",
    )
    assert (counts.in_flight, counts.expired, counts.retry) == (1, 1, 1)
    expected = {"in_flight": 2, "retrying": 1}

    status = queue_status(group="g1")
    (partition,) = [p for p in status.partitions if p.partition == A]
    (summary,) = status.groups
    (overview_row,) = [g for g in ops.overview().groups if g.group == "g1"]
    (group_row,) = [p for p in ops.group_offsets("g1", T) if p.partition == A]
    families: dict[str, Metric] = {f.name: f for f in QueueCollector(read_snapshot()).collect()}

    def gauge(name: str) -> float:
        labels = {"database": "default", "group": "g1", "topic": T}
        (sample,) = [x for x in families[name].samples if x.labels == labels]
        return sample.value

    metrics = {"in_flight": gauge("sqlqueue_in_flight_messages"), "retrying": gauge("sqlqueue_retrying_messages")}
    for surface, row in [
        ("queue_status partition", partition),
        ("queue_status group", summary),
        ("console overview", overview_row),
        ("console group page", group_row),
    ]:
        assert {"in_flight": row.in_flight, "retrying": row.retrying} == expected, surface
    assert metrics == expected
