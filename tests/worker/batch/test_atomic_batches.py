"""``atomic="batch"`` consumers (django_sqlqueue/worker/batch/atomic_batches.py), one batch at a time.

No worker and no thread: each test leases partition 0, records the deliveries the way a
poll does and runs ``BatchRunner.run`` on this thread against the real database
(``helpers.leased_batch``). A handler's effects are ``Handled`` rows: one that committed
twice would show twice, one rolled back not at all. ``transaction.on_commit`` tells how
many transactions there were: hooks registered in one transaction run at its COMMIT.
"""

from __future__ import annotations

import logging

import pytest
from django.db import connection, transaction

from django_sqlqueue.models import PartitionLease
from django_sqlqueue.worker.batch.atomic_batches import AtomicBatches
from django_sqlqueue.worker.batch.handlers import HandlerRunner
from django_sqlqueue.worker.batch.outcomes import Outcomes
from django_sqlqueue.worker.batch.runner import Batch
from tests.support.engine_helpers import (
    IN_FLIGHT,
    RETRY,
    SCHEDULED,
    Calls,
    dead_letters,
    delivery_rows,
    fetch_fresh,
    row,
    watermark,
)
from tests.support.poison import store_raw

from .helpers import effect, effects, leased_batch

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "abatch.t"


class Recorder:
    """A handler that writes its effect and notes, per call, the offset, the attempt and how
    many on-commit hooks of its transaction were pending (0: a transaction of its own)."""

    def __init__(self, fail_at: int | None = None, error: BaseException | None = None) -> None:
        self.calls = Calls()
        self.commits = Calls()
        self.fail_at = fail_at
        self.error = error or RuntimeError("poison")

    def __call__(self, message) -> None:
        self.calls.add((message.offset, message.attempt, len(connection.run_on_commit)))
        effect(message)
        transaction.on_commit(lambda: self.commits.add((message.offset, len(self.calls.list()))))
        if message.offset == self.fail_at:
            raise self.error


def test_a_batch_runs_in_one_transaction_and_commits_once():
    handler = Recorder()
    runner, sub, fetched, stats = leased_batch(TOPIC, handler, 3, atomic="batch")
    assert runner.run(sub, fetched, {0: 0}, HandlerRunner()) == 3
    # Each call saw the hooks of the calls before it pending: one transaction...
    assert handler.calls.list() == [(1, 1, 0), (2, 1, 1), (3, 1, 2)]
    # ... committed once, after the last handler: every hook ran then.
    assert handler.commits.list() == [(1, 3), (2, 3), (3, 3)]
    assert effects(TOPIC) == [1, 2, 3]
    assert watermark("g", TOPIC) == 3 and delivery_rows("g", TOPIC) == []  # acked in that transaction
    assert (stats.delivered, stats.acked, stats.nacked) == (3, 3, 0)


def test_the_batch_transaction_acks_by_itself_and_leaves_the_runner_only_counts_to_write():
    """AtomicBatches.run on its own (no outcome writer after it): the handlers' effects and the
    acks are committed already; the outcomes only count them and note the watermark moved."""
    handler = Recorder()
    runner, sub, fetched, _ = leased_batch(TOPIC, handler, 3, atomic="batch")
    batch = Batch(sub, fetched, Outcomes(), HandlerRunner(), None)
    assert AtomicBatches(runner).run(batch) == 3
    assert effects(TOPIC) == [1, 2, 3] and handler.commits.list() == [(1, 3), (2, 3), (3, 3)]
    assert watermark("g", TOPIC) == 3 and delivery_rows("g", TOPIC) == []
    outcomes = batch.outcomes
    assert (outcomes.committed, outcomes.moved, outcomes.pending) == (3, {0: 3}, [])
    assert not any(outcomes.acks.values()) and not outcomes.nacks and not outcomes.unprocessed


def test_a_raising_handler_makes_each_message_run_alone_so_its_batch_mates_commit(caplog):
    caplog.set_level(logging.INFO, logger="django_sqlqueue")
    handler = Recorder(fail_at=3)
    runner, sub, fetched, stats = leased_batch(TOPIC, handler, 5, atomic="batch")
    assert runner.run(sub, fetched, {0: 0}, HandlerRunner()) == 5
    together, alone = handler.calls.list()[:3], handler.calls.list()[3:]
    assert together == [(1, 1, 0), (2, 1, 1), (3, 1, 2)]  # rolled back at 3; 4 and 5 never began
    assert alone == [(o, 1, 0) for o in (1, 2, 3, 4, 5)]  # the same attempt, each in its own transaction
    assert effects(TOPIC) == [1, 2, 4, 5]  # once each: the batch's writes were rolled back
    poison = row("g", TOPIC, 0, 3)
    assert (poison.status, poison.acked) == (RETRY, False) and "poison" in poison.last_error
    assert watermark("g", TOPIC) == 2 and row("g", TOPIC, 0, 4).acked and row("g", TOPIC, 0, 5).acked
    assert (stats.delivered, stats.acked, stats.nacked) == (5, 4, 1)  # delivered once each
    assert "an atomic batch rolled back (RuntimeError: poison); its 5 message(s) run again" in caplog.text


def test_before_atomic_failing_runs_each_message_alone():
    prepared = Calls()

    def before(message) -> None:
        prepared.add(message.offset)
        if message.offset == 2:
            raise ValueError("not ready")

    handler = Recorder()
    runner, sub, fetched, stats = leased_batch(TOPIC, handler, 3, atomic="batch", before_atomic=before)
    runner.run(sub, fetched, {0: 0}, HandlerRunner())
    assert prepared.list() == [1, 2, 1, 2, 3]  # the batch's hooks up to the failure, then one per message
    assert [offset for offset, _, _ in handler.calls.list()] == [1, 3]  # no batch transaction was opened
    assert effects(TOPIC) == [1, 3]
    assert row("g", TOPIC, 0, 2).status == RETRY and (stats.acked, stats.nacked) == (2, 1)


def test_system_exit_fails_its_message_stops_the_worker_and_hands_the_others_back():
    handler = Recorder(fail_at=2, error=SystemExit(3))
    runner, sub, fetched, stats = leased_batch(TOPIC, handler, 3, atomic="batch")
    runner.run(sub, fetched, {0: 0}, HandlerRunner())  # does not raise: the worker re-raises once drained
    assert isinstance(runner.interrupted, SystemExit) and runner.stop_event.is_set()
    assert effects(TOPIC) == []  # rolled back, and not retried alone
    failed = row("g", TOPIC, 0, 2)
    assert (failed.status, failed.retry_count) == (RETRY, 0)  # attempt 1 failed
    for offset in (1, 3):
        r = row("g", TOPIC, 0, offset)
        assert (r.status, r.retry_count, r.acked) == (SCHEDULED, 0, False)  # handed back, not counted
    assert (stats.acked, stats.nacked) == (0, 1)


def test_a_lost_fence_rolls_the_whole_batch_back_and_writes_nothing(caplog):
    def handler(message) -> None:
        effect(message)
        if message.offset == 2:
            # As a thief of an expired lease would (here in the batch's own transaction,
            # rolled back with it): the fence at the end reads the lease row changed.
            PartitionLease.objects.filter(consumer_group="g", topic=TOPIC, partition=0).update(leased_by="thief")

    runner, sub, fetched, stats = leased_batch(TOPIC, handler, 3, atomic="batch")
    runner.run(sub, fetched, {0: 0}, HandlerRunner())
    assert effects(TOPIC) == []
    for offset in (1, 2, 3):
        r = row("g", TOPIC, 0, offset)
        assert (r.status, r.retry_count, r.acked) == (IN_FLIGHT, 0, False)  # the holder's to redeliver
    assert watermark("g", TOPIC) == 0 and (stats.acked, stats.nacked) == (0, 0)
    assert "an atomic consumer's transaction was rolled back" in caplog.text


def test_a_row_no_handler_takes_goes_the_ordinary_way_and_the_rest_commit_together():
    handler = Recorder()
    runner, sub, fetched, stats = leased_batch(TOPIC, handler, 3, atomic="batch")
    store_raw(TOPIC, fetched[1].id, "metadata", "[1, 2]")  # written by another program
    fetched = fetch_fresh("g", TOPIC, 0)  # read again, as the poll would have
    assert fetched[1].undecodable is not None
    runner.run(sub, fetched, {0: 0}, HandlerRunner())
    assert handler.calls.list() == [(1, 1, 0), (3, 1, 1)]  # one transaction for 1 and 3
    (dead,) = dead_letters(f"{TOPIC}_dlq")
    assert dead.last_error.startswith("undecodable row: metadata is not a JSON object")
    assert effects(TOPIC) == [1, 3]
    # The commit moved the watermark to 1; 2 (acked with its dead letter) and 3 are acked,
    # for the next poll's advance_watermark to pass.
    assert watermark("g", TOPIC) == 1 and row("g", TOPIC, 0, 2).acked and row("g", TOPIC, 0, 3).acked
    assert (stats.delivered, stats.acked, stats.dead_lettered) == (2, 2, 1)


def test_a_failure_outside_the_handlers_hands_back_only_the_messages_not_begun(monkeypatch):
    """The batch rolls back at offset 2 (its handler raised); then, run alone, offset 1
    commits and the thread is killed (an asynchronous exception). Offset 2's handler ran in
    this attempt: it stays in flight (counted); offset 3's never began: handed back."""
    handler = Recorder(fail_at=2)
    runner, sub, fetched, _ = leased_batch(TOPIC, handler, 3, atomic="batch")
    original = runner.handle

    def handle(sub, m, outcomes, invoke, **kwargs):
        done = original(sub, m, outcomes, invoke, **kwargs)
        if m.offset == 1:
            raise SystemExit  # as an asynchronous exception raised into the thread would
        return done

    monkeypatch.setattr(runner, "handle", handle)
    with pytest.raises(SystemExit):
        runner.run(sub, fetched, {0: 0}, HandlerRunner())
    assert effects(TOPIC) == [1] and watermark("g", TOPIC) == 1  # committed alone
    begun = row("g", TOPIC, 0, 2)
    assert (begun.status, begun.retry_count, begun.acked) == (IN_FLIGHT, 0, False)  # back after its timeout
    rest = row("g", TOPIC, 0, 3)
    assert (rest.status, rest.retry_count, rest.acked) == (SCHEDULED, 0, False)  # due now, not counted
