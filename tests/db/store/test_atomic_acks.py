"""AtomicAckStore (``store/atomic_acks.py``): the atomic consumers' ack inside the caller's
transaction, and the watermark's one compare-and-set (``acks.move_watermark``) it shares
with ``ack_contiguous``. Real rows, real transactions; the end-to-end atomic consumers are
tested in tests/worker/batch/test_atomic.py."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_sqlqueue.db.store.acks import move_watermark
from django_sqlqueue.db.store.atomic_acks import AtomicAckStore
from django_sqlqueue.exceptions import FenceLost

from ...support.engine_helpers import IN_FLIGHT, delivery_rows, row, store, watermark
from .helpers import A, G, T, deliver, fill

pytestmark = pytest.mark.django_db(transaction=True)


def atomic_acks() -> AtomicAckStore:
    """The module's store on its own (no other store mixin behind it): what these tests exercise."""
    return AtomicAckStore("default")


def delivered(offsets: list[int], total: int = 5) -> None:
    """A has ``total`` messages, the watermark at 0, ``offsets`` delivered to w1 (attempt 1)."""
    fill(A, total)
    store().ensure_offsets(G, T, [A])
    deliver(A, offsets)


def test_contiguous_acks_move_the_watermark_and_delete_the_rows_behind_it():
    delivered([1, 2, 3])
    with transaction.atomic():
        assert atomic_acks().ack_in_transaction(G, T, "w1", A, [(1, 0), (2, 0)]) == 2
    assert watermark(G, T, A) == 2
    assert [(r.message_offset, r.acked) for r in delivery_rows(G, T, A)] == [(3, False)]


def test_acks_after_a_gap_are_flagged_and_leave_the_watermark():
    delivered([1, 2, 3])
    with transaction.atomic():
        assert atomic_acks().ack_in_transaction(G, T, "w1", A, [(3, 0), (2, 0)]) is None  # 1 is not acked
    assert watermark(G, T, A) == 0
    assert [(r.message_offset, r.acked) for r in delivery_rows(G, T, A)] == [(1, False), (2, True), (3, True)]


def test_a_lost_lease_or_a_redelivered_message_raises_fence_lost_and_the_caller_rolls_back():
    delivered([1, 2])
    with pytest.raises(FenceLost, match="no longer held by w2"), transaction.atomic():
        atomic_acks().ack_in_transaction(G, T, "w2", A, [(1, 0)])
    # Delivered again meanwhile (retry_count 1): this attempt's ack must not count.
    with pytest.raises(FenceLost, match="redelivered, nacked or acked elsewhere"), transaction.atomic():
        atomic_acks().ack_in_transaction(G, T, "w1", A, [(1, 0), (2, 1)])
    assert watermark(G, T, A) == 0  # rolled back with the caller's transaction
    assert [(r.message_offset, r.acked, r.status) for r in delivery_rows(G, T, A)] == [
        (1, False, IN_FLIGHT),
        (2, False, IN_FLIGHT),
    ]
    assert atomic_acks().ack_in_transaction(G, T, "w1", A, []) is None


def test_the_watermark_moves_only_from_the_value_the_caller_saw():
    delivered([1])
    s = store()
    with s.transaction() as cursor:
        assert not move_watermark(s, cursor, G, T, A, 1, 3)  # it is at 0, not 1
        assert move_watermark(s, cursor, G, T, A, 0, 3)
        assert not move_watermark(s, cursor, G, T, A, 0, 4)  # moved meanwhile
    assert watermark(G, T, A) == 3
    assert row(G, T, A, 1).acked is False  # the compare-and-set touches the watermark row only
