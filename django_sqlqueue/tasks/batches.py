"""Batches: a set of tasks with one completion callback, enqueued exactly once.

::

    from django_sqlqueue.tasks import batch

    with batch(on_finish=report_done, metadata={"import": 42}) as b:
        for row in rows:
            import_row.enqueue(row)
    b.id, b.total

    # or: enqueue_batch(report_done, [(import_row, (row,), {}) for row in rows], metadata=...)

When every member has finished for good -- succeeded, or failed after its last attempt,
was rejected or dead-lettered -- ``on_finish`` is enqueued once, with keyword arguments
``batch_id``, ``total``, ``succeeded``, ``failed`` and ``metadata``. An empty batch
enqueues it when its block closes.

**Writing.** The block is an ``atomic()`` block on the queue's database: its members'
messages, the batch row (``queue_task_batches``, inserted when the block closes, with
``total``) and, for an empty batch, the callback commit together with the caller's
transaction, or not at all. A member is a task of the batch's backend enqueued in the
block, on the block's thread; its payload carries the batch id (``"batch"``).

**Counting, exactly once.** A member is counted by the transaction that acks its message
or dead-letters it -- not by the run: :class:`BatchSettlement` is the task consumers'
``settlement`` (``db/store/settle.py``), which the worker calls with that transaction's
cursor. So a member's count commits with its ack or not at all: a worker killed before
the ack leaves it uncounted, and the redelivery -- run again, or found already finished
and not run -- counts it with its own ack; one killed after the COMMIT leaves it acked
and counted, never redelivered. The ack's transaction reports only delivery rows it moves
from unacked to acked, so a retried or late second ack of the same message counts
nothing. A member whose message is acked counts as succeeded unless its result row says
FAILED (a task that failed for good, whose dead letter was not written before a crash,
is found finished and acked on its redelivery). The increment that makes ``succeeded +
failed`` reach ``total`` enqueues the callback and sets ``finished_at`` in that same
transaction, under the batch row's lock; a finished batch counts nothing more. The
callback's id is ``<batch id>.done``: stored once whatever happens.

A member retried by hand from its dead letter (``queue_dlq replay``, the console) is not
counted again: it was counted as failed when it was dead-lettered.
"""

from __future__ import annotations

import inspect
import json
import logging
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, transaction
from django.utils import timezone

from ..conf import get_settings
from ..db.dialects import get_dialect
from ..db.store import task_batches
from ..task_models import TaskBatch
from .batch_members import BATCH_KEY, CALLBACK_KWARGS, Batch, BatchError, current

if TYPE_CHECKING:
    from ..db.store import FetchedMessage
    from .backend import SQLQueueBackend
    from .compat import Task

logger = logging.getLogger(__name__)


@contextmanager
def batch(on_finish: Task, *, metadata: Mapping[str, Any] | None = None) -> Iterator[Batch]:
    """Enqueue the tasks of the block as one batch; ``on_finish`` is enqueued once when all
    have finished for good (see the module docstring). Raises :class:`BatchError` for a
    callback that is not a task of a ``SQLQueueBackend`` or does not take the callback's
    keyword arguments, or for metadata that is not a JSON object."""
    backend = _callback_backend(on_finish)
    opened = Batch(id=uuid.uuid4().hex, backend=backend.alias, on_finish=on_finish.module_path)
    opened.metadata = _metadata(metadata)
    using = get_settings().DATABASE
    with transaction.atomic(using=using):
        token = current.set(opened)
        try:
            yield opened
        finally:
            current.reset(token)
        _close(opened, on_finish.queue_name, using)


def enqueue_batch(
    on_finish: Task,
    members: Iterable[tuple[Task, Sequence[Any], Mapping[str, Any]]],
    *,
    metadata: Mapping[str, Any] | None = None,
) -> Batch:
    """The function form of :func:`batch`: enqueue ``(task, args, kwargs)`` members as one batch."""
    with batch(on_finish, metadata=metadata) as opened:
        for task, args, kwargs in members:
            task.enqueue(*args, **kwargs)
    return opened


def _close(opened: Batch, queue: str, using: str) -> None:
    """The block ends: insert the batch row with its total; an empty batch is finished now."""
    TaskBatch.objects.using(using).create(
        id=opened.id,
        backend=opened.backend,
        on_finish=opened.on_finish,
        on_finish_queue=queue,
        total=opened.total,
        metadata=opened.metadata,
        created_at=timezone.now(),
    )
    if opened.total == 0:
        finished = task_batches.FinishedBatch(
            opened.id, opened.backend, opened.on_finish, queue, 0, 0, 0, opened.metadata
        )
        connection = transaction.get_connection(using)
        with connection.cursor() as cursor:
            finish(cursor, get_dialect(connection), finished)


def _callback_backend(on_finish: Any) -> SQLQueueBackend:
    """The backend of the callback task; BatchError unless it is a task of a ``SQLQueueBackend``
    that a worker would run, and takes the callback's keyword arguments."""
    from .backend import SQLQueueBackend
    from .compat import Task, task_backends
    from .trust import UntrustedTask, trusted_task

    if not isinstance(on_finish, Task):
        raise BatchError(f"on_finish must be a task (a function decorated with @task), not {on_finish!r}.")
    backend = task_backends[on_finish.backend]
    if not isinstance(backend, SQLQueueBackend):
        raise BatchError(
            f"on_finish {on_finish.module_path} uses backend {on_finish.backend!r}, which is not a SQLQueueBackend."
        )
    backend.ensure_configured()
    try:
        trusted_task(on_finish.module_path, alias=backend.alias, queues=backend.queues, queue_name=on_finish.queue_name)
    except UntrustedTask as exc:
        raise BatchError(f"on_finish: {exc}") from exc
    params: list[Any] = [object()] if on_finish.takes_context else []
    try:
        inspect.signature(on_finish.func).bind(*params, **dict.fromkeys(CALLBACK_KWARGS))
    except TypeError as exc:
        raise BatchError(
            f"on_finish {on_finish.module_path} must accept the keyword arguments {', '.join(CALLBACK_KWARGS)} "
            f"(or **kwargs): {exc}."
        ) from None
    return backend


def _metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """The batch's metadata as stored (a JSON object); BatchError if it cannot be one."""
    from .compat import normalize_json

    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise BatchError(f"metadata must be a mapping (a JSON object), not {type(metadata).__name__}.")
    try:
        value: dict[str, Any] = normalize_json(dict(metadata))  # type: ignore[assignment]
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise BatchError(f"metadata must be JSON-serialisable: {exc}.") from None
    return value


# -- the worker's side: counting members with their ack ---------------------------------------


class BatchSettlement:
    """The task consumers' ``settlement`` (``db/store/settle.py``): counts batch members in
    the transaction that acks or dead-letters them; see the module docstring."""

    def key_of(self, message: FetchedMessage) -> tuple[str, str] | None:
        """``(batch id, result id)`` of a batch member; None for any other message (one
        dict look-up: what a plain task pays). A replayed dead letter is not counted again."""
        payload = message.payload
        if type(payload) is not dict:
            return None
        batch_id = payload.get(BATCH_KEY)
        if batch_id is None or type(batch_id) is not str or "result_id" in payload:
            return None
        return batch_id, message.id

    def settled(self, cursor: Any, acked: Sequence[Any], dead: Sequence[Any]) -> None:
        """Count the members the transaction settles; finish the batches they complete."""
        from .compat import TaskResultStatus

        statuses = task_batches.result_statuses(cursor, [result_id for _, result_id in acked])
        counts: dict[str, tuple[int, int]] = {}
        for batch_id, result_id in acked:
            ok, ko = counts.get(batch_id, (0, 0))
            failed = statuses.get(result_id) == TaskResultStatus.FAILED.value
            counts[batch_id] = (ok, ko + 1) if failed else (ok + 1, ko)
        for batch_id, _ in dead:
            ok, ko = counts.get(batch_id, (0, 0))
            counts[batch_id] = (ok, ko + 1)
        dialect = get_dialect(cursor.db)
        for finished in task_batches.add_counts(cursor, counts):
            finish(cursor, dialect, finished)


def callback_id(batch_id: str) -> str:
    """The id of a batch's callback task (so it is stored once whatever happens)."""
    return f"{batch_id}.done"


def finish(cursor: Any, dialect: Any, finished: task_batches.FinishedBatch) -> None:
    """Enqueue the callback of a batch whose last member was just counted, and mark the batch
    finished, in the caller's transaction (which holds the batch row's lock).

    A callback the backend cannot enqueue any more (its task or queue removed since the
    batch was made) is logged as an error and the batch finished without it: raising here
    would fail the member's ack forever. A database error is raised: the whole ack rolls
    back and is retried.
    """
    from .compat import task_backends
    from .trust import trusted_task

    kwargs = {
        "batch_id": finished.id,
        "total": finished.total,
        "succeeded": finished.succeeded,
        "failed": finished.failed,
        "metadata": finished.metadata,
    }
    enqueued = ""
    try:
        backend: Any = task_backends[finished.backend]
        task = trusted_task(
            finished.on_finish, alias=backend.alias, queues=backend.queues, queue_name=finished.on_finish_queue
        )
        if task.queue_name != finished.on_finish_queue:
            task = task.using(queue_name=finished.on_finish_queue)
        enqueued = backend.enqueue_with(task, (), kwargs, id=callback_id(finished.id)).id
    except DatabaseError:
        raise
    except Exception:
        logger.exception(
            "batch %s finished (%d succeeded, %d failed) but its callback %s could not be enqueued",
            finished.id,
            finished.succeeded,
            finished.failed,
            finished.on_finish,
        )
    task_batches.mark_finished(cursor, dialect, finished.id, enqueued)
