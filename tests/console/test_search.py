"""Search on the console's Messages and Dead letters pages (Django's test client, a real database):
the new filter fields, the payload search's window, bounded payload previews, and "act on all
matching" dead letters from a search filter."""

from __future__ import annotations

import datetime as dt
import json
import re
from html import unescape

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_sqlqueue import ops, publish_many
from django_sqlqueue.console.base import parse_search
from django_sqlqueue.ops.base import OperationError

from ..support.console_scene import SETTINGS, build, dead_letter

pytestmark = [pytest.mark.django_db]


@pytest.fixture(autouse=True)
def scene_settings():
    with override_settings(SQLQUEUE=SETTINGS):
        yield


def u(name: str, *args: object) -> str:
    return reverse(f"admin:django_sqlqueue_queueconsole_{name}", args=args)


@pytest.fixture
def operator() -> Client:
    user = User.objects.create_user("op", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_sqlqueue"))
    client = Client()
    client.force_login(user)
    return client


def rows(html: str, table: str) -> str:
    return html.split(f'id="{table}"', 1)[1].split("</table>", 1)[0]


def test_parse_search_types_the_value():
    assert parse_search({}) == {} and parse_search({"field": " ", "value": "1"}) == {}
    assert parse_search({"field": "a.b", "value": "42"}) == {"field": "a.b", "value": 42}
    assert parse_search({"field": "a", "value": '"42"'}) == {"field": "a", "value": "42"}
    assert parse_search({"field": "a", "value": "c-7"}) == {"field": "a", "value": "c-7"}
    with pytest.raises(OperationError, match="enter the value"):
        parse_search({"field": "a", "value": ""})


def test_search_messages_by_payload_field(operator):
    publish_many(
        "shop",
        [{"payload": {"order_id": n, "note": "x" * 300 if n == 42 else ""}, "id": f"s{n}"} for n in (41, 42, 43)],
    )
    publish_many("shop", [{"payload": {"order_id": "42"}, "id": "text42"}])
    with CaptureQueriesContext(connection) as queries:
        html = operator.get(u("messages"), {"topic": "shop", "field": "order_id", "value": "42"}).content.decode()
    # Only the database's cut of the payload is read: no query loads a whole one (a deferred load).
    whole = [q["sql"] for q in queries.captured_queries if "payload" in q["sql"] and "SUBSTR" not in q["sql"].upper()]
    assert not [q for q in whole if "LEFT(" not in q.upper()]
    table = rows(html, "messages")
    assert ">s42<" in table and ">s41<" not in table and ">text42<" not in table
    assert 'id="search-window"' in html and "order_id = 42" in unescape(html)
    # Cut by the database, with its size: on PostgreSQL jsonb's text form, a space after ':' and ','.
    size = len(json.dumps({"order_id": 42, "note": "x" * 300}, separators=(",", ":")))
    assert re.search(rf"cut, ({size}|{size + 2}|{size + 3}) bytes", table), table[-500:]
    text = operator.get(u("messages"), {"topic": "shop", "field": "order_id", "value": '"42"'}).content.decode()
    assert ">text42<" in rows(text, "messages") and ">s42<" not in rows(text, "messages")


def test_a_payload_search_window_is_explicit_in_the_links_and_bounded(operator):
    publish_many("shop", [{"payload": {"order_id": n}, "id": f"s{n}"} for n in range(60)])
    html = operator.get(u("messages"), {"topic": "shop", "field": "order_id", "value": "7"}).content.decode()
    newest = unescape(re.search(r'<a href="\?([^"]*)">Newest</a>', html).group(1))
    assert "after=" in newest and "before=" in newest and "field=order_id" in newest
    wide = operator.get(
        u("messages"), {"field": "order_id", "value": "7", "after": (timezone.now() - dt.timedelta(days=3)).isoformat()}
    ).content.decode()
    assert "reads at most 24 hours of the log" in wide and 'id="messages"' not in wide
    bad = operator.get(u("messages"), {"field": "order id", "value": "7"}).content.decode()
    assert "is not a key name" in unescape(bad)


def test_dead_letters_by_key_id_text_and_payload_field(operator):
    build()
    dead_letter("billing", "p1", key="k9", payload={"order_id": 7}, error="TimeoutError")
    for query, expected in [
        ({"key": "k9"}, {"p1"}),
        ({"id": "o7"}, {"o7"}),
        ({"text": "timeouterror"}, {"p1"}),
        ({"field": "order_id", "value": "7"}, {"p1"}),
        ({"field": "order", "value": "o1"}, {"o1"}),
    ]:
        table = rows(operator.get(u("deadletters"), query).content.decode(), "deadletters")
        shown = set(re.findall(r"<td>(o\d|p\d)</td>", table))
        assert shown == expected, (query, shown)


def test_dead_letter_list_loads_payload_starts(operator):
    build()
    dead_letter("billing", "big", payload={"blob": "y" * 5000})
    table = rows(operator.get(u("deadletters")).content.decode(), "deadletters")
    size = len(json.dumps({"blob": "y" * 5000}, separators=(",", ":")))
    assert re.search(rf"cut, ({size}|{size + 1}) bytes", table) and "y" * 250 not in table


def test_act_on_all_matching_a_search_confirms_and_replays_exactly_those(operator):
    scene = build()
    dead_letter("billing", "p1", payload={"order_id": 7})
    dead_letter("billing", "p2", payload={"order_id": 7})
    dead_letter("billing", "p3", payload={"order_id": "7"})
    html = operator.get(u("deadletters"), {"field": "order_id", "value": "7", "text": "bad p"}).content.decode()
    form = html.split('id="dl-form"', 1)[1].split("</form>", 1)[0]
    hidden = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form))
    assert {"field", "value", "text", "failed_after", "failed_before"} <= set(hidden)
    data = {k: unescape(v) for k, v in hidden.items() if k not in ("csrfmiddlewaretoken", "next")}
    data.update(action="replay", scope="matching")
    confirm = unescape(operator.post(u("deadletter_action"), data).content.decode())
    assert "Replay 2 dead letter(s): every dead letter matching:" in confirm and "payload order_id = 7" in confirm
    assert 'name="failed_after"' in confirm  # the window goes on to the confirmed POST as shown
    operator.post(u("deadletter_action"), {**data, "confirmed": "yes"})
    left = sorted(d.original_id for d in ops.list_dead_letters().items)
    assert left == ["o0", "o1", "o2", "o7", "p3"] and len(scene.dead) == 4
    log = LogEntry.objects.order_by("-pk").first()
    assert log is not None and "payload order_id = 7" in log.object_repr + log.object_id
