"""tasks/attempts.py: ``task_max_attempts`` gives a task fewer attempts than its backend's.

Run by the engine's own paths: ``drain_tasks`` (the worker's batch runner, retry delays
collapsed) and a real Worker thread (the watchdog's timeout). The backend allows 3
attempts (tests/support/taskapp/settings_common.py); the tasks are in attempts_tasks.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from django_sqlqueue import ConfigurationError, Reject
from django_sqlqueue.models import Message
from django_sqlqueue.tasks import TaskAttemptsExhausted, task_max_attempts
from django_sqlqueue.tasks.attempts import ATTRIBUTE, attempts_for, max_attempts_of
from django_sqlqueue.tasks.compat import InvalidTask, TaskResultStatus, task_backends
from django_sqlqueue.testing.tasks import drain_tasks
from tests.support.task_helpers import running_worker, wait_until
from tests.support.taskapp import tasks
from tests.support.taskapp.models import Run
from tests.support.taskapp.settings_common import TASKS
from tests.tasks import attempts_tasks

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task  # type: ignore[no-redef]

pytestmark = pytest.mark.django_db(transaction=True)

EXHAUSTED = "django_sqlqueue.tasks.attempts.TaskAttemptsExhausted"


@pytest.fixture(autouse=True)
def _released() -> Iterator[None]:
    attempts_tasks.RELEASE.clear()
    yield
    attempts_tasks.RELEASE.set()


def _forget_backends() -> None:
    from asgiref.local import Local

    task_backends.__dict__.pop("settings", None)
    task_backends._connections = Local(task_backends.thread_critical)


@pytest.fixture
def atomic_queue() -> Iterator[None]:
    default = TASKS["default"]
    with override_settings(TASKS={"default": {**default, "OPTIONS": {**default["OPTIONS"], "ATOMIC": True}}}):
        _forget_backends()
        yield
    _forget_backends()


def dead_letters() -> list[Message]:
    return list(Message.objects.filter(topic="tasks.default_dlq"))


@pytest.mark.parametrize("atomic", [False, True], ids=["plain", "atomic"])
def test_a_task_with_two_attempts_is_dead_lettered_after_exactly_two(atomic: bool, request: Any) -> None:
    if atomic:
        request.getfixturevalue("atomic_queue")
    own = attempts_tasks.fails_within_two.enqueue("own")
    default = tasks.always_fails.enqueue("default")  # the backend's 3 attempts
    summary = drain_tasks()
    if not atomic:  # an atomic queue rolls a failed task's effects (its Run row) back
        assert (Run.objects.filter(label="own").count(), Run.objects.filter(label="default").count()) == (2, 3)
    assert summary.dead_lettered == 2
    failed = attempts_tasks.fails_within_two.get_result(own.id)
    assert failed.status == TaskResultStatus.FAILED
    # The result has the task's own errors; the dead letter says why it ended early.
    assert [e.exception_class_path for e in failed.errors] == ["builtins.RuntimeError"] * 2
    assert failed.attempts == 2
    letter = next(m for m in dead_letters() if m.metadata.get("task", "").endswith("fails_within_two"))
    error = letter.last_error
    assert "TaskAttemptsExhausted" in error and "used its 2 attempt(s)" in error and "own: always fails" in error
    assert tasks.always_fails.get_result(default.id).attempts == 3


def test_the_mark_works_on_top_of_task_too() -> None:
    result = attempts_tasks.fails_once_marked_on_top.enqueue("top")
    assert drain_tasks().dead_lettered == 1
    assert Run.objects.filter(label="top").count() == 1
    assert attempts_tasks.fails_once_marked_on_top.get_result(result.id).status == TaskResultStatus.FAILED


def test_a_last_attempt_that_timed_out_is_dead_lettered_without_running_again() -> None:
    """The watchdog fails the attempt as the consumer sees it (3 attempts): the message is
    delivered again, and the handler ends it there, unrun."""
    result = attempts_tasks.hangs_once.enqueue("hung")
    with running_worker(concurrency=2):
        done = wait_until(
            lambda: (r := attempts_tasks.hangs_once.get_result(result.id)).is_finished and r, 20, "the task to fail"
        )
        wait_until(dead_letters, 10, "the dead letter")
    assert done.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in done.errors] == ["django_sqlqueue.exceptions.HandlerTimeout", EXHAUSTED]
    assert "its last attempt did not finish" in done.errors[1].traceback
    assert Run.objects.filter(label="hung").count() == 1
    assert len(dead_letters()) == 1


def test_a_task_cannot_ask_for_more_attempts_than_its_backend() -> None:
    with pytest.raises(InvalidTask, match=r"task_max_attempts\(5\), more than the 3 attempts of backend 'default'"):
        task()(task_max_attempts(5)(attempts_tasks.greedy))
    delattr(attempts_tasks.greedy, ATTRIBUTE)
    on_top = task_max_attempts(4)(task()(attempts_tasks.greedy))
    try:
        with pytest.raises(InvalidTask, match="more than the 3 attempts"):
            on_top.enqueue("greedy")
    finally:
        delattr(attempts_tasks.greedy, ATTRIBUTE)
    assert not Message.objects.exists()


@pytest.mark.parametrize("bad", [0, -1, 1001, 2.0, "3", True, None])
def test_task_max_attempts_refuses_what_is_not_a_count(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"task_max_attempts\(\) takes a whole number of attempts from 1"):
        task_max_attempts(bad)


def test_the_attempts_of_a_task_are_its_own_if_fewer() -> None:
    assert max_attempts_of(attempts_tasks.fails_within_two) == 2
    assert max_attempts_of(tasks.add) is None
    assert (attempts_for(attempts_tasks.fails_within_two, 3), attempts_for(tasks.add, 3)) == (2, 3)
    assert attempts_for(attempts_tasks.fails_within_two, 1) == 1
    assert issubclass(TaskAttemptsExhausted, Reject)
