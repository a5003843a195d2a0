"""tasks/trust.py: the backend runs only tasks it can vouch for (issue 28, item 1).

Forged task messages are written with ``publish()`` -- what a Spark backfill or anyone with
INSERT on the table can do -- and run by the engine's own path (a real Worker thread, or
``drain_tasks``). A refused message is never run (no ``Run`` row, no import), is
dead-lettered at once with the reason, and its result row says FAILED with that error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from django_sqlqueue import ops, publish
from django_sqlqueue.models import Message
from django_sqlqueue.task_models import TaskResultRecord
from django_sqlqueue.tasks.compat import InvalidTask, TaskResultStatus, task_backends
from django_sqlqueue.tasks.trust import UntrustedTask, message_task, trusted_task
from django_sqlqueue.testing.tasks import drain_tasks
from tests.support.task_helpers import running_worker, wait_until
from tests.support.taskapp import tasks
from tests.support.taskapp.models import Run
from tests.support.taskapp.settings_common import TASKS
from tests.tasks import trust_tasks

pytestmark = pytest.mark.django_db(transaction=True)

REFUSED = "django_sqlqueue.tasks.trust.UntrustedTask"
TRIPWIRE = "tests.tasks.tripwire"
#: The test backend plus a second one, "elsewhere", with a queue of the same name.
TWO_BACKENDS = {**TASKS, "elsewhere": {"BACKEND": "django_sqlqueue.tasks.SQLQueueBackend", "QUEUES": ["default"]}}


#: Set in the environment by importing the tripwire module (tests/tasks/tripwire.py).
TRIPWIRE_MARK = "SQLQUEUE_TEST_TRIPWIRE"


@pytest.fixture(autouse=True)
def _no_tripwire() -> Iterator[None]:
    """The tripwire module is not imported before a test, and is forgotten after one."""
    sys.modules.pop(TRIPWIRE, None)
    os.environ.pop(TRIPWIRE_MARK, None)
    yield
    sys.modules.pop(TRIPWIRE, None)
    os.environ.pop(TRIPWIRE_MARK, None)


def _tripwire_ran() -> bool:
    return TRIPWIRE in sys.modules or TRIPWIRE_MARK in os.environ


def forge(task_path: Any, *args: Any, topic: str = "tasks.default", **fields: Any) -> str:
    """Write a task message by hand, as enqueue() would shape it; its id."""
    payload = {"task": task_path, "args": list(args), "kwargs": {}, "backend": "default", "queue_name": "default"}
    return publish(topic, {**payload, **fields}, metadata={"task": task_path}).id


def dead_letter(message_id: str, topic: str = "tasks.default") -> Message:
    return Message.objects.get(topic=f"{topic}_dlq", id=f"tasks:{message_id}")


def assert_refused(message_id: str, reason: str, topic: str = "tasks.default") -> None:
    """Dead-lettered at its first attempt with ``reason``; its result row FAILED with it."""
    dead = dead_letter(message_id, topic)
    assert dead.failure_count == 1  # no retries
    assert dead.last_error.startswith(f"{REFUSED}: "), dead.last_error
    assert reason in dead.last_error.splitlines()[0]
    row = TaskResultRecord.objects.get(id=message_id)
    assert row.status == TaskResultStatus.FAILED and row.finished_at is not None
    assert [e["exception_class_path"] for e in row.errors] == [REFUSED]
    assert reason in row.errors[0]["traceback"]


def test_a_task_declared_for_another_backend_is_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The F1 repro: a task of backend "elsewhere", named by a message of tasks.default."""
    with override_settings(TASKS=TWO_BACKENDS):
        declared = trust_tasks.task(backend="elsewhere")(trust_tasks.elsewhere)
        monkeypatch.setattr(trust_tasks, "elsewhere", declared)
        path = "tests.tasks.trust_tasks.elsewhere"
        forged = forge(path, "forged")
        own = declared.enqueue("on its own backend")
        assert Message.objects.filter(topic="tasks.elsewhere.default", id=own.id).exists()
        with running_worker():
            wait_until(lambda: Message.objects.filter(topic="tasks.default_dlq").exists(), 20, "the dead letter")
            wait_until(lambda: Run.objects.filter(label="on its own backend").exists(), 20, "its own run")
        assert not Run.objects.filter(label="forged").exists()
        assert_refused(
            forged, f"task path '{path}' is not a task of backend 'default': it is declared for backend 'elsewhere'"
        )
        with pytest.raises(UntrustedTask, match="declared for backend 'elsewhere'"):
            task_backends["default"].get_result(forged)
        # Nor can enqueue() move it to "default": its worker would refuse it.
        with pytest.raises(InvalidTask, match="declared for backend 'elsewhere'"):
            declared.using(backend="default").enqueue("moved")
        assert Message.objects.filter(topic="tasks.default").count() == 1


def test_a_message_cannot_import_a_module_outside_the_installed_apps() -> None:
    path = f"{TRIPWIRE}.anything"
    forged = forge(path)
    # get_result() looks the task up as the worker does: no import either.
    with pytest.raises(UntrustedTask, match="is not part of an installed app"):
        task_backends["default"].get_result(forged)
    assert TRIPWIRE not in sys.modules
    summary = drain_tasks()
    assert (summary.dead_lettered, summary.handled) == (1, 0)
    assert TRIPWIRE not in sys.modules and not _tripwire_ran()
    assert_refused(forged, f"its module '{TRIPWIRE}' is not part of an installed app and was not imported")
    with pytest.raises(UntrustedTask, match="is not part of an installed app"):
        task_backends["default"].get_result(forged)
    assert not _tripwire_ran()


@pytest.mark.parametrize(
    "path, reason",
    [
        ("tests.support.taskapp.tasks.plain_function", "it is a function, not a django.tasks Task"),
        ("tests.support.taskapp.tasks.nothing_here", "it is nothing, not a django.tasks Task"),
        ("tests.support.taskapp.no_such_module.add", "cannot be imported: ModuleNotFoundError"),
        ("os.system", "it is a builtin_function_or_method, not a django.tasks Task"),
        ("tests.support.taskapp.tasks.Run", "it is a ModelBase, not a django.tasks Task"),
        ("add", "not a dotted path"),
        ("tests..add", "not a dotted path"),
        ("tests.support.taskapp.tasks.add()", "not a dotted path"),
        (["tests.support.taskapp.tasks.add"], "task path of type list is not a task of backend 'default'"),
        ("tests.support.taskapp.tasks.add\u202e\x9b", "'tests.support.taskapp.tasks.add\\u202e\\x9b' is not a task"),
    ],
)
def test_what_is_not_a_task_of_the_backend_is_refused(path: Any, reason: str) -> None:
    forged = forge(path, 1, 2)
    assert drain_tasks().dead_lettered == 1
    assert_refused(forged, reason)
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    "fields, reason",
    [
        ({"queue_name": "nope"}, "the message's queue_name 'nope' is not its topic's queue 'default'"),
        ({"queue_name": "other"}, "the message's queue_name 'other' is not its topic's queue 'default'"),
        ({"backend": "elsewhere"}, "the message names backend 'elsewhere'"),
        ({"args": "12"}, "its 'args' must be a list and its 'kwargs' an object"),
    ],
)
def test_a_message_enqueue_could_not_have_written_is_refused(fields: dict[str, Any], reason: str) -> None:
    forged = forge("tests.support.taskapp.tasks.add", 1, 2, **fields)
    assert drain_tasks().dead_lettered == 1
    assert_refused(forged, reason)
    assert not Run.objects.exists()


def test_a_queue_not_in_queues_is_refused() -> None:
    """A row or message of a queue the backend does not have names no task of it."""
    with pytest.raises(UntrustedTask, match=r"queue 'nope' is not one of its QUEUES \(default, other\)"):
        trusted_task("tests.support.taskapp.tasks.add", alias="default", queues={"default", "other"}, queue_name="nope")
    topics = task_backends["default"].topics()
    with pytest.raises(UntrustedTask, match=r"topic 'tasks\.nope' is not one of its task topics"):
        message_task("default", topics, "tasks.nope", {"task": "tests.support.taskapp.tasks.add"})
    result = tasks.add.enqueue(1, 2)
    TaskResultRecord.objects.create(
        id=result.id, backend="default", queue_name="nope", topic="tasks.nope", task_path=tasks.add.module_path
    )
    with pytest.raises(UntrustedTask, match="queue 'nope' is not one of its QUEUES"):
        tasks.add.get_backend().get_result(result.id)


def test_legitimate_tasks_still_run() -> None:
    on_default = tasks.add.enqueue(1, 2)
    on_other = tasks.add.using(queue_name="other").enqueue(3, 4)  # declared for "default"
    outside = trust_tasks.outside_add.enqueue(5, 6)  # outside the apps, but imported
    # Written without enqueue() (a backfill), without backend/queue_name: its topic's queue.
    backfilled = publish("tasks.other", {"task": tasks.add.module_path, "args": [7, 8], "kwargs": {}}).id
    summary = drain_tasks()
    assert (summary.handled, summary.dead_lettered) == (4, 0)
    for result_id, value, queue in [
        (on_default.id, 3, "default"),
        (on_other.id, 7, "other"),
        (backfilled, 15, "other"),
    ]:
        done = tasks.add.get_result(result_id)
        assert (done.status, done.return_value, done.task.queue_name) == (TaskResultStatus.SUCCESSFUL, value, queue)
    assert trust_tasks.outside_add.get_result(outside.id).return_value == 11
    assert TaskResultRecord.objects.get(id=backfilled).queue_name == "other"
    assert sorted(Run.objects.values_list("label", flat=True)) == ["add", "add", "add", "outside"]


def test_a_refused_task_on_an_atomic_queue() -> None:
    atomic = {"default": {**TASKS["default"], "OPTIONS": {**TASKS["default"]["OPTIONS"], "ATOMIC": True}}}
    with override_settings(TASKS=atomic):
        forged = forge(f"{TRIPWIRE}.anything")
        legit = tasks.add.enqueue(2, 2)
        summary = drain_tasks()
        assert (summary.handled, summary.dead_lettered) == (1, 1)
        assert_refused(forged, "is not part of an installed app")
        assert tasks.add.get_result(legit.id).return_value == 4
    assert not _tripwire_ran()


def test_a_replayed_refusal_is_refused_again_on_its_own_row() -> None:
    forged = forge("tests.support.taskapp.tasks.plain_function")
    drain_tasks()
    assert ops.replay([dead_letter(forged).seq]).done == 1
    assert TaskResultRecord.objects.get(id=forged).status == "READY"
    assert drain_tasks().dead_lettered == 1
    row = TaskResultRecord.objects.get(id=forged)
    assert row.status == TaskResultStatus.FAILED and [e["exception_class_path"] for e in row.errors] == [REFUSED] * 2
    assert not Run.objects.exists()


def test_a_forged_result_id_cannot_fail_another_tasks_result() -> None:
    waiting = TaskResultRecord.objects.create(
        id="someone-else",
        backend="default",
        queue_name="default",
        topic="tasks.default",
        task_path=tasks.add.module_path,
        status="READY",
    )
    forged = forge(f"{TRIPWIRE}.anything", result_id=waiting.id)
    assert drain_tasks().dead_lettered == 1
    assert TaskResultRecord.objects.get(id=waiting.id).status == "READY"
    assert not TaskResultRecord.objects.filter(id=forged).exists()
    assert dead_letter(forged).last_error.startswith(REFUSED)


def test_a_payload_that_names_no_task_is_refused() -> None:
    listed = publish("tasks.default", ["tests.support.taskapp.tasks.add", 1, 2]).id
    nameless = publish("tasks.default", {"args": [1, 2]}).id
    assert drain_tasks().dead_lettered == 2
    assert "its payload is a list, not an object with 'task'" in dead_letter(listed).last_error
    assert "its payload has no 'task'" in dead_letter(nameless).last_error
    assert not TaskResultRecord.objects.filter(id=listed).exists()  # names no task: no row
    assert TaskResultRecord.objects.get(id=nameless).status == TaskResultStatus.FAILED
    assert not Run.objects.exists()


def test_two_threads_meeting_a_task_modules_first_import_both_get_the_task() -> None:
    # A worker's first two tasks of a module not imported yet, on two handler threads: the
    # second finds the module in sys.modules while the first is still importing it.
    import threading

    name = "tests.support.taskapp.slow_import_tasks"
    sys.modules.pop(name, None)
    found: list[Any] = []

    def look() -> None:
        try:
            found.append(
                trusted_task(f"{name}.imported_slowly", alias="default", queues=["default"], queue_name="default")
            )
        except Exception as exc:  # noqa: BLE001 - asserted below
            found.append(exc)

    threads = [threading.Thread(target=look) for _ in range(2)]
    threads[0].start()
    wait_until(lambda: name in sys.modules, 5, "the first import to begin", 0.005)
    threads[1].start()
    for t in threads:
        t.join(10)
    assert [getattr(t, "module_path", t) for t in found] == [f"{name}.imported_slowly"] * 2
