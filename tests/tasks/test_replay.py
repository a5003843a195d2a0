"""tasks/replay.py: a failed task's dead letter, replayed, reruns the task under the same result;
the replay hook recognises tasks by their marker and leaves other messages alone.

Real database, real Worker threads (the same code runconsumer runs); the process-level
claims (kill -9, several workers) are in tests/processes/test_tasks.py. The backend is
configured by tests/tasks/conftest.py.
"""

from __future__ import annotations

import pytest
from django.db import transaction
from django.utils import timezone

from django_sqlqueue.models import Message
from django_sqlqueue.task_models import TaskResultRecord
from django_sqlqueue.tasks.compat import TaskResultStatus
from django_sqlqueue.tasks.trust import UntrustedTask
from tests.support.task_helpers import finished, running_worker, wait_until
from tests.support.taskapp import tasks

#: A failed task retried while a worker runs: READY, unless the worker already picked it up.
AFTER_RETRY = {TaskResultStatus.READY, TaskResultStatus.RUNNING, TaskResultStatus.SUCCESSFUL}

pytestmark = pytest.mark.django_db(transaction=True)


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
    # The result is READY again; get_result() of backend "jobs" refuses to name a task
    # declared for "default" (tasks/trust.py), as its worker would refuse to run it.
    with pytest.raises(UntrustedTask, match="declared for backend 'default'"):
        backend.get_result("custom-prefix")


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
