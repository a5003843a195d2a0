"""management/commands/queue_prune_task_results.py: which backends it prunes, --older-than, and
what it refuses. Pruning by each backend's RESULT_RETENTION: tests/tasks/test_results.py."""

from __future__ import annotations

import datetime as dt
import io

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from django_sqlqueue.management.commands import queue_prune_task_results
from django_sqlqueue.task_models import TaskResultRecord
from tests.support.task_helpers import task_settings

pytestmark = pytest.mark.django_db


def prune(*args: str) -> str:
    out = io.StringIO()
    call_command(queue_prune_task_results.Command(), *args, stdout=out)
    return out.getvalue().strip()


def row(result_id: str, status: str, finished_ago: float | None) -> None:
    finished = None if finished_ago is None else timezone.now() - dt.timedelta(seconds=finished_ago)
    TaskResultRecord.objects.create(
        id=result_id,
        backend="default",
        queue_name="default",
        topic="tasks.default",
        task_path="tests.support.taskapp.tasks.add",
        status=status,
        finished_at=finished,
    )


def test_older_than_overrides_the_retention_and_unfinished_tasks_stay() -> None:
    row("old-ok", "SUCCESSFUL", 7200)
    row("old-failed", "FAILED", 7200)
    row("recent", "SUCCESSFUL", 60)
    row("running", "RUNNING", None)
    with task_settings():
        assert prune("--older-than", "3600", "--dry-run") == (
            "default: would delete 2 finished task result(s) older than 3600s"
        )
        assert TaskResultRecord.objects.count() == 4
        assert prune("--older-than", "3600", "--backend", "default") == (
            "default: deleted 2 finished task result(s) older than 3600s"
        )
    assert sorted(TaskResultRecord.objects.values_list("id", flat=True)) == ["recent", "running"]


def test_it_refuses_without_a_backend_an_unknown_alias_or_a_negative_age() -> None:
    with override_settings(TASKS={}):
        with pytest.raises(
            CommandError, match=r"settings\.TASKS configures no django_sqlqueue\.tasks\.SQLQueueBackend"
        ):
            prune()
    with task_settings():
        with pytest.raises(CommandError, match=r"no SQLQueueBackend alias 'jobs' \(configured: default\)"):
            prune("--backend", "jobs")
        with pytest.raises(
            CommandError, match=r"argument --older-than: must be a number from 0 to 3153600000, got '-1'"
        ):
            prune("--older-than", "-1")
