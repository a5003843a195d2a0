"""Tasks of tests/tasks/test_trust.py, in a module outside the installed apps (imported by the test)."""

from __future__ import annotations

from tests.support.taskapp.tasks import record

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task  # type: ignore[no-redef]


@task()
def outside_add(a: int, b: int) -> int:
    """A task of backend "default" declared outside the installed apps: runs once imported."""
    record("outside")
    return a + b


def elsewhere(label: str) -> None:
    """Made a task of backend "elsewhere" by the tests (which configure that backend first)."""
    record(label)
