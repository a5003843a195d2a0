"""tasks/marks.py: RUNNING written lazily, once a task has run past MARK_RUNNING_AFTER, in due order.

Real database, real Worker threads (the same code runconsumer runs); the process-level
claims (kill -9, several workers) are in tests/processes/test_tasks.py. The backend is
configured by tests/tasks/conftest.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from django_sqlqueue.models import Message
from django_sqlqueue.tasks.compat import TaskResultStatus
from tests.support.task_helpers import first_delivery, result_statements, task_settings, wait_until
from tests.support.taskapp import tasks
from tests.support.taskapp.models import Run
from tests.support.taskapp.settings_common import TASKS

TASKS_DEFAULT = TASKS["default"]
TASKS_OPTIONS = TASKS_DEFAULT["OPTIONS"]

pytestmark = pytest.mark.django_db(transaction=True)


def test_mark_running_after_0_writes_running_as_the_task_starts() -> None:
    options = {**TASKS_OPTIONS, "MARK_RUNNING_AFTER": 0}
    with task_settings(), override_settings(TASKS={"default": {**TASKS_DEFAULT, "OPTIONS": options}}):
        result = tasks.add.enqueue(2, 3)
        statements = result_statements(first_delivery(result))
        assert [s.lstrip().split()[0].upper() for s in statements] == ["INSERT", "UPDATE"]
        assert tasks.add.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def test_a_lazy_row_is_written_running_past_the_threshold_and_then_finished() -> None:
    import threading

    result = tasks.sleepy.enqueue("lazyrow", 1.5)
    delivery = first_delivery(result)

    def run() -> None:
        from django.db import connections

        try:
            result_statements(delivery)
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
