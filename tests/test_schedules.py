"""Recurring schedules (``schedules.py``): parsing and validating specs, declaring them in code,
their ticks in a time zone.

Firing them -- catch-up of missed ticks, exactly once under contention -- is the scheduler
thread's: tests/worker/threads/test_scheduler.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest

from django_sqlqueue.conf import get_settings
from django_sqlqueue.exceptions import ConfigurationError
from django_sqlqueue.schedules import all_schedules, parse_schedule, recurring, schedule_message, unregister
from tests.support.task_helpers import task_settings

EVERY_SECOND = {"cron": "* * * * * *", "topic": "tsk.sched", "payload": {"p": 1}}


@pytest.fixture(autouse=True)
def _tasks_configured() -> Iterator[None]:
    with task_settings():
        yield


@pytest.mark.parametrize(
    "spec, match",
    [
        ({"cron": "not cron", "topic": "t"}, "cron expression"),
        ({"cron": "* * * * *"}, "exactly one of"),
        ({"cron": "* * * * *", "topic": "t", "task": "a.b"}, "exactly one of"),
        ({"cron": "* * * * *", "topic": "t", "args": [1]}, "payload"),
        ({"cron": "* * * * *", "task": "a.b", "payload": 1}, "args"),
        ({"cron": "* * * * *", "topic": "t", "timezone": "Mars/Base"}, "time zone"),
        ({"cron": "* * * * *", "topic": "t", "catch_up": 0}, "catch_up"),
        ({"cron": "* * * * *", "topic": "t", "every": 5}, "unknown key"),
        ({"cron": "* * * * *", "topic": "bad topic"}, "characters outside"),
        # Only the engine writes dead letters (issue 28): every tick would fail.
        ({"cron": "* * * * *", "topic": "orders_dlq"}, "dead-letter topic"),
    ],
)
def test_bad_schedules_are_refused(spec: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        parse_schedule("s", spec)


def test_settings_schedules_are_validated_with_the_rest_of_sqlqueue() -> None:
    with (
        task_settings(SCHEDULES={"x": {"cron": "nope", "topic": "t"}}),
        pytest.raises(ConfigurationError, match="E011"),
    ):
        get_settings()


def test_code_declared_schedules() -> None:
    from tests.support.taskapp import tasks

    try:
        recurring("0 3 * * *", args=["nightly"])(tasks.tick)
        schedule_message("ping", "*/5 * * * *", topic="tsk.ping", payload={"a": 1})
        with pytest.raises(ConfigurationError, match="twice"):
            schedule_message("ping", "*/10 * * * *", topic="tsk.ping", payload={"a": 1})
        with task_settings(SCHEDULES={"ping": EVERY_SECOND}), pytest.raises(ConfigurationError, match="both"):
            all_schedules(get_settings().SCHEDULES)
        names = [s.name for s in all_schedules(get_settings().SCHEDULES)]
        assert names == ["ping", "tests.support.taskapp.tasks.tick"]
        with pytest.raises(ConfigurationError, match="Task"):
            recurring("* * * * *")(lambda: None)
    finally:
        unregister("ping")
        unregister("tests.support.taskapp.tasks.tick")


def test_timezone_schedules_follow_local_time() -> None:
    s = parse_schedule("tz", {"cron": "0 3 * * *", "topic": "t", "timezone": "Europe/Paris"})
    after = dt.datetime(2025, 7, 1, 0, 0, tzinfo=dt.UTC)
    (tick,) = s.ticks(after, after + dt.timedelta(days=1))
    assert tick == dt.datetime(2025, 7, 1, 1, 0, tzinfo=dt.UTC)  # 03:00 CEST
