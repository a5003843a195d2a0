"""tasks/execution.py (TaskHandler): tasks run by a Worker -- results, signals, retries, dead letters,
async tasks, and a finished task not run again when redelivered.

Real database, real Worker threads (the same code runconsumer runs); the process-level
claims (kill -9, several workers) are in tests/processes/test_tasks.py. The backend is
configured by tests/tasks/conftest.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from django_sqlqueue.models import Message
from django_sqlqueue.tasks.compat import TaskResultStatus
from tests.support.task_helpers import finished, running_worker, wait_until
from tests.support.taskapp import tasks
from tests.support.taskapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


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
