"""Tasks of tests/tasks/test_attempts.py (per-task attempts), outside the installed apps: imported by the test."""

from __future__ import annotations

import threading

from django_sqlqueue.tasks import task_max_attempts, task_timeout
from tests.support.taskapp.tasks import record

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task  # type: ignore[no-redef]

#: Set by the tests to let a hung task return.
RELEASE = threading.Event()


@task()
@task_max_attempts(2)
def fails_within_two(label: str) -> None:
    """Always fails; 2 attempts of its own (the backend has 3)."""
    record(label)
    raise RuntimeError(f"{label}: always fails")


@task_max_attempts(1)
@task()
def fails_once_marked_on_top(label: str) -> None:
    """Always fails; 1 attempt, marked on top of ``@task``."""
    record(label)
    raise RuntimeError(f"{label}: always fails")


@task()
@task_max_attempts(1)
@task_timeout(0.3)
def hangs_once(label: str) -> None:
    """Hangs past its timeout on its only attempt."""
    record(label)
    RELEASE.wait(20)


def greedy(label: str) -> None:
    """Made a task asking for more attempts than the backend's by a test."""
    record(label)
