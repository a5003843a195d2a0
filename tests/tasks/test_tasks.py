"""The django.tasks contract on SQLQueueBackend (Django 6's django.tasks, or the backport on 5.2).

Real database, real Worker threads (the same code runconsumer runs); the process-level
claims (kill -9, several workers) are in tests/processes/test_tasks.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_sqlqueue.exceptions import ConfigurationError, InvalidMessage
from django_sqlqueue.models import Message
from django_sqlqueue.task_models import TaskResultRecord
from django_sqlqueue.tasks import enqueue_in_order, ordering_key
from django_sqlqueue.tasks.compat import (
    BUILTIN,
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
    task_finished,
    task_started,
)
from tests.support.task_helpers import running_worker, task_settings, wait_until
from tests.support.taskapp import tasks
from tests.support.taskapp.models import Run
from tests.support.taskapp.settings_common import TASKS

TASKS_DEFAULT = TASKS["default"]
TASKS_OPTIONS = TASKS_DEFAULT["OPTIONS"]

pytestmark = pytest.mark.django_db(transaction=True)


#: A failed task retried while a worker runs: READY, unless the worker already picked it up.
AFTER_RETRY = {TaskResultStatus.READY, TaskResultStatus.RUNNING, TaskResultStatus.SUCCESSFUL}


@pytest.fixture(autouse=True)
def _tasks_configured() -> Iterator[None]:
    from django_sqlqueue.tasks.marks import marks

    with task_settings():
        yield
    # The running-marks thread's connection: closed before the test database is dropped.
    assert marks.close_connections()


@pytest.fixture
def signals() -> Iterator[list[tuple[str, Any]]]:
    received: list[tuple[str, Any]] = []
    handlers = {
        "enqueued": lambda sender, task_result, **kw: received.append(("enqueued", task_result)),
        "started": lambda sender, task_result, **kw: received.append(("started", task_result)),
        "finished": lambda sender, task_result, **kw: received.append(("finished", task_result)),
    }
    task_enqueued.connect(handlers["enqueued"], weak=False)
    task_started.connect(handlers["started"], weak=False)
    task_finished.connect(handlers["finished"], weak=False)
    yield received
    task_enqueued.disconnect(handlers["enqueued"])
    task_started.disconnect(handlers["started"])
    task_finished.disconnect(handlers["finished"])


def finished(result: Any, timeout: float = 20) -> Any:
    def done() -> Any:
        fresh = tasks.add.get_backend().get_result(result.id)
        return fresh if fresh.is_finished else None

    return wait_until(done, timeout, f"task {result.id} to finish")


def test_which_django_tasks() -> None:
    import django

    assert (django.VERSION >= (6, 0)) == BUILTIN


# -- enqueue -------------------------------------------------------------------------------


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


# -- running -------------------------------------------------------------------------------


def test_get_result_after_success_and_signals(signals: list[Any]) -> None:
    result = tasks.add.enqueue(2, 3)
    with running_worker():
        done = finished(result)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == 5
    assert done.attempts == 1 and len(done.worker_ids) == 1
    assert done.enqueued_at <= done.started_at <= done.finished_at
    assert done.errors == []
    names = [name for name, r in signals if r.id == result.id]
    assert names == ["enqueued", "started", "finished"]
    started = next(r for name, r in signals if name == "started")
    assert started.status == TaskResultStatus.RUNNING
    assert signals[-1][1].status == TaskResultStatus.SUCCESSFUL


def test_aget_result() -> None:
    from asgiref.sync import async_to_sync

    result = tasks.add.enqueue(1, 1)
    fresh = async_to_sync(tasks.add.aget_result)(result.id)
    assert fresh.id == result.id and fresh.status == TaskResultStatus.READY


def test_async_task_and_context() -> None:
    first = tasks.async_add.enqueue(20, 22)
    second = tasks.attempt_number.enqueue("ctx")
    with running_worker():
        a, b = finished(first), finished(second)
    assert a.return_value == 42
    assert b.return_value == 1


def test_retry_then_success_records_every_error(signals: list[Any]) -> None:
    result = tasks.flaky.enqueue("flaky", 2)
    with running_worker():
        done = finished(result)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == "ok"
    assert done.attempts == 3
    assert [e.exception_class_path for e in done.errors] == ["builtins.ValueError"] * 2
    assert "planned failure" in done.errors[0].traceback and "Traceback" in done.errors[0].traceback
    assert Run.objects.filter(label="flaky").count() == 3
    # task_finished once, for the final outcome; task_started per attempt.
    assert [n for n, r in signals if r.id == result.id].count("started") == 3
    assert [n for n, r in signals if r.id == result.id].count("finished") == 1


def test_dead_letter_after_max_attempts() -> None:
    result = tasks.always_fails.enqueue("doomed")
    with running_worker():
        done = finished(result)
        wait_until(
            lambda: Message.objects.filter(topic="tasks.default_dlq", id=f"tasks:{result.id}").exists(),
            10,
            "the dead letter",
        )
    assert done.status == TaskResultStatus.FAILED
    assert done.attempts == 3  # OPTIONS MAX_ATTEMPTS
    assert len(done.errors) == 3
    assert done.errors[-1].exception_class is RuntimeError
    with pytest.raises(ValueError, match="failed"):
        _ = done.return_value
    dead = Message.objects.get(topic="tasks.default_dlq", id=f"tasks:{result.id}")
    assert dead.original_topic == "tasks.default" and dead.failure_count == 3
    assert dead.payload["task"] == "tests.support.taskapp.tasks.always_fails"
    assert Run.objects.filter(label="doomed").count() == 3


def test_ordering_key_runs_tasks_of_one_key_in_enqueue_order() -> None:
    with ordering_key("order:7"):
        results = [tasks.keyed.enqueue("keyed", "order:7", i) for i in range(20)]
    results.append(enqueue_in_order(tasks.keyed, "order:7", "keyed", "order:7", 20))
    keys = set(
        Message.objects.filter(topic="tasks.default", id__in=[r.id for r in results]).values_list("key", "partition")
    )
    assert len(keys) == 1 and next(iter(keys))[0] == "order:7"
    with running_worker(concurrency=4):
        for r in results:
            finished(r)
    assert list(Run.objects.filter(label="keyed").order_by("started", "id").values_list("seq", flat=True)) == list(
        range(21)
    )


def test_a_finished_task_is_not_run_again_when_redelivered() -> None:
    result = tasks.add.enqueue(1, 2)
    with running_worker():
        finished(result)
    from django_sqlqueue.consumers import ReceivedMessage
    from django_sqlqueue.tasks.execution import TaskHandler

    # The delivery a worker would make if it died after writing the result, before the ack.
    redelivery = ReceivedMessage(
        topic="tasks.default",
        key="",
        partition=0,
        offset=1,
        id=result.id,
        payload={
            "task": "tests.support.taskapp.tasks.add",
            "args": [1, 2],
            "kwargs": {},
            "backend": "default",
            "queue_name": "default",
        },
        metadata={},
        attempt=2,
        created_at=timezone.now(),
        deliver_at=timezone.now(),
        group="tasks",
    )
    TaskHandler("default", 3)(redelivery)
    assert Run.objects.filter(label="add").count() == 1
    assert tasks.add.get_result(result.id).attempts == 1


# -- validation ----------------------------------------------------------------------------


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


def test_a_bad_ordering_key_is_refused() -> None:
    with pytest.raises(InvalidMessage, match="empty"), ordering_key(""):
        pass


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
        ({"BOGUS": 1}, "unknown key"),
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS"),
        ({"TOPIC_PREFIX": "bad prefix "}, "TOPIC_PREFIX"),
        ({"STRICT": True, "BATCH_SIZE": 5}, "STRICT"),
        ({"MARK_RUNNING_AFTER": -1}, "MARK_RUNNING_AFTER"),
        ({"MARK_RUNNING_AFTER": "0.1"}, "MARK_RUNNING_AFTER"),
        ({"MARK_RUNNING_AFTER": float("inf")}, "MARK_RUNNING_AFTER"),
    ],
)
def test_bad_options_raise_configuration_error(options: dict[str, Any], match: str) -> None:
    from django_sqlqueue.tasks.backend import SQLQueueBackend

    with pytest.raises(ConfigurationError, match=match):
        SQLQueueBackend("default", {"QUEUES": ["default"], "OPTIONS": options})


def test_bad_queue_name_raises_configuration_error() -> None:
    from django_sqlqueue.tasks.backend import SQLQueueBackend

    with pytest.raises(ConfigurationError, match="characters outside"):
        SQLQueueBackend("default", {"QUEUES": ["has space"], "OPTIONS": {}})


# -- pruning -------------------------------------------------------------------------------


def test_prune_deletes_old_finished_results_only(capsys: pytest.CaptureFixture[str]) -> None:
    done = tasks.add.enqueue(1, 1)
    waiting = tasks.add.using(run_after=timezone.now() + dt.timedelta(hours=1)).enqueue(2, 2)
    with running_worker():
        finished(done)
    TaskResultRecord.objects.filter(id=done.id).update(finished_at=timezone.now() - dt.timedelta(days=8))
    TaskResultRecord.objects.create(
        id="running-old",
        backend="default",
        queue_name="default",
        topic="tasks.default",
        task_path="tests.support.taskapp.tasks.add",
        status="RUNNING",
        started_at=timezone.now() - dt.timedelta(days=9),
    )
    call_command("queue_prune_task_results", "--dry-run")
    assert "would delete 1" in capsys.readouterr().out
    assert TaskResultRecord.objects.filter(id=done.id).exists()
    call_command("queue_prune_task_results")
    assert "deleted 1" in capsys.readouterr().out
    assert not TaskResultRecord.objects.filter(id=done.id).exists()
    assert TaskResultRecord.objects.filter(id="running-old").exists()
    assert tasks.add.get_result(waiting.id).status == TaskResultStatus.READY


def test_retrying_a_dead_letter_reruns_the_task_under_the_same_result() -> None:
    from django_sqlqueue import ops

    result = tasks.flaky.enqueue("second-chance", 3)  # fails 3 times = MAX_ATTEMPTS, then would succeed
    with running_worker():
        assert finished(result).status == TaskResultStatus.FAILED
        dead = wait_until(
            lambda: Message.objects.filter(topic="tasks.default_dlq", id=f"tasks:{result.id}").first(),
            10,
            "dead letter",
        )
        assert ops.replay([dead.seq]).done == 1
        assert not Message.objects.filter(topic="tasks.default_dlq").exists()
        assert tasks.flaky.get_result(result.id).status in AFTER_RETRY
        done = finished(result)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.attempts == 4 and len(done.errors) == 3
    # Already retried: a second replay of the same dead letter finds nothing to replay.
    again = ops.replay([dead.seq])
    assert (again.done, again.missing) == (0, 1)


def test_the_consoles_replay_of_a_failed_task_reruns_it_under_the_same_result() -> None:
    """Failed tasks are dead letters: the console's replay (ops.replay) retries them like messages."""
    from django_sqlqueue import ops

    result = tasks.flaky.enqueue("console-replay", 3)  # fails 3 times = MAX_ATTEMPTS, then would succeed
    with running_worker():
        assert finished(result).status == TaskResultStatus.FAILED
        dead = wait_until(
            lambda: Message.objects.filter(topic="tasks.default_dlq", id=f"tasks:{result.id}").first(),
            10,
            "dead letter",
        )
        listed = ops.list_dead_letters(ops.DeadLetterFilter(topic="tasks.default")).items
        assert [d.seq for d in listed] == [dead.seq]
        assert ops.replay([dead.seq], actor="admin").done == 1
        assert ops.replay([dead.seq], actor="admin").done == 0  # once, even if clicked twice
        # READY again (no longer FAILED) -- or already picked up by the running worker.
        assert tasks.flaky.get_result(result.id).status in AFTER_RETRY
        done = finished(result)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.attempts == 4 and len(done.errors) == 3


# -- the replay hook -----------------------------------------------------------------------


def _failed_task_record(result_id: str, topic: str, backend: str = "default") -> TaskResultRecord:
    return TaskResultRecord.objects.create(
        id=result_id,
        backend=backend,
        queue_name="default",
        topic=topic,
        task_path="tests.support.taskapp.tasks.add",
        status="FAILED",
        finished_at=timezone.now(),
        worker_ids=["host:1", "host:1", "host:1"],
    )


def test_the_replay_hook_recognises_a_task_by_its_marker_whatever_the_topic_prefix() -> None:
    """A backend with its own TOPIC_PREFIX: its topics do not start with "tasks."."""
    from django_sqlqueue.conf import get_settings
    from django_sqlqueue.rules import dlq
    from django_sqlqueue.tasks.backend import SQLQueueBackend

    backend = SQLQueueBackend(
        "jobs",
        {
            "BACKEND": "django_sqlqueue.tasks.SQLQueueBackend",
            "QUEUES": ["default"],
            "OPTIONS": {"TOPIC_PREFIX": "jobs."},
        },
    )
    topic = backend.topic_for("default")
    assert topic == "jobs.default"
    _failed_task_record("custom-prefix", topic, backend="jobs")
    payload = {
        "task": "tests.support.taskapp.tasks.add",
        "args": [1, 2],
        "kwargs": {},
        "backend": "jobs",
        "queue_name": "default",
    }
    # A dead letter's metadata: the enqueue's marker plus the dead-letter part.
    metadata = dlq.dead_letter_metadata(
        {"task": "tests.support.taskapp.tasks.add"}, group="tasks", partition=0, offset=1, original_id="custom-prefix"
    )
    using = get_settings().DATABASE
    with transaction.atomic(using=using):
        copied = dlq.prepare_replay_payload(topic, payload, metadata, "custom-prefix", using)
    assert copied == {**payload, "result_id": "custom-prefix"}
    assert TaskResultRecord.objects.get(id="custom-prefix").status == "READY"
    assert backend.get_result("custom-prefix").status == TaskResultStatus.READY


def test_the_replay_hook_leaves_other_messages_alone() -> None:
    from django_sqlqueue.rules import dlq
    from django_sqlqueue.tasks.replay import replay_task

    tasks.add.get_backend()  # the backend registers its hook when it is built
    assert replay_task in dlq._replay_hooks
    _failed_task_record("not-a-task", "tasks.default")
    # A payload that merely has a "task" key, without the backend's metadata marker.
    payload = {"task": "tests.support.taskapp.tasks.add"}
    assert dlq.prepare_replay_payload("tasks.default", payload, {}, "not-a-task", "default") is payload
    other = {"task": "tests.support.taskapp.tasks.add"}
    assert dlq.prepare_replay_payload("orders", other, {"task": "something.else"}, "not-a-task", "default") is other
    assert TaskResultRecord.objects.get(id="not-a-task").status == "FAILED"


@pytest.mark.parametrize(
    ("tasks_setting", "registered"),
    [
        ({"default": {"BACKEND": "django_sqlqueue.tasks.SQLQueueBackend", "QUEUES": ["default"]}}, True),
        ({"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}, False),
        (None, False),
    ],
)
def test_the_app_registers_the_replay_hook_without_importing_django_tasks(
    tasks_setting: dict[str, Any] | None, registered: bool
) -> None:
    """In a process that never touches the backend (the console, queue_dlq): registered at
    start-up when TASKS names it, and neither django.tasks nor the backport is imported."""
    import os
    import subprocess
    import sys

    code = f"""
import sys
import django
from django.conf import settings

extra = {{"TASKS": {tasks_setting!r}}} if {tasks_setting!r} is not None else {{}}
settings.configure(
    INSTALLED_APPS=["django_sqlqueue"],
    DATABASES={{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}}},
    USE_TZ=True,
    **extra,
)
django.setup()
from django_sqlqueue import dlq

print([h.__qualname__ for h in dlq._replay_hooks])
print(sorted(m for m in sys.modules if m == "django_tasks" or m.startswith(("django_tasks.", "django.tasks"))))
"""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    hooks, imported = out.stdout.strip().splitlines()
    assert hooks == ("['replay_task']" if registered else "[]")
    assert imported == "[]"


# -- bookkeeping cost (issue 17) -------------------------------------------------------------


def _first_delivery(result: Any) -> Any:
    """The first delivery of an enqueued task, as a worker hands it to the task handler."""
    from django_sqlqueue.consumers import ReceivedMessage

    message = Message.objects.get(id=result.id)
    return ReceivedMessage(
        topic=message.topic,
        key=message.key,
        partition=message.partition,
        offset=message.offset,
        id=message.id,
        payload=message.payload,
        metadata=message.metadata,
        attempt=1,
        created_at=message.created_at,
        deliver_at=message.deliver_at,
        group="tasks",
    )


def _result_statements(delivery: Any) -> list[str]:
    """Run the task handler on ``delivery`` here; the statements it sent to the results table."""
    from django.db import connection

    from django_sqlqueue.tasks.execution import TaskHandler

    statements: list[str] = []

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        TaskHandler("default", 3)(delivery)
    return [s for s in statements if "queue_task_results" in s]


def test_a_short_task_writes_its_result_in_one_statement() -> None:
    result = tasks.add.enqueue(2, 3)
    statements = _result_statements(_first_delivery(result))
    assert len(statements) == 1 and statements[0].lstrip().upper().startswith("INSERT"), statements
    done = tasks.add.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 5
    assert done.attempts == 1 and done.enqueued_at <= done.started_at <= done.finished_at


def test_a_failed_short_first_attempt_is_one_insert_and_a_later_one_adds_to_it() -> None:
    # By hand first (so the worker's own delivery is a first attempt too, and finds the row:
    # the lazy insert is merged into it rather than lost).
    result = tasks.flaky.enqueue("lazyflaky", 1)
    delivery = _first_delivery(result)
    with pytest.raises(ValueError, match="planned failure"):
        _result_statements(delivery)
    ready = tasks.flaky.get_result(result.id)
    assert ready.status == TaskResultStatus.READY and ready.attempts == 1 and len(ready.errors) == 1
    assert ready.started_at is not None and ready.finished_at is None
    with running_worker():
        done = finished(result)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.attempts == 2 and len(done.errors) == 1
    assert done.started_at == ready.started_at and done.return_value == "ok"


def test_mark_running_after_0_writes_running_as_the_task_starts() -> None:
    options = {**TASKS_OPTIONS, "MARK_RUNNING_AFTER": 0}
    with task_settings(), override_settings(TASKS={"default": {**TASKS_DEFAULT, "OPTIONS": options}}):
        result = tasks.add.enqueue(2, 3)
        statements = _result_statements(_first_delivery(result))
        assert [s.lstrip().split()[0].upper() for s in statements] == ["INSERT", "UPDATE"]
        assert tasks.add.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def test_a_lazy_row_is_written_running_past_the_threshold_and_then_finished() -> None:
    import threading

    result = tasks.sleepy.enqueue("lazyrow", 1.5)
    delivery = _first_delivery(result)

    def run() -> None:
        from django.db import connections

        try:
            _result_statements(delivery)
        finally:
            connections.close_all()  # this thread's, before the test database is dropped

    runner = threading.Thread(target=run)
    runner.start()
    try:
        wait_until(lambda: Run.objects.filter(label="lazyrow:start").exists(), 10, "the task to start", 0.01)
        running = wait_until(
            lambda: (r := tasks.sleepy.get_result(result.id)).status == TaskResultStatus.RUNNING and r,
            1.2,  # (0.1 s, and slack for a loaded machine)
            "the result to say RUNNING",
            0.01,
        )
        assert running.started_at is not None and running.attempts == 1
    finally:
        runner.join(10)
    done = tasks.sleepy.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.started_at == running.started_at


def test_a_timeout_before_the_running_mark_is_recorded_over_a_running_row() -> None:
    from django_sqlqueue.exceptions import HandlerTimeout
    from django_sqlqueue.task_models import TaskResultRecord as Row
    from django_sqlqueue.tasks import results
    from django_sqlqueue.tasks.marks import marks

    result = tasks.add.enqueue(1, 1)
    record = results.begin(
        backend_alias="default",
        result_id=result.id,
        payload=Message.objects.get(id=result.id).payload,
        topic="tasks.default",
        key="",
        enqueued_at=timezone.now(),
        worker_id="here:1",
        first_attempt=True,
        lazy=True,
    )
    assert record is not None and not results.is_written(record)
    mark = marks.start(record, 3600)
    # The watchdog gives the attempt up before the mark is due: the row is written, then timed out.
    marks.write_now(result.id)
    assert results.time_out(result.id, error=HandlerTimeout("too slow"), final=False) is not None
    # The task returns after all: its outcome is not recorded over the timeout.
    assert marks.settle(mark) is True
    assert results.finish(record, value=2, final=True) is False
    row = Row.objects.get(id=result.id)
    assert row.status == TaskResultStatus.READY and len(row.errors) == 1 and row.return_value is None


def test_marks_are_written_in_due_order_whatever_their_thresholds() -> None:
    from django_sqlqueue.tasks import results
    from django_sqlqueue.tasks.marks import RunningMarks

    def unsaved(result: Any) -> Any:
        message = Message.objects.get(id=result.id)
        return results.begin(
            backend_alias="default",
            result_id=result.id,
            payload=message.payload,
            topic=message.topic,
            key="",
            enqueued_at=message.created_at,
            worker_id="here:1",
            first_attempt=True,
            lazy=True,
        )

    own = RunningMarks()
    slow, quick = unsaved(tasks.add.enqueue(1, 1)), unsaved(tasks.add.enqueue(2, 2))
    slow_mark = own.start(slow, 3600)  # first in, due last (another backend's threshold)
    quick_mark = own.start(quick, 0.05)
    wait_until(lambda: results.is_written(quick), 5, "the quick mark to be written", 0.01)
    assert tasks.add.get_result(quick.id).status == TaskResultStatus.RUNNING
    assert not results.is_written(slow) and own.pending() == 1
    assert own.settle(quick_mark) is True and own.settle(slow_mark) is False
    assert own.close_connections()
