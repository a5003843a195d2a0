"""tasks/results.py: the result rows -- one statement for a short task, a later attempt added to
the first one's row, a timeout not overwritten by a late return, and pruning old rows.

Real database, real Worker threads (the same code runconsumer runs); the process-level
claims (kill -9, several workers) are in tests/processes/test_tasks.py. The backend is
configured by tests/tasks/conftest.py.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_sqlqueue.models import Message
from django_sqlqueue.task_models import TaskResultRecord
from django_sqlqueue.tasks.compat import TaskResultStatus
from tests.support.task_helpers import finished, first_delivery, result_statements, running_worker
from tests.support.taskapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_short_task_writes_its_result_in_one_statement() -> None:
    result = tasks.add.enqueue(2, 3)
    statements = result_statements(first_delivery(result))
    assert len(statements) == 1 and statements[0].lstrip().upper().startswith("INSERT"), statements
    done = tasks.add.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 5
    assert done.attempts == 1 and done.enqueued_at <= done.started_at <= done.finished_at


def test_a_failed_short_first_attempt_is_one_insert_and_a_later_one_adds_to_it() -> None:
    # By hand first (so the worker's own delivery is a first attempt too, and finds the row:
    # the lazy insert is merged into it rather than lost).
    result = tasks.flaky.enqueue("lazyflaky", 1)
    delivery = first_delivery(result)
    with pytest.raises(ValueError, match="planned failure"):
        result_statements(delivery)
    ready = tasks.flaky.get_result(result.id)
    assert ready.status == TaskResultStatus.READY and ready.attempts == 1 and len(ready.errors) == 1
    assert ready.started_at is not None and ready.finished_at is None
    with running_worker():
        done = finished(result)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.attempts == 2 and len(done.errors) == 1
    assert done.started_at == ready.started_at and done.return_value == "ok"


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
