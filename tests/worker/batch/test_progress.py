"""What a running batch shares with the watchdog (django_sqlqueue/worker/batch/progress.py).

First the states and transitions of one :class:`BatchProgress`, on this thread. Then the
race it decides, on the real database: an atomic handler's commit on a handler thread
against the watchdog giving the batch up on this one (the watchdog's writes are done the
way ``threads/watchdog.py`` does them: ``failed``, then ``complete``). Exactly one of the
two writes the attempt's outcome, whichever takes the progress lock first.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import transaction

from django_sqlqueue.exceptions import HandlerTimeout
from django_sqlqueue.models import PartitionLease
from django_sqlqueue.worker.batch.handlers import HandlerRunner
from django_sqlqueue.worker.batch.outcomes import Outcomes
from django_sqlqueue.worker.batch.progress import CANCEL_GRACE, BatchProgress, State
from tests.support.engine_helpers import RETRY, not_on_sqlite, row, wait_until, watermark

from .helpers import effect, effects, leased_batch

TOPIC = "progress.t"


def fresh(n: int = 2) -> BatchProgress:
    """A batch's progress, outside any worker (the messages are placeholders)."""
    return BatchProgress(None, [object()] * n, {}, Outcomes())


# -- states ------------------------------------------------------------------------------------


def test_a_batch_runs_then_writes_and_its_states_are_an_enum():
    progress = fresh()
    assert progress.state is State.RUNNING and progress.index == -1
    assert progress.begin(0, 5.0)
    assert progress.record(lambda: None) and progress.index == -1  # no handler in hand
    assert progress.start_writing() and progress.state is State.WRITING
    assert {s.value for s in State} == {"running", "committing", "writing", "abandoned"}


def test_the_watchdog_abandons_only_a_handler_in_hand_past_its_deadline():
    progress = fresh()
    now = time.monotonic()
    assert progress.abandon(now + 60) is None  # no handler in hand
    assert progress.begin(1, None)
    assert progress.abandon(now + 60) is None and progress.watchdog_deadline() is None  # no timeout
    assert progress.record(lambda: None)
    assert progress.begin(1, 0.5)
    deadline = progress.handler_deadline()
    assert deadline is not None and progress.watchdog_deadline() == deadline
    assert progress.abandon(deadline - 0.01) is None  # not yet
    time.sleep(0.02)
    progress.touch()  # progress restarts the clock
    assert progress.handler_deadline() > deadline
    taken = progress.abandon(progress.handler_deadline() + 0.01)
    assert taken is not None and taken[0] == 1 and taken[2] == 0.5
    assert progress.state is State.ABANDONED


def test_an_awaited_handler_gets_a_grace_before_its_thread_is_abandoned():
    progress = fresh()
    assert progress.begin(0, 1.0)
    progress.cancel_in_place()
    deadline = progress.handler_deadline()
    assert progress.watchdog_deadline() == deadline + CANCEL_GRACE
    assert progress.abandon(deadline + CANCEL_GRACE / 2) is None
    assert progress.abandon(deadline + CANCEL_GRACE + 0.01) is not None


def test_once_abandoned_the_batch_records_commits_and_writes_nothing():
    progress = fresh()
    assert progress.begin(0, 0.0)
    assert progress.abandon(time.monotonic() + 1) is not None
    applied = []
    assert not progress.record(lambda: applied.append(1))
    assert not progress.start_commit()
    assert not progress.start_writing()
    assert not progress.begin(1, 1.0)
    assert applied == [] and progress.state is State.ABANDONED


def test_a_commit_or_the_writes_cannot_be_abandoned_and_a_commit_that_ends_can_again():
    progress = fresh()
    assert progress.begin(0, 0.0)
    assert progress.start_commit() and progress.state is State.COMMITTING
    assert progress.abandon(time.monotonic() + 60) is None
    assert progress.watchdog_deadline() is None
    applied = []
    progress.end_commit(lambda: applied.append(progress.lock.locked()))  # runs under the lock
    assert applied == [True] and progress.state is State.RUNNING
    assert progress.abandon(time.monotonic() + 60) is not None  # the handler is still in hand

    progress = fresh()
    assert progress.begin(0, 0.0)
    assert progress.record(lambda: None)
    assert progress.start_writing()
    assert progress.abandon(time.monotonic() + 60) is None
    assert not progress.begin(1, 0.0)  # nothing runs once the batch writes


# -- the race, on the database -------------------------------------------------------------------


def give_up(scene, progress: BatchProgress, index: int) -> None:
    """What the watchdog writes for a batch it took over (threads/watchdog.py)."""
    runner, sub = scene.runner, scene.sub
    message = progress.messages[index]
    outcomes = progress.outcomes
    runner.failed(sub, message, 1, HandlerTimeout("over its timeout"), outcomes, log=False)
    outcomes.unprocessed.extend((m.partition, m.offset) for m in progress.messages[index + 1 :])
    outcomes.unprocessed.extend(outcomes.pending)
    outcomes.pending.clear()
    runner.complete(sub, outcomes, progress.watermarks)


@pytest.mark.django_db(transaction=True)
@not_on_sqlite("a hung atomic handler holds SQLite's database write lock: the watchdog's nack could not be written")
def test_the_watchdog_first_the_late_atomic_handler_rolls_back_and_writes_nothing(spawn, caplog):
    caplog.set_level("INFO", logger="django_sqlqueue")
    inside, release = threading.Event(), threading.Event()

    def handler(message):
        effect(message)
        inside.set()
        assert release.wait(10)

    scene = leased_batch(TOPIC, handler, 1, atomic=True, timeout=0.05)
    progress = BatchProgress(scene.sub, scene.fetched, {0: 0}, Outcomes())
    batch = spawn(lambda: scene.runner.run(scene.sub, scene.fetched, {0: 0}, HandlerRunner(), progress))
    assert inside.wait(10)
    taken = wait_until(lambda: progress.abandon(time.monotonic()), what="past the deadline")
    give_up(scene, progress, taken[0])
    release.set()
    assert batch.join_ok() == 0  # wrote nothing
    assert effects(TOPIC) == []  # its transaction rolled back: start_commit was refused
    nacked = row("g", TOPIC, 0, 1)
    assert (nacked.status, nacked.acked) == (RETRY, False)
    assert nacked.last_error.startswith("django_sqlqueue.exceptions.HandlerTimeout")
    assert "its transaction rolled back" in caplog.text


@pytest.mark.django_db(transaction=True)
@not_on_sqlite("the test holds the lease row locked from another connection while the handler's transaction is open")
def test_the_commit_first_the_watchdog_cannot_give_the_batch_up_until_it_is_recorded(spawn):
    """The handler's transaction has won ``start_commit`` and waits in its fence (this test
    holds the lease row): however late it is, the watchdog may not take the batch over."""
    scene = leased_batch(TOPIC, effect, 1, atomic=True, timeout=0.05)
    progress = BatchProgress(scene.sub, scene.fetched, {0: 0}, Outcomes())
    with transaction.atomic():
        # The fence reads the lease row FOR SHARE: it waits for this lock.
        list(PartitionLease.objects.select_for_update().filter(consumer_group="g", topic=TOPIC, partition=0))
        batch = spawn(lambda: scene.runner.run(scene.sub, scene.fetched, {0: 0}, HandlerRunner(), progress))
        wait_until(lambda: progress.state is State.COMMITTING, what="the handler's commit begun")
        time.sleep(0.1)  # past the handler's timeout of 0.05 s
        assert progress.abandon(time.monotonic() + 60) is None
        assert progress.watchdog_deadline() is None
    assert batch.join_ok() == 1
    assert effects(TOPIC) == [1] and watermark("g", TOPIC) == 1
    assert progress.state is State.WRITING and progress.abandon(time.monotonic() + 60) is None
