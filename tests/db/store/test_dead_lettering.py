"""DeadLetteringStore (``store/dead_lettering.py``): a delivery's copy in the dead-letter
topic and its ack, in one transaction, against real rows and the database clock."""

from __future__ import annotations

import pytest

from django_sqlqueue import publish
from django_sqlqueue.db.store.dead_lettering import DeadLetteringStore
from django_sqlqueue.models import ConsumerOffset, Message

from ...support.engine_helpers import db_now, fetch_fresh, key_for_partition, row, sequence, store
from .helpers import A, G, T, deliver

pytestmark = pytest.mark.django_db(transaction=True)


def test_dead_letter_copies_to_the_dlq_and_acks_for_the_group_only():
    key = key_for_partition(A)
    original = publish(T, {"n": 1}, key=key, id="o-1", metadata={"trace": "x"})
    sequence(T)
    s = store()
    s.ensure_offsets(G, T, [A])  # as a worker has: the running totals live on the watermark row
    deliver(A, [1])
    deliver(A, [1], group="analytics")
    (m,) = fetch_fresh(G, T, A)
    before = db_now()
    assert s.dead_letter(G, T, "w1", m, dlq_topic="orders_dlq", attempts=3, error="builtins.ValueError: boom")
    after = db_now()
    # A retried call: no second copy, the first one is kept as it is.
    assert s.dead_letter(G, T, "w1", m, dlq_topic="orders_dlq", attempts=3, error="again")
    # ... and counted once in the group's running totals (one failure, one dead letter).
    w = ConsumerOffset.objects.get(consumer_group=G, topic=T, partition=A)
    assert (w.failed_total, w.dead_lettered_total, w.handled_total, w.retried_total) == (1, 1, 0, 0)

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


def test_the_store_is_part_of_the_queue_store():
    assert isinstance(store(), DeadLetteringStore)
