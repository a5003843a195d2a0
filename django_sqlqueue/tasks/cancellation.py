"""Cancelling tasks: :func:`cancel` from code, :func:`cancel_requested` for a running task.

::

    from django_sqlqueue.tasks import CancelOutcome, cancel, cancel_requested

    result = export_report.enqueue(month="2026-01")
    cancel(result, by="alice")           # CancelOutcome.CANCELLED: it never runs

    @task(takes_context=True)
    def export_report(context, month):
        for chunk in chunks(month):
            if cancel_requested(context):  # a cancel while it runs: stop cleanly
                return "stopped"
            write(chunk)

The decision (cancelled / requested / finished) is :func:`django_sqlqueue.ops.task_cancel.cancel_task`'s,
shared with the console and ``manage.py queue_cancel_task``; its docstring says why it is
race-free. The worker's side -- a cancelled task is not run -- is ``tasks/precheck.py``.
"""

from __future__ import annotations

from django.db import transaction

from ..conf import get_settings
from ..db.conn import on_own_connection
from ..ops.task_cancel import CancelOutcome, UnknownTask, cancel_task, check_result_id
from ..task_models import TaskResultRecord
from .compat import TaskContext, TaskResult

__all__ = ["CancelOutcome", "UnknownTask", "cancel", "cancel_requested"]


def cancel(result: TaskResult | str, *, by: str = "") -> CancelOutcome:
    """Cancel a task, given its ``TaskResult`` or result id; ``by`` says who (recorded).

    Returns ``CANCELLED`` (it had not started: it never runs, its result is FAILED with
    ``TaskCancelled``), ``REQUESTED`` (it is running: :func:`cancel_requested` is now True
    for it) or ``FINISHED`` (nothing changed). Raises :class:`UnknownTask` for an id no task
    has, :class:`~django_sqlqueue.ops.OperationError` for a malformed one (nothing written),
    or when called inside ``transaction.atomic()`` on the queue database.
    """
    result_id = result.id if isinstance(result, TaskResult) else result
    outcome = cancel_task(result_id, by=by)
    if outcome is CancelOutcome.UNKNOWN:
        raise UnknownTask(
            f"no task has the result id {result_id!r}: never enqueued on a django_sqlqueue tasks backend "
            "of settings.TASKS, or its enqueue() did not commit, or its result was pruned."
        )
    return outcome


def cancel_requested(task: TaskContext | TaskResult | str) -> bool:
    """Whether a cancel was asked for this task (a running task polls it and may return early).

    ``task``: the task's ``context`` (``@task(takes_context=True)``), its ``TaskResult`` or
    result id. One primary-key read. Inside an atomic queue's transaction the read runs on
    a connection of its own: the transaction's snapshot would not see a later cancel.
    """
    if isinstance(task, TaskContext):
        result_id = task.task_result.id
    elif isinstance(task, TaskResult):
        result_id = task.id
    else:
        result_id = check_result_id(task)
    using = get_settings().DATABASE

    def read() -> bool:
        return TaskResultRecord.objects.using(using).filter(id=result_id, cancel_requested_at__isnull=False).exists()

    if transaction.get_connection(using).in_atomic_block:
        return on_own_connection(read)
    return read()
