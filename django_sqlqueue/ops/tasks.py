"""Tasks of the ``django.tasks`` backend for the console: list and detail of results, retry.

Reads ``queue_task_results`` (one row per task a worker started) with the ORM; imports
nothing of ``django_sqlqueue.tasks`` (the console may not). A task no worker has started
yet has no row: :func:`get_task` finds it by its message instead (status READY).

**Bounded lists.** A list page never loads a whole ``args``, ``kwargs`` or ``return_value``
column: the database cuts them (``LEFT(CAST(col AS text), n)``, with the full length) and
sends the ``errors`` column only when it is at most :data:`LIST_ERRORS_LENGTH` characters;
the task's own page has everything. No ``COUNT(*)``: keyset pages, newest first, by
``enqueued_at`` (or ``finished_at`` for the finished statuses, the order of the
``(status, finished_at)`` index), ties broken by id.

**Retry** is the dead-letter replay (``ops/replay.py``) of the task's dead letter: one
transaction locks and deletes the dead letter and appends its copy, and the tasks backend's
replay hook sets the result back to READY in it. A second retry finds no dead letter.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Case, F, Q, QuerySet, TextField, Value, When
from django.db.models.functions import Cast, Length

from ..conf import get_settings
from ..models import Message
from ..rules.dlq import parse_dead_letter_id
from ..rules.limits import MAX_LIST_LIMIT, MAX_MESSAGE_ID_LENGTH
from ..task_models import TaskResultRecord
from .base import NotFound, OperationError, alias, check_count
from .previews import LIST_PREVIEW_LENGTH as LIST_PREVIEW_LENGTH  # re-exported: the tasks' tests use it
from .previews import Cut, cut_columns, read_cut
from .replay import BulkResult, OnBatch, replay
from .topics import log_topics

#: The status filter's values: Django's ``TaskResultStatus`` and CANCELLED.
STATUSES = ("READY", "RUNNING", "FAILED", "SUCCESSFUL", "CANCELLED")
FINISHED = ("FAILED", "SUCCESSFUL", "CANCELLED")
#: A cancelled task is FAILED with this error last (``cancel_task``, ``tasks/cancel.py``).
CANCELLED_ERROR = "django_sqlqueue.exceptions.TaskCancelled"
#: A list row holds its ``errors`` (as JSON) only up to this many characters.
LIST_ERRORS_LENGTH = 20_000
#: Keys under which a task's message payload names its batch (``tasks/batch_members.BATCH_KEY``).
BATCH_PAYLOAD_KEYS = ("batch",)


@dataclass(frozen=True)
class TaskFilter:
    status: str | None = None
    queue: str | None = None
    #: The task's module path, or its end (``send_mail`` or ``mail.send_mail``).
    task: str | None = None

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in STATUSES:
            raise OperationError(f"status must be one of {', '.join(STATUSES)}, got {self.status!r}.")

    def as_query(self) -> dict[str, str]:
        return {k: v for k in ("status", "queue", "task") if (v := getattr(self, k))}

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.as_query().items()) or "all tasks"


@dataclass(frozen=True)
class TaskRow:
    """A task on a list page (bounded: see the module docstring)."""

    id: str
    backend: str
    queue_name: str
    task_path: str
    status: str
    enqueued_at: dt.datetime | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    attempts: int
    args: Cut
    kwargs: Cut
    #: The errors, or None when they are longer than LIST_ERRORS_LENGTH.
    errors: list[dict[str, Any]] | None
    cancel_requested: bool

    @property
    def last_error_class(self) -> str:
        return str(self.errors[-1].get("exception_class_path", "")) if self.errors else ""

    @property
    def shown_status(self) -> str:
        """The status, with CANCELLED for a task failed by its cancellation."""
        return "CANCELLED" if self.status == "FAILED" and self.last_error_class == CANCELLED_ERROR else self.status


@dataclass(frozen=True)
class TaskPage:
    items: list[TaskRow] = field(default_factory=list)
    next_cursor: str | None = None


def _cursor(value: str | None) -> tuple[dt.datetime, str] | None:
    """``<ISO time>|<result id>`` -> (time, id); OperationError for anything else."""
    if value is None or value == "":
        return None
    when, sep, rid = value.partition("|")
    try:
        moment = dt.datetime.fromisoformat(when)
    except ValueError:
        moment = None
    if not sep or moment is None or moment.tzinfo is None or not rid or len(rid) > MAX_MESSAGE_ID_LENGTH:
        raise OperationError(f"cursor must be '<time>|<task id>' as a previous page gave it, got {value[:80]!r}.")
    return moment, rid


def sort_field(f: TaskFilter) -> str:
    """``finished_at`` for a finished status (the (status, finished_at) index), else ``enqueued_at``."""
    return "finished_at" if f.status in FINISHED else "enqueued_at"


def matching(f: TaskFilter, using: str | None = None) -> QuerySet[TaskResultRecord]:
    qs = TaskResultRecord.objects.using(alias(using))
    if f.status == "CANCELLED":
        # Narrowed in SQL (FAILED, the class name in its errors), confirmed per row (the last error).
        qs = qs.filter(status="FAILED").annotate(errors_text=Cast("errors", TextField()))
        qs = qs.filter(errors_text__contains=CANCELLED_ERROR)
    elif f.status:
        qs = qs.filter(status=f.status)
    if f.queue:
        qs = qs.filter(queue_name=f.queue)
    if f.task:
        qs = qs.filter(Q(task_path=f.task) | Q(task_path__endswith=f".{f.task}"))
    return qs


def _bounded(qs: QuerySet[TaskResultRecord]) -> QuerySet[TaskResultRecord]:
    """The list's columns: the JSON columns cut by the database (module docstring)."""
    cut = {**cut_columns("args", "args"), **cut_columns("kwargs", "kwargs")}
    errors = Cast("errors", TextField())
    small = Case(
        When(errors_length__lte=LIST_ERRORS_LENGTH, then=errors), default=Value(None), output_field=TextField()
    )
    return (
        qs.defer("args", "kwargs", "errors", "return_value")
        .annotate(errors_length=Length(errors), **cut)
        .annotate(errors_small=small)
    )


def _row(r: Any) -> TaskRow:
    errors = json.loads(r.errors_small) if r.errors_small is not None else None
    return TaskRow(
        id=r.id,
        backend=r.backend,
        queue_name=r.queue_name,
        task_path=r.task_path,
        status=r.status,
        enqueued_at=r.enqueued_at,
        started_at=r.started_at,
        finished_at=r.finished_at,
        attempts=len(r.worker_ids or []),
        args=read_cut(r, "args"),
        kwargs=read_cut(r, "kwargs"),
        errors=errors if isinstance(errors, list) else None,
        cancel_requested=r.cancel_requested_at is not None,
    )


def list_tasks(
    f: TaskFilter | None = None, *, cursor: str | None = None, limit: int = 50, using: str | None = None
) -> TaskPage:
    """Newest tasks first, ``limit`` per page, keyset-paginated by (time, id) (module docstring).

    A row without the time it is sorted by (never written so by the worker) is not listed.
    """
    f = f or TaskFilter()
    limit = check_count(limit, "limit", MAX_LIST_LIMIT)
    after = _cursor(cursor)
    key = sort_field(f)
    qs = _bounded(matching(f, using).filter(**{f"{key}__isnull": False}))
    items: list[TaskRow] = []
    last: tuple[dt.datetime, str] | None = after
    while len(items) <= limit:
        page = qs
        if last is not None:
            page = qs.filter(Q(**{f"{key}__lt": last[0]}) | Q(**{key: last[0], "id__lt": last[1]}))
        batch = list(page.order_by(F(key).desc(), F("id").desc())[: limit + 1])
        for r in batch:
            row = _row(r)
            last = (getattr(r, key), r.id)
            # CANCELLED was narrowed in SQL; a row whose last error is another (a cancelled
            # task retried and failed again) is dropped here.
            if f.status != "CANCELLED" or row.shown_status == "CANCELLED" or row.errors is None:
                items.append(row)
            if len(items) > limit:
                break
        if len(batch) <= limit:
            break
    more = len(items) > limit
    items = items[:limit]
    tail = items[-1] if items else None
    when = getattr(tail, key) if tail else None
    return TaskPage(items, f"{when.isoformat()}|{tail.id}" if more and tail and when else None)


@dataclass(frozen=True)
class TaskDetail:
    """Everything about one task: its result row, or its message when no worker started it yet."""

    id: str
    backend: str
    queue_name: str
    topic: str
    key: str
    task_path: str
    status: str
    args: Any
    kwargs: Any
    enqueued_at: dt.datetime | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    last_attempted_at: dt.datetime | None
    return_value: Any
    errors: list[dict[str, Any]]
    worker_ids: list[str]
    cancel_requested_at: dt.datetime | None
    #: Its dead letter's seq, when it has one (it can be retried).
    dead_letter_seq: int | None
    #: The batch its message names, if any (and the message is still in the log).
    batch_id: str | None
    #: True when no worker started it: read from its message.
    from_message: bool = False

    @property
    def shown_status(self) -> str:
        last = self.errors[-1].get("exception_class_path") if self.errors else None
        if self.status == "FAILED" and last == CANCELLED_ERROR:
            return "CANCELLED"
        # A worker that died on every attempt: dead-lettered without its row saying so (tasks/lookup.py).
        if self.status not in FINISHED and self.dead_letter_seq is not None:
            return "FAILED"
        return self.status

    @property
    def can_retry(self) -> bool:
        return self.dead_letter_seq is not None

    @property
    def can_cancel(self) -> bool:
        return self.status in ("READY", "RUNNING") and self.dead_letter_seq is None


def _check_id(result_id: Any) -> str:
    if not isinstance(result_id, str) or not result_id or len(result_id) > MAX_MESSAGE_ID_LENGTH:
        raise NotFound(f"no task with id {str(result_id)[:80]!r}.")
    return result_id


def dead_letter_of(result_id: str, topic: str, using: str | None = None) -> Message | None:
    """The newest dead letter of task ``result_id`` in ``topic``'s dead-letter topic, if any.

    Its id is ``<group>:<result id>``, or ``<group>:<result id>@replay<seq>`` once a retried
    copy failed again: two ranges of the (topic, id) index, confirmed here.
    """
    rid = _check_id(result_id)
    dlq = get_settings().dlq_topic(topic)
    candidates = (
        Message.objects.using(alias(using))
        .filter(topic=dlq)
        .exclude(original_topic="")
        .filter(Q(id__endswith=f":{rid}") | Q(id__contains=f":{rid}@replay"))
        .order_by("-seq")
    )
    pattern = re.compile(re.escape(rid) + r"(@replay[0-9]+)?")
    for m in candidates[:20]:
        if pattern.fullmatch(parse_dead_letter_id(m.id)[1]):
            return m
    return None


def _batch_id(payload: Any) -> str | None:
    if isinstance(payload, dict):
        for name in BATCH_PAYLOAD_KEYS:
            value = payload.get(name)
            if isinstance(value, str) and value:
                return value
    return None


def _is_task(m: Message) -> bool:
    """The backend's marker (``tasks/replay.is_task_message``): the path in payload and metadata."""
    meta = m.metadata if isinstance(m.metadata, dict) else {}
    return isinstance(m.payload, dict) and isinstance(meta.get("task"), str) and m.payload.get("task") == meta["task"]


def _message_of(result_id: str, topics: list[str], using: str) -> Message | None:
    # One probe of the (topic, id) unique index per topic.
    for m in Message.objects.using(using).filter(topic__in=topics, id=result_id).order_by("seq"):
        if _is_task(m):
            return m
    return None


def get_task(result_id: str, using: str | None = None) -> TaskDetail:
    """Return task ``result_id``; :class:`NotFound` when neither a result row nor a message has it."""
    rid, using = _check_id(result_id), alias(using)
    conf = get_settings()
    r = TaskResultRecord.objects.using(using).filter(id=rid).first()
    if r is not None:
        m = _message_of(rid, [r.topic], using)
        dead = dead_letter_of(rid, r.topic, using)
        return TaskDetail(
            id=r.id,
            backend=r.backend,
            queue_name=r.queue_name,
            topic=r.topic,
            key=r.key,
            task_path=r.task_path,
            status=r.status,
            args=r.args,
            kwargs=r.kwargs,
            enqueued_at=r.enqueued_at,
            started_at=r.started_at,
            finished_at=r.finished_at,
            last_attempted_at=r.last_attempted_at,
            return_value=r.return_value,
            errors=list(r.errors or []),
            worker_ids=[str(w) for w in r.worker_ids or []],
            cancel_requested_at=r.cancel_requested_at,
            dead_letter_seq=dead.seq if dead else None,
            batch_id=_batch_id(m.payload) if m else None,
        )
    m = _message_of(rid, [t for t in log_topics(using) if not conf.is_dlq_topic(t)], using)
    if m is None:
        raise NotFound(f"no task with id {rid!r} (no result row, and no task message with this id in the log).")
    payload: dict[str, Any] = m.payload
    return TaskDetail(
        id=rid,
        backend=str(payload.get("backend", "")),
        queue_name=str(payload.get("queue_name", "")),
        topic=m.topic,
        key=m.key,
        task_path=str(payload.get("task", "")),
        status="READY",
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        enqueued_at=m.created_at,
        started_at=None,
        finished_at=None,
        last_attempted_at=None,
        return_value=None,
        errors=[],
        worker_ids=[],
        cancel_requested_at=None,
        dead_letter_seq=None,
        batch_id=_batch_id(payload),
        from_message=True,
    )


def retry_task(
    result_id: str, *, actor: str = "", dry_run: bool = False, using: str | None = None, on_batch: OnBatch | None = None
) -> BulkResult:
    """Retry failed task ``result_id``: replay its dead letter (module docstring).

    :class:`OperationError` when it has none (not failed, retried already, or purged).
    """
    task = get_task(result_id, using)
    if task.dead_letter_seq is None:
        raise OperationError(
            f"task {task.id} is {task.shown_status} and has no dead letter to replay: only a failed task "
            "can be retried (retried already, or its dead letter purged?)."
        )
    return replay([task.dead_letter_seq], actor=actor, dry_run=dry_run, using=using, on_batch=on_batch)
