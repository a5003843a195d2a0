"""tasks/priorities.py: a queue's priority levels, each a topic, polled highest first.

Real database and real Worker threads (the code runconsumer runs); a runconsumer process
with a backlog is in tests/processes/test_task_priorities.py.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
from django.test import override_settings

from django_sqlqueue.exceptions import ConfigurationError
from django_sqlqueue.models import Message
from django_sqlqueue.tasks.compat import InvalidTask, TaskResultStatus
from django_sqlqueue.tasks.priorities import level_topic, parse_priorities, split_level
from tests.support.task_helpers import finished, running_worker, wait_until
from tests.support.taskapp import tasks
from tests.support.taskapp.models import Run
from tests.support.taskapp.settings_common import TASKS

pytestmark = pytest.mark.django_db(transaction=True)

LEVELS = [-10, 0, 50]


@pytest.fixture
def levels() -> Iterator[None]:
    """The test backend with priority levels -10, 0 and 50."""
    configured = copy.deepcopy(TASKS)
    configured["default"]["OPTIONS"]["PRIORITIES"] = LEVELS
    with override_settings(TASKS=configured):
        yield


def test_levels_are_parsed_highest_first_and_always_include_the_default() -> None:
    assert parse_priorities("P", None) == (0,)
    assert parse_priorities("P", [5, -3, 5]) == (5, 0, -3)
    for bad in (["1"], [101], [-101], [True], "10", 3):
        with pytest.raises(ConfigurationError, match="P"):
            parse_priorities("P", bad)


def test_a_level_has_its_own_topic_and_the_default_keeps_the_queue_topic() -> None:
    assert level_topic("tasks.default", 0) == "tasks.default"
    assert level_topic("tasks.default", 50) == "tasks.default.p50"
    assert level_topic("tasks.default", -10) == "tasks.default.p-10"
    assert split_level("tasks.default.p-10") == ("tasks.default", -10)
    assert split_level("tasks.default") == ("tasks.default", 0)


def test_the_backend_supports_priorities_but_refuses_one_without_a_level(levels: None) -> None:
    backend = tasks.add.get_backend()
    assert backend.supports_priority
    with pytest.raises(InvalidTask, match=r"priority 7 is not one of backend 'default'.*PRIORITIES"):
        tasks.add.using(priority=7)
    assert not Message.objects.exists()


def test_without_levels_any_other_priority_is_refused_naming_the_option() -> None:
    with pytest.raises(InvalidTask, match=r"priority 10 .*levels \(0\).*OPTIONS'\]\['PRIORITIES'\]"):
        tasks.add.using(priority=10)


def test_a_task_goes_to_its_level_topic_and_its_result_says_its_priority(levels: None) -> None:
    high = tasks.add.using(priority=50).enqueue(1, 2)
    low = tasks.add.using(priority=-10).enqueue(3, 4)
    plain = tasks.add.enqueue(5, 6)
    topics = dict(Message.objects.values_list("id", "topic"))
    assert topics == {high.id: "tasks.default.p50", low.id: "tasks.default.p-10", plain.id: "tasks.default"}
    backend = tasks.add.get_backend()
    assert backend.get_result(high.id).task.priority == 50  # from the message, before a worker ran it
    with running_worker():
        done = finished(high)
        assert finished(low).return_value == 7
    assert done.status == TaskResultStatus.SUCCESSFUL and done.task.priority == 50
    assert backend.get_result(low.id).task.priority == -10


def test_a_queue_with_a_topic_that_is_another_queues_level_is_a_configuration_error() -> None:
    configured = copy.deepcopy(TASKS)
    configured["default"]["QUEUES"] = ["default", "default.p5"]
    configured["default"]["OPTIONS"]["PRIORITIES"] = [5]
    with override_settings(TASKS=configured):
        backend = tasks.add.get_backend()
        assert any(
            "queues 'default' and 'default.p5' would share topic 'tasks.default.p5'" in p.msg for p in backend.problems
        )


def test_a_backlog_of_low_priority_tasks_lets_higher_ones_start_first(levels: None) -> None:
    # A backlog before the worker starts: every higher level runs before any lower one.
    low = [tasks.keyed.using(priority=-10).enqueue("low", "", i) for i in range(30)]
    plain = [tasks.keyed.enqueue("plain", "", i) for i in range(5)]
    high = [tasks.keyed.using(priority=50).enqueue("high", "", i) for i in range(5)]
    with running_worker(concurrency=1):
        for r in low + plain + high:
            finished(r)
    order = list(Run.objects.order_by("started", "id").values_list("label", flat=True))
    assert order == ["high"] * 5 + ["plain"] * 5 + ["low"] * 30


def test_a_higher_priority_enqueued_behind_a_running_backlog_starts_within_one_poll(levels: None) -> None:
    # One handler thread, batch size 10, 8 partitions: once the high tasks are committed, the
    # next round takes them first; what started meanwhile is at most the poll in progress
    # (one batch per partition with work: 80 tasks) -- under issue 30's aim of 100.
    backlog = [tasks.sleepy.using(priority=-10).enqueue(f"low-{i}", 0.01) for i in range(200)]
    with running_worker(concurrency=1):
        wait_until(
            lambda: Run.objects.filter(label__startswith="low-", label__endswith=":start").count() >= 20,
            30,
            "the backlog to start",
        )
        before = Run.objects.filter(label__startswith="low-", label__endswith=":start").count()
        high = [tasks.keyed.using(priority=50).enqueue("high", "", i) for i in range(5)]
        for r in high:
            finished(r)
        started_high = max(Run.objects.filter(label="high").values_list("started", flat=True))
        lows_between = (
            Run.objects.filter(label__startswith="low-", label__endswith=":start", started__lt=started_high).count()
            - before
        )
        for r in backlog:
            finished(r, timeout=60)
    assert lows_between < 100, lows_between
