"""The operator console under arbitrary query strings and form posts (Hypothesis).

The properties, for a superuser on a realistic queue (``tests/support/console_scene.py``):

- GET of any console page with any query string (unknown keys, invalid or extreme dates
  and numbers, unknown enum values, unicode, percent-encoding garbage, NUL) and any path
  argument answers below 500;
- POST of any operator form with any field values answers below 500, redirects only within
  the site, and writes nothing unless the action was carried out (an audit ``LogEntry``
  says so).

Each example runs in a savepoint that is rolled back, so examples do not see each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client, override_settings
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from django_sqlqueue.models import (
    ConsumerOffset,
    DeliveryState,
    Message,
    PartitionLease,
    PausedTopic,
    SubscriberHeartbeat,
)

from ..support import strategies as s
from ..support.console_scene import SETTINGS, build

pytestmark = pytest.mark.django_db


def u(name: str, *args: Any) -> str:
    return reverse(f"admin:django_sqlqueue_queueconsole_{name}", args=args)


@pytest.fixture
def admin_client_on_scene() -> Iterator[Client]:
    with override_settings(SQLQUEUE=SETTINGS):
        scene = build()
        user = User.objects.create_superuser("root", "root@example.com", "pw")
        client = Client()
        client.force_login(user)
        client.dead = [str(seq) for seq in scene.dead]  # type: ignore[attr-defined]
        yield client


@contextmanager
def example_transaction() -> Iterator[None]:
    with transaction.atomic():
        yield
        transaction.set_rollback(True)


# -- query strings ----------------------------------------------------------------------------

FILTER_NAMES = [
    "topic",
    "group",
    "key",
    "id",
    "partition",
    "cursor",
    "after",
    "before",
    "failed_after",
    "failed_before",
    "error",
    "status",
    "o",
    "p",
    "q",
    "_changelist_filters",
]

DATES = [
    "2026-01-31T12:00:00Z",
    "2026-02-30T00:00",
    "2026-13-01",
    "0001-01-01T00:00+01:00",
    "9999-12-31T23:59:59-05:00",
    "9999-12-31T23:59:59.999999",
    "0001-01-01",
    "2026-01-01T00:00+99:00",
    "2026-01-01T25:00",
    "yesterday",
    "1e9",
    "2026-01-01T00:00:00.0000000001",
    "+002026-01-01",
]
NUMBERS = ["0", "-1", "1", "007", " 5 ", "1_000", "9" * 19, "9" * 40, "-" + "9" * 30, "1e3", "0x10", "١٢", "NaN"]
STATUSES = ["in flight", "retrying", "scheduled", "failed", "IN FLIGHT", ""]

values = st.one_of(
    st.sampled_from(DATES + NUMBERS + STATUSES + ["orders", "billing", "k1", "o3", "orders_dlq", "typo"]),
    st.integers().map(str),
    s.nasty_text(60),
    st.text(max_size=20),
)


def encoded(text: str) -> st.SearchStrategy[str]:
    """``text`` percent-encoded properly, or pasted raw (broken escapes, '&', '=', '#' and all)."""
    proper = quote(text, safe="", errors="surrogatepass")
    raw = quote(text, safe="%&=+;#/?", errors="surrogatepass")
    return st.sampled_from([proper, raw])


@st.composite
def query_strings(draw: st.DrawFn) -> str:
    parts = []
    for _ in range(draw(st.integers(min_value=0, max_value=6))):
        name = draw(st.one_of(st.sampled_from(FILTER_NAMES), st.text(max_size=8)))
        value = draw(values)
        parts.append(f"{draw(encoded(name))}={draw(encoded(value))}")
        if draw(st.booleans()):
            parts.append(draw(st.sampled_from(["", "&", "=", "%", "%zz", "%ff%fe", "%00", "x", "=%", ";"])))
    return "&".join(parts)


PLAIN_PAGES = ["changelist", "overview", "messages", "groups", "leases", "deliveries", "deadletters", "topics"]
#: The pages taking path arguments, built by hand so that any text can be put there.
GROUP_NAMES = st.one_of(st.sampled_from(["billing", "shipping", "retired", "nobody", "orders"]), s.nasty_text(40))
SEQS = st.one_of(st.integers(min_value=0, max_value=10**6).map(str), st.sampled_from(["9" * 19, "9" * 40, "0"]))


def segment(text: str) -> str:
    return quote(text, safe="", errors="surrogatepass")


@st.composite
def page_paths(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from([*PLAIN_PAGES, "group", "message", "deadletter", "action"]))
    if kind in PLAIN_PAGES:
        return u(kind)
    if kind == "group":
        group, topic = draw(GROUP_NAMES), draw(st.one_of(st.sampled_from(["orders", "typo"]), s.nasty_text(40)))
        return f"{u('groups')}{segment(group)}/{segment(topic)}/"
    if kind == "action":  # the POST-only endpoints, fetched with GET
        return draw(st.sampled_from([u("drop"), u("release"), u("deadletter_action"), u("purge_topic")]))
    return f"{u(kind + 's')}{draw(SEQS)}/"


@settings(max_examples=150)
@given(path=page_paths(), query=query_strings())
@example(path="/admin/django_sqlqueue/queueconsole/messages/", query="topic=orders&cursor=" + "9" * 40)
@example(path="/admin/django_sqlqueue/queueconsole/messages/", query="topic=orders&partition=-" + "9" * 30)
@example(path="/admin/django_sqlqueue/queueconsole/messages/", query="after=0001-01-01T00:00%2B01:00")
@example(path="/admin/django_sqlqueue/queueconsole/messages/", query="before=9999-12-31T23:59:59.999999")
@example(path="/admin/django_sqlqueue/queueconsole/messages/", query="topic=orders&key=%00")
@example(path="/admin/django_sqlqueue/queueconsole/deadletters/", query="failed_before=9999-12-31T23:00-05:00")
@example(path="/admin/django_sqlqueue/queueconsole/deadletters/", query="cursor=" + "9" * 40)
@example(path="/admin/django_sqlqueue/queueconsole/leases/", query="group=%00")
@example(path="/admin/django_sqlqueue/queueconsole/deliveries/", query="status=exploded&group=%ff%fe")
@example(path="/admin/django_sqlqueue/queueconsole/groups/billing%00/orders/", query="")
@example(path="/admin/django_sqlqueue/queueconsole/messages/" + "9" * 40 + "/", query="")
def test_no_query_string_makes_a_page_fail(admin_client_on_scene, path, query):
    with example_transaction():
        response = admin_client_on_scene.get(path, QUERY_STRING=query)
        event(f"status {response.status_code}")
        assert response.status_code < 500


# -- forms -------------------------------------------------------------------------------------

form_text = st.one_of(
    st.sampled_from([v for v in s.NASTY if not any(0xD800 <= ord(c) <= 0xDFFF for c in v)]),
    st.text(s.json_text_chars, max_size=30),
    st.sampled_from(DATES + NUMBERS),
)
NEXT = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "/admin/",
            "https://evil.example/",
            "//evil.example/",
            "javascript:alert(1)",
            "/admin/\nSet-Cookie: x=1",
            "\\\\evil.example",
            "http:///evil.example",
            "",
        ]
    ),
    form_text,
)


def fields(**strategies: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Each field present (four times in five) or absent; present ones from their strategy."""
    return st.fixed_dictionaries(
        {name: st.integers(0, 4).flatmap(lambda n, f=f: st.none() if n == 0 else f) for name, f in strategies.items()}
    )


def mostly(*good: Any, other: st.SearchStrategy[Any] = form_text) -> st.SearchStrategy[Any]:
    """One of the ``good`` values three times in four, else ``other``: actions must also succeed."""
    return st.integers(0, 3).flatmap(lambda n: other if n == 0 else st.sampled_from(good))


CONFIRMED = st.sampled_from(["yes", "yes", "no", "YES", ""])
GROUP = mostly("billing", "shipping", "retired", "nobody")
TOPIC = mostly("orders", "orders", "typo", "orders_dlq", "none", "x" * 200, "y" * 20000)
#: "@dead<n>" stands for the seq of the scene's n-th dead letter (seqs differ between runs).
SEQ_VALUES = mostly("@dead0", "@dead1", "@dead3", other=st.one_of(st.integers(-5, 10**6).map(str), form_text))

FORMS: dict[str, tuple[Any, st.SearchStrategy[dict[str, Any]]]] = {
    "seek": (
        lambda d: d(st.tuples(GROUP, TOPIC)),
        fields(
            mode=mostly("offset", "time", "earliest", "latest"),
            value=mostly(*DATES, *NUMBERS),
            partitions=mostly("0", "0,1", "1,1", "-1", "9" * 30, "a-b", ",", " "),
            confirmed=CONFIRMED,
        ),
    ),
    "pause": (
        lambda d: d(st.tuples(GROUP, TOPIC)),
        fields(
            reason=st.one_of(form_text, st.just("r" * 70000)),
            resume=st.sampled_from(["1", "", "0"]),
            next=NEXT,
        ),
    ),
    "drop": (
        None,
        fields(group=GROUP, topic=TOPIC, force=st.sampled_from(["1", "0", ""]), confirmed=CONFIRMED),
    ),
    "release": (
        None,
        fields(
            group=GROUP,
            topic=TOPIC,
            partition=mostly("0", "1", *NUMBERS),
            holder=mostly("w1", "w2", ""),
        ),
    ),
    "deadletter_action": (
        None,
        fields(
            action=mostly("replay", "purge"),
            scope=mostly("selected", "matching"),
            seq=st.lists(SEQ_VALUES, max_size=3),
            topic=TOPIC,
            group=GROUP,
            error=form_text,
            failed_after=st.one_of(st.sampled_from(DATES), form_text),
            failed_before=st.one_of(st.sampled_from(DATES), form_text),
            next=NEXT,
            confirmed=CONFIRMED,
        ),
    ),
    "purge_topic": (None, fields(topic=TOPIC, confirmed=CONFIRMED)),
}


@st.composite
def form_posts(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    name = draw(st.sampled_from(sorted(FORMS)))
    path_args, data = FORMS[name]
    if path_args is None:
        path = u(name)
    else:
        group, topic = path_args(draw)
        path = f"{u('groups')}{quote(group, safe='')}/{quote(topic, safe='')}/{name}/"
    return path, {k: v for k, v in draw(data).items() if v is not None}


def snapshot() -> tuple:
    """Everything an operator action may change (the log entries aside)."""
    return tuple(
        sorted(map(repr, model.objects.values_list()))
        for model in (Message, ConsumerOffset, PartitionLease, PausedTopic, DeliveryState, SubscriberHeartbeat)
    )


@settings(max_examples=150)
@given(post=form_posts())
@example(post=(u("pause", "billing", "orders"), {"reason": "x", "next": "https://evil.example/"}))
@example(post=(u("pause", "billing", "orders"), {"reason": "x", "next": "/admin/\nSet-Cookie: x=1"}))
@example(post=(u("pause", "billing", "orders"), {"reason": "\x00"}))
@example(post=(u("pause", "billing", "y" * 20000), {"reason": "x"}))
@example(post=(u("release"), {"group": "billing", "topic": "orders", "partition": "9" * 40, "holder": "w1"}))
@example(post=(u("seek", "billing", "orders"), {"mode": "offset", "value": "9" * 40, "confirmed": "yes"}))
@example(post=(u("seek", "billing", "orders"), {"mode": "time", "value": "0001-01-01T00:00+01:00"}))
@example(post=(u("seek", "billing", "orders"), {"mode": "earliest", "partitions": "9" * 30}))
@example(post=(u("deadletter_action"), {"action": "replay", "seq": ["9" * 40]}))
@example(post=(u("deadletter_action"), {"action": "purge", "scope": "matching", "failed_after": "0001-01-01"}))
@example(post=(u("deadletter_action"), {"action": "replay", "seq": ["1"], "next": "//evil.example/"}))
@example(post=(u("drop"), {"group": "x" * 200, "confirmed": "yes"}))
@example(post=(u("purge_topic"), {"topic": "y" * 20000, "confirmed": "yes"}))
def test_no_form_post_fails_and_refused_ones_write_nothing(admin_client_on_scene, post):
    path, data = post
    if "seq" in data:
        data["seq"] = [admin_client_on_scene.dead[int(v[5:])] if v.startswith("@dead") else v for v in data["seq"]]
    with example_transaction():
        before, logged = snapshot(), LogEntry.objects.count()
        response = admin_client_on_scene.post(path, data)
        event(f"{path.rstrip('/').rsplit('/', 1)[-1]}: status {response.status_code}")
        assert response.status_code < 500
        if response.status_code in (301, 302, 303, 307, 308):
            assert url_has_allowed_host_and_scheme(response["Location"], allowed_hosts={"testserver"}), response[
                "Location"
            ]
        if LogEntry.objects.count() == logged:
            assert snapshot() == before, "refused, yet the queue tables changed"
        else:
            event("carried out")
