"""task_models.py: the tables of the tasks backend (``queue_task_results``) and of recurring
schedules (``queue_schedules``), as the database holds them."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.utils import timezone

from django_sqlqueue.rules.limits import MAX_MESSAGE_ID_LENGTH, TOPIC_COLUMN_LENGTH
from django_sqlqueue.task_models import TASK_STATUSES, ScheduleState, TaskResultRecord

pytestmark = pytest.mark.django_db


def test_a_result_row_holds_the_longest_id_and_topic_and_starts_with_empty_json() -> None:
    result_id, topic = "r" * MAX_MESSAGE_ID_LENGTH, "t" * TOPIC_COLUMN_LENGTH
    TaskResultRecord.objects.create(
        id=result_id, backend="default", queue_name="default", topic=topic, task_path="app.tasks.add", status="READY"
    )
    row = TaskResultRecord.objects.get(id=result_id)
    assert (row.topic, row.args, row.kwargs, row.errors, row.worker_ids) == (topic, [], {}, [], [])
    assert row.updated_at is not None and row.return_value is None
    assert str(row) == f"app.tasks.add {result_id} READY"


def test_statuses_are_those_of_django_tasks() -> None:
    assert [value for value, _ in TASK_STATUSES] == ["READY", "RUNNING", "FAILED", "SUCCESSFUL"]
    row = TaskResultRecord(id="x", backend="default", queue_name="q", topic="t", task_path="p", status="DONE")
    with pytest.raises(ValidationError, match="DONE"):
        row.full_clean()


def test_the_console_and_pruning_read_the_results_through_their_indexes() -> None:
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, TaskResultRecord._meta.db_table)
    assert constraints["queue_task_status_finished"]["columns"] == ["status", "finished_at"]
    assert constraints["queue_task_path_enqueued"]["columns"] == ["task_path", "enqueued_at"]


def test_a_schedule_row_is_its_name_and_last_tick() -> None:
    now = timezone.now()
    ScheduleState.objects.create(name="nightly-report", created_at=now, updated_at=now)
    state = ScheduleState.objects.get(pk="nightly-report")
    assert state.last_tick is None and str(state) == "nightly-report last tick None"
    assert ScheduleState._meta.db_table == "queue_schedules"
