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
    #: Set by a cancel while the task runs: the task may check it (``tasks/cancellation.py``).
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "queue_task_results"
        indexes = [
            # The console's lists (failed tasks, newest first) and pruning of finished results.
            models.Index(fields=["status", "finished_at"], name="queue_task_status_finished"),
            models.Index(fields=["task_path", "enqueued_at"], name="queue_task_path_enqueued"),
            # The console's list of every result, newest first (keyset on enqueued_at, id).
            models.Index(fields=["enqueued_at", "id"], name="queue_task_enqueued"),
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


# -- issue 30: unique tasks, limits, batches ----------------------------------------------
# Each table below has one owner module (named in its docstring); nothing else writes it.


class TaskUniqueLock(models.Model):
    """A unique task's claim (``tasks/uniqueness.py``): at most one task per ``lock_key``.

    The primary key is the constraint that makes a duplicate ``enqueue()`` -- also one
    from a concurrent transaction -- find the existing task instead of writing a second.
    """

    #: sha256 hex of (backend alias, task path, the unique keys' values).
    lock_key = models.CharField(max_length=64, primary_key=True)
    result_id = models.CharField(max_length=MAX_MESSAGE_ID_LENGTH)
    task_path = models.CharField(max_length=255)
    created_at = models.DateTimeField()
    #: When the claim lapses whatever the task's state (None: only the states end it).
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "queue_task_unique"

    def __str__(self) -> str:
        return f"{self.task_path} {self.lock_key[:12]} -> {self.result_id}"


class RateLimitState(models.Model):
    """One rate limit's state shared by every worker (``worker/limits`` owns it)."""

    #: The limit's name (task path or consumer, plus the per-key value when keyed).
    name = models.CharField(max_length=255, primary_key=True)
    #: The algorithm's state (GCRA: the theoretical arrival time, epoch seconds).
    value = models.FloatField(default=0)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "queue_rate_limits"

    def __str__(self) -> str:
        return f"{self.name} {self.value}"


class ConcurrencySlot(models.Model):
    """One of the ``n`` slots of a concurrency limit (``worker/limits`` owns it)."""

    pk = models.CompositePrimaryKey("name", "slot")
    #: The limit's name (task path plus the per-key value).
    name = models.CharField(max_length=255)
    slot = models.PositiveIntegerField()
    #: Who holds it ("" when free): the delivery (message id and attempt).
    holder = models.CharField(max_length=255, blank=True, default="")
    #: A holder that died lets the slot go at this time.
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "queue_concurrency_slots"

    def __str__(self) -> str:
        return f"{self.name}[{self.slot}] {self.holder or 'free'}"


class TaskBatch(models.Model):
    """A batch of tasks with one completion callback (``tasks/batches.py`` owns it).

    Each member's final outcome increments ``succeeded`` or ``failed`` in the transaction
    that acks it; the increment that completes the batch enqueues ``on_finish`` in that
    same transaction, so the callback is enqueued exactly once.
    """

    id = models.CharField(max_length=MAX_MESSAGE_ID_LENGTH, primary_key=True)
    backend = models.CharField(max_length=128)
    #: The callback task's module path and queue.
    on_finish = models.CharField(max_length=255)
    on_finish_queue = models.CharField(max_length=128, blank=True, default="")
    #: Members enqueued (set when the batch block closes).
    total = models.PositiveIntegerField(default=0)
    succeeded = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    #: The batch's own data, handed to the callback.
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    #: The callback's TaskResult id, once enqueued.
    callback_id = models.CharField(max_length=MAX_MESSAGE_ID_LENGTH, blank=True, default="")

    class Meta:
        db_table = "queue_task_batches"

    def __str__(self) -> str:
        return f"batch {self.id} {self.succeeded + self.failed}/{self.total}"
