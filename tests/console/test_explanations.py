"""The console explains what it shows (issue 29, items 4 and 5, and the dead letter's time zone).

- The Messages page says, with ``SQLQUEUE["RETENTION"]`` 0, that handled messages are
  garbage-collected and how to keep them; its topic filter keeps every known topic.
- A dead-letter topic is not a problem for being consumed by no group; the Topics tables say
  how long each topic's messages are kept, and count dead letters on both rows of a pair.
- Every time the console shows is in UTC and says so, whatever ``TIME_ZONE`` is.

Through Django's test client, in the scene of tests/support/console_scene.py.
"""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.test import Client, override_settings

from django_sqlqueue import ops
from django_sqlqueue.models import Message

from ..support.console_scene import SETTINGS, build
from .test_admin import login, u

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]

WEEK = 7 * 24 * 3600


@pytest.fixture
def scene_settings():
    with override_settings(SQLQUEUE=SETTINGS):
        yield


@pytest.fixture
def viewer() -> Client:
    return login("view_queue")


def note(html: str) -> str:
    """The text of the Messages page's note on retention (tags dropped)."""
    match = re.search(r'id="retention-note">(.*?)<div class="sq-scroll"><table id="messages">', html, re.S)
    assert match, "the Messages page has no retention note"
    return re.sub(r"<[^>]+>", "", match.group(1))


def row(html: str, table: str, first_cell: str) -> str:
    """The ``<tr>`` of table ``#table`` whose first cell starts with ``first_cell``."""
    body = html.split(f'id="{table}"', 1)[1].split("</table>", 1)[0]
    return next(r for r in body.split("<tr") if re.search(rf"<td><a [^>]*>{re.escape(first_cell)}</a>", r))


# -- the Messages page and garbage collection (item 4) ------------------------------------------


def test_an_empty_messages_page_says_handled_messages_are_collected_and_how_to_keep_them(viewer):
    """After a normal run the log is empty (RETENTION 0): the page said only "No messages match"."""
    html = viewer.get(u("messages")).content.decode()
    assert "No messages match. Handled messages are garbage-collected: see above." in html
    text = note(html)
    assert "Handled messages are not kept." in text
    assert 'SQLQUEUE["RETENTION"] at 0 (the default)' in text and "every 1 minute" in text
    assert 'set SQLQUEUE["RETENTION"] to a number of seconds, e.g. 7 * 24 * 3600 for 7 days' in text
    assert "docs/console.md" in text
    assert 'class="sq-note sq-box"' in html  # prominent when nothing is listed


def test_a_messages_page_with_rows_keeps_the_note_quiet(viewer):
    build()
    html = viewer.get(u("messages")).content.decode()
    assert 'class="sq-note sq-quiet" id="retention-note"' in html and "Handled messages are not kept." in html


def test_with_retention_the_messages_page_says_how_long_messages_are_kept(viewer):
    build()
    with override_settings(SQLQUEUE={**SETTINGS, "RETENTION": WEEK}):
        html = viewer.get(u("messages")).content.decode()
    assert "Handled messages are kept 7 days" in note(html) and "not kept" not in html


def test_the_topic_filter_keeps_topics_that_have_no_message_now(viewer):
    """Once GC collected a topic's messages, it left the filter: a consumed topic stays there."""
    build()
    ops.purge_topic("orders")  # every message of it gone, as GC leaves a caught-up topic
    assert not Message.objects.filter(topic="orders").exists()
    html = viewer.get(u("messages")).content.decode()
    assert "<option>orders</option>" in html and "<option>typo</option>" in html
    # A topic typed into the URL stays selected even if no one knows it.
    html = viewer.get(u("messages"), {"topic": "nosuch"}).content.decode()
    assert "<option selected>nosuch</option>" in html


# -- dead-letter topics in the overview and the Topics page (item 5) --------------------------


def test_the_overview_does_not_flag_a_dead_letter_topic_and_counts_its_dead_letters(viewer):
    build()
    html = viewer.get(u("overview")).content.decode()
    problems = html.split('id="problems"', 1)[1].split("</ul>", 1)[0]
    assert "typo is consumed by no group" in problems and "orders_dlq" not in problems
    dlq = row(html, "topics", "orders_dlq")
    assert "sq-warn" not in dlq.split(">", 1)[0] and "no group (by design)" in dlq and "never collected" not in dlq
    assert "until replayed or purged" in dlq and "dead letters of orders" in dlq
    assert re.search(r'\?topic=orders">4</a> <span class="sq-quiet">held</span>', dlq)  # it said 0
    orders = row(html, "topics", "orders")
    assert re.search(r'\?topic=orders">4</a></td>', orders)
    assert "until every consuming group has handled them" in orders
    typo = row(html, "topics", "typo")
    assert 'class="sq-warn"' in typo and "nobody: never collected" in typo and "forever: no group consumes it" in typo


def test_the_topics_page_explains_dead_letter_topics(viewer):
    build()
    html = viewer.get(u("topics")).content.decode()
    dlq = row(html, "topic-list", "orders_dlq")
    assert "no group (by design)" in dlq and "until replayed or purged" in dlq and "sq-warn" not in dlq
    assert "warn" in row(html, "topic-list", "typo")
    assert "A dead-letter topic is consumed by no group by design" in html


# -- time zones (item 6: the dead letter's "failed at") ------------------------------------------


@override_settings(TIME_ZONE="Asia/Kathmandu")  # UTC+05:45: no page can look right by accident
def test_every_time_shown_is_utc_and_says_so(viewer):
    scene = build()
    failed = dt.datetime(2024, 3, 4, 5, 6, 7, 890123, tzinfo=dt.UTC)
    Message.objects.filter(seq=scene.dead[0]).update(failed_at=failed)
    html = viewer.get(u("deadletter", scene.dead[0])).content.decode()
    assert "<dt>Failed at</dt><dd>2024-03-04 05:06:07.890123 UTC</dd>" in html
    assert ">2024-03-04 05:06:07 UTC</a>" in viewer.get(u("deadletters")).content.decode()
    seq = Message.objects.get(topic="orders", id="o3").seq
    Message.objects.filter(seq=seq).update(published_at=failed)
    assert "<dt>Published</dt><dd>2024-03-04 05:06:07.890123 UTC</dd>" in viewer.get(u("message", seq)).content.decode()
    assert "<td>2024-03-04 05:06:07 UTC</td>" in viewer.get(u("messages"), {"topic": "orders"}).content.decode()
    assert re.search(r"Database time \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC;", viewer.get(u("overview")).content.decode())
    leases = viewer.get(u("leases")).content.decode()
    assert re.search(r"<td>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</td>", leases) and "+0545" not in leases
