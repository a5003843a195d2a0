"""tasks/backend.py (SQLQueueBackend): enqueue joins the caller's transaction, queues are topics,
run_after defers, and what the backend refuses (tasks, arguments, OPTIONS, queue names).

Real database, real Worker threads (the same code runconsumer runs); the process-level
claims (kill -9, several workers) are in tests/processes/test_tasks.py. The backend is
configured by tests/tasks/conftest.py.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from django_sqlqueue.exceptions import ConfigurationError
from django_sqlqueue.models import Message
from django_sqlqueue.tasks.compat import InvalidTask, TaskResultDoesNotExist, TaskResultStatus
from tests.support.task_helpers import finished, running_worker
from tests.support.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_enqueue_in_a_rolled_back_transaction_leaves_nothing(signals: list[Any]) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        assert Message.objects.filter(topic="tasks.default", id=result.id).exists()  # visible inside
        raise Boom
    assert not Message.objects.filter(topic="tasks.default").exists()
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(result.id)
    assert signals == []  # task_enqueued fires on commit only


def test_enqueue_commits_with_the_callers_transaction(signals: list[Any]) -> None:
    with transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        assert signals == []
    assert [name for name, _ in signals] == ["enqueued"]
    assert signals[0][1].id == result.id
    message = Message.objects.get(topic="tasks.default", id=result.id)
    assert message.payload == {
        "task": "tests.support.taskapp.tasks.add",
        "args": [1, 2],
        "kwargs": {},
        "backend": "default",
        "queue_name": "default",
    }
    fresh = tasks.add.get_result(result.id)
    assert fresh.status == TaskResultStatus.READY
    assert (fresh.args, fresh.kwargs, fresh.attempts, fresh.errors) == ([1, 2], {}, 0, [])
    with pytest.raises(ValueError, match="not finished"):
        _ = fresh.return_value


def test_queue_names_map_to_topics() -> None:
    result = tasks.add.using(queue_name="other").enqueue(3, 4)
    assert Message.objects.filter(topic="tasks.other", id=result.id).exists()
    assert tasks.add.get_backend().topics() == {"default": "tasks.default", "other": "tasks.other"}


def test_run_after_defers_the_task() -> None:
    later = timezone.now() + dt.timedelta(seconds=2)
    result = tasks.add.using(run_after=later).enqueue(5, 6)
    message = Message.objects.get(topic="tasks.default", id=result.id)
    assert abs((message.deliver_at - later).total_seconds()) < 0.01
    with running_worker():
        done = finished(result)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.started_at >= later - dt.timedelta(milliseconds=50)


def test_priorities_are_refused() -> None:
    with pytest.raises(InvalidTask, match="priority"):
        tasks.add.using(priority=10)


def test_unknown_queue_is_refused() -> None:
    with pytest.raises(InvalidTask, match="nope"):
        tasks.add.using(queue_name="nope")


def test_naive_run_after_is_refused() -> None:
    with pytest.raises(InvalidTask, match="aware"):
        tasks.add.using(run_after=dt.datetime(2030, 1, 1))


def test_non_json_arguments_are_refused_and_nothing_is_stored() -> None:
    with pytest.raises(TypeError):
        tasks.add.enqueue(object(), 1)
    assert not Message.objects.filter(topic="tasks.default").exists()


def test_non_module_level_function_is_refused() -> None:
    try:
        from django.tasks import task
    except ImportError:
        from django_tasks import task  # type: ignore[no-redef]

    def local() -> None:
        pass

    with pytest.raises(InvalidTask, match="module level"):
        task()(local)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"BOGUS": 1}, "unknown key 'BOGUS'"),
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS"),
        ({"TOPIC_PREFIX": "bad prefix "}, "TOPIC_PREFIX"),
        ({"STRICT": True, "BATCH_SIZE": 5}, "STRICT"),
        ({"MARK_RUNNING_AFTER": -1}, "MARK_RUNNING_AFTER"),
        ({"MARK_RUNNING_AFTER": "0.1"}, "MARK_RUNNING_AFTER"),
        ({"MARK_RUNNING_AFTER": float("inf")}, "MARK_RUNNING_AFTER"),
    ],
)
def test_bad_options_are_check_errors_and_refuse_use(options: dict[str, Any], match: str) -> None:
    """Built all the same (Django builds it as a @task is declared: an import); check()
    reports the problem, and using the backend raises it in one line."""
    assert_misconfigured({"QUEUES": ["default"], "OPTIONS": options}, match)


def assert_misconfigured(params: dict[str, Any], match: str) -> None:
    from django_sqlqueue.tasks.backend import SQLQueueBackend
    from django_sqlqueue.tasks.options import TaskBackendMisconfigured

    backend = SQLQueueBackend("default", params)
    errors = backend.check()
    assert len(errors) == 1 and errors[0].id.startswith("sqlqueue.tasks.E00"), errors
    assert re.search(match, errors[0].msg)
    for use in (backend.topics, lambda: backend.topic_for("default"), lambda: backend.get_result("x")):
        with pytest.raises(TaskBackendMisconfigured, match=match) as raised:
            use()
        assert "\n" not in str(raised.value)
    with pytest.raises(ConfigurationError, match=match):
        backend.enqueue(tasks.add, [1, 2], {})
    assert not Message.objects.exists()


def test_bad_queue_name_is_a_check_error() -> None:
    assert_misconfigured({"QUEUES": ["has space"], "OPTIONS": {}}, "characters outside")


def test_a_queue_whose_topic_is_a_dead_letter_topic_is_refused() -> None:
    """Issue 28: publish() refuses dead-letter topics, so a queue cannot be one."""
    assert_misconfigured({"QUEUES": ["emails_dlq"], "OPTIONS": {}}, "dead-letter topic")


def test_a_misconfigured_backend_still_lets_tasks_be_declared() -> None:
    """Issue 29: @task validates the task with its backend as the module is imported; a
    typo in OPTIONS used to raise there, a long import traceback instead of a check error."""
    from django_sqlqueue.tasks.backend import SQLQueueBackend

    backend = SQLQueueBackend("default", {"QUEUES": ["default"], "OPTIONS": {"MAX_ATEMPTS": 3}})
    backend.validate_task(tasks.add)  # no error: check() reports it
    assert [e.id for e in backend.check()] == ["sqlqueue.tasks.E001"]
