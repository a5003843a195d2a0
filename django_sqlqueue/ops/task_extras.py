"""Batches of tasks and recurring schedules, for the console's Tasks pages.

- Batches: rows of ``queue_task_batches`` (``tasks/batches.py`` writes them), newest first,
  keyset-paginated by (created_at, id); no ``COUNT(*)``.
- Schedules: those of ``SQLQUEUE["SCHEDULES"]`` and those declared in code (``@recurring``
  in an app's ``tasks`` module, which :func:`~django_sqlqueue.consumers.known_consumers`
  imports as ``runconsumer`` does), with their bookkeeping row of ``queue_schedules``: the
  last tick fired, and the next one, computed as the scheduler thread does
  (``worker/threads/scheduler.py``: from the last tick, or the registration, but no earlier
  than ``catch_up`` seconds ago). Times are the database clock's, in UTC.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django.db.models import F, Q

from ..conf import get_settings
from ..consumers import known_consumers
from ..exceptions import ConfigurationError
from ..rules.limits import MAX_LIST_LIMIT, MAX_MESSAGE_ID_LENGTH
from ..schedules import Schedule, all_schedules
from ..task_models import ScheduleState, TaskBatch
from .base import NotFound, OperationError, alias, check_count, store

#: How far ahead the next tick of a schedule is looked for.
NEXT_TICK_HORIZON = dt.timedelta(days=400)


@dataclass(frozen=True)
class BatchPage:
    items: list[TaskBatch] = field(default_factory=list)
    next_cursor: str | None = None


def _cursor(value: str | None) -> tuple[dt.datetime, str] | None:
    if value is None or value == "":
        return None
    when, sep, bid = value.partition("|")
    try:
        moment = dt.datetime.fromisoformat(when)
    except ValueError:
        moment = None
    if not sep or moment is None or moment.tzinfo is None or not bid or len(bid) > MAX_MESSAGE_ID_LENGTH:
        raise OperationError(f"cursor must be '<time>|<batch id>' as a previous page gave it, got {value[:80]!r}.")
    return moment, bid


def list_batches(
    *, unfinished: bool = False, cursor: str | None = None, limit: int = 50, using: str | None = None
) -> BatchPage:
    """Newest batches first (``unfinished``: only those still waiting for members)."""
    limit = check_count(limit, "limit", MAX_LIST_LIMIT)
    after = _cursor(cursor)
    qs = TaskBatch.objects.using(alias(using))
    if unfinished:
        qs = qs.filter(finished_at__isnull=True)
    if after is not None:
        qs = qs.filter(Q(created_at__lt=after[0]) | Q(created_at=after[0], id__lt=after[1]))
    rows = list(qs.order_by(F("created_at").desc(), F("id").desc())[: limit + 1])
    more = len(rows) > limit
    items = rows[:limit]
    return BatchPage(items, f"{items[-1].created_at.isoformat()}|{items[-1].id}" if more and items else None)


def get_batch(batch_id: str, using: str | None = None) -> TaskBatch:
    found = None
    if isinstance(batch_id, str) and 0 < len(batch_id) <= MAX_MESSAGE_ID_LENGTH:
        found = TaskBatch.objects.using(alias(using)).filter(id=batch_id).first()
    if found is None:
        raise NotFound(f"no batch with id {str(batch_id)[:80]!r}.")
    return found


def progress(batch: TaskBatch) -> int:
    """Percent of the members finished (0 while the batch block is open: total not set yet)."""
    done = batch.succeeded + batch.failed
    return min(100, done * 100 // batch.total) if batch.total else 0


@dataclass(frozen=True)
class ScheduleInfo:
    name: str
    #: None for a row of ``queue_schedules`` that no schedule of this process declares.
    schedule: Schedule | None
    last_run: dt.datetime | None
    next_run: dt.datetime | None
    #: A worker first saw the schedule (None: no worker has run it yet).
    registered_at: dt.datetime | None

    @property
    def what(self) -> str:
        if self.schedule is None:
            return ""
        return f"task {self.schedule.task}" if self.schedule.task else f"message to {self.schedule.topic}"


def next_tick(schedule: Schedule, state: ScheduleState | None, now: dt.datetime) -> dt.datetime | None:
    """The next tick a worker fires (module docstring); None when none within NEXT_TICK_HORIZON.

    A tick in the past is due: a worker fires it within about a second.
    """
    start = now if state is None else (state.last_tick or state.created_at)
    start = max(start, now - dt.timedelta(seconds=schedule.catch_up))
    ticks = schedule.ticks(start, start + NEXT_TICK_HORIZON, limit=1)
    return ticks[0] if ticks else None


def list_schedules(using: str | None = None) -> tuple[dt.datetime, list[ScheduleInfo]]:
    """Return the database's now and every schedule, by name (see the module docstring)."""
    conf = get_settings()
    known_consumers()  # imports the apps' tasks modules: their @recurring schedules register
    try:
        schedules = {s.name: s for s in all_schedules(conf.SCHEDULES, conf.DLQ_SUFFIX)}
    except ConfigurationError as exc:
        raise OperationError(f"the schedules cannot be read: {exc}") from exc
    states = {s.name: s for s in ScheduleState.objects.using(alias(using)).order_by("name")}
    now = store(using).now()
    out = []
    for name in sorted(set(schedules) | set(states)):
        schedule, state = schedules.get(name), states.get(name)
        out.append(
            ScheduleInfo(
                name=name,
                schedule=schedule,
                last_run=state.last_tick if state else None,
                next_run=next_tick(schedule, state, now) if schedule else None,
                registered_at=state.created_at if state else None,
            )
        )
    return now, out
