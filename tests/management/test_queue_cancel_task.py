"""management/commands/queue_cancel_task.py: confirmation, what it prints and logs, what it refuses.
The decision itself: tests/ops/test_task_cancel.py; against a worker: tests/tasks/test_cancellation.py."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
from django.core.management import CommandError, call_command

from django_sqlqueue.management.commands import queue_cancel_task
from django_sqlqueue.task_models import TaskResultRecord
from tests.support.task_helpers import task_settings
from tests.support.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _tasks() -> Iterator[None]:
    with task_settings():
        yield


def cancel(*args: str) -> str:
    out = io.StringIO()
    call_command(queue_cancel_task.Command(), *args, stdout=out)
    return out.getvalue().strip()


def test_cancels_each_id_says_what_happened_and_logs_it(caplog: pytest.LogCaptureFixture) -> None:
    first, second = tasks.add.enqueue(1, 2), tasks.add.enqueue(3, 4)
    with caplog.at_level(logging.INFO, logger="django_sqlqueue.commands"):
        out = cancel(first.id, second.id, first.id, "--yes", "--by", "ops-oncall")
    assert out.splitlines() == [
        f"{first.id}: cancelled: it will not run (its result is FAILED, TaskCancelled)",
        f"{second.id}: cancelled: it will not run (its result is FAILED, TaskCancelled)",
    ]
    assert f"queue_cancel_task id={first.id} outcome=cancelled by=ops-oncall" in caplog.text
    assert "by ops-oncall" in TaskResultRecord.objects.get(id=first.id).errors[-1]["traceback"]
    assert cancel(first.id, "--yes").endswith("cancelled: it will not run (its result is FAILED, TaskCancelled)")


def test_a_finished_task_is_reported_as_such() -> None:
    done = tasks.add.enqueue(1, 2)
    TaskResultRecord.objects.create(
        id=done.id, backend="default", queue_name="default", topic="tasks.default", task_path="x", status="SUCCESSFUL"
    )
    assert cancel(done.id, "--yes") == f"{done.id}: already finished: nothing changed"


def test_without_yes_and_without_a_terminal_it_refuses_and_writes_nothing() -> None:
    result = tasks.add.enqueue(1, 2)
    with pytest.raises(CommandError, match="refusing without confirmation"):
        cancel(result.id)
    assert not TaskResultRecord.objects.exists()


def test_unknown_ids_fail_the_command_after_the_others_are_cancelled() -> None:
    result = tasks.add.enqueue(1, 2)
    with pytest.raises(CommandError, match="1 of 2 id"):
        cancel("nope", result.id, "--yes")
    assert TaskResultRecord.objects.get(id=result.id).status == "FAILED"


def test_a_malformed_id_is_refused_before_anything_is_written() -> None:
    result = tasks.add.enqueue(1, 2)
    with pytest.raises(CommandError, match="not a task result id"):
        cancel(result.id, "x" * 129, "--yes")
    assert not TaskResultRecord.objects.exists()
