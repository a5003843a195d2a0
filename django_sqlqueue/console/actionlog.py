"""The console's action log: the admin ``LogEntry`` rows its actions write (``base.audit``).

**Order and index.** ``django_admin_log`` has no index on ``action_time`` (Django's
``LogEntry.Meta`` declares none, and the app adds no migration to another app's table).
Its primary key grows with the time of writing (``action_time`` is set by ``save()``), so
the log is read newest first by ``id`` -- the primary key, or the ``content_type_id``
index, which holds the key in order on every database -- and paged by keyset
(``id < cursor``), never by OFFSET. A time range becomes a range of ids found by binary
search on the primary key (:func:`_first_id_at`, about 20 point reads for a million
entries), widened by ``CLOCK_SLACK`` for entries written a little out of order
(concurrent requests, servers' clocks), then filtered exactly on ``action_time``.

**Filters without an index** (the target, the kind: text columns) scan the ids of the
time range only; the page bounds them to the last ``DEFAULT_WINDOW`` when no start is given.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass

from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.db import router
from django.db.models import F, Max, Min, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch
from django.utils import timezone
from django.utils.http import urlencode

from ..exceptions import SQLQueueError
from ..models import QueueConsole
from ..ops import OperationError
from .base import Console, parse_int, parse_time, require, url

#: At most this many markers from :func:`group_actions` (the newest, in time order).
MARKER_LIMIT = 200
#: Entries on a page of the action log.
PAGE_SIZE = 50
#: How far out of ``id`` order an entry's ``action_time`` may be and still be found by a time range.
CLOCK_SLACK = dt.timedelta(minutes=5)
#: The time range searched by a filter on the target or the kind when no start is given.
DEFAULT_WINDOW = dt.timedelta(days=7)

#: Action kind -> (target prefix, message prefix) of its entries (``None``: any); as console/*.py writes them.
KINDS: dict[str, tuple[str | None, str | None]] = {
    "seek": ("group ", "Seek "),
    "pause": ("group ", "Paused "),
    "resume": ("group ", "Resumed "),
    "drop": ("group ", "Dropped "),
    "replay": ("dead letters (", "Replayed "),
    "purge": ("dead letters (", "Purged "),
    "purge_topic": ("topic ", None),
    "release": ("lease ", "Released "),
    "retry": ("task ", "Retried "),
    "cancel": ("task ", None),
}
KIND_LABELS = {"purge": "purge dead letters", "purge_topic": "purge topic"}

#: "<n> message(s)" and "<n> dead letter(s)" counts in a change message; a seek's skipped messages.
_COUNTS = re.compile(r"(\d+) (?:dead letter\(s\)|message\(s\)(?: redelivered)?)|(\d+) skipped")


@dataclass(frozen=True)
class ActionMarker:
    """An operator action on a group, to mark on its charts."""

    at: dt.datetime
    #: A key of ``KINDS``: ``pause``, ``resume``, ``seek``, ``drop``, ``replay`` or ``retry``.
    kind: str
    user: str
    message: str


def console_entries(using: str | None = None, *, indexed: bool = True) -> QuerySet[LogEntry]:
    """Every ``LogEntry`` of the console (its content type is the ``QueueConsole`` proxy).

    ``indexed=False`` when the query has a better index to read (a range of ids, a user):
    the content type is then compared as ``content_type_id + 0``, which no index serves.
    Else MariaDB reads the content type's index newest first even with a range of ids,
    and a filter matching nothing reads every console entry, not those of the range.
    """
    ctype = ContentType.objects.db_manager(using).get_for_model(QueueConsole, for_concrete_model=False)
    qs = LogEntry.objects.using(using or router.db_for_read(LogEntry))
    if indexed:
        return qs.filter(content_type_id=ctype.pk)
    return qs.alias(console_type=F("content_type_id") + 0).filter(console_type=ctype.pk)


def kind_of(target: str, message: str) -> str:
    """The kind of the action an entry records (a key of ``KINDS``), or ``""`` for one unknown."""
    for kind, (target_prefix, message_prefix) in KINDS.items():
        if target.startswith(target_prefix or "") and message.startswith(message_prefix or ""):
            return kind
    return ""


def kind_filter(kind: str) -> Q:
    target_prefix, message_prefix = KINDS[kind]
    q = Q(object_id__startswith=target_prefix) if target_prefix else Q()
    if message_prefix:
        q &= Q(change_message__startswith=message_prefix)
    if kind == "cancel":  # the retries share the target: a cancel is a task's other entry
        q &= ~Q(change_message__startswith=KINDS["retry"][1])
    return q


def message_count(message: str) -> int | None:
    """The messages (or dead letters) an entry says it acted on, summed; ``None`` if it names none."""
    found = [int(a or b) for a, b in _COUNTS.findall(message)]
    return sum(found) if found else None


def _named_group(group: str) -> Q:
    """Entries of a replay (or retry) whose per-group counts (``BulkResult.describe``) name ``group``."""
    return Q(change_message__contains=f"({group}: ") | Q(change_message__contains=f", {group}: ")


def _filter_names(name: str, value: str) -> Q:
    """A dead-letter filter's ``name=value`` in a target (``DeadLetterFilter.describe`` in parentheses)."""
    return Q(object_id__contains=f"{name}={value}, ") | Q(object_id__contains=f"{name}={value})")


def group_filter(group: str) -> Q:
    """Entries about consumer group ``group``, on any topic."""
    replays = Q(object_id__startswith="dead letters (") & (_filter_names("group", group) | _named_group(group))
    return (
        Q(object_id__startswith=f"group {group} on ")
        | Q(object_id=f"group {group}")
        | Q(object_id__startswith=f"lease {group}:")
        | replays
        | (Q(object_id__startswith="task ") & _named_group(group))
    )


def topic_filter(topic: str) -> Q:
    """Entries about topic ``topic``: its groups, its leases, its dead letters, its purge."""
    return (
        (Q(object_id__startswith="group ") & Q(object_id__endswith=f" on {topic}"))
        | Q(object_id=f"topic {topic}")
        | (Q(object_id__startswith="lease ") & Q(object_id__contains=f":{topic}["))
        | (Q(object_id__startswith="dead letters (") & _filter_names("topic", topic))
    )


def about_group(group: str, topic: str) -> Q:
    """Entries about ``group`` on ``topic``: pause, resume, seek, drop (on it or on every topic),
    and replays of the group's dead letters of that topic -- or of no named topic: a replay of
    selected dead letters names their groups, not their topics.
    """
    replays = (
        Q(object_id__startswith="dead letters (")
        & Q(change_message__startswith=KINDS["replay"][1])
        & (_filter_names("topic", topic) | ~Q(object_id__contains="topic="))
        & (_filter_names("group", group) | _named_group(group))
    )
    retries = Q(object_id__startswith="task ") & Q(change_message__startswith=KINDS["retry"][1]) & _named_group(group)
    return Q(object_id=f"group {group} on {topic}") | Q(object_id=f"group {group}") | replays | retries


def _first_id_at(qs: QuerySet[LogEntry], at: dt.datetime, low: int, high: int) -> int:
    """The first id in ``[low, high]`` whose entry was written at ``at`` or later (``high + 1``: none).

    A binary search on the primary key (each step one index read), right as long as ids
    grow with ``action_time``; callers widen ``at`` by ``CLOCK_SLACK`` and filter exactly.
    """
    hi = high + 1
    while low < hi:
        row = qs.filter(pk__gte=(low + hi) // 2, pk__lt=hi).order_by("pk").values_list("pk", "action_time").first()
        if row is None or row[1] >= at:
            hi = (low + hi) // 2 if row is None else row[0]
        else:
            low = row[0] + 1
    return hi


def in_time_range(qs: QuerySet[LogEntry], since: dt.datetime | None, until: dt.datetime | None) -> QuerySet[LogEntry]:
    """``qs`` limited to entries written in ``[since, until]``, by a range of ids (module docstring)."""
    if since is None and until is None:
        return qs
    # The ids of the whole table (the primary key's two ends), not of one content type.
    ids = LogEntry.objects.using(qs.db).aggregate(low=Min("pk"), high=Max("pk"))
    if ids["low"] is None:
        return qs.none()
    everything = LogEntry.objects.using(qs.db)
    if since is not None:
        qs = qs.filter(pk__gte=_first_id_at(everything, since - CLOCK_SLACK, ids["low"], ids["high"]))
        qs = qs.filter(action_time__gte=since)
    if until is not None:
        qs = qs.filter(pk__lt=_first_id_at(everything, until + CLOCK_SLACK, ids["low"], ids["high"]))
        qs = qs.filter(action_time__lte=until)
    return qs


def usernames(entries: list[LogEntry]) -> dict[object, str]:
    """The usernames of the entries' users, by key: one query, no join.

    Not ``select_related``: joined to the (small) users table, MariaDB's plan sorts every
    entry of the console in a temporary table instead of reading the index newest first.
    """
    users = get_user_model()._default_manager
    found = users.filter(pk__in={e.user_id for e in entries}).values_list("pk", users.model.USERNAME_FIELD)
    return {pk: str(name) for pk, name in found}


def group_actions(
    group: str, topic: str, since: dt.datetime, until: dt.datetime | None = None, using: str | None = None
) -> list[ActionMarker]:
    """Return the console's actions on ``group`` on ``topic`` between ``since`` and ``until``, oldest first.

    Pauses, resumes, seeks, drops, and replays (or task retries) of the group's dead letters;
    at most ``MARKER_LIMIT``, the newest. ``using`` is the database of ``LogEntry`` (else the
    router's).
    """
    qs = in_time_range(console_entries(using, indexed=False), since, until).filter(about_group(group, topic))
    entries = list(qs.order_by("-pk")[:MARKER_LIMIT])
    names = usernames(entries)
    markers = [
        ActionMarker(
            e.action_time, kind_of(e.object_id or "", e.change_message), names.get(e.user_id, ""), e.change_message
        )
        for e in entries
    ]
    return sorted(markers, key=lambda m: m.at)


# -- the page --------------------------------------------------------------------------------

#: A dead-letter filter's fields in a replay's or purge's target (``DeadLetterFilter.describe``).
_TARGET_FIELD = re.compile(r"[(,] ?(topic|group)=([^,)]*)")
#: The per-group counts of a replay or purge (``BulkResult.describe``): "(billing: 3, shipping: 1)".
_GROUP_COUNTS = re.compile(r"dead letter\(s\) \(([^()]*: \d+)\)")


@dataclass(frozen=True)
class ActionLogFilter:
    """The page's filters; the target and kind filters scan: they are bounded by ``since``."""

    user: str = ""
    group: str = ""
    topic: str = ""
    kind: str = ""
    since: dt.datetime | None = None
    until: dt.datetime | None = None

    @classmethod
    def from_query(cls, data: Mapping[str, str]) -> ActionLogFilter:
        """Read the filters of a query string; raise OperationError on an unknown kind or a bad time."""
        kind = data.get("kind") or ""
        if kind and kind not in KINDS:
            raise OperationError(f"unknown action kind {kind!r}; one of: {', '.join(KINDS)}.")
        f = cls(
            user=(data.get("user") or "").strip(),
            group=data.get("group") or "",
            topic=data.get("topic") or "",
            kind=kind,
            since=parse_time(data.get("since"), "since"),
            until=parse_time(data.get("until"), "until"),
        )
        if f.since and f.until and f.since > f.until:
            raise OperationError(f"since ({f.since.isoformat()}) is after until ({f.until.isoformat()}).")
        return f

    @property
    def scans(self) -> bool:
        """Whether a filter reads text columns no index serves (the target, the kind)."""
        return bool(self.group or self.topic or self.kind)

    def as_query(self) -> dict[str, str]:
        out = {k: getattr(self, k) for k in ("user", "group", "topic", "kind") if getattr(self, k)}
        out.update({k: getattr(self, k).strftime("%Y-%m-%dT%H:%M:%S") for k in ("since", "until") if getattr(self, k)})
        return out


@dataclass(frozen=True)
class ActionRow:
    """One entry of the action log, as the page shows it."""

    id: int
    at: dt.datetime
    user: str
    kind: str
    message: str
    target: str
    group: str
    topic: str
    #: Messages (or dead letters) acted on, when the message says.
    count: int | None
    deletion: bool
    #: The group's page, when the entry is about one group on one topic.
    link: str = ""


@dataclass(frozen=True)
class ActionPage:
    rows: list[ActionRow]
    #: ``cursor`` of the next older page, and ``newer`` of the next newer one (``None``: no such page).
    older: int | None
    newer: int | None
    #: The start of the time range searched when the filters scan and gave none (``DEFAULT_WINDOW``).
    window_since: dt.datetime | None = None


def target_parts(target: str, message: str) -> tuple[str, str]:
    """The (group, topic) an entry's target names (``""`` where it names none)."""
    if target.startswith("group "):
        group, _, topic = target[len("group ") :].rpartition(" on ")
        return (group, topic) if group else (topic, "")
    if target.startswith("lease "):
        group, _, topic = target[len("lease ") :].rpartition("[")[0].rpartition(":")
        return group, topic
    if target.startswith("topic "):
        return "", target[len("topic ") :]
    if target.startswith("dead letters ("):
        fields = dict(_TARGET_FIELD.findall(target))
        counts = _GROUP_COUNTS.search(message)
        groups = [part.rpartition(": ")[0] for part in counts.group(1).split(", ")] if counts else []
        return fields.get("group") or ", ".join(groups), fields.get("topic", "")
    return "", ""


def _group_page(target: str, group: str, topic: str) -> str:
    if not (group and topic and target.startswith(("group ", "lease "))):
        return ""
    try:
        return url("group", group, topic)
    except NoReverseMatch:  # a name the route cannot hold (a "/")
        return ""


def _row(entry: LogEntry, names: dict[object, str]) -> ActionRow:
    target, message = entry.object_id or entry.object_repr, entry.change_message
    group, topic = target_parts(target, message)
    kind, count, deletion = kind_of(target, message), message_count(message), entry.action_flag == DELETION
    user, link = names.get(entry.user_id, ""), _group_page(target, group, topic)
    return ActionRow(entry.pk, entry.action_time, user, kind, message, target, group, topic, count, deletion, link)


def action_log(
    f: ActionLogFilter, *, cursor: int | None = None, newer: int | None = None, using: str | None = None
) -> ActionPage:
    """A page of the console's entries matching ``f``: newest first, older than ``cursor`` (or newer than ``newer``)."""
    window = timezone.now() - DEFAULT_WINDOW if f.scans and f.since is None else None
    since = f.since or window
    indexed = not (f.user or since or f.until)  # else a range of ids or the user's index is read
    qs = in_time_range(console_entries(using, indexed=indexed), since, f.until)
    if f.user:
        users = get_user_model()._default_manager
        # The user's key first (the users' table may live on another database than the log).
        user = users.filter(**{users.model.USERNAME_FIELD: f.user}).values_list("pk", flat=True).first()
        qs = qs.filter(user_id=user) if user is not None else qs.none()
    if f.group and f.topic:
        lease = Q(object_id__startswith=f"lease {f.group}:{f.topic}[")
        qs = qs.filter(about_group(f.group, f.topic) | lease)
    elif f.group or f.topic:
        qs = qs.filter(group_filter(f.group) if f.group else topic_filter(f.topic))
    if f.kind:
        qs = qs.filter(kind_filter(f.kind))
    if newer is not None:
        # The page just newer than ``newer``: read upwards, shown newest first.
        entries = list(qs.filter(pk__gt=newer).order_by("pk")[: PAGE_SIZE + 1])
        more_newer = len(entries) > PAGE_SIZE
        entries = entries[:PAGE_SIZE][::-1]
        older: int | None = entries[-1].pk if entries else newer + 1
        newest = entries[0].pk if more_newer else None
    else:
        if cursor is not None:
            qs = qs.filter(pk__lt=cursor)
        entries = list(qs.order_by("-pk")[: PAGE_SIZE + 1])
        older = entries[PAGE_SIZE - 1].pk if len(entries) > PAGE_SIZE else None
        entries = entries[:PAGE_SIZE]
        newest = entries[0].pk if entries and cursor is not None else None
    names = usernames(entries)
    return ActionPage([_row(e, names) for e in entries], older, newest, window)


class ActionLogPage(Console):
    """The console's "Action log" tab."""

    def actionlog(self, request: HttpRequest) -> HttpResponse:
        require(request)
        error, page, f = None, None, ActionLogFilter()
        try:
            f = ActionLogFilter.from_query(request.GET)
            cursor, newer = parse_int(request.GET.get("cursor"), "cursor"), parse_int(request.GET.get("newer"), "newer")
            page = action_log(f, cursor=cursor, newer=newer)
        except SQLQueueError as exc:
            error = str(exc)
        kinds = [(k, KIND_LABELS.get(k, k)) for k in KINDS]
        context = {"page": page, "filter": request.GET, "qs": urlencode(f.as_query()), "error": error, "kinds": kinds}
        return self.render(request, "actionlog.html", context, tab="actionlog", title="Action log")
