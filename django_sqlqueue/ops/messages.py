"""A read-only browser of the log: filters and keyset pagination by ``seq``.

Never ``COUNT(*)`` over the table and never a ``DISTINCT`` scan: a page is the newest
``limit`` rows below a ``seq`` cursor, read backwards along the primary key or the
``(topic, seq)`` index. Filters that no index serves are made cheap instead: a key
narrows the read to its partition (keys are hashed to partitions), and a time bound is
turned into a ``seq`` bound by a binary search over the primary key (``seq`` and
``published_at`` grow together: both are taken when the row is inserted).

A payload field (``field="customer.id", value="c-7"``) has no index at all: it is searched
only within a time window, by default the last hour and at most a day (``ops/search.py``),
so the database reads that window's ``seq`` range and no more.

A partition (or a key, which names one) has no index in ``seq`` order either: one in eight
rows of an 8-partition topic matches, and a rare key may match none in a million. Such a page
reads the ``(topic, seq)`` index backwards in windows of growing width, at most
:data:`SCAN_SPAN` positions per call; a page that used them up before finding ``limit``
messages is returned short, with ``Page.scanned_to`` set and a cursor that continues below it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet

from ..conf import get_settings
from ..db.dialects.json_search import JsonScalar
from ..models import Message
from ..rules.partitioning import partition_for
from .base import NotFound, OperationError, alias, store, topic_alias
from .previews import Cut, cut_columns, read_cut
from .search import TIME_SLACK, check_value, field_path, payload_equals, seq_bound, value_text, window, within

#: The seq positions a page filtered by partition or key reads at most, per call (see above).
SCAN_SPAN = 100_000


@dataclass(frozen=True)
class MessageFilter:
    topic: str | None = None
    partition: int | None = None
    key: str | None = None
    id: str | None = None
    #: Published at or after / at or before.
    after: dt.datetime | None = None
    before: dt.datetime | None = None
    #: A payload field, as a dotted path of keys (``order_id``, ``customer.id``), and the JSON
    #: scalar it must equal (typed: ``42`` is not ``"42"``; ``None`` is JSON ``null``).
    field: str | None = None
    value: JsonScalar = None

    def __post_init__(self) -> None:
        if self.field is not None:
            field_path(self.field)
            check_value(self.value)

    def as_query(self) -> dict[str, str]:
        """The filter as GET parameters (for links)."""
        out = {}
        for name in ("topic", "partition", "key", "id", "after", "before", "field"):
            value = getattr(self, name)
            if value not in (None, ""):
                out[name] = value.isoformat() if isinstance(value, dt.datetime) else str(value)
        if self.field:
            out["value"] = value_text(self.value)
        return out

    def resolved(self, now: dt.datetime | None = None) -> MessageFilter:
        """This filter with the time window a payload search reads made explicit (no search: itself).

        Pages and their "older" links then read the same window, wherever "now" has moved.
        """
        if not self.field:
            return self
        after, before = window(self.after, self.before, now)
        return MessageFilter(self.topic, self.partition, self.key, self.id, after, before, self.field, self.value)


@dataclass(frozen=True)
class Page:
    items: list[Message] = field(default_factory=list)
    #: Pass as ``cursor`` for the next (older) page; None on the last page.
    next_cursor: int | None = None
    #: With ``browse(preview=True)``: the start of each item's payload (``items[i].payload``
    #: is then not loaded).
    previews: list[Cut] = field(default_factory=list)
    #: A page filtered by partition or key that read :data:`SCAN_SPAN` positions before it
    #: found ``limit`` messages: the seq it read down to (``next_cursor`` continues there).
    scanned_to: int | None = None


def filtered(f: MessageFilter, using: str) -> QuerySet[Message]:
    qs = Message.objects.using(using).all()
    if f.id and not f.topic:
        raise OperationError("filtering by message id needs a topic (ids are unique per topic).")
    if f.partition is not None and not f.topic:
        raise OperationError("filtering by partition needs a topic.")
    after, before = f.after, f.before
    if f.field:
        # Checked before any query: a search outside its window would read the whole log.
        path = field_path(f.field)
        after, before = window(after, before)
        qs = qs.filter(payload_equals(path, check_value(f.value), using))
    if f.topic:
        qs = qs.filter(topic=f.topic)
    if f.id:
        qs = qs.filter(id=f.id)
    if f.key:
        qs = qs.filter(key=f.key)
    partition = key_partition(f, using)
    if partition is not None:
        qs = qs.filter(partition=partition)
    if after is not None:
        qs = qs.filter(published_at__gte=after)
    if before is not None:
        qs = qs.filter(published_at__lte=before)
    return within(qs, after, before, using)


def key_partition(f: MessageFilter, using: str) -> int | None:
    """The partition ``f`` reads: its own, else its key's in its topic (keys are hashed), else None."""
    if f.partition is not None or not f.key or not f.topic:
        return f.partition
    registered, count = store(using).registered_partitions(f.topic)
    if not registered:
        count = get_settings().partitions_for(f.topic)
    return partition_for(f.key, count)


def browse(
    f: MessageFilter, *, cursor: int | None = None, limit: int = 50, preview: bool = False, using: str | None = None
) -> Page:
    """The newest ``limit`` messages matching ``f`` with ``seq < cursor``.

    A payload search (``f.field``) reads only its time window (module docstring); a window
    wider than ``ops.search.MAX_WINDOW``, or a bad field path or value, raises
    :class:`~django_sqlqueue.ops.base.OperationError` before any query. With ``preview``, the
    payloads are not loaded: ``Page.previews`` has the start of each (cut by the database)
    with its length and size in bytes. Of one database: ``using``, else ``f.topic``'s (or the
    chosen one, or ``SQLQUEUE["DATABASE"]``); a ``seq`` (the cursor) is a position in it.
    """
    using = topic_alias(f.topic, using)
    if (f.partition is not None or f.key) and not f.id and not f.field:
        return _scan(f, cursor, limit, preview, using)
    qs = filtered(f, using)
    if cursor is not None:
        qs = qs.filter(seq__lt=cursor)
    rows: list[Any] = list(_shown(qs, preview).order_by("-seq")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, rows[-1].seq if more and rows else None, _previews(rows, preview))


def _shown(qs: QuerySet[Message], preview: bool) -> QuerySet[Message]:
    return qs.defer("payload").annotate(**cut_columns("payload", "payload", size=True)) if preview else qs


def _previews(rows: list[Any], preview: bool) -> list[Cut]:
    return [read_cut(m, "payload", compact=True) for m in rows] if preview else []


def _scan(f: MessageFilter, cursor: int | None, limit: int, preview: bool, using: str) -> Page:
    """A page filtered by partition or key: windows of the ``(topic, seq)`` index, newest first.

    The first window is wide enough to hold ``limit`` rows of an 8-partition topic twice over;
    each next one twice the last, until ``limit + 1`` rows are found, the topic's first seq is
    passed, or :data:`SCAN_SPAN` positions are read.
    """
    if f.partition is not None and not f.topic:
        raise OperationError("filtering by partition needs a topic.")
    reports = store(using)
    extent = reports.seq_extent(f.topic)
    if extent is None:
        return Page()
    bottom, top = extent[0], extent[1] + 1
    if f.after is not None:  # published_at and seq grow together (module docstring)
        bound = seq_bound(f.after, using)
        bottom = top if bound is None else max(bottom, bound - TIME_SLACK)
    if f.before is not None:
        bound = seq_bound(f.before + dt.timedelta(microseconds=1), using)
        top = top if bound is None else min(top, bound + TIME_SLACK)
    high = top if cursor is None else min(cursor, top)
    partition, key = key_partition(f, using), f.key or None
    start, span, found = high, max(16 * limit, 1_000), list[int]()
    while len(found) <= limit and high > bottom and start - high < SCAN_SPAN:
        low = max(bottom, high - span, start - SCAN_SPAN)
        found += reports.page_seqs(f.topic, partition, key, (low, high), (f.after, f.before), limit + 1 - len(found))
        high, span = low, span * 2
    shown = found[:limit]
    rows: list[Any] = list(_shown(Message.objects.using(using).filter(seq__in=shown), preview).order_by("-seq"))
    if len(found) > limit:
        return Page(rows, shown[-1], _previews(rows, preview))
    cut = high if high > bottom else None  # the span ran out above the topic's first message
    return Page(rows, cut, _previews(rows, preview), scanned_to=cut)


def get_message(seq: int, using: str | None = None) -> Message:
    try:
        return Message.objects.using(alias(using)).get(seq=seq)
    except (Message.DoesNotExist, ValueError, TypeError):
        raise NotFound(f"no message with seq {seq!r} (garbage-collected?).") from None
