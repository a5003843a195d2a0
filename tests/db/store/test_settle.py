"""settle.py (and task_batches.py's SQL through it): a consumer's bookkeeping committed with
the ack or dead letter that settles each message -- reported once, whichever ack path runs
and however often it runs (a retried ack whose COMMIT reply was lost, a late second ack).
Real rows and transactions; the tasks' batches end to end are in tests/tasks/test_batches.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_sqlqueue.db.store import task_batches as sql
from django_sqlqueue.db.store.delivery import FetchedMessage
from django_sqlqueue.db.store.settle import Settlement, Settling
from django_sqlqueue.task_models import TaskBatch

from ...support.engine_helpers import dead_letters, delivery_rows, store, watermark
from .helpers import A, B, G, T, deliver, fill

pytestmark = pytest.mark.django_db(transaction=True)


class Recorder:
    """A settlement that keeps what it is told (the tasks' one is tests/tasks/test_batches.py's)."""

    def __init__(self) -> None:
        self.acked: list[Any] = []
        self.dead: list[Any] = []

    def key_of(self, message: FetchedMessage) -> Any:
        return message.id

    def settled(self, cursor: Any, acked: Sequence[Any], dead: Sequence[Any]) -> None:
        assert connection.in_atomic_block  # inside the ack's transaction
        self.acked += acked
        self.dead += dead


def settling(recorder: Settlement, tokens: dict[tuple[int, int], Any]) -> Settling:
    return Settling(recorder, tokens)


def test_the_contiguous_ack_reports_each_message_once_and_a_retry_reports_nothing() -> None:
    fill(A, 3)
    store().ensure_offsets(G, T, [A])
    deliver(A, [1, 2, 3])
    recorder = Recorder()
    tokens = {(A, 1): "one", (A, 3): "three"}  # offset 2 is a plain message: no token
    for _ in range(2):  # the second: a retry after a lost COMMIT reply (watermark moved already)
        store().record_acks(G, T, "w1", {A: [1, 2, 3]}, {}, {A: 0}, settling(recorder, tokens))
    assert watermark(G, T, A) == 3
    assert sorted(recorder.acked) == ["one", "three"] and recorder.dead == []


def test_the_flagging_ack_after_a_gap_reports_once() -> None:
    fill(B, 3)
    store().ensure_offsets(G, T, [B])
    deliver(B, [1, 2, 3])
    recorder = Recorder()
    for _ in range(2):
        store().record_acks(G, T, "w1", {B: [2, 3]}, {}, {B: 0}, settling(recorder, {(B, 2): "two", (B, 3): "x"}))
    assert [(r.message_offset, r.acked) for r in delivery_rows(G, T, B)] == [(1, False), (2, True), (3, True)]
    assert sorted(recorder.acked) == ["two", "x"]


def test_an_ack_of_a_lost_lease_reports_nothing() -> None:
    fill(A, 1)
    store().ensure_offsets(G, T, [A])
    deliver(A, [1])
    recorder = Recorder()
    store().record_acks(G, T, "w2", {A: [1]}, {}, {A: 0}, settling(recorder, {(A, 1): "one"}))
    assert recorder.acked == [] and watermark(G, T, A) == 0


def test_a_dead_letter_reports_once_even_when_written_twice() -> None:
    fill(A, 1)
    store().ensure_offsets(G, T, [A])
    deliver(A, [1])
    recorder = Recorder()
    message = _fetched(A, 1)
    for _ in range(2):
        assert store().dead_letter(
            G,
            T,
            "w1",
            message,
            dlq_topic=f"{T}_dlq",
            attempts=3,
            error="boom",
            settling=settling(recorder, {(A, 1): "d"}),
        )
    assert recorder.dead == ["d"] and recorder.acked == []
    assert len(dead_letters(f"{T}_dlq")) == 1


def test_the_atomic_ack_reports_after_its_fence() -> None:
    fill(A, 2)
    store().ensure_offsets(G, T, [A])
    deliver(A, [1, 2])
    recorder = Recorder()
    with transaction.atomic():
        store().ack_in_transaction(G, T, "w1", A, [(1, 0), (2, 0)], settling(recorder, {(A, 2): "two"}))
    assert recorder.acked == ["two"]


def test_batch_counts_stop_at_the_finish_and_unknown_batches_change_nothing() -> None:
    TaskBatch.objects.create(id="b1", backend="default", on_finish="x.y", total=3, created_at=timezone.now())
    with transaction.atomic(), connection.cursor() as cursor:
        assert sql.add_counts(cursor, {"b1": (1, 0), "nope": (5, 5)}) == []
        (done,) = sql.add_counts(cursor, {"b1": (1, 1)})
        assert (done.id, done.total, done.succeeded, done.failed, done.metadata) == ("b1", 3, 2, 1, {})
        from django_sqlqueue.db.dialects import get_dialect

        sql.mark_finished(cursor, get_dialect(connection), "b1", "b1.done")
        assert sql.add_counts(cursor, {"b1": (1, 0)}) == []  # finished: counts nothing more
        assert sql.result_statuses(cursor, ["missing"]) == {}
    row = TaskBatch.objects.get(id="b1")
    assert (row.succeeded, row.failed, row.callback_id) == (2, 1, "b1.done") and row.finished_at is not None


def _fetched(partition: int, offset: int) -> FetchedMessage:
    """The delivery of (partition, offset) as the worker holds it (its delivery row exists)."""
    from django_sqlqueue.models import Message

    m = Message.objects.get(topic=T, partition=partition, offset=offset)
    return FetchedMessage(
        partition, offset, m.key, m.id, m.payload, m.metadata, m.created_at, m.deliver_at, retry_count=0, status=None
    )
