"""Cancel a task by its result id: what the console, ``manage.py queue_cancel_task`` and
``django_sqlqueue.tasks.cancel`` share.

:func:`cancel_task` returns a :class:`CancelOutcome`:

- ``CANCELLED``: the task had not started (waiting, scheduled with ``run_after``, waiting
  for a retry): it never runs. Its result is FAILED, with an ``errors`` entry
  ``django_sqlqueue.exceptions.TaskCancelled`` saying who cancelled it and when. Its message
  stays in the log until a worker of the backend's group reaches it: the worker finds the
  FAILED row, does not run the task and acks the message (not a dead letter: nothing
  failed, and a replay of dead letters must not run a cancelled task), so the queue
  passes it and GC collects it.
- ``REQUESTED``: the task is running (or a worker has it in hand and is about to run it):
  its row's ``cancel_requested_at`` is set; the task may poll it
  (``django_sqlqueue.tasks.cancel_requested``) and return early.
- ``FINISHED``: it had finished already (SUCCESSFUL or FAILED): nothing is changed.
- ``UNKNOWN``: no task of a configured backend has this id: nothing is written.

**How the outcome is decided -- by writes on the result row, never read-then-write.**
Each step below is one autocommitted statement (so :func:`cancel_task` refuses to run
inside a transaction on the queue database: its row must be visible to the workers at once).

1. No row yet: INSERT one "cancel pending" (READY, no ``started_at``,
   ``cancel_requested_at`` set). The primary key decides against a worker inserting its
   own row: if the INSERT fails, a row exists and we start over from it.
2. With the row READY (pending, or waiting for a retry): read the message's delivery for
   the backend's consumer group (``queue_delivery_state``).
3. Not in flight: compare-and-set ``READY -> FAILED`` (TaskCancelled): ``CANCELLED``.
   In flight (a worker holds the message): compare-and-set ``READY -> RUNNING`` with
   the flag set: ``REQUESTED``. A RUNNING row: compare-and-set the flag: ``REQUESTED``.
   A compare-and-set that finds the row changed starts over from what is there now.

Why that is exact. Every worker path but one writes the row before running the task,
under its lock (``results.begin``: ``SELECT ... FOR UPDATE``, FINISHED -> not run, else
UPDATE RUNNING): it and the cancel's compare-and-set are serialized on the row, the
second one sees the first one's state (a worker does not run a FAILED task; a cancel
reports REQUESTED over RUNNING). The exception is a FIRST attempt, whose row is written
lazily (``tasks/marks.py``), after the task started. Such a worker looked for rows of its
fetched batch once before running it (``tasks.precheck.check_batch``, one
``SELECT id ... WHERE id IN (...)``) and found none -- else it takes the locked path. So
it made that check before our step 1; and its delivery was recorded IN_FLIGHT and
committed by its fetch (``store.mark_delivered``) before the check. Our step 2 comes
after step 1, hence after the delivery was committed: it sees it IN_FLIGHT -- or moved
on, which the worker does only after writing the attempt's outcome into the row (ack,
nack), which the compare-and-set sees. So step 3 never calls CANCELLED a task that a
worker may run lazily, and a worker never runs a task whose cancel said CANCELLED.
A worker holding the message whose handler has not begun yet counts as running: the
task runs, with its flag set. A delivery left IN_FLIGHT by a worker that died counts so
too until it is redelivered (that attempt then runs with the flag set).
"""

from __future__ import annotations

import datetime as dt
import enum
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from ..conf import get_settings
from ..exceptions import InvalidMessage, TaskCancelled
from ..models import DeliveryState, Message, Topic
from ..rules import dlq
from ..rules.validation import validate_message_id
from ..task_models import TaskResultRecord
from .base import NotFound, OperationError

logger = logging.getLogger(__name__)

#: ``settings.TASKS[alias]["BACKEND"]`` of this project's backend (``tasks/checks.py``).
BACKEND_PATH = "django_sqlqueue.tasks.SQLQueueBackend"
#: What a cancelled task's ``errors`` entry names.
CANCELLED_ERROR = f"{TaskCancelled.__module__}.{TaskCancelled.__qualname__}"
#: Compare-and-set rounds before giving up (each lost round means the row moved on; a
#: task cannot move on more than a few times while we look).
_ROUNDS = 10


class CancelOutcome(enum.Enum):
    """What :func:`cancel_task` did (see the module docstring)."""

    #: The task had not started: it never runs; its result is FAILED with ``TaskCancelled``.
    CANCELLED = "cancelled"
    #: The task is running (or a worker has it in hand): its cancel flag is set.
    REQUESTED = "requested"
    #: The task had finished already: nothing changed.
    FINISHED = "finished"
    #: No task of a configured backend has this id: nothing written.
    UNKNOWN = "unknown"


class UnknownTask(NotFound):
    """No task of a configured ``django_sqlqueue`` tasks backend has this result id."""


@dataclass(frozen=True)
class _Backend:
    alias: str
    topic_prefix: str
    group: str
    queues: tuple[str, ...]


def cancel_task(result_id: str, *, by: str = "") -> CancelOutcome:
    """Cancel the task whose result id is ``result_id``; ``by`` names who (for the error and the log).

    Raise :class:`OperationError` for a malformed id (nothing written) or when called
    inside a transaction on the queue database.
    """
    result_id = check_result_id(result_id)
    if not isinstance(by, str) or len(by) > 200:
        raise OperationError(f"by must be a str of at most 200 characters, got {by!r:.60}.")
    using = get_settings().DATABASE
    if transaction.get_connection(using).in_atomic_block:
        raise OperationError(
            "cancel_task() must run outside transaction.atomic() on the queue database: each of its "
            "writes must be visible to the workers at once (see django_sqlqueue/ops/task_cancel.py)."
        )
    rows = TaskResultRecord.objects.using(using)
    pending = False
    for _ in range(_ROUNDS):
        record = rows.filter(id=result_id).first()
        if record is None:
            outcome = _insert_pending(result_id, by, using)
            if outcome is not None:
                return outcome
            pending = True
            continue  # inserted (or a row appeared meanwhile): decide over the row
        if record.status in ("SUCCESSFUL", "FAILED"):
            if is_cancelled(record.errors):
                return CancelOutcome.CANCELLED
            if pending and record.cancel_requested_at is not None:
                # The task was running (lazily, without a row): it saw our pending row's flag
                # and finished before this call's next look. The request reached it.
                return CancelOutcome.REQUESTED
            return CancelOutcome.FINISHED
        now = timezone.now()
        mine = rows.filter(id=result_id, status=record.status)
        if record.status == "RUNNING":
            if mine.update(cancel_requested_at=record.cancel_requested_at or now, updated_at=now):
                logger.info("cancel requested for a running task id=%s by=%s", result_id, by or "-")
                return CancelOutcome.REQUESTED
            continue
        # READY: waiting (our pending row), or waiting for a retry. Read AFTER the row exists.
        if _in_flight(record, using):
            # A worker has the message: it runs the task (perhaps lazily, without a row yet).
            if mine.update(
                status="RUNNING", cancel_requested_at=now, started_at=record.started_at or now, updated_at=now
            ):
                logger.info("cancel requested for a task a worker holds id=%s by=%s", result_id, by or "-")
                return CancelOutcome.REQUESTED
            continue
        entry = {"exception_class_path": CANCELLED_ERROR, "traceback": cancelled_message(by, now)}
        if mine.update(
            status="FAILED",
            errors=[*record.errors, entry],
            finished_at=now,
            cancel_requested_at=record.cancel_requested_at or now,
            updated_at=now,
        ):
            logger.info("task cancelled before it ran id=%s task=%s by=%s", result_id, record.task_path, by or "-")
            return CancelOutcome.CANCELLED
    raise OperationError(f"task {result_id!r} kept changing state while being cancelled; try again.")


def check_result_id(result_id: Any) -> str:
    """Return ``result_id`` if it can be a task's result id; raise :class:`OperationError` otherwise."""
    if not isinstance(result_id, str):
        raise OperationError(f"a task result id must be a str, got {type(result_id).__name__}.")
    try:
        return validate_message_id(result_id)
    except InvalidMessage as exc:
        raise OperationError(f"not a task result id: {exc}") from None


def is_cancelled(errors: list[dict[str, str]]) -> bool:
    """Whether a finished row's errors say it was cancelled (its last entry is ``TaskCancelled``)."""
    return bool(errors) and errors[-1].get("exception_class_path") == CANCELLED_ERROR


def cancelled_message(by: str, when: dt.datetime) -> str:
    """The text of a cancelled task's error (its ``traceback`` field: it was never raised)."""
    who = f" by {by}" if by else ""
    return f"{CANCELLED_ERROR}: cancelled{who} at {when.isoformat(timespec='seconds')} before it ran"


# -- the steps ------------------------------------------------------------------------------


def _insert_pending(result_id: str, by: str, using: str) -> CancelOutcome | None:
    """Step 1: insert the "cancel pending" row of a task that has none. None: the row now
    exists (ours, or one a worker inserted first); else the outcome without a row."""
    found = _find_message(result_id, using)
    if found is None:
        return CancelOutcome.FINISHED if _dead_lettered(result_id, using) else CancelOutcome.UNKNOWN
    backend, message = found
    if _delivery(backend.group, message, using) == "acked":
        return CancelOutcome.FINISHED  # its row was pruned: nothing left to cancel
    payload = message.payload if isinstance(message.payload, dict) else {}
    now = timezone.now()
    record = TaskResultRecord(
        id=result_id,
        backend=backend.alias,
        queue_name=message.topic[len(backend.topic_prefix) :],
        topic=message.topic,
        key=message.key,
        task_path=str(payload.get("task", ""))[:255],
        status="READY",
        args=payload.get("args", []) if isinstance(payload.get("args"), list) else [],
        kwargs=payload.get("kwargs", {}) if isinstance(payload.get("kwargs"), dict) else {},
        enqueued_at=message.created_at,
        errors=[],
        worker_ids=[],
        cancel_requested_at=now,
    )
    try:
        record.save(using=using, force_insert=True)
    except IntegrityError:
        pass  # a worker's row came first: decide over it
    return None


def _in_flight(record: TaskResultRecord, using: str) -> bool:
    """Step 2: whether a worker of the task's backend holds its message now."""
    backend = _backends().get(record.backend)
    if backend is None:
        return False  # a backend no longer configured: no worker runs it
    message = Message.objects.using(using).filter(topic=record.topic, id=record.id).first()
    # A replayed task's message has an id of its own: its worker takes the locked path.
    return message is not None and _delivery(backend.group, message, using) == "in flight"


def _delivery(group: str, message: Message, using: str) -> str:
    """ "none", "acked", "in flight" or "waiting" (scheduled, handed back, waiting for a retry)."""
    if message.offset is None:
        return "none"  # not sequenced yet: no worker can have fetched it
    row = (
        DeliveryState.objects.using(using)
        .filter(consumer_group=group, topic=message.topic, partition=message.partition, message_offset=message.offset)
        .values_list("acked", "status")
        .first()
    )
    if row is None:
        return "none"
    acked, status = row
    if acked:
        return "acked"
    return "in flight" if status == DeliveryState.Status.IN_FLIGHT else "waiting"


def _find_message(result_id: str, using: str) -> tuple[_Backend, Message] | None:
    """The task message ``result_id`` in a topic of a configured backend (the unique
    (topic, id) index: one look-up per candidate topic)."""
    backends = list(_backends().values())
    if not backends:
        return None
    suffix = get_settings().DLQ_SUFFIX
    topics = {b.topic_prefix + q for b in backends for q in b.queues}
    # Queues not listed in TASKS (QUEUES empty: any name) are found among the registered topics.
    registered = Topic.objects.using(using).values_list("topic", flat=True)
    topics |= {t for t in registered if any(t.startswith(b.topic_prefix) for b in backends) and not t.endswith(suffix)}
    message = Message.objects.using(using).filter(topic__in=sorted(topics), id=result_id).first()
    if message is None:
        return None
    owner = max((b for b in backends if message.topic.startswith(b.topic_prefix)), key=lambda b: len(b.topic_prefix))
    return owner, message


def _dead_lettered(result_id: str, using: str) -> bool:
    """Whether the task's message went to a dead-letter topic (it failed, its row aside)."""
    suffix = get_settings().DLQ_SUFFIX
    backends = _backends().values()
    ids = {dlq.dead_letter_id(b.group, result_id) for b in backends}
    topics = {f"{b.topic_prefix}{q}{suffix}" for b in backends for q in b.queues}
    return Message.objects.using(using).filter(topic__in=sorted(topics), id__in=sorted(ids)).exists()


def _backends() -> dict[str, _Backend]:
    """The configured tasks backends of this project, by alias, from ``settings.TASKS``.

    The defaults repeat ``tasks/options.py`` (``parse_options``): this layer may not import
    the tasks package (the console uses it); tests check both agree.
    """
    found = {}
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        if not isinstance(params, dict) or params.get("BACKEND") != BACKEND_PATH:
            continue
        options = params.get("OPTIONS") or {}
        prefix = options.get("TOPIC_PREFIX", "tasks." if alias == "default" else f"tasks.{alias}.")
        queues = params.get("QUEUES", ["default"])
        found[alias] = _Backend(alias, prefix, options.get("GROUP", "tasks"), tuple(queues or ()))
    return found
