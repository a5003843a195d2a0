"""Tasks of tests/tasks/test_cancel.py, outside the installed apps: imported by the tests."""

from __future__ import annotations

import time

from django_sqlqueue.exceptions import Retry
from django_sqlqueue.tasks import cancel_requested
from django_sqlqueue.tasks.compat import TaskContext
from tests.support.taskapp.tasks import record

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task  # type: ignore[no-redef]


@task()
def mark(label: str) -> str:
    """Records that it ran."""
    record(label)
    return label


@task()
def mark_slowly(label: str, seconds: float) -> str:
    """Records that it ran, then sleeps (a task in front of others in a worker's batch)."""
    record(label)
    time.sleep(seconds)
    return label


@task()
def retry_later(label: str, delay: float) -> None:
    """Records each attempt, asks to be retried after ``delay`` seconds."""
    record(label)
    raise Retry("later", delay=delay)


@task(takes_context=True)
def cooperative(context: TaskContext, label: str, limit: float) -> str:
    """Runs until a cancel is requested (polling its flag), at most ``limit`` seconds."""
    record(f"{label}:start")
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cancel_requested(context):
            record(f"{label}:cancel seen")
            return "stopped"
        time.sleep(0.02)
    return "not cancelled"
