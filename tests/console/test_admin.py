"""The operator console in the admin, through Django's test client: every page and action,
each permission denial, non-staff users, CSRF and the audit log."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.test import Client, RequestFactory, override_settings
from django.urls import reverse
from django.utils import timezone

from django_sqlqueue import ops
from django_sqlqueue.console.actionlog import ActionLogPage
from django_sqlqueue.console.actions import Views
from django_sqlqueue.console.pages import Pages
from django_sqlqueue.console.tasks import TaskPages
from django_sqlqueue.db.store import seek_reads
from django_sqlqueue.models import ConsumerOffset, DeliveryState, Message, PartitionLease, PausedTopic, QueueConsole

from ..support.console_client import login, u
from ..support.console_scene import SETTINGS, build

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]

ACTION_PERMS = [
    "replay_deadletter",
    "purge_deadletter",
    "seek_group",
    "pause_group",
    "drop_group",
    "release_lease",
    "purge_topic",
]


@pytest.fixture
def scene_settings():
    with override_settings(SQLQUEUE=SETTINGS):
        yield


@pytest.fixture
def viewer() -> Client:
    return login("view_queue")


@pytest.fixture
def operator() -> Client:
    return login("view_queue", *ACTION_PERMS)


@pytest.fixture
def scene():
    return build()


PAGES = [
    ("changelist", ()),
    ("overview", ()),
    ("messages", ()),
    ("groups", ()),
    ("group", ("billing", "orders")),
    ("leases", ()),
    ("deliveries", ()),
    ("deadletters", ()),
    ("topics", ()),
]


@pytest.mark.parametrize("name, args", PAGES)
def test_every_page_renders_for_a_viewer(scene, viewer, name, args):
    response = viewer.get(u(name, *args))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'class="sq-tabs"' in html and "Django administration" in html  # admin chrome, each_context


def test_detail_pages(scene, viewer):
    seq = Message.objects.get(topic="orders", id="o3").seq
    html = viewer.get(u("message", seq)).content.decode()
    assert "&quot;n&quot;: 3" in html
    html = viewer.get(u("deadletter", scene.dead[0])).content.decode()
    assert "Traceback (most recent call last)" in html and "builtins.ValueError" in html
    assert viewer.get(u("deadletter", 999999)).status_code == 404
    assert viewer.get(u("message", 999999)).status_code == 404
    assert viewer.get(u("group", "nobody", "orders")).status_code == 404


def test_deliveries_page_shows_the_last_error(scene, viewer):
    DeliveryState.objects.create(
        consumer_group="billing",
        topic="orders",
        partition=0,
        message_offset=scene.heads[0],
        retry_count=1,
        status=DeliveryState.Status.RETRY,
        invisible_until=timezone.now(),
        last_error="builtins.TimeoutError: upstream <slow>\nTraceback (most recent call last):\n  in charge",
    )
    html = viewer.get(u("deliveries") + "?status=retrying").content.decode()
    assert "<summary>builtins.TimeoutError: upstream &lt;slow&gt;</summary>" in html  # escaped
    assert "in charge" in html


@pytest.mark.parametrize("name, args", PAGES)
def test_pages_need_the_view_permission(scene, name, args):
    client = login(*ACTION_PERMS)  # every action permission, but not view_queue
    assert client.get(u(name, *args)).status_code == 403


def view_names(cls: type) -> set[str]:
    """The views a console class defines itself (its public methods)."""
    return {name for name, value in vars(cls).items() if callable(value) and not name.startswith("_")}


#: The URL arguments of the views that take some.
VIEW_ARGS = {
    "message": ("1",),
    "deadletter": ("1",),
    "group": ("billing", "orders"),
    "seek": ("billing", "orders"),
    "pause": ("billing", "orders"),
    "task": ("r1",),
}


def test_every_console_view_is_routed_and_checks_the_view_permission_itself(scene):
    """Not only through the admin's wrapper (which lets any staff user in): each method of
    Pages (the read-only pages, lease release, topic purge) and Views (groups, dead letters)
    refuses a staff user without ``view_queue``, on GET and on POST, before it reads anything."""
    routed = {route.callback.__name__ for route in admin.site._registry[QueueConsole].get_urls()}
    pages, actions, tasks = view_names(Pages), view_names(Views), view_names(TaskPages)
    log = view_names(ActionLogPage)
    assert pages | actions | tasks | log == routed and not pages & actions and not (pages | actions) & tasks
    staff = User.objects.create_user("staff-only", is_staff=True)
    views = Views(admin.site)
    for name in sorted(routed):
        for method in ("get", "post"):
            request = getattr(RequestFactory(), method)("/x/", {"confirmed": "yes"} if method == "post" else {})
            request.user = staff
            with pytest.raises(PermissionDenied):
                view = getattr(ActionLogPage(admin.site), name) if name in log else getattr(views, name)
                view(request, *VIEW_ARGS.get(name, ()))
    assert not LogEntry.objects.exists() and ops.count_dead_letters() == len(scene.dead)


@pytest.mark.parametrize("name, args", PAGES)
def test_non_staff_and_anonymous_see_nothing(scene, name, args):
    anonymous = Client().get(u(name, *args))
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    non_staff = login("view_queue", *ACTION_PERMS, staff=False).get(u(name, *args))
    assert non_staff.status_code == 302 and "/login/" in non_staff["Location"]


def test_admin_index_lists_the_console_only_for_viewers(scene, viewer):
    assert "queue console" in viewer.get(reverse("admin:index")).content.decode().lower()
    assert "queue console" not in login().get(reverse("admin:index")).content.decode().lower()


def test_overview_shows_problems(scene, viewer):
    html = viewer.get(u("overview")).content.decode()
    assert "holds back garbage collection" in html
    assert "typo is consumed by no group" in html


def test_overview_flags_the_health_thresholds_of_the_setting(scene, viewer):
    """SQLQUEUE["HEALTH"]: the problems queue_health prints, in words, and the rows marked."""
    html = viewer.get(u("overview")).content.decode()
    assert "No health thresholds are set" in html and "over threshold" not in html
    with override_settings(SQLQUEUE={**SETTINGS, "HEALTH": {"MAX_LAG": 3, "MAX_DEAD_LETTERS": 2}}):
        html = viewer.get(u("overview")).content.decode()
    assert "No health thresholds are set" not in html
    assert "group billing on orders is 4 message(s) behind (HEALTH MAX_LAG 3)" in html
    assert "group billing on orders has 3 dead letter(s) (HEALTH MAX_DEAD_LETTERS 2)" in html
    assert 'title="lag group=billing topic=orders value=4 max=3"' in html
    billing = next(row for row in html.split("<tr") if ">billing</a>" in row)
    assert 'class="sq-bad"' in billing and "lag over threshold" in billing and "dead letters over threshold" in billing
    shipping = next(row for row in html.split("<tr") if ">shipping</a>" in row)  # caught up, 1 dead letter
    assert "over threshold" not in shipping


def test_messages_filters_and_pagination(scene, viewer):
    html = viewer.get(u("messages"), {"topic": "orders", "key": "k1"}).content.decode()
    assert "o16" in html and "o3<" not in html
    page = viewer.get(u("messages"), {"topic": "orders"})
    assert page.status_code == 200
    bad = viewer.get(u("messages"), {"id": "o1"}).content.decode()
    assert "needs a topic" in bad
    assert "not a date" in viewer.get(u("messages"), {"after": "yesterday"}).content.decode()


def test_a_key_page_that_read_its_span_says_so_and_goes_on(scene, viewer, monkeypatch):
    from django_sqlqueue.ops import messages

    monkeypatch.setattr(messages, "SCAN_SPAN", 4)  # the newest 4 positions of orders: o16..o19
    html = viewer.get(u("messages"), {"topic": "orders", "key": "k1"}).content.decode()  # o0, o4, ..., o16
    assert "o16" in html and "o12" not in html
    assert 'id="scanned"' in html and "read the topic down to seq" in html and 'id="older"' in html
    cursor = html.split("cursor=")[1].split('"')[0]
    older = viewer.get(u("messages"), {"topic": "orders", "key": "k1", "cursor": cursor}).content.decode()
    assert "o12" in older and "o16" not in older


def test_deadletter_filters(scene, viewer):
    html = viewer.get(u("deadletters"), {"error": "KeyError"}).content.decode()
    assert "builtins.KeyError" in html and "builtins.ValueError" not in html


# -- actions: each needs its permission, on every POST ------------------------------------

ACTIONS = [
    ("seek_group", lambda s: (u("seek", "billing", "orders"), {"mode": "earliest"})),
    ("pause_group", lambda s: (u("pause", "billing", "orders"), {"reason": "x"})),
    ("drop_group", lambda s: (u("drop"), {"group": "retired", "topic": "orders"})),
    (
        "release_lease",
        lambda s: (u("release"), {"group": "billing", "topic": "orders", "partition": "0", "holder": "w1"}),
    ),
    ("purge_topic", lambda s: (u("purge_topic"), {"topic": "typo"})),
    ("replay_deadletter", lambda s: (u("deadletter_action"), {"action": "replay", "seq": s.dead[0]})),
    ("purge_deadletter", lambda s: (u("deadletter_action"), {"action": "purge", "seq": s.dead[0]})),
]


@pytest.mark.parametrize("perm, make", ACTIONS, ids=[a[0] for a in ACTIONS])
def test_each_action_is_denied_without_its_permission(scene, perm, make):
    client = login("view_queue", *[p for p in ACTION_PERMS if p != perm])
    path, data = make(scene)
    before = (
        Message.objects.count(),
        PartitionLease.objects.count(),
        ConsumerOffset.objects.count(),
        PausedTopic.objects.count(),
    )
    assert client.post(path, {**data, "confirmed": "yes"}).status_code == 403
    assert (
        Message.objects.count(),
        PartitionLease.objects.count(),
        ConsumerOffset.objects.count(),
        PausedTopic.objects.count(),
    ) == before
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize("perm, make", ACTIONS, ids=[a[0] for a in ACTIONS])
def test_actions_are_post_only_and_csrf_protected(scene, perm, make):
    path, data = make(scene)
    client = login("view_queue", *ACTION_PERMS)
    assert client.get(path).status_code == 403
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(pk=client.session["_auth_user_id"]))
    assert strict.post(path, {**data, "confirmed": "yes"}).status_code == 403


def last_log() -> LogEntry:
    return LogEntry.objects.order_by("-pk").first()


def test_seek_confirmation_shows_counts_then_applies_and_logs(scene, operator):
    page = operator.post(u("seek", "shipping", "orders"), {"mode": "earliest"})
    html = page.content.decode()
    assert page.status_code == 200 and "20 message(s) will be delivered again and 0 skipped" in html
    assert all(o.offset_acked > 0 for o in ConsumerOffset.objects.filter(consumer_group="shipping"))
    done = operator.post(u("seek", "shipping", "orders"), {"mode": "earliest", "confirmed": "yes"})
    assert done.status_code == 302
    assert all(o.offset_acked == 0 for o in ConsumerOffset.objects.filter(consumer_group="shipping"))
    assert "20 message(s) redelivered" in last_log().change_message


def test_seek_confirmation_of_a_range_too_long_to_count_says_up_to(scene, operator, monkeypatch):
    monkeypatch.setattr(seek_reads, "COUNT_CAP", 0)  # no range is counted: the offsets are shown
    html = operator.post(u("seek", "shipping", "orders"), {"mode": "earliest"}).content.decode()
    assert "Up to 20 message(s) will be delivered again and 0 skipped" in html
    assert "up to 0" not in html.lower()
    html = operator.post(u("seek", "retired", "orders"), {"mode": "latest"}).content.decode()
    assert "0 message(s) will be delivered again and up to 20 skipped" in html


def test_seek_bad_input_shows_the_error_and_changes_nothing(scene, operator):
    response = operator.post(
        u("seek", "billing", "orders"), {"mode": "offset", "value": "999999", "confirmed": "yes"}, follow=True
    )
    assert "beyond the head" in response.content.decode()
    assert not LogEntry.objects.exists()


def test_pause_resume_and_log(scene, operator):
    operator.post(u("pause", "billing", "orders"), {"reason": "deploy"})
    assert PausedTopic.objects.get().reason == "deploy"
    assert last_log().change_message == "Paused billing on orders (1 topic)."
    operator.post(u("pause", "billing", "orders"), {"resume": "1"})
    assert not PausedTopic.objects.exists()
    assert "Resumed" in last_log().change_message


def test_drop_group_confirms_with_counts(scene, operator):
    html = operator.post(u("drop"), {"group": "retired", "topic": "orders"}).content.decode()
    assert "Delete 2 row(s) of group retired on orders" in html
    operator.post(u("drop"), {"group": "retired", "topic": "orders", "confirmed": "yes"})
    assert not ConsumerOffset.objects.filter(consumer_group="retired").exists()
    assert last_log().action_flag == DELETION and "2 row(s)" in last_log().change_message
    refused = operator.post(u("drop"), {"group": "billing", "confirmed": "yes"}, follow=True).content.decode()
    assert "live subscriber" in refused


def test_release_lease(scene, operator):
    operator.post(u("release"), {"group": "billing", "topic": "orders", "partition": "0", "holder": "w1"})
    assert list(PartitionLease.objects.values_list("partition", flat=True)) == [1]
    assert "billing:orders[0]" in last_log().object_repr
    again = operator.post(
        u("release"), {"group": "billing", "topic": "orders", "partition": "0", "holder": "w1"}, follow=True
    )
    assert "released already" in again.content.decode()


def test_purge_topic_confirms_with_count(scene, operator):
    assert (
        "Delete all 3 message(s) of topic typo" in operator.post(u("purge_topic"), {"topic": "typo"}).content.decode()
    )
    assert Message.objects.filter(topic="typo").count() == 3
    operator.post(u("purge_topic"), {"topic": "typo", "confirmed": "yes"})
    assert not Message.objects.filter(topic="typo").exists()
    assert "3 message(s)" in last_log().change_message


def test_replay_single_dead_letter_twice_replays_once(scene, operator):
    data = {"action": "replay", "seq": scene.dead[0]}
    assert operator.post(u("deadletter_action"), data).status_code == 302
    second = operator.post(u("deadletter_action"), data, follow=True).content.decode()
    assert "were gone already" in second
    assert Message.objects.filter(topic="orders", id__contains="@replay").count() == 1
    assert "Replayed 1 dead letter(s) (billing: 1)" in LogEntry.objects.order_by("pk").first().change_message


def test_bulk_replay_selection_confirms(scene, operator):
    data = {"action": "replay", "seq": scene.dead[:2], "scope": "selected"}
    html = operator.post(u("deadletter_action"), data).content.decode()
    assert "Replay 2 dead letter(s)" in html
    operator.post(u("deadletter_action"), {**data, "confirmed": "yes"})
    assert ops.count_dead_letters() == 2


def test_bulk_purge_everything_matching_the_filter(scene, operator):
    data = {"action": "purge", "scope": "matching", "group": "billing", "topic": "orders"}
    html = operator.post(u("deadletter_action"), data).content.decode()
    assert "Purge 3 dead letter(s): every dead letter matching: topic=orders, group=billing" in html
    operator.post(u("deadletter_action"), {**data, "confirmed": "yes"})
    assert ops.count_dead_letters() == 1
    assert last_log().action_flag == DELETION and "Purged 3 dead letter(s)" in last_log().change_message


def test_unknown_deadletter_action(scene, operator):
    response = operator.post(u("deadletter_action"), {"action": "explode"}, follow=True)
    assert "Unknown action" in response.content.decode()


def test_console_pages_cannot_be_framed(scene, viewer):
    """Issue 28 (F13): the test project keeps Django's clickjacking middleware (docs/console.md
    asks projects to): no other site can frame the one-click "Replay to <group>" button."""
    assert viewer.get(u("deadletter", scene.dead[0]))["X-Frame-Options"] == "DENY"
