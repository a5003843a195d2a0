"""The scheduler thread (``worker/threads/scheduler.py``): firing due ticks of recurring
schedules, catch-up of missed ticks, exactly once under contention, and running as a
supervised side thread.

The database clock is real: ticks are made "missed" by moving a schedule's bookkeeping
row (its last tick) into the past, not by faking time. The specs themselves (parsing,
validation, time zones) are tested in tests/test_schedules.py.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator

import pytest
from django.db import connections

from django_sqlqueue.conf import get_settings
from django_sqlqueue.db.store import QueueStore
from django_sqlqueue.models import Message
from django_sqlqueue.schedules import parse_schedule
from django_sqlqueue.task_models import ScheduleState, TaskResultRecord
from django_sqlqueue.worker.threads.scheduler import Scheduler

from ...support.engine_helpers import wait_until
from ...support.task_helpers import task_settings

pytestmark = pytest.mark.django_db(transaction=True)

EVERY_SECOND = {"cron": "* * * * * *", "topic": "tsk.sched", "payload": {"p": 1}}


@pytest.fixture(autouse=True)
def _tasks_configured() -> Iterator[None]:
    with task_settings():
        yield


def scheduler(*specs: tuple[str, dict], interval: float = 1.0) -> Scheduler:
    return Scheduler([parse_schedule(n, s) for n, s in specs], using=get_settings().DATABASE, interval=interval)


def test_a_new_schedule_fires_only_ticks_after_it_was_first_seen() -> None:
    s = scheduler(("fresh", EVERY_SECOND))
    assert s.run_once() == {"fresh": 0}
    state = ScheduleState.objects.get(name="fresh")
    assert state.last_tick is None
    s._next.clear()
    now = QueueStore(get_settings().DATABASE).now()
    ScheduleState.objects.filter(name="fresh").update(created_at=now - dt.timedelta(seconds=3, milliseconds=500))
    fired = s.run_once()["fresh"]
    assert fired in (3, 4)  # the ticks of the last 3.5 s
    assert Message.objects.filter(topic="tsk.sched").count() == fired


def test_missed_ticks_within_the_window_fire_once_older_ones_are_skipped(caplog: pytest.LogCaptureFixture) -> None:
    s = scheduler(("late", {**EVERY_SECOND, "catch_up": 5}))
    s.run_once()
    now = QueueStore(get_settings().DATABASE).now().replace(microsecond=0)
    ScheduleState.objects.filter(name="late").update(last_tick=now - dt.timedelta(seconds=60))
    s._next.clear()
    fired = s.run_once()["late"]
    assert 5 <= fired <= 6  # the last catch_up seconds only
    assert "skipped" in caplog.text and "missed tick" in caplog.text
    ids = sorted(Message.objects.filter(topic="tsk.sched").values_list("id", flat=True))
    assert len(ids) == len(set(ids)) == fired
    s._next.clear()
    assert s.run_once()["late"] in (0, 1)  # nothing twice; at most the tick of the new second


def test_concurrent_schedulers_fire_each_tick_once() -> None:
    """Eight schedulers (own connections) race over the same 20 missed ticks."""
    now = QueueStore(get_settings().DATABASE).now().replace(microsecond=0)
    ScheduleState.objects.create(name="race", last_tick=now - dt.timedelta(seconds=20), created_at=now, updated_at=now)
    counts: list[int] = []
    barrier = threading.Barrier(8)

    def run() -> None:
        try:
            s = scheduler(("race", {**EVERY_SECOND, "catch_up": 60}))
            barrier.wait()
            counts.append(s.run_once()["race"])
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    ids = list(Message.objects.filter(topic="tsk.sched").values_list("id", flat=True))
    assert len(ids) == len(set(ids)) == sum(counts)
    assert sum(counts) >= 20
    assert sorted(counts)[-2] <= 1  # one scheduler fired the backlog; the others at most a new tick


def test_task_schedule_enqueues_with_the_tick_id() -> None:
    s = scheduler(("tick-task", {"cron": "* * * * * *", "task": "tests.support.taskapp.tasks.tick", "args": ["t"]}))
    s.run_once()
    now = QueueStore(get_settings().DATABASE).now().replace(microsecond=0)
    ScheduleState.objects.filter(name="tick-task").update(last_tick=now - dt.timedelta(seconds=2))
    s._next.clear()
    s.run_once()
    ids = list(Message.objects.filter(topic="tasks.default").values_list("id", flat=True))
    assert ids and all(i.startswith("schedule:tick-task:") for i in ids)
    assert not TaskResultRecord.objects.exists()  # enqueued, not run yet


def test_the_thread_fires_due_ticks_on_its_own_and_stops_when_asked() -> None:
    s = scheduler(("threaded", EVERY_SECOND), interval=0.05)
    s.start()
    try:
        # A new schedule fires the ticks after it was first seen: the next second's, within ~1 s.
        wait_until(lambda: Message.objects.filter(topic="tsk.sched").exists(), timeout=5, what="a tick fired")
    finally:
        s.stop()
    assert not s.is_alive() and not s.died and s.error is None
    ids = list(Message.objects.filter(topic="tsk.sched").values_list("id", flat=True))
    assert ids and all(i.startswith("schedule:threaded:") for i in ids)
    assert ScheduleState.objects.get(name="threaded").last_tick is not None
