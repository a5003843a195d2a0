"""ops/task_extras.py: batches (newest first, keyset pages, progress) and recurring schedules
(last run from ``queue_schedules``, next run as the scheduler thread computes it). Real database."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import override_settings
from django.utils import timezone

from django_sqlqueue import schedules
from django_sqlqueue.ops.base import NotFound, OperationError
from django_sqlqueue.ops.task_extras import get_batch, list_batches, list_schedules, next_tick, progress
from django_sqlqueue.schedules import parse_schedule
from django_sqlqueue.task_models import ScheduleState, TaskBatch

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)


def batch(bid: str, minute: int, **kw) -> TaskBatch:
    fields = {"backend": "default", "on_finish": "shop.tasks.report", "created_at": T0 + dt.timedelta(minutes=minute)}
    return TaskBatch.objects.create(id=bid, **{**fields, **kw})


def test_batches_newest_first_with_their_progress():
    batch("b1", 1, total=4, succeeded=3, failed=1, finished_at=T0 + dt.timedelta(minutes=5), callback_id="cb1")
    batch("b2", 2, total=10, succeeded=2, failed=1)
    batch("b3", 2, total=0)  # same time as b2: the id breaks the tie
    batch("b4", 3, total=3, succeeded=1)
    first = list_batches(limit=2)
    assert [b.id for b in first.items] == ["b4", "b3"] and first.next_cursor
    second = list_batches(cursor=first.next_cursor, limit=2)
    assert [b.id for b in second.items] == ["b2", "b1"] and second.next_cursor is None
    assert [b.id for b in list_batches(unfinished=True).items] == ["b4", "b3", "b2"]
    assert [progress(get_batch(b)) for b in ("b1", "b2", "b3", "b4")] == [100, 30, 0, 33]
    with pytest.raises(NotFound):
        get_batch("nope")
    with pytest.raises(OperationError, match="cursor"):
        list_batches(cursor="yesterday")


def test_next_tick_follows_the_scheduler():
    s = parse_schedule("every-5", {"cron": "*/5 * * * *", "task": "shop.tasks.ping"})
    now = T0 + dt.timedelta(minutes=7)
    # Never run by a worker: the first tick after now.
    assert next_tick(s, None, now) == T0 + dt.timedelta(minutes=10)
    state = ScheduleState(name="every-5", last_tick=T0 + dt.timedelta(minutes=5), created_at=T0, updated_at=T0)
    assert next_tick(s, state, now) == T0 + dt.timedelta(minutes=10)
    # Workers were down: the missed tick at :05 is due (within catch_up, 300 s)...
    state.last_tick = T0
    assert next_tick(s, state, now) == T0 + dt.timedelta(minutes=5)
    # ... but not one older than catch_up (:05 at :11): skipped, as the scheduler thread skips it.
    assert next_tick(s, state, T0 + dt.timedelta(minutes=11)) == T0 + dt.timedelta(minutes=10)
    assert next_tick(s, state, T0 + dt.timedelta(minutes=15, seconds=1)) == T0 + dt.timedelta(minutes=15)


def test_schedules_with_last_and_next_run():
    now = timezone.now()
    ScheduleState.objects.create(name="nightly", last_tick=now - dt.timedelta(hours=1), created_at=now, updated_at=now)
    ScheduleState.objects.create(name="removed", last_tick=None, created_at=now, updated_at=now)
    schedules = {
        "nightly": {"cron": "0 3 * * *", "task": "shop.tasks.nightly"},
        "ping": {"cron": "*/5 * * * *", "topic": "monitoring.ping", "payload": {}},
    }
    with override_settings(SQLQUEUE={"SCHEDULES": schedules}):
        db_now, rows = list_schedules()
    by_name = {r.name: r for r in rows}
    assert [r.name for r in rows] == ["nightly", "ping", "removed"]
    nightly, ping, removed = by_name["nightly"], by_name["ping"], by_name["removed"]
    assert nightly.last_run == now - dt.timedelta(hours=1)
    assert (
        nightly.next_run is not None
        and nightly.next_run.hour == 3
        and nightly.next_run > db_now - dt.timedelta(minutes=5)
    )
    assert nightly.what == "task shop.tasks.nightly" and ping.what == "message to monitoring.ping"
    assert ping.last_run is None and ping.registered_at is None and ping.next_run is not None
    assert ping.next_run.minute % 5 == 0 and db_now < ping.next_run <= db_now + dt.timedelta(minutes=5)
    assert removed.schedule is None and removed.next_run is None


def test_a_schedule_declared_twice_is_an_operation_error():
    """Declared in code (as @recurring does) and in SQLQUEUE["SCHEDULES"]: the page says so, it does not crash."""
    schedules.schedule_message("twice", "*/5 * * * *", topic="monitoring.ping", payload={})
    try:
        spec = {"cron": "0 3 * * *", "topic": "monitoring.ping", "payload": {}}
        with override_settings(SQLQUEUE={"SCHEDULES": {"twice": spec}}):
            with pytest.raises(OperationError, match=r"schedules cannot be read.*twice"):
                list_schedules()
    finally:
        schedules.unregister("twice")
