"""What a handler's outcome means and the writes it leads to (django_sqlqueue/worker/batch/outcomes.py).

The :class:`OutcomeWriter` of a runner is driven directly: each test leases a partition and
records its deliveries the way a poll does (``helpers.leased_batch``), decides outcomes in
memory, then writes them to the real database and reads the rows back.
"""

from __future__ import annotations

import pytest
from django.db import transaction

from django_sqlqueue import Reject, Retry
from django_sqlqueue.models import Message
from django_sqlqueue.worker.batch.outcomes import (
    BatchHooks,
    Outcomes,
    attempt_number,
    describe_error,
    expired_error,
)
from tests.support.engine_helpers import (
    IN_FLIGHT,
    RETRY,
    SCHEDULED,
    dead_letters,
    delivery_rows,
    fast_conf,
    fetch_due,
    row,
    store,
    watermark,
)

from .helpers import leased_batch

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "outcomes.t"
DLQ = f"{TOPIC}_dlq"


def noop(message) -> None:
    pass


# -- what a delivery is ------------------------------------------------------------------------


def test_attempt_numbers_count_deliveries_not_parkings_nor_hand_backs():
    fetched = leased_batch(TOPIC, noop, 2).fetched
    assert [attempt_number(m) for m in fetched] == [1, 1]
    assert row("g", TOPIC, 0, 1).status == IN_FLIGHT
    s = store()
    s.nack("g", TOPIC, "w1", [(0, 1, 0.0)], {(0, 1): "boom"})  # attempt 1 failed
    s.release_deliveries("g", TOPIC, "w1", [(0, 2)])  # handed back: attempt not counted
    due = {m.offset: m for m in fetch_due("g", TOPIC, 0)}
    assert (due[1].status, due[2].status) == (RETRY, SCHEDULED)
    assert (attempt_number(due[1]), attempt_number(due[2])) == (2, 1)


def test_describe_error_names_the_class_and_keeps_the_traceback_tail():
    try:
        raise KeyError("missing")
    except KeyError as exc:
        text = describe_error(exc)
    assert text.startswith("builtins.KeyError: 'missing'\n")
    assert "Traceback" in text and "test_describe_error" in text


def test_expired_error_counts_the_deliveries_that_timed_out():
    sub = leased_batch(TOPIC, noop, 1, visibility_timeout=7).sub
    store().nack("g", TOPIC, "w1", [(0, 1, 0.0)], {})
    (again,) = fetch_due("g", TOPIC, 0)
    assert expired_error(again, sub).startswith("delivered 1 times without an ack or nack (visibility timeout 7s")


# -- deciding ----------------------------------------------------------------------------------


def test_decide_sorts_returns_rejects_and_failures_and_a_retry_keeps_its_delay():
    conf = fast_conf(BACKOFF_MIN=2, BACKOFF_MAX=4)
    runner, sub, fetched, _ = leased_batch(TOPIC, noop, 5, conf=conf, max_attempts=3)
    m1, m2, m3, m4, m5 = fetched
    decide, outcomes = runner.writer.decide, Outcomes()
    decide(sub, m1, 1, None, outcomes)
    decide(sub, m2, 1, Reject("poison"), outcomes)
    decide(sub, m3, 1, ValueError("boom"), outcomes)
    decide(sub, m4, 1, Retry(delay=7), outcomes)
    decide(sub, m5, 3, ValueError("again"), outcomes)  # the last attempt
    assert dict(outcomes.acks) == {0: [1]}
    assert [(m.offset, attempts) for m, attempts, _ in outcomes.dead] == [(2, 1), (5, 3)]
    assert outcomes.dead[0][2].startswith("django_sqlqueue.exceptions.Reject: poison")
    (p3, o3, delay3), (p4, o4, delay4) = outcomes.nacks
    assert (p3, o3, p4, o4, delay4) == (0, 3, 0, 4, 7)
    assert 1.6 <= delay3 <= 2.4  # the backoff's: BACKOFF_MIN after attempt 1, jittered by 20%
    assert outcomes.errors[(0, 3)].startswith("builtins.ValueError: boom")


def test_decide_counts_an_atomic_commit_without_writing_it_again():
    runner, sub, fetched, _ = leased_batch(TOPIC, noop, 2)
    outcomes = Outcomes()
    runner.writer.decide(sub, fetched[0], 1, None, outcomes, committed=True, moved=1)
    runner.writer.decide(sub, fetched[1], 1, None, outcomes, committed=True, moved=None)
    assert (outcomes.committed, outcomes.moved, dict(outcomes.acks)) == (2, {0: 1}, {})


# -- writing -----------------------------------------------------------------------------------


def test_complete_writes_dead_letters_nacks_acks_and_hand_backs():
    runner, sub, fetched, stats = leased_batch(TOPIC, noop, 5)
    m1, m2, m3, m4, _ = fetched
    outcomes = Outcomes()
    runner.writer.decide(sub, m1, 1, None, outcomes)
    runner.writer.decide(sub, m2, 1, Reject("no"), outcomes)
    runner.writer.decide(sub, m3, 1, None, outcomes)
    runner.writer.decide(sub, m4, 1, ValueError("boom"), outcomes)
    outcomes.unprocessed.append((0, 5))
    runner.writer.complete(sub, outcomes, {0: 0})
    # 1, its dead-lettered neighbour 2 and 3 are done: the watermark passes all three.
    assert watermark("g", TOPIC) == 3
    (dead,) = dead_letters(DLQ)
    assert dead.id == f"g:{m2.id}" and dead.last_error.startswith("django_sqlqueue.exceptions.Reject: no")
    nacked = row("g", TOPIC, 0, 4)
    assert (nacked.status, nacked.acked) == (RETRY, False) and nacked.last_error.startswith("builtins.ValueError")
    back = row("g", TOPIC, 0, 5)
    assert (back.status, back.retry_count, back.acked) == (SCHEDULED, 0, False)
    assert (stats.acked, stats.nacked, stats.dead_lettered) == (2, 1, 1)


def test_acks_continue_from_the_watermark_an_atomic_commit_moved():
    runner, sub, fetched, stats = leased_batch(TOPIC, noop, 2)
    s = store()
    with transaction.atomic():  # what an atomic handler's transaction commits for offset 1
        moved = s.ack_in_transaction("g", TOPIC, "w1", 0, [(1, 0)])
    assert moved == 1
    outcomes = Outcomes()
    runner.writer.decide(sub, fetched[0], 1, None, outcomes, committed=True, moved=moved)
    runner.writer.decide(sub, fetched[1], 1, None, outcomes)
    runner.writer.complete(sub, outcomes, {0: 0})  # fetched at 0; the commit moved it to 1
    assert watermark("g", TOPIC) == 2 and delivery_rows("g", TOPIC) == []
    assert stats.acked == 2


# -- the hooks ---------------------------------------------------------------------------------


class Watching(BatchHooks):
    def __init__(self) -> None:
        self.outcomes: list[tuple[str, int]] = []
        self.dead: list[tuple[int, int, bool]] = []

    def on_outcomes(self, sub, outcomes) -> None:
        self.outcomes.append((sub.spec.name, len(outcomes.nacks)))
        outcomes.nacks = [(partition, offset, 0.0) for partition, offset, _ in outcomes.nacks]

    def on_dead_letter(self, sub, message, attempts, error) -> None:
        written = Message.objects.filter(topic=DLQ, id=f"g:{message.id}").exists()
        self.dead.append((message.offset, attempts, written))


def test_hooks_may_change_the_outcomes_before_they_are_written_and_see_each_dead_letter_after():
    hooks = Watching()
    conf = fast_conf(BACKOFF_MIN=60, BACKOFF_MAX=60)
    runner, sub, fetched, _ = leased_batch(TOPIC, noop, 3, hooks=hooks, conf=conf)
    outcomes = Outcomes()
    runner.writer.decide(sub, fetched[0], 1, ValueError("boom"), outcomes)  # nacked for 60 s...
    runner.writer.decide(sub, fetched[1], 1, Reject("no"), outcomes)
    runner.complete(sub, outcomes, {0: 0})
    assert hooks.outcomes == [("g:outcomes.t", 1)]
    # ... but the hook made it due at once (on the database's clock).
    assert [m.offset for m in fetch_due("g", TOPIC, 0)] == [1]
    # A dead letter the poller decides (out of attempts) goes through the same hook.
    runner.dead_letter(sub, fetched[2], 5, "expired")
    assert hooks.dead == [(2, 1, True), (3, 5, True)]  # each seen after it was written
