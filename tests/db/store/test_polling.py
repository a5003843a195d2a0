"""PollStore (``store/polling.py``): the poll's state query, against real rows and the
database clock."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection

from django_sqlqueue.db.store.polling import PartitionState
from django_sqlqueue.models import DeliveryState

from ...support.engine_helpers import (
    age_lease,
    db_now,
    publish_to,
    qn,
    sequence,
    store,
)
from ...support.factories import ConsumerOffsetFactory
from .helpers import A, B, C, D, E, F, G, T, deliver, fill, leased

pytestmark = pytest.mark.django_db(transaction=True)


# -- the poll's state ------------------------------------------------------------------


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
    assert all(isinstance(st, PartitionState) for st in states)
    a, b = states
    assert (a.head, a.watermark, a.has_offsets_row) == (3, 0, True)
    assert (b.head, b.watermark, b.has_offsets_row) == (3, 0, False)
    for st in states:
        assert st.delivered_max is None and st.next_due is None
        assert st.in_flight == 0 and not st.advanceable and not st.unsequenced
    assert [st.partition for st in s.poll_state(G, T, "w2", 30)] == [C]
    assert s.poll_state(G, T, "nobody", 30) == []


@pytest.mark.skipif(connection.vendor != "mysql", reason="MySQL/MariaDB's plan and handler counters")
def test_poll_state_reads_only_the_subscribers_own_leases():
    """An idle poll costs the partitions a worker holds, not the topic's: 100 workers on
    4,096 partitions each read 4,096 lease rows per poll when MariaDB chose the primary
    key's (group, topic) range over the leased_by index (issue 14, bench/scale.py)."""
    partitions, workers = 4096, 100
    with connection.cursor() as cursor:
        for start in range(0, partitions, 512):
            chunk = range(start, start + 512)
            cursor.execute(
                f"INSERT INTO queue_partition_leases (consumer_group, topic, {qn('partition')}, leased_by, "
                "leased_at, lease_renewed_at) VALUES "
                + ", ".join(["(%s, %s, %s, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"] * len(chunk)),
                [v for p in chunk for v in (G, T, p, f"w{p % workers}")],
            )
            cursor.execute(
                f"INSERT INTO queue_partitions (topic, {qn('partition')}, head_offset, created_at) VALUES "
                + ", ".join(["(%s, %s, 0, UTC_TIMESTAMP(6))"] * len(chunk)),
                [v for p in chunk for v in (T, p)],
            )
            cursor.execute(
                f"INSERT INTO queue_offsets (consumer_group, topic, {qn('partition')}, offset_acked, updated_at) "
                "VALUES " + ", ".join(["(%s, %s, %s, 0, UTC_TIMESTAMP(6))"] * len(chunk)),
                [v for p in chunk for v in (G, T, p)],
            )
        cursor.execute("ANALYZE TABLE queue_partition_leases, queue_partitions, queue_offsets")
        cursor.execute("FLUSH STATUS")
        states = store().poll_state(G, T, "w7", 30)
        cursor.execute("SHOW SESSION STATUS LIKE 'Handler_read_next'")
        read_next = int(cursor.fetchone()[1])
    assert states == []  # no head rows: nothing to do, but the leases were read
    assert read_next <= partitions // workers + 1  # its own 41 rows, not 4,096


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
