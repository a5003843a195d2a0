"""Shared pieces of the console views: permissions, audit log, rendering, input parsing."""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from ..models import QueueConsole
from ..ops import OperationError
from ..rules.limits import MAX_BIGINT
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
}

TABS = [
    ("overview", "Overview"),
    ("messages", "Messages"),
    ("groups", "Groups & offsets"),
    ("leases", "Leases & subscribers"),
    ("deliveries", "In flight & retrying"),
    ("deadletters", "Dead letters"),
    ("topics", "Topics"),
]


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


def refuse_nul(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Answer 400 to a NUL character anywhere in the path, query string or form.

    No column of the queue can hold one (PostgreSQL refuses it even in a comparison), and
    no operator means to type one: refuse it before any view reads its input.
    """

    @functools.wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        texts = [*map(str, args), *map(str, kwargs.values())]
        for data in (request.GET, request.POST):
            for name, values in data.lists():
                texts += [name, *values]
        if any("\x00" in text for text in texts):
            return HttpResponseBadRequest("The console's input must not contain NUL characters (%00).")
        return view(request, *args, **kwargs)

    return checked


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
    messages.error(request, str(exc))


def parse_time(value: str | None, what: str) -> dt.datetime | None:
    """Parse an ISO 8601 time from a form (``datetime-local`` inputs are naive: taken as UTC)."""
    if not value:
        return None
    try:
        return parse_iso_time(value)
    except ValueError:
        raise OperationError(f"{what}: {value!r} is not a date and time (use YYYY-MM-DDTHH:MM[:SS], UTC).") from None


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
