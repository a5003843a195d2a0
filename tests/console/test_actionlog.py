"""console/actionlog.py: the action log page and ``group_actions`` (issue 31, item 5).

Every entry here is written by the real console action, posted through the Django test
client (seek, pause, resume, replay, drop, release); times are moved only by shifting every
entry at once, which keeps the log's ids in time order as a real log is.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from django_sqlqueue.console import actionlog
from django_sqlqueue.console.actionlog import ActionMarker, group_actions

from ..support.console_scene import SETTINGS, build, dead_letter

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def scene():
    # No per-minute history: the action log does not read it.
    with override_settings(SQLQUEUE={**SETTINGS, "HISTORY_RETENTION": 0}):
        yield build()


def staff(name: str, *codenames: str) -> Client:
    user = User.objects.create_user(name, is_staff=True)
    perms = Permission.objects.filter(content_type__app_label="django_sqlqueue")
    user.user_permissions.set(perms.filter(codename__in=codenames) if codenames else perms)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def operator() -> Client:
    return staff("op")


def u(name: str, *args: str) -> str:
    return reverse(f"admin:django_sqlqueue_queueconsole_{name}", args=args)


def pause(client: Client, group: str = "billing", topic: str = "orders", *, resume: bool = False) -> None:
    data = {"resume": "1"} if resume else {"reason": "deploy"}
    assert client.post(u("pause", group, topic), data).status_code == 302


def seek(client: Client, group: str = "billing", topic: str = "orders") -> None:
    response = client.post(u("seek", group, topic), {"mode": "earliest", "confirmed": "yes"})
    assert response.status_code == 302


def replay(client: Client, seqs: list[int] | None = None, **filters: str) -> None:
    data = {"action": "replay", "confirmed": "yes", **filters}
    data.update({"seq": [str(s) for s in seqs]} if seqs else {"scope": "matching"})
    assert client.post(u("deadletter_action"), data).status_code == 302


def shift_log(delta: dt.timedelta) -> None:
    """Move every entry by ``delta`` (all together: ids stay in time order)."""
    for entry in LogEntry.objects.all():
        LogEntry.objects.filter(pk=entry.pk).update(action_time=entry.action_time + delta)


def hour_ago() -> dt.datetime:
    return timezone.now() - dt.timedelta(hours=1)


# -- group_actions ------------------------------------------------------------------------


def test_group_actions_returns_the_pauses_seeks_and_replays_of_that_group_in_time_order(scene, operator):
    pause(operator)
    seek(operator)
    pause(operator, resume=True)
    replay(operator, [scene.dead[0]])  # one of billing's dead letters, selected
    replay(operator, group="shipping", topic="orders")  # shipping's: not billing's
    pause(operator, "shipping", "orders")
    markers = group_actions("billing", "orders", since=hour_ago())
    assert [m.kind for m in markers] == ["pause", "seek", "resume", "replay"]
    assert all(isinstance(m, ActionMarker) and m.user == "op" for m in markers)
    assert markers[0].message == "Paused billing on orders (1 topic)."
    assert markers[1].message.startswith("Seek billing on orders to earliest")
    assert "(billing: 1)" in markers[3].message
    assert [m.at for m in markers] == sorted(m.at for m in markers)
    assert [m.kind for m in group_actions("shipping", "orders", since=hour_ago())] == ["replay", "pause"]
    # A replay of selected dead letters names their groups, not their topics: it marks each topic.
    assert [m.kind for m in group_actions("billing", "typo", since=hour_ago())] == ["replay"]
    assert group_actions("retired", "orders", since=hour_ago()) == []
    with pytest.raises(dataclasses.FrozenInstanceError):
        markers[0].kind = "x"  # type: ignore[misc]


def test_group_actions_keeps_to_the_time_range(operator):
    pause(operator)
    shift_log(-dt.timedelta(days=2))  # that pause was two days ago
    seek(operator)
    pause(operator, resume=True)
    recent = group_actions("billing", "orders", since=hour_ago())
    assert [m.kind for m in recent] == ["seek", "resume"]
    three_days = timezone.now() - dt.timedelta(days=3)
    assert [m.kind for m in group_actions("billing", "orders", since=three_days)] == ["pause", "seek", "resume"]
    until = timezone.now() - dt.timedelta(days=1)
    assert [m.kind for m in group_actions("billing", "orders", since=three_days, until=until)] == ["pause"]
    assert group_actions("billing", "orders", since=timezone.now() + dt.timedelta(minutes=1)) == []


def test_a_replay_of_matching_dead_letters_of_another_topic_is_not_a_marker(operator):
    dead_letter("billing", "x1", topic="invoices")
    replay(operator, group="billing", topic="invoices")
    replay(operator, group="billing", topic="orders")
    assert [m.kind for m in group_actions("billing", "orders", since=hour_ago())] == ["replay"]
    assert [m.kind for m in group_actions("billing", "invoices", since=hour_ago())] == ["replay"]


def test_a_drop_of_the_group_on_every_topic_is_a_marker(operator):
    assert operator.post(u("drop"), {"group": "retired", "confirmed": "yes", "force": "1"}).status_code == 302
    markers = group_actions("retired", "orders", since=hour_ago())
    assert [m.kind for m in markers] == ["drop"]


def test_group_actions_is_bounded_to_the_newest(monkeypatch, operator):
    monkeypatch.setattr(actionlog, "MARKER_LIMIT", 3)
    for _ in range(3):
        pause(operator)
        pause(operator, resume=True)
    markers = group_actions("billing", "orders", since=hour_ago())
    assert [m.kind for m in markers] == ["resume", "pause", "resume"]
    newest = LogEntry.objects.order_by("-pk").first()
    assert markers[-1].at == newest.action_time


# -- the page ---------------------------------------------------------------------------------


def log_page(client: Client, **query: str):
    response = client.get(u("actionlog"), query)
    assert response.status_code == 200, response.content[:500]
    return response


def rows(client: Client, **query: str) -> list[actionlog.ActionRow]:
    return log_page(client, **query).context["page"].rows


def test_the_page_shows_who_did_what_on_which_group_newest_first(scene, operator):
    seek(operator)
    pause(operator)
    replay(operator, [scene.dead[0], scene.dead[1]])
    assert operator.post(u("drop"), {"group": "retired", "topic": "orders", "confirmed": "yes", "force": "1"})
    response = log_page(operator)
    shown = response.context["page"].rows
    assert [r.kind for r in shown] == ["drop", "replay", "pause", "seek"]
    drop, replayed, paused, sought = shown
    assert all(r.user == "op" for r in shown)
    assert (sought.group, sought.topic, sought.count) == ("billing", "orders", 16)  # 8 acked on each of 2 partitions
    assert (paused.group, paused.topic, paused.count, paused.deletion) == ("billing", "orders", None, False)
    assert (replayed.group, replayed.topic, replayed.count) == ("billing", "", 2)
    assert (drop.group, drop.topic, drop.deletion) == ("retired", "orders", True)
    html = response.content.decode()
    assert 'id="actionlog"' in html and "Paused billing on orders (1 topic)." in html
    assert html.count('class="sq-deletion"') == 1
    assert f'href="{u("group", "billing", "orders")}"' in html
    assert '<a href="' + u("actionlog") + '" class="active" aria-current="page">Action log</a>' in html


def test_only_the_consoles_entries_are_shown(operator):
    pause(operator)
    user = User.objects.get(username="op")
    LogEntry.objects.log_actions(user.pk, [user], 2, change_message="Changed the password.")
    assert LogEntry.objects.count() == 2
    assert [r.kind for r in rows(operator)] == ["pause"]


def test_filter_by_user_group_topic_and_kind(scene, operator):
    other = staff("night-shift")
    release = {"group": "billing", "topic": "orders", "partition": "0", "holder": "w1"}
    assert operator.post(u("release"), release).status_code == 302  # before the seek, which releases leases
    pause(operator)
    pause(other, "shipping", "orders")
    seek(other)
    replay(operator, group="shipping", topic="orders")
    assert [r.kind for r in rows(operator, user="night-shift")] == ["seek", "pause"]
    assert rows(operator, user="nobody") == []
    assert [(r.kind, r.group) for r in rows(operator, group="shipping")] == [
        ("replay", "shipping"),
        ("pause", "shipping"),
    ]
    assert [r.kind for r in rows(operator, group="billing", topic="orders")] == ["seek", "pause", "release"]
    assert [r.kind for r in rows(operator, topic="orders")] == ["replay", "seek", "pause", "pause", "release"]
    assert rows(operator, topic="typo") == []
    assert [r.kind for r in rows(operator, kind="pause")] == ["pause", "pause"]
    assert [r.kind for r in rows(operator, kind="pause", user="op")] == ["pause"]
    assert [r.kind for r in rows(operator, kind="replay")] == ["replay"]
    assert [(r.group, r.topic) for r in rows(operator, kind="release")] == [("billing", "orders")]
    assert rows(operator, kind="drop") == []


def test_filter_by_time_range(operator):
    pause(operator)
    shift_log(-dt.timedelta(days=5))
    pause(operator, resume=True)
    shift_log(-dt.timedelta(days=5))
    seek(operator)  # now; the resume 5 days ago, the pause 10 days ago
    fmt = "%Y-%m-%dT%H:%M:%S"
    nine_days_ago = (timezone.now() - dt.timedelta(days=9)).strftime(fmt)
    assert [r.kind for r in rows(operator)] == ["seek", "resume", "pause"]
    assert [r.kind for r in rows(operator, since=nine_days_ago)] == ["seek", "resume"]
    assert [r.kind for r in rows(operator, until=nine_days_ago)] == ["pause"]
    # A filter on the target reads the last 7 days unless "since" says otherwise.
    response = log_page(operator, group="billing")
    assert [r.kind for r in response.context["page"].rows] == ["seek", "resume"]
    assert 'id="actionlog-window"' in response.content.decode()
    eleven = (timezone.now() - dt.timedelta(days=11)).strftime(fmt)
    assert [r.kind for r in rows(operator, group="billing", since=eleven)] == ["seek", "resume", "pause"]


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ({"kind": "explode"}, "unknown action kind 'explode'"),
        ({"since": "yesterday"}, "since: 'yesterday' is not a date and time"),
        ({"since": "2026-01-02T00:00", "until": "2026-01-01T00:00"}, "is after until"),
        ({"cursor": "-3"}, "cursor must be >= 0"),
    ],
)
def test_bad_filters_are_named(operator, query, error):
    response = log_page(operator, **query)
    assert response.context["page"] is None
    assert error in response.context["error"]


def test_keyset_pagination_walks_every_entry_once_without_offset(monkeypatch, operator):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    monkeypatch.setattr(actionlog, "PAGE_SIZE", 2)
    for _ in range(3):
        pause(operator)
        pause(operator, resume=True)
    every = list(LogEntry.objects.order_by("-pk").values_list("pk", flat=True))
    seen: list[int] = []
    pages: list[dict[str, str]] = [{}]
    query: dict[str, str] = {}
    with CaptureQueriesContext(connection) as queries:
        while True:
            page = log_page(operator, **query).context["page"]
            seen += [r.id for r in page.rows]
            if page.older is None:
                break
            query = {"cursor": str(page.older)}
            pages.append(query)
    assert seen == every and len(pages) == 3
    assert not any("OFFSET" in q["sql"].upper() for q in queries.captured_queries)
    # Back from the last page: "newer" gives the page before it.
    last = log_page(operator, **pages[-1]).context["page"]
    back = log_page(operator, newer=str(last.newer)).context["page"]
    assert [r.id for r in back.rows] == every[2:4]
    assert back.older == every[3] and back.newer == every[2]


def test_the_page_needs_the_consoles_view_permission(operator):
    pause(operator)
    assert staff("viewer", "view_queue").get(u("actionlog")).status_code == 200
    assert staff("stranger", "pause_group").get(u("actionlog")).status_code == 403
    anonymous = Client().get(u("actionlog"))
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]


def test_the_group_page_links_to_its_action_log(operator):
    html = operator.get(u("group", "billing", "orders")).content.decode()
    assert f'href="{u("actionlog")}?group=billing&amp;topic=orders"' in html


def test_counts_and_targets_read_from_the_messages():
    assert actionlog.message_count("Replayed 3 dead letter(s) (billing: 3) (batch 1).") == 3
    assert actionlog.message_count("Purged topic typo: deleted 7 message(s) (batch 2).") == 7
    assert actionlog.message_count("Seek b on o to time x: 1 partition(s), 2 message(s) redelivered, 5 skipped.") == 7
    assert actionlog.message_count("Paused b on o (1 topic).") is None
    assert actionlog.message_count("Released lease b:o[0] held by w1 (1 lease).") is None
    parts = actionlog.target_parts
    assert parts("lease a:b:orders[3]", "") == ("a:b", "orders")
    assert parts("group retired", "Dropped group retired: 4 row(s).") == ("retired", "")
    assert parts("topic typo", "") == ("", "typo")
    assert parts("dead letters (topic=orders, group=billing)", "") == ("billing", "orders")
    assert parts("dead letters (seq 1, 2)", "Replayed 2 dead letter(s) (a: 1, b: 1) (batch 1).") == ("a, b", "")
    assert parts("task 42", "Retried task 42") == ("", "")
