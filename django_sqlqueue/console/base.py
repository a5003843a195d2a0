"""Shared pieces of the console views: permissions, audit log, rendering, input parsing."""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from ..conf import get_settings
from ..models import QueueConsole
from ..ops import OperationError
from ..ops.base import chosen_database, on_database
from ..ops.pausing import REASON_LENGTH
from ..ops.search import parse_value
from ..rules.limits import CONSUMER_GROUP_LENGTH, KEY_LENGTH, MAX_BIGINT, MESSAGE_ID_LENGTH, TOPIC_COLUMN_LENGTH
from ..rules.timeparse import parse_time as parse_iso_time

APP = "django_sqlqueue"
VIEW = "view_queue"
#: Action -> permission codename.
PERMISSIONS = {
    "replay": "replay_deadletter",
    "purge": "purge_deadletter",
    "seek": "seek_group",
    "pause": "pause_group",
    "resume": "pause_group",
    "drop": "drop_group",
    "release": "release_lease",
    "purge_topic": "purge_topic",
    # Retrying a failed task replays its dead letter: the same right as on the dead-letter pages.
    "retry_task": "replay_deadletter",
    "cancel_task": "cancel_task",
}

TABS = [
    ("overview", "Overview"),
    ("messages", "Messages"),
    ("groups", "Groups & offsets"),
    ("leases", "Leases & subscribers"),
    ("deliveries", "In flight & retrying"),
    ("deadletters", "Dead letters"),
    ("topics", "Topics"),
    ("tasks", "Tasks"),
    ("actionlog", "Action log"),
]

#: Longest flash message: a message is stored in the session (or a cookie) until the next
#: page shows it, and it often echoes operator input or a list (of partitions, groups).
FLASH_LENGTH = 500
#: Characters of a payload the list pages show (compact JSON); the message's own page shows it all.
PREVIEW_LENGTH = 200
#: Characters of a stored error the list pages show: the start (the headline) and the end
#: (the traceback's last lines); the dead letter's own page shows it whole.
ERROR_HEAD, ERROR_TAIL = 300, 1200
#: Longest value (and name) of any form field or query parameter, unless FIELD_LENGTHS says
#: otherwise: every name, key, id and time the console takes is far shorter (300 at most).
DEFAULT_FIELD_LENGTH = 1000
FIELD_LENGTHS = {
    # Every partition of a topic of MAX_PARTITIONS (4096) partitions, comma-separated, fits.
    "partitions": 50_000,
    # The page to go back to: a console URL with its filters.
    "next": 16_000,
}
#: ``maxlength`` of the forms' inputs (the server checks the same and more: FIELD_LENGTHS, ops).
INPUT_LENGTHS = {
    "reason": REASON_LENGTH,
    "key": KEY_LENGTH,
    "id": MESSAGE_ID_LENGTH,
    "group": CONSUMER_GROUP_LENGTH,
    "topic": TOPIC_COLUMN_LENGTH,
    "field": DEFAULT_FIELD_LENGTH,
}


def has(request: HttpRequest, codename: str) -> bool:
    return request.user.is_active and request.user.is_staff and request.user.has_perm(f"{APP}.{codename}")


def require(request: HttpRequest, codename: str = VIEW) -> None:
    """Raise PermissionDenied (HTTP 403) unless the user has the console permission ``codename``."""
    if not has(request, VIEW) or not has(request, codename):
        raise PermissionDenied(f"needs the permission {APP}.{codename}")


def require_action(request: HttpRequest, action: str) -> None:
    if request.method != "POST":
        raise PermissionDenied("actions are POST only")
    require(request, PERMISSIONS[action])


def audit(request: HttpRequest, target: str, message: str, *, deletion: bool = False) -> None:
    """Record an operator action in the admin log (``LogEntry``): what, on what, how many.

    The user's primary key goes in as it is, as the admin's own ``LogEntry.objects.log_actions``
    gets it (``user_id=request.user.pk``): a custom user model's key need not be a number.
    """
    user_id = request.user.pk
    if user_id is None:  # unreachable: every action needs a staff user (require_action)
        raise PermissionDenied("the audit log needs a logged-in user")
    database = chosen_database()
    if database is not None and len(get_settings().databases) > 1:
        # Several databases: the entry says which one the action changed (at the end, so
        # the action log's kinds, which match the start of the message, still match).
        message = f"{message} [database {database}]"
    LogEntry.objects.create(
        user_id=user_id,
        content_type=ContentType.objects.get_for_model(QueueConsole, for_concrete_model=False),
        object_id=target[:2000],
        object_repr=target[:200],
        action_flag=DELETION if deletion else CHANGE,
        change_message=message,
    )


def url(name: str, *args: Any) -> str:
    return reverse(f"admin:{APP}_queueconsole_{name}", args=args)


def next_url(request: HttpRequest, default: str) -> str:
    """The posted ``next`` page if it is a page of this site, else ``default`` (no open redirect)."""
    target = request.POST.get("next") or ""
    if (
        target
        and target.isprintable()
        and url_has_allowed_host_and_scheme(
            target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        )
    ):
        return target
    return default


def _inputs(request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """Every ``(field name, text)`` a view can read: URL arguments, query string and form (names too)."""
    for arg in args:
        yield "path", str(arg)
    for name, value in kwargs.items():
        yield name, str(value)
    for data in (request.GET, request.POST):
        for name, values in data.lists():
            yield "field name", name
            for value in values:
                yield name, value


def refuse_nul(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Answer 400 to a NUL character anywhere in the path, query string or form.

    No column of the queue can hold one (PostgreSQL refuses it even in a comparison), and
    no operator means to type one: refuse it before any view reads its input.
    """

    @functools.wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if any("\x00" in text for _, text in _inputs(request, args, kwargs)):
            return HttpResponseBadRequest("The console's input must not contain NUL characters (%00).")
        return view(request, *args, **kwargs)

    return checked


def refuse_oversized(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Answer 400 to a field longer than the console takes (FIELD_LENGTHS, else DEFAULT_FIELD_LENGTH).

    Views echo their input -- in a filter form, a confirmation page's hidden fields, an
    error message -- so a field of megabytes would make pages (and flash messages kept in
    the session) of megabytes. Nothing the console takes comes near these bounds.
    """

    @functools.wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        for name, text in _inputs(request, args, kwargs):
            limit = FIELD_LENGTHS.get(name, DEFAULT_FIELD_LENGTH)
            if len(text) > limit:
                return HttpResponseBadRequest(
                    f"The console's {cut(name, 40)!r} is {len(text)} characters long; it takes at most {limit}.",
                    content_type="text/plain",
                )
        return view(request, *args, **kwargs)

    return checked


#: The query parameter and form field that choose the database (the switcher's), and the
#: session key that keeps the choice for the pages visited next.
DATABASE_FIELD = "db"
DATABASE_SESSION_KEY = "sqlqueue_console_database"


def with_database(view: Callable[..., HttpResponse], *, fixed: bool = False) -> Callable[..., HttpResponse]:
    """Run ``view`` on the database the console's switcher chose (``?db=<alias>``).

    Only when the queue has several databases (``SQLQUEUE["TOPIC_DATABASES"]``). The
    alias comes from the form or query string (``db``: every action form carries the
    one its page showed, so an action never lands in another database than the one the
    operator looked at), else from the session (the last one chosen), else
    ``SQLQUEUE["DATABASE"]``. An alias that is not one of the queue's is a 404 naming the
    known ones. The page renders inside the choice (:func:`~django_sqlqueue.ops.on_database`).
    ``fixed``: the view is always of ``SQLQUEUE["DATABASE"]`` (the Tasks tab: the tasks
    backend keeps its results there) and shows no switcher.
    """

    @functools.wraps(view)
    def chosen(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        databases = get_settings().databases
        if len(databases) < 2:
            return view(request, *args, **kwargs)
        given = databases[0] if fixed else request.POST.get(DATABASE_FIELD) or request.GET.get(DATABASE_FIELD)
        if fixed:
            request.sqlqueue_database_fixed = True  # type: ignore[attr-defined]
        elif given:
            if given not in databases:
                raise Http404(f"{cut(given, 40)!r} is not a database of the queue (known: {', '.join(databases)}).")
            request.session[DATABASE_SESSION_KEY] = given
        else:
            kept = request.session.get(DATABASE_SESSION_KEY)
            given = kept if kept in databases else databases[0]
        request.sqlqueue_database = given  # type: ignore[attr-defined]
        with on_database(given):
            response = view(request, *args, **kwargs)
            render = getattr(response, "render", None)
            if render is not None and not getattr(response, "is_rendered", True):
                render()  # the template's reads too, on the chosen database
            return response

    return chosen


def cut(text: str, limit: int = FLASH_LENGTH) -> str:
    """Return ``text`` cut to about ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def flash(request: HttpRequest, level: int, text: str) -> None:
    """Add a flash message, cut to FLASH_LENGTH (it waits in the session for the next page)."""
    messages.add_message(request, level, cut(text))


def clip(text: str, head: int = ERROR_HEAD, tail: int = ERROR_TAIL) -> str:
    """Return ``text`` with its middle left out (and said so) when it is longer than ``head + tail``."""
    if len(text) <= head + tail:
        return text
    return f"{text[:head]}\n… ({len(text) - head - tail} characters left out) …\n{text[-tail:]}"


@dataclass(frozen=True)
class Preview:
    """The start of a payload as compact JSON, for a list: the whole of it is on its own page."""

    text: str
    #: Bytes of the whole value as compact JSON (UTF-8): what MAX_PAYLOAD_BYTES counts.
    size: int
    cut: bool


def preview(value: Any, limit: int = PREVIEW_LENGTH) -> Preview:
    """Return the first ``limit`` characters of ``value`` as compact JSON, and its size."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return Preview(text[:limit], len(text.encode("utf-8", "surrogatepass")), len(text) > limit)


class Console:
    """Binds the views to an admin site."""

    def __init__(self, admin_site: Any) -> None:
        self.admin_site = admin_site

    def render(
        self, request: HttpRequest, template: str, context: dict[str, Any], *, tab: str, title: str
    ) -> HttpResponse:
        perms = {codename: has(request, codename) for codename in set(PERMISSIONS.values())}
        ctx = {
            **self.admin_site.each_context(request),
            "title": title,
            "tab": tab,
            "tabs": [(key, label, url(key)) for key, label in TABS],
            "can": perms,
            "opts": QueueConsole._meta,
            "limits": INPUT_LENGTHS,
            # The database switcher (base.html): shown when the queue has several databases.
            "databases": get_settings().databases
            if len(get_settings().databases) > 1 and not getattr(request, "sqlqueue_database_fixed", False)
            else [],
            "database": getattr(request, "sqlqueue_database", None),
            "database_field": DATABASE_FIELD,
            # Switching goes to the tab's first page: a seq or a group is of one database only.
            "database_action": url(tab) if tab in dict(TABS) else url("overview"),
            **context,
        }
        return TemplateResponse(request, f"django_sqlqueue/console/{template}", ctx)

    def confirm(
        self,
        request: HttpRequest,
        *,
        tab: str,
        title: str,
        summary: str,
        details: Iterable[str] = (),
        table: Any = None,
        danger: bool = True,
        back: str,
    ) -> HttpResponse:
        """The confirmation page: the counts, the posted fields again, and a confirm button."""
        fields = [
            (k, v)
            for k in request.POST
            if k not in ("csrfmiddlewaretoken", "confirmed")
            for v in request.POST.getlist(k)
        ]
        return self.render(
            request,
            "confirm.html",
            {
                "summary": summary,
                "details": list(details),
                "table": table,
                "fields": fields,
                "danger": danger,
                "back": back,
                "action_url": request.get_full_path(),
            },
            tab=tab,
            title=title,
        )


def confirmed(request: HttpRequest) -> bool:
    return request.POST.get("confirmed") == "yes"


def fail(request: HttpRequest, exc: Exception) -> None:
    flash(request, messages.ERROR, str(exc))


def parse_time(value: str | None, what: str) -> dt.datetime | None:
    """Parse an ISO 8601 time from a form (``datetime-local`` inputs are naive: taken as UTC)."""
    if not value:
        return None
    try:
        return parse_iso_time(value)
    except ValueError:
        raise OperationError(f"{what}: {value!r} is not a date and time (use YYYY-MM-DDTHH:MM[:SS], UTC).") from None


def parse_search(data: Any) -> dict[str, Any]:
    """A filter form's payload search: ``field`` and its ``value``, typed (``42``, ``"42"``, ``true``, ``null``)."""
    name = (data.get("field") or "").strip()
    if not name:
        return {}
    text = data.get("value") or ""
    if not text:
        raise OperationError('enter the value the payload field must equal (null for JSON null, "" for "").')
    return {"field": name, "value": parse_value(text)}


def parse_int(value: str | None, what: str, *, minimum: int | None = 0) -> int | None:
    if value is None or value.strip() == "":
        return None
    try:
        number = int(value)
    except ValueError:
        raise OperationError(f"{what} must be an integer, got {value!r}.") from None
    if minimum is not None and number < minimum:
        raise OperationError(f"{what} must be >= {minimum}, got {number}.")
    if abs(number) > MAX_BIGINT:
        raise OperationError(f"{what} must be at most {MAX_BIGINT}, got {number}.")
    return number


def pretty(value: Any) -> str:
    """Return ``value`` as indented JSON for a page (payloads, metadata)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
