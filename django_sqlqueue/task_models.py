"""Tables of the ``django.tasks`` backend and of recurring schedules.

- ``queue_task_results``: one row per task that a worker started: status, attempts
  (``worker_ids``), errors with tracebacks, return value. A task not started yet has no
  row: its state is its message in ``queue_messages`` (see ``tasks/lookup.py``).
- ``queue_schedules``: one row per recurring schedule: the last tick fired. A worker
  fires a tick in the transaction that moves ``last_tick`` while holding the row's lock,
  so each tick fires once however many workers run (``scheduler.py``).
"""

from __future__ import annotations

from django.db import models

from .rules.limits import KEY_LENGTH, MAX_MESSAGE_ID_LENGTH, TOPIC_COLUMN_LENGTH

#: Status values: those of ``django.tasks.TaskResultStatus``.
TASK_STATUSES = [("READY", "Ready"), ("RUNNING", "Running"), ("FAILED", "Failed"), ("SUCCESSFUL", "Successful")]


class TaskResultRecord(models.Model):
    """The result of one enqueued task, written by the worker that runs it."""

    #: The TaskResult id, which is also the id of the task's message in its topic.
    id = models.CharField(max_length=MAX_MESSAGE_ID_LENGTH, primary_key=True)
    backend = models.CharField(max_length=128)
    queue_name = models.CharField(max_length=128)
    topic = models.CharField(max_length=TOPIC_COLUMN_LENGTH)
    #: The ordering key the task was enqueued with ("" when none).
    key = models.CharField(max_length=KEY_LENGTH, blank=True, default="")
    task_path = models.CharField(max_length=255)
    status = models.CharField(max_length=16, choices=TASK_STATUSES)
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    return_value = models.JSONField(null=True, blank=True)
    #: ``[{"exception_class_path": ..., "traceback": ...}, ...]``, one per failed attempt.
    errors = models.JSONField(default=list)
    #: One entry per attempt: the worker process that ran it, as ``host:pid``
    #: (``tasks.execution.WORKER_ID``), also when ``runconsumer --name`` names the subscriber.
    worker_ids = models.JSONField(default=list)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "queue_task_results"
        indexes = [
            # The console's lists (failed tasks, newest first) and pruning of finished results.
            models.Index(fields=["status", "finished_at"], name="queue_task_status_finished"),
            models.Index(fields=["task_path", "enqueued_at"], name="queue_task_path_enqueued"),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} {self.id} {self.status}"


class ScheduleState(models.Model):
    """Bookkeeping of one recurring schedule: the last tick fired."""

    name = models.CharField(max_length=200, primary_key=True)
    #: The latest tick fired (None: the schedule was just registered, nothing fired yet).
    last_tick = models.DateTimeField(null=True, blank=True)
    #: When the row was created: a new schedule fires ticks after this moment only.
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "queue_schedules"

    def __str__(self) -> str:
        return f"{self.name} last tick {self.last_tick}"
