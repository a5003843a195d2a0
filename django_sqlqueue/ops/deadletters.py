"""Dead letters: list, count and detail (replaying and purging them is ``ops/replay.py``).

A dead letter is a row of a dead-letter topic ``<topic><DLQ_SUFFIX>`` with
``original_topic`` set and the id ``<group>:<original id>``; the naming rules live in
``django_sqlqueue.rules.dlq``. The reads here are ORM queries on ``Message``: the dead-letter
topics are ranges of the (topic, seq) and (topic, id) indexes, never a scan of the log.

A search by payload field (:class:`DeadLetterFilter` ``field``/``value``) reads only a time
window of failures, by default the last hour and at most a day (``ops/search.py``): a dead
letter's ``failed_at`` is written with its row's ``published_at``, in the same statement, so
the window is a ``seq`` range of the (topic, seq) index. The list pages of the console read
a payload's start only (``list_dead_letters(preview=True)``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from typing import Any

from django.db.models import Q, QuerySet
from django.db.models.functions import Left, Lower

from ..conf import get_settings
from ..db.dialects.json_search import JsonScalar
from ..models import Message
from ..rules.dlq import (
    dead_letter_id_prefix,
    dead_letter_info,
    parse_dead_letter_id,
    replay_marker,
)
from ..rules.limits import MAX_BIGINT, MAX_LIST_LIMIT
from .base import NotFound, OperationError, alias, brief_repr, check_count, first_line, topic_alias
from .previews import Cut, cut_columns, read_cut
from .search import check_value, field_path, payload_equals, value_text, window, within
from .topics import log_topics

#: Dead letters per transaction of a bulk replay or purge (``ops/replay.py``).
DEFAULT_BATCH = 500
#: Longest error text searched for (``DeadLetterFilter.text``).
MAX_TEXT_LENGTH = 200
#: Characters of the stored error a list row holds (``preview=True``): its headline is enough.
LIST_ERROR_LENGTH = 1000


@dataclass(frozen=True)
class DeadLetter:
    seq: int
    dlq_topic: str
    original_topic: str
    group: str
    id: str
    original_id: str
    key: str
    partition: int
    original_offset: int | None
    failure_count: int
    failed_at: dt.datetime | None
    created_at: dt.datetime
    last_error: str
    payload: Any
    metadata: dict[str, Any]
    #: In a list read with ``preview=True``: the start of the payload (``payload`` is None).
    payload_preview: Cut | None = None

    @property
    def error_class(self) -> str:
        """``module.Class`` of the last error (the text before the first ``:``)."""
        head = first_line(self.last_error)
        return head.split(":", 1)[0] if ":" in head else head[:100]

    @property
    def error_message(self) -> str:
        head = first_line(self.last_error)
        return head.split(":", 1)[1].strip() if ":" in head else ""

    @property
    def replays(self) -> int:
        return int(replay_marker(self.metadata).get("replays", 0))

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "dlq_topic": self.dlq_topic,
            "original_topic": self.original_topic,
            "group": self.group,
            "id": self.id,
            "original_id": self.original_id,
            "key": self.key,
            "partition": self.partition,
            "original_offset": self.original_offset,
            "failure_count": self.failure_count,
            "failed_at": self.failed_at.isoformat() if self.failed_at else None,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "error_class": self.error_class,
            "last_error": self.last_error,
            "payload": self.payload,
            "metadata": self.metadata,
        }


def from_message(m: Message, preview: Cut | None = None) -> DeadLetter:
    """Return the dead letter stored in the row ``m`` of a dead-letter topic (``preview``: its payload's start)."""
    meta = m.metadata if isinstance(m.metadata, dict) else {}
    info = dead_letter_info(meta)
    group, rest = parse_dead_letter_id(m.id)
    marker = replay_marker(meta)
    return DeadLetter(
        seq=m.seq,
        dlq_topic=m.topic,
        original_topic=m.original_topic,
        group=str(info.get("consumer_group") or group),
        id=m.id,
        original_id=str(marker.get("original_id") or info.get("original_id") or rest),
        key=m.key,
        partition=m.partition,
        original_offset=info.get("original_offset"),
        failure_count=m.failure_count,
        failed_at=m.failed_at,
        created_at=m.created_at,
        last_error=m.last_error,
        payload=None if preview is not None else m.payload,
        metadata=meta,
        payload_preview=preview,
    )


@dataclass(frozen=True)
class DeadLetterFilter:
    #: The original topic (the dead letters live in ``<topic><DLQ_SUFFIX>``).
    topic: str | None = None
    group: str | None = None
    #: Exception class, ``module.Class`` or just ``Class``.
    error: str | None = None
    failed_after: dt.datetime | None = None
    failed_before: dt.datetime | None = None
    #: The message key the dead letter kept.
    key: str | None = None
    #: The original message's id, or the dead letter's own (``<group>:<original id>``).
    id: str | None = None
    #: Text anywhere in the stored error (message or traceback), at most MAX_TEXT_LENGTH characters.
    text: str | None = None
    #: A payload field (dotted path of keys) and the JSON scalar it must equal: searched only
    #: within a window of ``failed_at`` (the last hour unless given, at most a day).
    field: str | None = None
    value: JsonScalar = None

    def __post_init__(self) -> None:
        if self.text is not None and len(self.text) > MAX_TEXT_LENGTH:
            raise OperationError(
                f"error text is {len(self.text)} characters long; the search takes at most {MAX_TEXT_LENGTH}."
            )
        if self.field is not None:
            field_path(self.field)
            check_value(self.value)

    def as_query(self) -> dict[str, str]:
        out = {}
        for name in ("topic", "group", "error", "failed_after", "failed_before", "key", "id", "text", "field"):
            value = getattr(self, name)
            if value not in (None, ""):
                out[name] = value.isoformat() if isinstance(value, dt.datetime) else str(value)
        if self.field:
            out["value"] = value_text(self.value)
        return out

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.as_query().items() if k not in ("field", "value")]
        if self.field:
            parts.append(f"payload {self.field} = {value_text(self.value)}")
        return ", ".join(parts) or "all dead letters"

    def resolved(self, now: dt.datetime | None = None) -> DeadLetterFilter:
        """This filter with a payload search's window made explicit (no search: itself).

        "Act on all matching" confirms and then acts on the same window, however long the
        operator takes to confirm.
        """
        if not self.field:
            return self
        after, before = window(self.failed_after, self.failed_before, now)
        return replace(self, failed_after=after, failed_before=before)


def dlq_topics(topic: str | None = None, using: str | None = None) -> list[str]:
    """Dead-letter topics to read: ``<topic><suffix>``, or every topic in the log ending with the suffix."""
    conf = get_settings()
    if topic:
        return [conf.dlq_topic(topic)]
    return [t for t in log_topics(using) if conf.is_dlq_topic(t)]


def matching(f: DeadLetterFilter, using: str | None = None) -> QuerySet[Message]:
    """The dead letters matching ``f`` (rows of DLQ topics with ``original_topic`` set).

    A payload search reads only its window (module docstring); a bad field path or value,
    or a window wider than ``ops.search.MAX_WINDOW``, raises :class:`OperationError` first.
    Of one database: ``using``, else ``f.topic``'s (or the chosen one, or ``SQLQUEUE["DATABASE"]``).
    """
    using = topic_alias(f.topic, using)
    after, before = f.failed_after, f.failed_before
    path = None
    if f.field:
        path = field_path(f.field)
        after, before = window(after, before)
    qs = Message.objects.using(using).filter(topic__in=dlq_topics(f.topic, using)).exclude(original_topic="")
    if f.group:
        # A group's dead-letter ids share a prefix: a range of the (topic, id) index.
        qs = qs.filter(id__startswith=dead_letter_id_prefix(f.group))
    if f.error:
        qs = qs.filter(Q(last_error__startswith=f"{f.error}:") | Q(last_error__contains=f".{f.error}:"))
    if f.key:
        qs = qs.filter(key=f.key)
    if f.id:
        # The dead letter's own id (one row of the (topic, id) index), or the original's: the
        # suffix after "<group>:" (the marker keeps it too, but a suffix is what the id has).
        qs = qs.filter(Q(id=f.id) | Q(id__endswith=f":{f.id}"))
    if f.text:
        # Case-insensitive everywhere (SQLite's LIKE is; a _bin collation on MySQL is not).
        qs = qs.alias(error_lower=Lower("last_error")).filter(error_lower__contains=f.text.lower())
    if after:
        qs = qs.filter(failed_at__gte=after)
    if before:
        qs = qs.filter(failed_at__lte=before)
    if path is not None:
        qs = within(qs.filter(payload_equals(path, check_value(f.value), using)), after, before, using)
    return qs


@dataclass(frozen=True)
class DeadLetterPage:
    items: list[DeadLetter] = field(default_factory=list)
    next_cursor: int | None = None


def list_dead_letters(
    f: DeadLetterFilter | None = None,
    *,
    cursor: int | None = None,
    limit: int = 50,
    preview: bool = False,
    using: str | None = None,
) -> DeadLetterPage:
    """Newest dead letters first, ``limit`` per page, keyset-paginated by ``seq``.

    ``limit`` must be 1 to ``MAX_LIST_LIMIT`` and ``cursor`` a seq (a BIGINT), else
    :class:`~django_sqlqueue.ops.base.OperationError`. With ``preview``, neither the payload
    nor the whole error is loaded: each item's ``payload_preview`` has the payload's start
    (cut by the database, with its length and size in bytes) and ``last_error`` its first
    LIST_ERROR_LENGTH characters.
    """
    limit = check_count(limit, "limit", MAX_LIST_LIMIT)
    if cursor is not None and (
        isinstance(cursor, bool) or not isinstance(cursor, int) or not -MAX_BIGINT <= cursor <= MAX_BIGINT
    ):
        raise OperationError(f"cursor must be a seq, an integer of at most {MAX_BIGINT}, got {brief_repr(cursor)}.")
    qs = matching(f or DeadLetterFilter(), using)
    if cursor is not None:
        qs = qs.filter(seq__lt=cursor)
    if preview:
        qs = qs.defer("payload", "last_error").annotate(
            last_error_head=Left("last_error", LIST_ERROR_LENGTH), **cut_columns("payload", "payload", size=True)
        )
    rows: list[Any] = list(qs.order_by("-seq")[: limit + 1])
    more = len(rows) > limit
    items = [_listed(m) if preview else from_message(m) for m in rows[:limit]]
    return DeadLetterPage(items, items[-1].seq if more and items else None)


def _listed(m: Any) -> DeadLetter:
    """A dead letter read with ``preview=True``: the deferred columns are not touched."""
    m.last_error = m.last_error_head or ""  # sets the deferred field: no query
    return from_message(m, read_cut(m, "payload", compact=True))


def count_dead_letters(f: DeadLetterFilter | None = None, using: str | None = None) -> int:
    """How many dead letters match (a count over the DLQ topics only, never the whole log)."""
    return matching(f or DeadLetterFilter(), using).count()


def get_dead_letter(seq: int, using: str | None = None) -> DeadLetter:
    try:
        number = int(seq)
        if not -MAX_BIGINT <= number <= MAX_BIGINT:  # no such row, and SQLite's driver cannot send it
            raise ValueError(seq)
        m = Message.objects.using(alias(using)).exclude(original_topic="").get(seq=number)
    except (Message.DoesNotExist, ValueError, TypeError):
        raise NotFound(f"no dead letter with seq {seq!r} (replayed or purged already?).") from None
    return from_message(m)
