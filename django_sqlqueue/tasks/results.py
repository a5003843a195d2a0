"""Task results: the rows written by the worker that runs a task (read by ``tasks/lookup.py``).

A task's row in ``queue_task_results`` exists once a worker started it: :func:`begin`
records each attempt, :func:`finish` its outcome, :func:`prune` deletes old finished
rows. :func:`to_result` turns a row into the ``TaskResult`` that ``get_result()`` and
the signals hand out.

Rows are written outside the task's own transaction, on the queue's database
(``SQLQUEUE["DATABASE"]``), each in one autocommitted statement that locks only that
row, except the rare locked read-then-write of :func:`begin` for a task delivered again.

**Lazy RUNNING** (``OPTIONS["MARK_RUNNING_AFTER"]``, ``tasks/marks.py``): a task's first
attempt need not write its row when it starts. :func:`begin` with ``lazy=True`` returns
the row unsaved (``record._state.adding``); the row is inserted RUNNING only if the task
is still running after the threshold, and otherwise :func:`finish` inserts it once, in
its final state, with the ``started_at`` the attempt began at. That is one statement per
short task instead of a write at each end.
"""

from __future__ import annotations

import datetime as dt
import logging
import traceback
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from ..conf import get_settings
from ..task_models import TaskResultRecord
from .compat import Task, TaskError, TaskResult, TaskResultStatus, set_field

logger = logging.getLogger(__name__)

FINISHED = (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
#: Recorded in ``worker_ids`` for an attempt whose worker died before its row was written
#: (lazy RUNNING: killed within ``MARK_RUNNING_AFTER`` of its start).
UNRECORDED_WORKER = "unrecorded"


def _errors(raw: list[dict[str, str]]) -> list[TaskError]:
    return [TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"]) for e in raw]


def to_result(record: TaskResultRecord, task: Task) -> TaskResult:
    """Return the ``TaskResult`` of a result row."""
    result: TaskResult = TaskResult(
        task=task,
        id=record.id,
        status=TaskResultStatus(record.status),
        enqueued_at=record.enqueued_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        last_attempted_at=record.last_attempted_at,
        args=record.args,
        kwargs=record.kwargs,
        backend=record.backend,
        errors=_errors(record.errors),
        worker_ids=list(record.worker_ids),
    )
    if record.status == TaskResultStatus.SUCCESSFUL:
        set_field(result, "_return_value", record.return_value)
    return result


# -- written by the worker ---------------------------------------------------------------------


def begin(
    *,
    backend_alias: str,
    result_id: str,
    payload: dict[str, Any],
    topic: str,
    key: str,
    enqueued_at: dt.datetime,
    worker_id: str,
    first_attempt: bool = False,
    earlier_attempts: int = 0,
    lazy: bool = False,
) -> TaskResultRecord | None:
    """Record an attempt starting (RUNNING, one more worker id); None if already finished.

    A finished task delivered again (its worker died between writing the result and
    acking the message) is not run again. ``first_attempt`` with ``lazy``: write nothing,
    return the row unsaved (see the module docstring). ``earlier_attempts``: deliveries
    of the message before this one; those that left no row (their worker died before
    writing it) are counted in ``worker_ids`` as :data:`UNRECORDED_WORKER`.
    """
    using = get_settings().DATABASE
    now = timezone.now()
    if first_attempt:
        # The common case: no row can exist yet unless an earlier delivery got as far as
        # writing it (then the INSERT fails and the locked path below runs). One INSERT in
        # autocommit, no transaction around it: a failed INSERT changes nothing.
        record = _new_record(backend_alias, result_id, payload, topic, key, enqueued_at, now, [worker_id])
        if lazy:
            return record
        if insert(record):
            return record
    with transaction.atomic(using=using):
        found = TaskResultRecord.objects.using(using).select_for_update().filter(id=result_id).first()
        if found is None:
            # Later deliveries of a task whose earlier ones died before writing its row.
            worker_ids = [*[UNRECORDED_WORKER] * earlier_attempts, worker_id]
            record = _new_record(backend_alias, result_id, payload, topic, key, enqueued_at, now, worker_ids)
            record.save(using=using, force_insert=True)
            return record
        if found.status in FINISHED:
            return None
        found.status = TaskResultStatus.RUNNING
        found.last_attempted_at = now
        found.worker_ids = [*found.worker_ids, worker_id]
        found.save(using=using, update_fields=["status", "last_attempted_at", "worker_ids", "updated_at"])
    return found


def _new_record(
    backend_alias: str,
    result_id: str,
    payload: dict[str, Any],
    topic: str,
    key: str,
    enqueued_at: dt.datetime,
    now: dt.datetime,
    worker_ids: list[str],
) -> TaskResultRecord:
    """The unsaved RUNNING row of an attempt starting ``now``."""
    return TaskResultRecord(
        id=result_id,
        backend=backend_alias,
        queue_name=payload.get("queue_name", ""),
        topic=topic,
        key=key,
        task_path=payload["task"],
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        enqueued_at=enqueued_at,
        started_at=now,
        last_attempted_at=now,
        status=TaskResultStatus.RUNNING,
        errors=[],
        worker_ids=worker_ids,
    )


def insert(record: TaskResultRecord) -> bool:
    """Insert an unsaved row as it is, in one autocommitted statement; False if a row with
    its id exists already (nothing written)."""
    using = get_settings().DATABASE
    try:
        if transaction.get_connection(using).in_atomic_block:
            with transaction.atomic(using=using):  # a savepoint: a failed INSERT leaves the caller's intact
                record.save(using=using, force_insert=True)
        else:
            record.save(using=using, force_insert=True)
    except IntegrityError:
        return False
    return True


def is_written(record: TaskResultRecord) -> bool:
    """Whether the row is in the database (False: a lazy attempt's row, not inserted yet)."""
    return not record._state.adding


def finish(record: TaskResultRecord, *, value: Any = None, error: BaseException | None = None, final: bool) -> bool:
    """Record the attempt's outcome: SUCCESSFUL with ``value``, or an error (FAILED if
    ``final``, else READY: it waits for its retry). One statement.

    Only over its own attempt: False (nothing written) when the row moved on meanwhile --
    the attempt timed out (:func:`time_out`) or a later delivery began. A lazy attempt's
    row that was never written is inserted in its final state (or merged into a row with
    its id that appeared meanwhile: :func:`_merge`).
    """
    using = get_settings().DATABASE
    now = timezone.now()
    update: dict[str, Any] = {"updated_at": now}
    if error is None:
        update |= {"status": TaskResultStatus.SUCCESSFUL, "return_value": value, "finished_at": now}
        record.status, record.return_value, record.finished_at = update["status"], value, now
    else:
        entry = {
            "exception_class_path": f"{type(error).__module__}.{type(error).__qualname__}",
            # A timed-out attempt's error was never raised: its message is its traceback.
            "traceback": "".join(traceback.format_exception(type(error), error, error.__traceback__)),
        }
        record.errors = [*record.errors, entry]
        record.status = TaskResultStatus.FAILED if final else TaskResultStatus.READY
        record.finished_at = now if final else None
        update |= {"status": record.status, "errors": record.errors, "finished_at": record.finished_at}
    if not is_written(record):
        return insert(record) or _merge(record)
    own_attempt = {"status": TaskResultStatus.RUNNING, "last_attempted_at": record.last_attempted_at}
    return TaskResultRecord.objects.using(using).filter(id=record.id, **own_attempt).update(**update) == 1


def _merge(record: TaskResultRecord) -> bool:
    """A lazy attempt's final row could not be inserted: a row with its id exists. Add the
    attempt to it (worker id, error, outcome) under its lock; False, keeping the row as it
    is, when that row is finished already (an id enqueued again after its message was
    garbage-collected: the earlier task's result stands).
    """
    using = get_settings().DATABASE
    with transaction.atomic(using=using):
        found = TaskResultRecord.objects.using(using).select_for_update().filter(id=record.id).first()
        if found is None:  # deleted meanwhile (pruned): the attempt's row alone
            record.save(using=using, force_insert=True)
            return True
        if found.status in FINISHED:
            logger.warning("a task's result row is finished already; this attempt is not recorded id=%s", record.id)
            return False
        record.worker_ids = [*found.worker_ids, *record.worker_ids]
        record.errors = [*found.errors, *record.errors]
        record.started_at = found.started_at
        record.cancel_requested_at = found.cancel_requested_at  # a cancel's flag (ops/task_cancel.py) stays
        record.save(using=using, force_update=True)
    return True


def record_refusal(
    *,
    backend_alias: str,
    result_id: str,
    replayed: bool,
    payload: dict[str, Any],
    topic: str,
    key: str,
    enqueued_at: dt.datetime,
    worker_id: str,
    attempt: int,
    error: BaseException,
) -> bool:
    """Record a task message the backend refused (``trust.py``): its row FAILED with ``error``.

    ``payload``: the row's fields as the refusal found them, made storable by the caller.
    A replayed message (``replayed``: its ``result_id`` is not its own id) is recorded
    only on a row of its own task path -- a forged ``result_id`` cannot fail another
    task's result. False when nothing was written (that, or the row is finished already).
    """
    using = get_settings().DATABASE
    if replayed:
        own = TaskResultRecord.objects.using(using).filter(
            id=result_id, backend=backend_alias, task_path=payload["task"]
        )
        if not own.exists():
            return False
    record = begin(
        backend_alias=backend_alias,
        result_id=result_id,
        payload=payload,
        topic=topic,
        key=key,
        enqueued_at=enqueued_at,
        worker_id=worker_id,
        first_attempt=attempt == 1 and not replayed,
        earlier_attempts=0 if replayed else attempt - 1,
        lazy=True,  # a first attempt: one INSERT of the final row
    )
    return record is not None and finish(record, error=error, final=True)


def time_out(result_id: str, *, error: BaseException, final: bool) -> TaskResultRecord | None:
    """Record a timed-out attempt (the watchdog gave it up): an entry in ``errors``,
    FAILED if ``final`` else READY. None when the row is not RUNNING (already finished)."""
    using = get_settings().DATABASE
    with transaction.atomic(using=using):
        record = (
            TaskResultRecord.objects.using(using)
            .select_for_update()
            .filter(id=result_id, status=TaskResultStatus.RUNNING)
            .first()
        )
        if record is None:
            return None
        if not finish(record, error=error, final=final):
            return None
    return record


def prune(*, older_than: float, backend: str | None = None, dry_run: bool = False) -> int:
    """Delete finished results (SUCCESSFUL/FAILED) that finished more than ``older_than`` seconds ago."""
    using = get_settings().DATABASE
    cutoff = timezone.now() - dt.timedelta(seconds=older_than)
    qs = TaskResultRecord.objects.using(using).filter(
        Q(status__in=[s.value for s in FINISHED]) & Q(finished_at__lt=cutoff)
    )
    if backend is not None:
        qs = qs.filter(backend=backend)
    if dry_run:
        return qs.count()
    deleted, _ = qs.delete()
    return deleted


def reset_for_replay(result_id: str, *, using: str) -> bool:
    """Set the result row ``result_id`` back to READY for a replayed task; False if it is gone.

    Locks the row (``SELECT ... FOR UPDATE``) in the caller's transaction -- the replay's,
    which also deletes the dead letter -- so a replay that rolls back leaves it FAILED, and
    a worker finishing an earlier attempt of the task waits for the replay's commit.
    """
    record = TaskResultRecord.objects.using(using).select_for_update().filter(id=result_id).first()
    if record is None:
        return False
    record.status = "READY"
    record.finished_at = None
    record.save(using=using, update_fields=["status", "finished_at", "updated_at"])
    return True
