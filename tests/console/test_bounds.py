"""Issue 28 (F6, F11): the console's output is bounded whatever the queue holds or the operator types.

Payloads in lists are cut server-side (the message's own page has the whole payload and its
size), errors in lists keep their two ends, flash messages (kept in the session until the
next page) are cut, and form fields longer than the console takes are refused with a 400
before a view reads them. Real database, Django's test client.
"""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from django_sqlqueue import publish_many
from django_sqlqueue.conf import DEFAULT_MAX_PAYLOAD_BYTES
from django_sqlqueue.console.base import DEFAULT_FIELD_LENGTH, FLASH_LENGTH, PREVIEW_LENGTH, clip, cut, preview
from django_sqlqueue.models import DeliveryState, Message, PausedTopic
from django_sqlqueue.ops.pausing import REASON_LENGTH

from ..support.console_scene import SETTINGS, build, dead_letter

pytestmark = [pytest.mark.django_db]

#: A string payload as large as MAX_PAYLOAD_BYTES lets through: '"' + 262,140 '&' + '"', and
#: metadata "{}". Each '&' is 5 bytes once escaped in HTML.
AMPERSANDS = "&" * (DEFAULT_MAX_PAYLOAD_BYTES - 4)
PAGE_LIMIT = 1_000_000


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


def test_the_messages_tab_cuts_payloads_and_the_message_page_has_all_of_it(operator):
    """50 payloads at the size limit made a 65.6 MB Messages tab; now a page under 1 MB that
    says each payload was cut and how big it is."""
    for start in range(0, 50, 5):  # 5 at a time: one INSERT stays well under max_allowed_packet
        publish_many("big", [{"payload": AMPERSANDS, "key": f"k{i}"} for i in range(start, start + 5)])
    size = len(AMPERSANDS) + 2
    for query in ({}, {"topic": "big"}):
        response = operator.get(u("messages"), query)
        html = response.content.decode()
        assert response.status_code == 200 and len(response.content) < PAGE_LIMIT, len(response.content)
        assert html.count(f"cut, {size} bytes") == 50
        # The JSON string's opening quote, then the first 199 '&'.
        assert html.count("&quot;" + "&amp;" * (PREVIEW_LENGTH - 1) + "…") == 50
        assert "&amp;" * PREVIEW_LENGTH not in html
        assert f"longer than {PREVIEW_LENGTH} characters" in html
    seq = Message.objects.filter(topic="big").order_by("seq").values_list("seq", flat=True).first()
    page = operator.get(u("message", seq)).content.decode()
    assert "&amp;" * len(AMPERSANDS) in page and f"({size} bytes as compact JSON)" in page


def test_a_short_payload_is_shown_whole_as_json(operator):
    scene = build()
    html = operator.get(u("messages"), {"topic": "orders"}).content.decode()
    assert "{&quot;n&quot;:19}" in html and "cut, " not in html
    assert (
        operator.get(u("deadletter", scene.dead[0])).content.decode().count("(14 bytes as compact JSON)")
    )  # {"order":"o0"} == 1


def test_the_dead_letter_list_bounds_errors_and_the_detail_page_keeps_them(operator):
    huge = "Boom: " + "&" * 7_900
    seqs = [dead_letter("billing", f"x{i}", error=huge, payload=AMPERSANDS) for i in range(50)]
    response = operator.get(u("deadletters"))
    assert response.status_code == 200 and len(response.content) < PAGE_LIMIT, len(response.content)
    assert "&amp;" * 7_900 in operator.get(u("deadletter", seqs[0])).content.decode()


def test_the_deliveries_page_shows_both_ends_of_a_long_error(operator):
    scene = build()
    error = "builtins.RuntimeError: " + "&" * 7_000 + "\nTraceback (most recent call last):\n  the end"
    for offset in range(1, scene.heads[0] + 1):
        DeliveryState.objects.create(
            consumer_group="billing",
            topic="orders",
            partition=0,
            message_offset=offset,
            retry_count=1,
            status=DeliveryState.Status.RETRY,
            invisible_until=timezone.now(),
            last_error=error,
        )
    html = operator.get(u("deliveries")).content.decode()
    assert html.count("characters left out") == scene.heads[0] and html.count("  the end") == scene.heads[0]
    assert "&amp;" * 2_000 not in html


def test_cut_clip_and_preview():
    assert cut("short") == "short" and cut("x" * 600) == "x" * FLASH_LENGTH + "… (100 more characters)"
    assert clip("a" * 10, head=3, tail=3) == "aaa\n… (4 characters left out) …\naaa" and clip("abc", 2, 1) == "abc"
    assert preview({"é": [1, 2]}) == preview({"é": [1, 2]}, limit=100)
    assert (preview({"é": [1, 2]}).text, preview({"é": [1, 2]}).size, preview("x" * 300).cut) == (
        '{"é":[1,2]}',
        12,
        True,
    )


def test_flash_messages_are_cut(operator):
    """An error echoing the operator's input (here an unknown seek mode of 900 characters)
    waits in the session for the next page: it is cut to FLASH_LENGTH."""
    build()
    response = operator.post(u("seek", "billing", "orders"), {"mode": "m" * 900}, follow=True)
    (message,) = [str(m) for m in response.context["messages"]]
    assert message.startswith("unknown seek mode 'mmm") and message.endswith("… (421 more characters)")
    assert len(message) == FLASH_LENGTH + len("… (421 more characters)")


def test_a_seek_preview_over_thousands_of_unknown_partitions_gives_a_short_error(operator):
    """A preview naming 9,000 partitions the topic does not have: the error names ten."""
    build()
    partitions = ",".join(map(str, range(9_000)))
    response = operator.post(
        u("seek", "billing", "orders"), {"mode": "earliest", "partitions": partitions}, follow=True
    )
    (message,) = [str(m) for m in response.context["messages"]]
    assert "has no partition 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 and 8988 more" in message and len(message) < 200


def test_a_pause_reason_over_the_limit_is_refused_and_nothing_is_paused(operator):
    build()
    response = operator.post(u("pause", "billing", "orders"), {"reason": "r" * (REASON_LENGTH + 1)}, follow=True)
    assert f"at most {REASON_LENGTH} are kept" in response.content.decode()
    huge = operator.post(u("pause", "billing", "orders"), {"reason": "r" * 100_000})
    assert huge.status_code == 400 and huge["Content-Type"].startswith("text/plain")
    assert b"'reason' is 100000 characters long; it takes at most 1000" in huge.content
    assert not PausedTopic.objects.exists() and not LogEntry.objects.exists()
    assert f'maxlength="{REASON_LENGTH}"' in operator.get(u("group", "billing", "orders")).content.decode()
    operator.post(u("pause", "billing", "orders"), {"reason": "r" * REASON_LENGTH})
    assert PausedTopic.objects.get().reason == "r" * REASON_LENGTH


@pytest.mark.parametrize(
    "method, name, args, data",
    [
        ("get", "messages", (), {"key": "k" * (DEFAULT_FIELD_LENGTH + 1)}),
        ("get", "deadletters", (), {"error": "<script>" * 200}),
        ("get", "messages", (), {"<b>" * 400: "1"}),  # a field's name is echoed too (the confirm page)
        ("post", "deadletter_action", (), {"action": "purge", "scope": "matching", "group": "g" * 5000}),
        ("post", "drop", (), {"group": "retired", "topic": "orders", "force": "1" * 2000}),
        ("post", "seek", ("billing", "orders"), {"mode": "earliest", "partitions": "0," * 30_000}),
        ("post", "deadletter_action", (), {"action": "replay", "seq": "1", "next": "/" * 17_000}),
    ],
)
def test_a_field_longer_than_the_console_takes_is_a_400_before_the_view_reads_it(operator, method, name, args, data):
    build()
    before = Message.objects.count()
    response = getattr(operator, method)(u(name, *args), data)
    assert response.status_code == 400 and b"characters long; it takes at most" in response.content
    assert response["Content-Type"].startswith("text/plain") and b"<script>" not in response.content
    assert Message.objects.count() == before and not LogEntry.objects.exists()
