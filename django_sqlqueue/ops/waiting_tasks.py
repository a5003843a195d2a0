"""Waiting tasks for the console: tasks of the ``django.tasks`` backend that no worker started.

A task no worker started has no row in ``queue_task_results`` (or only a READY row without
``started_at``: the "cancel pending" row of ``ops/task_cancel.py``). It is a message of a
task topic that the tasks group has not passed yet. :func:`list_waiting` reads them from
the log, for every task topic of every configured backend (``settings.TASKS``, read as
``ops/task_cancel.py`` reads it: this layer may not import ``django_sqlqueue.tasks``):

- **Sequenced** messages above the group's watermark (``queue_offsets.offset_acked``) of
  each partition: one range of the ``(topic, partition, offset)`` unique index per
  partition, ``offset > watermark ORDER BY offset LIMIT n`` -- never the acked part of the
  log. A message above the watermark that was acked out of order, or that a worker holds
  now (``queue_delivery_state``: acked, or IN_FLIGHT), or whose result row says it started,
  is left out: one look-up of each table's primary key per batch.
- **Unsequenced** messages (``offset`` NULL: published, not numbered by the sequencer yet,
  so no worker can have fetched them) come first on the first page, at most ``limit`` of
  them: the sequencer's own read per partition (``_unsequenced``).

**Order and pages.** Partition after partition, ``(topic, partition, offset)``: oldest first
is the order a partition's worker takes them; newest first is the reverse. A keyset page:
the cursor is the last row's ``topic|partition|offset``; no ``COUNT(*)``. A page examines at
most :data:`SCAN_FACTOR` x ``limit`` messages: past that it ends early, with a cursor, so a
long run of finished-but-not-yet-watermarked messages never makes one page read the backlog.

No lock is taken: it is a snapshot, and a task listed may start the moment after. Cancelling
it (the task's page) is decided by ``ops/task_cancel.py`` over the result row, not over this list.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.db.models.fields.json import KT, KeyTransform
from django.utils import timezone

from ..conf import get_settings
from ..db.sequencer import Sequencer
from ..models import ConsumerOffset, DeliveryState, Message, Partition, Topic
from ..rules.limits import MAX_LIST_LIMIT
from ..task_models import TaskResultRecord
from .base import OperationError, alias, check_count
from .previews import Cut, cut_columns, read_cut
from .task_cancel import _backends

#: A page examines at most this many messages per row it shows (module docstring).
SCAN_FACTOR = 10
#: The level's topic of a queue, ``<queue topic>.p<level>`` (``tasks/priorities.py``:
#: ``level_topic``/``split_level``, repeated here: ops may not import the tasks package).
_LEVEL = re.compile(r"^(?P<base>.+)\.p(?P<level>-?\d{1,3})$")
ORDERS = ("oldest", "newest")
#: Above every offset: the cursor that starts a partition, newest first.
_TOP = 2**62


@dataclass(frozen=True)
class TaskTopic:
    topic: str
    backend: str
    group: str
    queue: str
    level: int


@dataclass(frozen=True)
class WaitingTask:
    id: str
    backend: str
    queue_name: str
    priority: int
    task_path: str
    topic: str
    partition: int
    #: None: not numbered by the sequencer yet.
    offset: int | None
    args: Cut
    kwargs: Cut
    enqueued_at: dt.datetime
    #: ``run_after`` (the message's ``deliver_at``) when it is in the future, else None.
    run_after: dt.datetime | None
    #: A "cancel pending" result row exists (a cancel is deciding over it).
    cancel_requested: bool = False


@dataclass(frozen=True)
class WaitingPage:
    items: list[WaitingTask] = field(default_factory=list)
    next_cursor: str | None = None


def task_topics(using: str | None = None) -> list[TaskTopic]:
    """Every task topic of the configured backends, sorted: each queue and each priority level.

    A backend whose ``QUEUES`` is empty (any queue name) has its topics among the registered ones.
    """
    suffix = get_settings().DLQ_SUFFIX
    found: dict[str, TaskTopic] = {}
    registered: list[str] | None = None
    for b in _backends().values():
        options = (getattr(settings, "TASKS", {})[b.alias].get("OPTIONS")) or {}
        levels = {0, *(p for p in options.get("PRIORITIES") or () if isinstance(p, int))}
        names: set[str] = {b.topic_prefix + q for q in b.queues}
        if not b.queues:
            if registered is None:
                registered = list(Topic.objects.using(alias(using)).values_list("topic", flat=True))
            names |= {t for t in registered if t.startswith(b.topic_prefix) and not t.endswith(suffix)}
        for name in names:
            match = _LEVEL.match(name)
            base, level = (match["base"], int(match["level"])) if match else (name, 0)
            for lv in levels if match is None else (level,):
                topic = base if lv == 0 else f"{base}.p{lv}"
                found.setdefault(topic, TaskTopic(topic, b.alias, b.group, base[len(b.topic_prefix) :], lv))
    return [found[t] for t in sorted(found)]


def _cursor(value: str | None) -> tuple[str, int, int] | None:
    if not value:
        return None
    parts = value.rsplit("|", 2)
    try:
        topic, partition, offset = parts[0], int(parts[1]), int(parts[2])
    except (IndexError, ValueError):
        raise OperationError(
            f"cursor must be '<topic>|<partition>|<offset>' as a page gave it, got {value[:80]!r}."
        ) from None
    return topic, partition, offset


def _columns(qs: Any) -> Any:
    """The row's columns, with ``args``/``kwargs`` cut by the database (never the whole payload)."""
    cut: dict[str, Any] = {"task_path": KT("payload__task"), "meta_task": KT("metadata__task")}
    for name in ("args", "kwargs"):
        cut.update(cut_columns(KeyTransform(name, "payload"), name))
    return qs.defer("payload", "metadata", "last_error").annotate(**cut)


def list_waiting(
    *, order: str = "oldest", cursor: str | None = None, limit: int = 50, using: str | None = None
) -> WaitingPage:
    """Tasks no worker started, ``limit`` per page, partition by partition (module docstring)."""
    if order not in ORDERS:
        raise OperationError(f"order must be one of {', '.join(ORDERS)}, got {order!r:.40}.")
    limit = check_count(limit, "limit", MAX_LIST_LIMIT)
    after, using = _cursor(cursor), alias(using)
    topics = {t.topic: t for t in task_topics(using)}
    items: list[WaitingTask] = []
    if not topics:
        return WaitingPage()
    parts = sorted(Partition.objects.using(using).filter(topic__in=sorted(topics)).values_list("topic", "partition"))
    if after is None:
        items += _keep(_unsequenced(sorted(topics), parts, limit, using), topics, using)
    newest = order == "newest"
    budget = SCAN_FACTOR * limit
    if newest:
        parts.reverse()
    marks = {
        (t, p): w
        for t, p, w, g in ConsumerOffset.objects.using(using)
        .filter(consumer_group__in=sorted({t.group for t in topics.values()}), topic__in=sorted(topics))
        .values_list("topic", "partition", "offset_acked", "consumer_group")
        if g == topics[t].group
    }
    last: tuple[str, int, int] | None = None
    for topic, partition in parts:
        if after is not None and ((topic, partition) < after[:2] if not newest else (topic, partition) > after[:2]):
            continue
        base = Message.objects.using(using).filter(topic=topic, partition=partition)
        low, high = marks.get((topic, partition), 0), None
        if after is not None and (topic, partition) == after[:2]:
            low, high = (low, after[2]) if newest else (max(low, after[2]), None)
        while len(items) <= limit and budget > 0:
            qs = base.filter(offset__gt=low) if high is None else base.filter(offset__gt=low, offset__lt=high)
            take = min(budget, limit + 1 - len(items))
            batch = list(_columns(qs).order_by("-offset" if newest else "offset")[:take])
            budget -= len(batch)
            if not batch:
                break
            last = (topic, partition, batch[-1].offset)
            items += _keep(batch, topics, using)
            if newest:
                high = batch[-1].offset
            else:
                low = batch[-1].offset
            if len(batch) < take:
                break
        if len(items) > limit or budget <= 0:
            break
    if len(items) > limit:
        tail = items[limit - 1]
        if tail.offset is None:
            # The page holds unsequenced messages only: the next one starts the sequenced part.
            first = parts[0]
            return WaitingPage(items[:limit], f"{first[0]}|{first[1]}|{_TOP if newest else 0}")
        return WaitingPage(items[:limit], f"{tail.topic}|{tail.partition}|{tail.offset}")
    # Out of budget: the page ends short, with where it stopped (module docstring).
    more = budget <= 0 and last is not None
    return WaitingPage(items, f"{last[0]}|{last[1]}|{last[2]}" if more and last else None)


def _unsequenced(names: list[str], parts: list[tuple[str, int]], limit: int, using: str) -> list[Any]:
    """The oldest ``limit`` messages not numbered yet: one read per partition.

    The sequencer's own read (``db/sequencer.py``): ``topic = ? AND partition = ? AND offset
    IS NULL ORDER BY seq``, a short range of the unique ``(topic, partition, offset)`` index
    on MySQL and of the partial unsequenced index elsewhere (migration 0003). One ``topic IN
    (...) AND offset IS NULL`` read instead can walk every sequenced row of the topics on
    MySQL (the partition is not fixed, so NULL offsets are not one range of that index).
    The partitions: those with a head row, and those the topic's count says it has (a
    head row is created when a worker registers the topic); a topic with one partition
    per key and no head row yet asks the database which partitions hold unsequenced rows.
    """
    conf = get_settings()
    registered = dict(Topic.objects.using(using).filter(topic__in=names).values_list("topic", "partitions"))
    wanted = set(parts)
    for t in names:
        count = registered[t] if t in registered else conf.partitions_for(t)
        if count is not None:
            wanted |= {(t, p) for p in range(count)}
        elif not any(topic == t for topic, _ in parts):
            wanted |= {(t, p) for p in Sequencer(using).unsequenced_partitions(t)}
    found: list[Any] = []
    for topic, partition in sorted(wanted):
        qs = Message.objects.using(using).filter(topic=topic, partition=partition, offset__isnull=True)
        found += _columns(qs).order_by("seq")[:limit]
    return sorted(found, key=lambda m: m.seq)[:limit]


def _keep(batch: list[Any], topics: dict[str, TaskTopic], using: str) -> list[WaitingTask]:
    """The batch's task messages that no worker started or holds (module docstring)."""
    batch = [m for m in batch if m.task_path and m.task_path == m.meta_task]
    if not batch:
        return []
    # One look-up by primary key: a READY row not started is the "cancel pending" row (still
    # waiting); any other row means a worker started it (or a cancel finished it).
    rows, other = {}, set()
    for rid, status, started, cancel in (
        TaskResultRecord.objects.using(using)
        .filter(id__in=[m.id for m in batch])
        .values_list("id", "status", "started_at", "cancel_requested_at")
    ):
        if status == "READY" and started is None:
            rows[rid] = cancel
        else:
            other.add(rid)
    busy: set[tuple[str, int, int]] = set()
    sequenced = [m for m in batch if m.offset is not None]
    if sequenced:
        m0 = sequenced[0]
        q = Q()
        for m in sequenced:
            q |= Q(topic=m.topic, partition=m.partition, message_offset=m.offset)
        busy = {
            (t, p, o)
            for t, p, o in DeliveryState.objects.using(using)
            .filter(q, consumer_group=topics[m0.topic].group)
            .filter(Q(acked=True) | Q(status=DeliveryState.Status.IN_FLIGHT))
            .values_list("topic", "partition", "message_offset")
        }
    now = timezone.now()
    out = []
    for m in batch:
        if m.id in other or (m.topic, m.partition, m.offset) in busy:
            continue
        t = topics[m.topic]
        out.append(
            WaitingTask(
                id=m.id,
                backend=t.backend,
                queue_name=t.queue,
                priority=t.level,
                task_path=m.task_path,
                topic=m.topic,
                partition=m.partition,
                offset=m.offset,
                args=read_cut(m, "args"),
                kwargs=read_cut(m, "kwargs"),
                enqueued_at=m.created_at,
                run_after=m.deliver_at if m.deliver_at > now else None,
                cancel_requested=rows.get(m.id) is not None,
            )
        )
    return out
