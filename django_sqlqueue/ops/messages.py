"""A read-only browser of the log: filters and keyset pagination by ``seq``.

Never ``COUNT(*)`` over the table and never a ``DISTINCT`` scan: a page is the newest
``limit`` rows below a ``seq`` cursor, read backwards along the primary key or the
``(topic, seq)`` index. Filters that no index serves are made cheap instead: a key
narrows the read to its partition (keys are hashed to partitions), and a time bound is
turned into a ``seq`` bound by a binary search over the primary key (``seq`` and
``published_at`` grow together: both are taken when the row is inserted).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django.db.models import QuerySet

from ..conf import get_settings
from ..models import Message
from ..rules.partitioning import partition_for
from .base import NotFound, OperationError, alias, store

#: The last time a datetime can hold: a "before" bound there has no time after it.
_LAST = dt.datetime.max.replace(tzinfo=dt.UTC)
#: Rows of slack around a seq bound found by time: concurrent inserts may commit their
#: published_at slightly out of seq order.
TIME_SLACK = 1000


@dataclass(frozen=True)
class MessageFilter:
    topic: str | None = None
    partition: int | None = None
    key: str | None = None
    id: str | None = None
    #: Published at or after / at or before.
    after: dt.datetime | None = None
    before: dt.datetime | None = None

    def as_query(self) -> dict[str, str]:
        """The filter as GET parameters (for links)."""
        out = {}
        for name in ("topic", "partition", "key", "id", "after", "before"):
            value = getattr(self, name)
            if value not in (None, ""):
                out[name] = value.isoformat() if isinstance(value, dt.datetime) else str(value)
        return out


@dataclass(frozen=True)
class Page:
    items: list[Message] = field(default_factory=list)
    #: Pass as ``cursor`` for the next (older) page; None on the last page.
    next_cursor: int | None = None


def _seq_bound(when: dt.datetime, using: str) -> int | None:
    """The smallest seq whose published_at is at or after ``when`` (None if none).

    A bisection over the primary key: about 2 * log2(rows) single-row index reads.
    """
    qs = Message.objects.using(using)
    low = qs.order_by("seq").values_list("seq", flat=True).first()
    high = qs.order_by("-seq").values_list("seq", flat=True).first()
    best = None
    while low is not None and high is not None and low <= high:
        mid = (low + high) // 2
        row = qs.filter(seq__gte=mid, seq__lte=high).order_by("seq").values_list("seq", "published_at").first()
        if row is None:
            high = mid - 1
        elif row[1] >= when:
            best, high = row[0], mid - 1
        else:
            low = row[0] + 1
    return best


def filtered(f: MessageFilter, using: str) -> QuerySet[Message]:
    qs = Message.objects.using(using).all()
    if f.id and not f.topic:
        raise OperationError("filtering by message id needs a topic (ids are unique per topic).")
    if f.partition is not None and not f.topic:
        raise OperationError("filtering by partition needs a topic.")
    if f.topic:
        qs = qs.filter(topic=f.topic)
    if f.id:
        qs = qs.filter(id=f.id)
    partition = f.partition
    if f.key is not None and f.key != "":
        qs = qs.filter(key=f.key)
        if f.topic and partition is None:
            registered, count = store(using).registered_partitions(f.topic)
            if not registered:
                count = get_settings().partitions_for(f.topic)
            partition = partition_for(f.key, count)
    if partition is not None:
        qs = qs.filter(partition=partition)
    if f.after is not None:
        qs = qs.filter(published_at__gte=f.after)
        bound = _seq_bound(f.after, using)
        if bound is None:
            return qs.none()
        qs = qs.filter(seq__gte=max(0, bound - TIME_SLACK))
    if f.before is not None:
        qs = qs.filter(published_at__lte=f.before)
        # The first seq after ``before`` (none after the last representable time).
        bound = _seq_bound(f.before + dt.timedelta(microseconds=1), using) if f.before < _LAST else None
        if bound is not None:
            qs = qs.filter(seq__lt=bound + TIME_SLACK)
    return qs


def browse(f: MessageFilter, *, cursor: int | None = None, limit: int = 50, using: str | None = None) -> Page:
    """The newest ``limit`` messages matching ``f`` with ``seq < cursor``."""
    using = alias(using)
    qs = filtered(f, using)
    if cursor is not None:
        qs = qs.filter(seq__lt=cursor)
    rows = list(qs.order_by("-seq")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, rows[-1].seq if more and rows else None)


def get_message(seq: int, using: str | None = None) -> Message:
    try:
        return Message.objects.using(alias(using)).get(seq=seq)
    except (Message.DoesNotExist, ValueError, TypeError):
        raise NotFound(f"no message with seq {seq!r} (garbage-collected?).") from None
