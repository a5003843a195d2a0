"""console/base.py: the helpers every console view stands on, with real requests and users.

Where an action may send the operator next (never off the site), the refusal of NUL
characters before a view reads its input, the permission checks, and the parsing of form
fields. The views that use them are driven through the test client in test_admin.py.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import AnonymousUser, Permission, User
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory

from django_sqlqueue.console.base import has, next_url, parse_int, parse_time, refuse_nul, require, require_action
from django_sqlqueue.ops import OperationError
from django_sqlqueue.rules.limits import MAX_BIGINT

DEFAULT = "/admin/django_sqlqueue/queueconsole/groups/"


def posted(data: dict[str, str], *, secure: bool = False) -> HttpRequest:
    return RequestFactory().post("/admin/django_sqlqueue/queueconsole/groups/drop/", data, secure=secure)


@pytest.mark.parametrize(
    "target",
    [
        "/admin/django_sqlqueue/queueconsole/deadletters/?group=billing",
        "http://testserver/admin/",
        "deadletters/",
    ],
)
def test_next_url_keeps_a_page_of_this_site(target: str) -> None:
    assert next_url(posted({"next": target}), DEFAULT) == target


@pytest.mark.parametrize(
    "target",
    [
        "",
        "https://evil.example/",
        "//evil.example/admin/",
        "http://testserver.evil.example/",
        "javascript:alert(1)",
        "/admin/\nSet-Cookie: x=1",  # header injection: not printable
        "/admin/\x00",
    ],
)
def test_next_url_never_leaves_the_site(target: str) -> None:
    assert next_url(posted({"next": target}), DEFAULT) == DEFAULT


def test_next_url_keeps_a_secure_page_secure() -> None:
    assert next_url(posted({"next": "http://testserver/admin/"}, secure=True), DEFAULT) == DEFAULT
    assert next_url(posted({"next": "https://testserver/admin/"}, secure=True), DEFAULT) == "https://testserver/admin/"
    assert next_url(posted({}), DEFAULT) == DEFAULT


def test_refuse_nul_answers_400_before_the_view_reads_anything() -> None:
    seen: list[tuple[str, ...]] = []

    @refuse_nul
    def view(request: HttpRequest, *args: str, **kwargs: str) -> HttpResponse:
        seen.append((*args, *kwargs.values()))
        return HttpResponse("ok")

    factory = RequestFactory()
    refused = [
        view(factory.get("/x/"), "billing\x00"),
        view(factory.get("/x/"), group="billing", topic="or\x00ders"),
        view(factory.get("/x/", {"topic": "a\x00"})),
        view(factory.get("/x/", {"to\x00pic": "a"})),
        view(factory.post("/x/", {"reason": "deploy\x00"})),
        view(factory.post("/x/", {"seq": ["1", "2\x00"]})),
    ]
    assert [r.status_code for r in refused] == [400] * len(refused)
    assert b"NUL" in refused[0].content and seen == []
    ok = view(factory.post("/x/?topic=orders", {"seq": ["1", "2"]}), "billing", topic="orders")
    assert (ok.status_code, seen) == (200, [("billing", "orders")])
    assert view.__name__ == "view"  # the routes are named after the wrapped view


def user(*codenames: str, staff: bool = True, active: bool = True) -> User:
    made = User.objects.create_user(f"u{User.objects.count()}", is_staff=staff, is_active=active)
    made.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_sqlqueue", codename__in=codenames)
    )
    return User.objects.get(pk=made.pk)  # fresh: no permission cache


def request_of(who: User | AnonymousUser, method: str = "get") -> HttpRequest:
    request = getattr(RequestFactory(), method)("/x/")
    request.user = who
    return request


@pytest.mark.django_db
def test_every_check_needs_an_active_staff_user_with_the_view_and_the_action_permission() -> None:
    operator = user("view_queue", "seek_group")
    assert has(request_of(operator), "view_queue") and has(request_of(operator), "seek_group")
    require(request_of(operator))
    require_action(request_of(operator, "post"), "seek")
    denied = [
        (user("view_queue", "seek_group", staff=False), "seek"),  # not staff
        (user("view_queue", "seek_group", active=False), "seek"),  # deactivated
        (user("seek_group"), "seek"),  # may act, may not look
        (user("view_queue", "seek_group"), "drop"),  # another action's permission
        (AnonymousUser(), "seek"),
    ]
    for who, action in denied:
        with pytest.raises(PermissionDenied):
            require_action(request_of(who, "post"), action)
    with pytest.raises(PermissionDenied, match="POST only"):
        require_action(request_of(operator, "get"), "seek")
    with pytest.raises(PermissionDenied, match=r"django_sqlqueue\.view_queue"):
        require(request_of(user()))


def test_parse_int_takes_blank_as_none_and_refuses_what_no_column_holds() -> None:
    assert parse_int(None, "partition") is None and parse_int("  ", "partition") is None
    assert parse_int("7", "partition") == 7 and parse_int(str(MAX_BIGINT), "offset") == MAX_BIGINT
    assert parse_int("-3", "delta", minimum=None) == -3
    for value, message in [
        ("x", "partition must be an integer, got 'x'"),
        ("-1", "partition must be >= 0, got -1"),
        (str(MAX_BIGINT + 1), f"partition must be at most {MAX_BIGINT}"),
    ]:
        with pytest.raises(OperationError, match=message):
            parse_int(value, "partition")
    with pytest.raises(OperationError, match="at most"):
        parse_int(str(-MAX_BIGINT - 1), "delta", minimum=None)


def test_parse_time_takes_a_form_time_as_utc_and_names_the_field_it_refuses() -> None:
    assert parse_time("", "published after") is None and parse_time(None, "published after") is None
    assert parse_time("2026-01-31T12:30", "published after") == dt.datetime(2026, 1, 31, 12, 30, tzinfo=dt.UTC)
    assert parse_time("2026-01-31T14:30+02:00", "x") == dt.datetime(2026, 1, 31, 12, 30, tzinfo=dt.UTC)
    with pytest.raises(OperationError, match=r"published before: '2026-13-01' is not a date and time"):
        parse_time("2026-13-01", "published before")
