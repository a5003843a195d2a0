"""tasks/lookup.py: get_result() reads the result row, else the task's message, else its dead letter.

Real database, real Worker threads (the same code runconsumer runs); the process-level
claims (kill -9, several workers) are in tests/processes/test_tasks.py. The backend is
configured by tests/tasks/conftest.py.
"""

from __future__ import annotations

import pytest
from django.utils import timezone

from django_sqlqueue.db.store.messages import write_dead_letter
from django_sqlqueue.models import Message
from django_sqlqueue.task_models import TaskResultRecord
from django_sqlqueue.tasks.compat import TaskResultDoesNotExist, TaskResultStatus
from django_sqlqueue.tasks.lookup import load_result
from tests.support.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_aget_result() -> None:
    from asgiref.sync import async_to_sync

    result = tasks.add.enqueue(1, 1)
    fresh = async_to_sync(tasks.add.aget_result)(result.id)
    assert fresh.id == result.id and fresh.status == TaskResultStatus.READY


def test_the_state_comes_from_the_row_else_the_message_else_the_dead_letter() -> None:
    backend = tasks.add.get_backend()
    result = tasks.add.enqueue(1, 2)
    message = Message.objects.get(topic="tasks.default", id=result.id)
    # 1. Only its message: READY since the message was written.
    ready = load_result(backend, result.id)
    assert ready.status == TaskResultStatus.READY and ready.enqueued_at == message.created_at
    assert (ready.args, ready.kwargs, ready.errors) == ([1, 2], {}, [])
    # 2. A row that says RUNNING, and its dead letter: the worker died on every attempt.
    TaskResultRecord.objects.create(
        id=result.id,
        backend="default",
        queue_name="default",
        topic="tasks.default",
        task_path="tests.support.taskapp.tasks.add",
        status="RUNNING",
        args=[1, 2],
        started_at=timezone.now(),
        worker_ids=["host:1", "host:2", "host:3"],
    )
    write_dead_letter(
        backend.dead_letter_topic("default"),
        key="",
        id=backend.dead_letter_id(result.id),
        payload=message.payload,
        metadata={},
        created_at=message.created_at,
        failure_count=3,
        last_error="django_sqlqueue.exceptions.HandlerTimeout: lease lost\nTraceback ...",
        original_topic="tasks.default",
        using="default",
    )
    dead = Message.objects.get(topic="tasks.default_dlq")
    failed = load_result(backend, result.id)
    assert failed.status == TaskResultStatus.FAILED and failed.finished_at == dead.failed_at
    assert [e.exception_class_path for e in failed.errors] == ["django_sqlqueue.exceptions.HandlerTimeout"]
    assert failed.worker_ids == ["host:1", "host:2", "host:3"]  # the rest from the row
    # 3. No row and its message collected: FAILED, read from the dead letter alone.
    TaskResultRecord.objects.filter(id=result.id).delete()
    message.delete()
    only_dead = load_result(backend, result.id)
    assert only_dead.status == TaskResultStatus.FAILED and only_dead.args == [1, 2]
    assert only_dead.enqueued_at == message.created_at and only_dead.finished_at == dead.failed_at
    # 4. None of them: the contract's error.
    dead.delete()
    with pytest.raises(TaskResultDoesNotExist):
        load_result(backend, result.id)
