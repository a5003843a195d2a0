"""DeadLetterStore (``store/deadletters.py``): locking and deleting dead letters, the once-only
guard of an operator's replay or purge (``ops/replay.py``; its end-to-end tests are in
tests/ops/). Real rows, real transactions, and two real connections for the guard.
"""

from __future__ import annotations

import threading

import pytest
from django.db import transaction
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from django_sqlqueue.db.store.deadletters import DeadLetterStore
from django_sqlqueue.db.store.messages import write_dead_letter
from django_sqlqueue.models import Message

from ...support.engine_helpers import lock_waiting, not_on_sqlite, publish_to, session_id, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

T, DLQ = "orders", "orders_dlq"


def dead_letters() -> DeadLetterStore:
    return DeadLetterStore("default")


def store_dead_letters(*ids: str) -> list[int]:
    """Dead letters of ``ids`` in DLQ (in this order); return their seqs."""
    for message_id in ids:
        write_dead_letter(
            DLQ,
            key="k",
            id=message_id,
            payload={"id": message_id},
            metadata={},
            created_at=timezone.now(),
            failure_count=1,
            last_error="boom",
            original_topic=T,
            using="default",
        )
    by_id = dict(Message.objects.filter(topic=DLQ).values_list("id", "seq"))
    return [by_id[message_id] for message_id in ids]


def test_lock_returns_only_existing_dead_letters_in_seq_order():
    first, second, third = store_dead_letters("g:1", "g:2", "g:3")
    publish_to(T, 0, 2)  # ordinary messages: never locked, whatever seq the caller names
    ordinary = sorted(Message.objects.filter(topic=T).values_list("seq", flat=True))
    Message.objects.filter(seq=second).delete()  # gone already (another operator's purge)
    with transaction.atomic():
        rows = dead_letters().lock_dead_letters([third, *ordinary, second, first, 10**12])
    assert [m.seq for m in rows] == [first, third]
    assert [(m.topic, m.id, m.original_topic) for m in rows] == [(DLQ, "g:1", T), (DLQ, "g:3", T)]
    with transaction.atomic():
        assert dead_letters().lock_dead_letters([]) == []


def test_delete_removes_exactly_the_locked_rows():
    first, second, third = store_dead_letters("g:1", "g:2", "g:3")
    s = dead_letters()
    with transaction.atomic():
        rows = s.lock_dead_letters([third, first])
        assert s.delete_dead_letters(rows) == 2
    assert list(Message.objects.values_list("seq", flat=True)) == [second]
    with transaction.atomic():
        assert s.delete_dead_letters(rows) == 0  # already gone: nothing else is touched
    assert Message.objects.count() == 1


@not_on_sqlite("no row locks: the database write lock serializes every writer, readers never wait")
def test_locking_needs_the_callers_transaction():
    (seq,) = store_dead_letters("g:1")
    with pytest.raises(TransactionManagementError):
        dead_letters().lock_dead_letters([seq])  # FOR UPDATE in autocommit would lock nothing


@not_on_sqlite("no row locks: the second transaction's BEGIN IMMEDIATE waits for the database write lock instead")
def test_a_second_operator_waits_for_the_first_then_finds_nothing_to_replay(spawn):
    first_seq, second_seq = store_dead_letters("g:1", "g:2")
    locked, release = threading.Event(), threading.Event()

    def first_operator() -> int:
        s = dead_letters()
        with transaction.atomic():
            rows = s.lock_dead_letters([first_seq, second_seq])
            deleted = s.delete_dead_letters(rows)
            locked.set()
            assert release.wait(10)
        return deleted

    second_session: list[int] = []

    def second_operator() -> list[int]:
        second_session.append(session_id())
        with transaction.atomic():
            return [m.seq for m in dead_letters().lock_dead_letters([second_seq, first_seq])]

    first = spawn(first_operator, name="first")
    assert locked.wait(10)
    second = spawn(second_operator, name="second")
    wait_until(lambda: second_session and lock_waiting(second_session[0]), timeout=5, what="the second lock to wait")
    assert second.is_alive()
    release.set()
    assert first.join_ok() == 2
    assert second.join_ok() == []  # the rows the first operator took are gone: a second click does nothing
    assert not Message.objects.exists()
