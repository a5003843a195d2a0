"""What a plain task costs the worker (issue 30: "a plain task pays nothing"): the task a
message names is resolved once per delivery (``TaskHandler.task_of``), and the trust
rule's answer is remembered per path while the module still holds that task
(``trust.py``, "Remembered answers") -- and neither memory hides a change.

Real database and a real Worker (``running_worker``: handler threads, as runconsumer);
``bench/task_plain_cost.py`` counts the calls and statements per task.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import override_settings

from django_sqlqueue.tasks import execution, trust
from django_sqlqueue.tasks.compat import TaskResultStatus, task_backends
from django_sqlqueue.tasks.trust import UntrustedTask, trusted_task
from django_sqlqueue.testing.tasks import drain_tasks
from tests.support.task_helpers import finished, running_worker, task_settings
from tests.support.taskapp import tasks
from tests.support.taskapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

ADD = "tests.support.taskapp.tasks.add"


def counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[Any]:
    """Replace ``module.name`` by a wrapper noting each call's first argument (then calling it)."""
    calls: list[Any] = []
    original: Callable[..., Any] = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0] if args else kwargs.get("path"))
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


@pytest.fixture(autouse=True)
def _nothing_remembered() -> Iterator[None]:
    trust._remembered.clear()
    yield
    trust._remembered.clear()


def test_each_delivery_is_resolved_once_on_a_worker_with_handler_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    # The worker asks for a delivery's task for its limits, twice for its timeout (the
    # limiter's slot and the watchdog) and to run it: one resolution.
    resolved = counting(monkeypatch, execution, "message_task")
    results = [tasks.add.enqueue(i, 1) for i in range(3)]
    with running_worker() as worker:
        assert worker.uses_handler_threads  # the path runconsumer takes for a task queue
        done = [finished(r) for r in results]
    assert [d.return_value for d in done] == [1, 2, 3]
    assert len(resolved) == 3


def test_a_retry_is_a_new_delivery_resolved_again(monkeypatch: pytest.MonkeyPatch) -> None:
    resolved = counting(monkeypatch, execution, "message_task")
    with task_settings(BACKOFF_MIN=0.01, BACKOFF_MAX=0.01):
        result = tasks.flaky.enqueue("flaky", 1)
        with running_worker():
            done = finished(result)
    assert (done.status, done.attempts) == (TaskResultStatus.SUCCESSFUL, 2)
    assert len(resolved) == 2


def test_the_rule_runs_once_per_path_while_the_module_holds_the_task(monkeypatch: pytest.MonkeyPatch) -> None:
    rule = counting(monkeypatch, trust, "_trusted_task")
    for i in range(5):
        tasks.add.enqueue(i, i)
    assert drain_tasks().handled == 5
    assert rule == [ADD]
    queues = list(task_backends["default"].topics())  # what the worker passes
    first = trusted_task(ADD, alias="default", queues=queues, queue_name="default")
    assert first is tasks.add and rule == [ADD]
    # Another set of queues: asked again (the answer depends on them).
    trusted_task(ADD, alias="default", queues=[*queues, "another"], queue_name="default")
    assert rule == [ADD, ADD]


def test_a_task_replaced_in_its_module_is_not_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    assert trusted_task(ADD, alias="default", queues=["default"], queue_name="default") is tasks.add
    # The same name now holds another object: the rule again, with what is there now.
    monkeypatch.setattr(tasks, "add", tasks.plain_function)
    with pytest.raises(UntrustedTask, match=re.escape("it is a function, not a django.tasks Task")):
        trusted_task(ADD, alias="default", queues=["default"], queue_name="default")
    other = tasks.tick.using(queue_name="default")
    monkeypatch.setattr(tasks, "add", other)
    with pytest.raises(
        UntrustedTask, match=re.escape("it is the task 'tests.support.taskapp.tasks.tick', declared elsewhere")
    ):
        trusted_task(ADD, alias="default", queues=["default"], queue_name="default")


def test_refusals_are_not_remembered_and_a_settings_change_forgets(monkeypatch: pytest.MonkeyPatch) -> None:
    rule = counting(monkeypatch, trust, "_trusted_task")
    for _ in range(2):
        with pytest.raises(UntrustedTask, match="it is nothing"):
            trusted_task(
                "tests.support.taskapp.tasks.nothing_here", alias="default", queues=["default"], queue_name="default"
            )
    assert len(rule) == 2 and not trust._remembered
    trusted_task(ADD, alias="default", queues=["default"], queue_name="default")
    assert trust._remembered
    with override_settings(SQLQUEUE={"POLL_INTERVAL": 0.5}):
        assert not trust._remembered


def test_at_most_max_remembered_answers_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trust, "MAX_REMEMBERED", 3)
    for n in range(7):
        queues = ["default", *(f"q{i}" for i in range(n))]  # a key of its own each time
        trusted_task(ADD, alias="default", queues=queues, queue_name="default")
        assert 1 <= len(trust._remembered) <= 3
    assert Run.objects.count() == 0
