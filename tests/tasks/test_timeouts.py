"""Task timeouts (django_sqlqueue/tasks/timeouts.py): per queue and per task, in-process workers.

A timed-out attempt is a failed attempt: a ``HandlerTimeout`` entry in ``errors``,
retried, then FAILED and dead-lettered; a late return is not recorded.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.test import override_settings

from django_sqlqueue import ConfigurationError
from django_sqlqueue.models import Message
from django_sqlqueue.tasks.compat import TaskResultStatus
from django_sqlqueue.tasks.discovery import task_consumer_specs
from tests.support.task_helpers import running_worker, task_settings, wait_until
from tests.support.taskapp import tasks
from tests.support.taskapp.models import Run
from tests.support.taskapp.settings_common import TASKS

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT_PATH = "django_sqlqueue.exceptions.HandlerTimeout"


@pytest.fixture(autouse=True)
def _tasks_configured() -> Iterator[None]:
    tasks.RELEASE.clear()
    with task_settings():
        yield
    tasks.RELEASE.set()  # hung tasks return; their late outcome is dropped


@contextmanager
def with_options(**options: Any) -> Iterator[None]:
    """TASKS["default"] with more OPTIONS; the cached backend objects are rebuilt."""
    default = TASKS["default"]
    with override_settings(TASKS={"default": {**default, "OPTIONS": {**default["OPTIONS"], **options}}}):
        _forget_backends()
        try:
            yield
        finally:
            _forget_backends()


def _forget_backends() -> None:
    from asgiref.local import Local

    from django_sqlqueue.tasks.compat import task_backends

    task_backends.__dict__.pop("settings", None)
    task_backends._connections = Local(task_backends.thread_critical)


def result_of(result_id: str) -> Any:
    return tasks.add.get_backend().get_result(result_id)


def test_a_task_over_its_own_timeout_fails_each_attempt_then_is_dead_lettered() -> None:
    result = tasks.hangs.enqueue("own")
    with running_worker(concurrency=3):  # 3 attempts, 3 stuck threads: not more than --concurrency
        done = wait_until(lambda: (r := result_of(result.id)).is_finished and r, 20, "the task to fail")
    assert done.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in done.errors] == [TIMEOUT_PATH] * 3
    assert "over its timeout of 0.4s without progress" in done.errors[0].traceback
    assert Run.objects.filter(label="own").count() == 3
    assert Message.objects.filter(topic="tasks.default_dlq").count() == 1
    tasks.RELEASE.set()  # the three hung calls return now: nothing changes
    assert result_of(result.id).status == TaskResultStatus.FAILED


def test_the_queue_timeout_applies_per_queue_and_a_task_can_opt_out() -> None:
    with task_settings(BACKOFF_MIN=30, BACKOFF_MAX=30), with_options(TIMEOUT={"other": 0.3}, MAX_ATTEMPTS=5):
        specs = {s.topic: s for s in task_consumer_specs()}
        assert specs["tasks.other"].timeout == 0.3
        hung = tasks.hangs_on_queue.using(queue_name="other").enqueue("queue")
        slow = tasks.slow_but_unlimited.using(queue_name="other").enqueue("slow", 1.0)
        with running_worker(concurrency=2):
            wait_until(lambda: result_of(hung.id).errors, 20, "the timed-out attempt recorded")
            done = wait_until(lambda: (r := result_of(slow.id)).is_finished and r, 20, "the slow task")
        first = result_of(hung.id)
        assert first.status == TaskResultStatus.READY  # waiting for its retry (backoff 30 s)
        assert [e.exception_class_path for e in first.errors] == [TIMEOUT_PATH]
        assert done.status == TaskResultStatus.SUCCESSFUL and done.errors == []  # 1 s, over 0.3 s: opted out


def test_the_default_timeout_is_the_visibility_timeout() -> None:
    with with_options(VISIBILITY_TIMEOUT=12):
        specs = task_consumer_specs()
    from django_sqlqueue.conf import get_settings

    assert {s.resolve(get_settings()).timeout for s in specs} == {12}


@pytest.mark.parametrize(
    ("timeout", "message"),
    [
        (0, "must be a positive number of seconds"),
        ("10", "must be a positive number of seconds"),
        ({"default": -1}, "\\['TIMEOUT'\\]\\['default'\\] must be a positive number"),
        ({"nope": 5}, "names queue\\(s\\) not in QUEUES: nope"),
    ],
)
def test_bad_timeouts_are_refused(timeout: Any, message: str) -> None:
    from django_sqlqueue.tasks.backend import SQLQueueBackend

    backend = SQLQueueBackend("default", {**TASKS["default"], "OPTIONS": {"TIMEOUT": timeout}})
    assert [e.id for e in backend.check()] == ["sqlqueue.tasks.E002"]
    assert re.search(message, backend.check()[0].msg)
    with pytest.raises(ConfigurationError, match=message):
        backend.topics()


def test_task_timeout_refuses_bad_seconds() -> None:
    from django_sqlqueue.tasks import task_timeout

    for bad in (0, -2, "1", True, float("inf")):
        with pytest.raises(ConfigurationError, match="task_timeout\\(\\) takes a positive number"):
            task_timeout(bad)


def test_a_tasks_own_timeout_is_read_from_the_function_it_runs() -> None:
    """Under ``@task`` or over it, ``task_timeout`` marks the function; ``None`` is no limit."""
    import math

    from django_sqlqueue.tasks.timeouts import ATTRIBUTE, task_timeout, timeout_of

    assert timeout_of(tasks.hangs) == 0.4
    assert timeout_of(tasks.slow_but_unlimited) == math.inf
    assert timeout_of(tasks.add) is None  # none of its own: its queue's applies
    assert task_timeout(2)(tasks.add) is tasks.add  # on top of @task: the same task, its function marked
    try:
        assert timeout_of(tasks.add) == 2.0
    finally:
        delattr(tasks.add.func, ATTRIBUTE)
