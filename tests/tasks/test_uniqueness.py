"""tasks/uniqueness.py: ``@unique`` enqueues a task once while an equal one counts.

Duplicates return the existing result and write nothing; the primary key of
``queue_task_unique`` decides between concurrent transactions (threads with their own
connections, and processes); stale claims are taken over by compare-and-set. The tasks
are in tests/support/taskapp/unique_tasks.py.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections, transaction

from django_sqlqueue import ConfigurationError
from django_sqlqueue.models import Message
from django_sqlqueue.task_models import TaskUniqueLock
from django_sqlqueue.tasks import unique
from django_sqlqueue.tasks.compat import InvalidTask, TaskResultStatus
from django_sqlqueue.tasks.uniqueness import prune_claims
from django_sqlqueue.testing.tasks import drain_tasks
from tests.support.engine_helpers import lock_waiting, not_on_sqlite, session_id
from tests.support.processes import ROOT, database_url
from tests.support.task_helpers import running_worker, wait_until
from tests.support.taskapp import unique_tasks as ut
from tests.support.taskapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _released() -> Iterator[None]:
    ut.RELEASE.clear()
    yield
    ut.RELEASE.set()


def messages() -> int:
    return Message.objects.filter(topic="tasks.default").count()


# -- duplicates ------------------------------------------------------------------------------


def test_a_duplicate_returns_the_existing_result_and_writes_nothing(signals: list[tuple[str, Any]]) -> None:
    first = ut.digest.enqueue(7, "mon")
    again = ut.digest.enqueue(user_id=7, day="tue")  # the key is user_id only, positional or not
    assert again.id == first.id
    assert again.status == TaskResultStatus.READY and again.args == [7, "mon"]
    assert ut.digest.get_result(again.id).id == first.id
    assert messages() == 1 and TaskUniqueLock.objects.count() == 1
    assert [name for name, _ in signals] == ["enqueued"]  # the duplicate sent none


def test_different_keys_make_different_tasks() -> None:
    assert ut.digest.enqueue(1).id != ut.digest.enqueue(2).id
    a, b = ut.every_argument.enqueue(1), ut.every_argument.enqueue(1, b=2)
    assert a.id != b.id
    assert ut.every_argument.enqueue(1, 1).id == a.id  # the default of b is part of the key
    assert ut.every_argument.enqueue(1, extra=3).id not in (a.id, b.id)  # **kwargs by name
    assert ut.with_context.enqueue("c", 1).id == ut.with_context.enqueue("c", n=2).id  # context left out
    assert messages() == 6


def test_a_duplicate_in_the_callers_transaction_leaves_it_usable() -> None:
    first = ut.digest.enqueue(3)
    with transaction.atomic():
        assert ut.digest.enqueue(3).id == first.id
        Run.objects.create(label="after", pid=0, started=0)  # the transaction still works
    assert Run.objects.filter(label="after").exists() and messages() == 1


def test_a_rolled_back_enqueue_leaves_neither_claim_nor_message() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        ut.digest.enqueue(4)
        raise RuntimeError("roll back")
    assert messages() == 0 and TaskUniqueLock.objects.count() == 0
    assert ut.digest.enqueue(4).id  # free again


# -- states and period -------------------------------------------------------------------------


def test_waiting_and_running_count_by_default_and_a_finished_task_does_not() -> None:
    first = ut.held.enqueue("h")
    assert ut.held.enqueue("h").id == first.id  # waiting
    with running_worker():
        wait_until(lambda: ut.held.get_result(first.id).status == TaskResultStatus.RUNNING, 20, "it to run")
        assert ut.held.enqueue("h").id == first.id  # running
        ut.RELEASE.set()
        wait_until(lambda: ut.held.get_result(first.id).is_finished, 20, "it to finish")
    ut.RELEASE.clear()
    second = ut.held.enqueue("h")  # finished does not count: the claim is taken over
    assert second.id != first.id
    assert TaskUniqueLock.objects.get().result_id == second.id


def test_states_waiting_only_lets_a_second_start_while_the_first_runs() -> None:
    first = ut.held_waiting_only.enqueue("w")
    assert ut.held_waiting_only.enqueue("w").id == first.id
    with running_worker():
        wait_until(lambda: ut.held_waiting_only.get_result(first.id).status == TaskResultStatus.RUNNING, 20, "run")
        second = ut.held_waiting_only.enqueue("w")
        assert second.id != first.id
        ut.RELEASE.set()


def test_finished_counts_within_the_period() -> None:
    first = ut.once_a_minute.enqueue("m")
    drain_tasks()
    assert ut.once_a_minute.get_result(first.id).status == TaskResultStatus.SUCCESSFUL
    again = ut.once_a_minute.enqueue("m")
    assert again.id == first.id and again.return_value == "m"
    # The period ends the claim whatever the state: age it as if a minute had passed.
    TaskUniqueLock.objects.update(expires_at=TaskUniqueLock.objects.get().created_at)
    assert ut.once_a_minute.enqueue("m").id != first.id


def test_a_claim_lapses_after_its_period_even_while_waiting() -> None:
    first = ut.short_period.enqueue("p")
    assert ut.short_period.enqueue("p").id == first.id
    time.sleep(0.6)
    second = ut.short_period.enqueue("p")
    assert second.id != first.id and messages() == 2


def test_a_claim_whose_task_is_gone_is_taken_over() -> None:
    TaskUniqueLock.objects.create(
        lock_key=_key_of(ut.digest, 5), result_id="gone", task_path="x.y", created_at=dt.datetime.now(dt.UTC)
    )
    result = ut.digest.enqueue(5)
    assert TaskUniqueLock.objects.get().result_id == result.id != "gone"


def _key_of(task: Any, *args: Any, **kwargs: Any) -> str:
    from django_sqlqueue.tasks.uniqueness import lock_key, unique_of

    spec = unique_of(task)
    assert spec is not None
    return lock_key("default", task, spec, list(args), kwargs)


# -- concurrency -------------------------------------------------------------------------------


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``fn`` on a thread with its own connection; its outcome (value or error) lands in the list."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            out.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_concurrent_enqueues_from_many_threads_make_one_task() -> None:
    barrier = threading.Barrier(8)

    def enqueue() -> list[str]:
        barrier.wait(10)
        return [ut.bench_unique.enqueue("race").id for _ in range(5)]

    started = [in_thread(enqueue) for _ in range(8)]
    for thread, _ in started:
        thread.join(60)
    ids = {i for _, out in started for i in out[0]}
    assert len(ids) == 1 and messages() == 1


def test_a_stale_claim_is_taken_over_once_by_concurrent_enqueues() -> None:
    """Compare-and-set: a transaction takes the claim over and holds it; another enqueue
    waits on the row, finds it changed and returns the winner's task."""
    TaskUniqueLock.objects.create(
        lock_key=_key_of(ut.digest, 6), result_id="gone", task_path="x.y", created_at=dt.datetime.now(dt.UTC)
    )
    taken, release = threading.Event(), threading.Event()

    def take_over_and_hold() -> str:
        with transaction.atomic():
            result = ut.digest.enqueue(6)
            taken.set()
            release.wait(20)
        return result.id

    holder, held = in_thread(take_over_and_hold)
    assert taken.wait(20)
    waiter, waited = in_thread(lambda: ut.digest.enqueue(6).id)
    time.sleep(0.5)
    assert not waited  # waits for the holder's transaction (same key)
    release.set()
    holder.join(20), waiter.join(20)
    assert held == waited and messages() == 1
    assert TaskUniqueLock.objects.get().result_id == held[0]


@not_on_sqlite("one writer at a time: every enqueue waits for the open transaction")
def test_different_keys_do_not_wait_for_an_open_claim() -> None:
    claimed, release = threading.Event(), threading.Event()

    def hold() -> None:
        with transaction.atomic():
            ut.digest.enqueue(10)
            claimed.set()
            release.wait(20)

    holder, _ = in_thread(hold)
    assert claimed.wait(20)
    try:
        other, out = in_thread(lambda: [ut.digest.enqueue(n).id for n in range(11, 31)])
        other.join(10)
        assert len(out) == 1 and len(out[0]) == 20  # done while key 10 is held
    finally:
        release.set()
        holder.join(20)


@not_on_sqlite("one writer at a time: no two transactions wait on one key")
def test_the_holder_rolls_back_while_two_wait() -> None:
    """The InnoDB trap: T1 holds an uncommitted claim, T2 and T3 (each in its own
    transaction) wait on the key, T1 rolls back. One of them claims the key, the other
    returns its task: no deadlock victim, and while the winner's transaction is still
    open another key's enqueue does not wait (no gap lock inherited from T1's row)."""
    claimed, release, finish = threading.Event(), threading.Event(), threading.Event()
    sessions: list[int] = []
    decided: list[str] = []

    def hold_then_roll_back() -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            ut.bench_unique.enqueue("trap")
            claimed.set()
            release.wait(20)
            raise RuntimeError("roll back")

    def wait_in_transaction() -> str:
        sessions.append(session_id())
        with transaction.atomic():
            result = ut.bench_unique.enqueue("trap")
            decided.append(result.id)
            finish.wait(20)  # the winner's claim stays uncommitted meanwhile
        return result.id

    holder, _ = in_thread(hold_then_roll_back)
    assert claimed.wait(20)
    waiters = [in_thread(wait_in_transaction) for _ in range(2)]
    try:
        wait_until(lambda: len(sessions) == 2 and all(lock_waiting(s) for s in sessions), 20, "both to wait")
        release.set()
        holder.join(30)
        wait_until(lambda: decided, 20, "a waiter to claim the key")
        other, out = in_thread(lambda: [ut.bench_unique.enqueue(f"other{n}").id for n in range(20)])
        other.join(10)
        assert len(out) == 1 and len(out[0]) == 20  # while the winner's transaction is open
    finally:
        finish.set()
        for thread, _ in waiters:
            thread.join(30)
    outcomes = [out[0] for _, out in waiters]
    assert all(isinstance(o, str) for o in outcomes), outcomes
    assert len(set(outcomes)) == 1 and messages() == 21
    assert TaskUniqueLock.objects.get(result_id=outcomes[0])


@not_on_sqlite("one writer at a time: no two transactions wait on one key")
def test_outside_a_transaction_the_trap_is_retried() -> None:
    claimed, release = threading.Event(), threading.Event()
    sessions: list[int] = []

    def hold_then_roll_back() -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            ut.bench_unique.enqueue("trap2")
            claimed.set()
            release.wait(20)
            raise RuntimeError("roll back")

    def enqueue() -> str:
        sessions.append(session_id())
        return ut.bench_unique.enqueue("trap2").id

    holder, _ = in_thread(hold_then_roll_back)
    assert claimed.wait(20)
    waiters = [in_thread(enqueue) for _ in range(3)]
    wait_until(lambda: len(sessions) == 3 and all(lock_waiting(s) for s in sessions), 20, "all to wait")
    release.set()
    holder.join(30)
    for thread, _ in waiters:
        thread.join(30)
    outcomes = [out[0] for _, out in waiters]
    assert all(isinstance(o, str) for o in outcomes), outcomes
    assert len(set(outcomes)) == 1 and messages() == 1


@pytest.mark.slow
def test_two_processes_of_50_concurrent_enqueues_make_one_task_and_one_run(
    runconsumer: Callable[..., Any],
) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.taskapp.process_settings",
        "DATABASE_URL": database_url(),
    }
    command = [sys.executable, "-m", "bench.unique", "enqueue", "--threads", "10", "--each", "5", "--label", "procs"]
    procs = [subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    ids = set()
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
        ids |= set(out.split()[-1].split(","))
    assert len(ids) == 1 and messages() == 1
    (only,) = ids
    worker = runconsumer("uniq-w1", settings="tests.support.taskapp.process_settings")
    wait_until(lambda: ut.bench_unique.get_result(only).is_finished, 30, "the run")
    worker.terminate()
    assert Run.objects.filter(label="procs").count() == 1


# -- bad arguments, cleaning -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keys": "user_id"}, "not the string 'user_id'"),
        ({"keys": ()}, "at least one"),
        ({"keys": ("a", "a")}, "distinct argument names"),
        ({"keys": ("1x",)}, "distinct argument names"),
        ({"period": 0}, "positive number of seconds"),
        ({"period": float("inf")}, "positive number of seconds"),
        ({"period": True}, "positive number of seconds"),
        ({"states": ("done",)}, "one or more of waiting, running, finished"),
        ({"states": ()}, "one or more of"),
        ({"states": "waiting"}, "not the string"),
        ({"states": ("finished",)}, "'finished' needs a period"),
    ],
)
def test_bad_arguments_are_refused_at_decoration(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        unique(**kwargs)


def test_a_key_that_is_not_an_argument_is_refused() -> None:
    def fn(user_id: int) -> None: ...

    with pytest.raises(ConfigurationError, match=r"usr is not an argument of .*fn \(its arguments: user_id\)"):
        unique(keys=("usr",))(fn)
    unique(keys=("usr",))(lambda **kw: None)  # any name may come through **kwargs


def test_arguments_that_do_not_fit_the_signature_are_refused_and_nothing_written() -> None:
    with pytest.raises(InvalidTask, match="do not fit its signature"):
        ut.digest.enqueue(1, "mon", "extra")
    with pytest.raises(InvalidTask, match="missing a required argument: 'user_id'"):
        ut.digest.enqueue()
    assert messages() == 0 and TaskUniqueLock.objects.count() == 0


def test_prune_deletes_only_claims_that_no_longer_count() -> None:
    expired = ut.short_period.enqueue("x")
    done = ut.digest.enqueue(20)
    waiting = ut.digest.enqueue(21)
    TaskUniqueLock.objects.filter(result_id=expired.id).update(expires_at=dt.datetime.now(dt.UTC))
    ut.RELEASE.set()
    with running_worker():
        wait_until(lambda: ut.digest.get_result(done.id).is_finished, 20, "it to finish")
        wait_until(lambda: ut.digest.get_result(waiting.id).is_finished, 20, "it to finish")
    ut.digest.enqueue(22)  # waiting: stays
    assert prune_claims(dry_run=True) == 3
    assert prune_claims() == 3
    assert list(TaskUniqueLock.objects.values_list("lock_key", flat=True)) == [_key_of(ut.digest, 22)]
