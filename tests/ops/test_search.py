"""ops/search.py with ops/messages.py and ops/deadletters.py: payload search, bounded by a time window.

On a real database: messages published now (the window bisection reads their real
``published_at``), dead letters written as the engine writes them (tests/support/console_scene.py).
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from django_sqlqueue import publish_many
from django_sqlqueue.models import Message
from django_sqlqueue.ops.base import OperationError
from django_sqlqueue.ops.deadletters import (
    MAX_TEXT_LENGTH,
    DeadLetterFilter,
    count_dead_letters,
    list_dead_letters,
)
from django_sqlqueue.ops.messages import MessageFilter, browse
from django_sqlqueue.ops.replay import replay_matching
from django_sqlqueue.ops.search import (
    DEFAULT_WINDOW,
    MAX_PATH_KEYS,
    MAX_PATH_LENGTH,
    MAX_WINDOW,
    TIME_SLACK,
    check_value,
    field_path,
    parse_value,
    value_text,
    window,
)

from ..support.console_scene import build, dead_letter

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]

ORDERS = [
    {"order_id": 42, "customer": {"id": "c-7", "vip": True}},
    {"order_id": "42", "customer": {"id": "c-8", "vip": False}},
    {"order_id": 42.0, "customer": {"id": "C-7", "vip": None}},
    {"order_id": 43, "customer": {"id": "c-7"}},
    {"other": 1},
    ["order_id", 42],
    "order_id",
]


def publish_orders() -> None:
    publish_many("shop", [{"payload": p, "key": f"k{i}", "id": f"s{i}"} for i, p in enumerate(ORDERS)])


def found(field: str, value: object, **kw: object) -> list[str]:
    return sorted(m.id for m in browse(MessageFilter(field=field, value=value, **kw), limit=100).items)


def test_payload_search_compares_typed_json_values():
    publish_orders()
    assert found("order_id", 42) == ["s0", "s2"]  # 42 and 42.0, not "42"
    assert found("order_id", "42") == ["s1"]
    assert found("order_id", 42, topic="shop") == ["s0", "s2"]
    assert found("customer.id", "c-7") == ["s0", "s3"]  # byte for byte: not "C-7"
    assert found("customer.vip", True) == ["s0"] and found("customer.vip", False) == ["s1"]
    assert found("customer.vip", None) == ["s2"]  # JSON null, not a missing key
    assert found("order_id", 44) == [] and found("nothing.here", 1) == []
    assert found("order_id", 42, topic="shop", key="k2") == ["s2"]


def test_payload_search_reads_a_seq_range_and_no_count():
    publish_orders()
    with CaptureQueriesContext(connection) as queries:
        page = browse(MessageFilter(topic="shop", field="order_id", value=43), limit=5)
    assert [m.id for m in page.items] == ["s3"]
    listing = queries.captured_queries[-1]["sql"]
    assert "seq" in listing and ">=" in listing and "COUNT(" not in listing.upper()


def test_the_window_defaults_to_the_last_hour_and_is_bounded():
    now = timezone.now()
    assert window(None, None, now) == (now - DEFAULT_WINDOW, now)
    assert window(now - dt.timedelta(hours=3), None, now) == (now - dt.timedelta(hours=3), now)
    two_days_ago = now - dt.timedelta(days=2)
    assert window(None, two_days_ago, now) == (two_days_ago - DEFAULT_WINDOW, two_days_ago)
    with pytest.raises(OperationError, match=r"reads at most 24 hours of the log.*is 3\.0 days"):
        window(now - dt.timedelta(days=3), now, now)
    with pytest.raises(OperationError, match="reads at most 24 hours"):
        window(now - MAX_WINDOW - dt.timedelta(seconds=1), None, now)
    with pytest.raises(OperationError, match=r"ends .* before it starts"):
        window(now, now - dt.timedelta(seconds=1), now)


def test_a_search_outside_its_window_finds_nothing_and_a_wide_one_is_refused():
    publish_orders()
    now = timezone.now()
    assert found("order_id", 43, before=now - dt.timedelta(hours=2)) == []
    assert found("order_id", 43, after=now - dt.timedelta(hours=23)) == ["s3"]
    with pytest.raises(OperationError, match="reads at most 24 hours"):
        browse(MessageFilter(field="order_id", value=43, after=now - dt.timedelta(days=2)))


def test_resolved_fixes_the_window_in_the_links():
    now = timezone.now()
    f = MessageFilter(topic="shop", field="customer.id", value="42").resolved(now)
    assert (f.after, f.before) == (now - DEFAULT_WINDOW, now)
    q = f.as_query()
    assert q["value"] == '"42"' and q["field"] == "customer.id" and q["after"] == (now - DEFAULT_WINDOW).isoformat()
    assert MessageFilter(topic="shop").resolved(now) == MessageFilter(topic="shop")


@pytest.mark.parametrize(
    "path, problem",
    [
        ("", "dotted path"),
        ("a..b", "is not a key name"),
        ("a.1b", "is not a key name"),
        ("order id", "is not a key name"),
        ("a'); DROP TABLE x; --", "is not a key name"),
        ("$.a", "is not a key name"),
        ("a.*", "is not a key name"),
        ("é", "is not a key name"),
        ("x" * (MAX_PATH_LENGTH + 1), "characters long"),
        (".".join(["a"] * (MAX_PATH_KEYS + 1)), "keys"),
    ],
)
def test_bad_field_paths_are_refused_before_any_query(path, problem):
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(OperationError, match=problem):
            browse(MessageFilter(field=path, value=1))
        with pytest.raises(OperationError, match=problem):
            list_dead_letters(DeadLetterFilter(field=path, value=1))
    assert queries.captured_queries == []


@pytest.mark.parametrize("value", [[1], {"a": 1}, 2**63, -(2**63) - 1, float("nan"), float("inf"), "x" * 1001, b"1"])
def test_bad_values_are_refused(value):
    with pytest.raises(OperationError, match="value"):
        MessageFilter(field="a", value=value)


def test_parse_value_reads_json_scalars_else_text():
    assert [parse_value(t) for t in ("42", "-1.5", "true", "false", "null", '"42"', "abc", "c-7", "NaN")] == [
        42,
        -1.5,
        True,
        False,
        None,
        "42",
        "abc",
        "c-7",
        "NaN",
    ]
    with pytest.raises(OperationError, match=r"a string, a number"):
        parse_value("[1, 2]")


@given(st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=50)))
def test_value_text_reads_back_as_the_value(value):
    assert parse_value(value_text(value)) == value and type(parse_value(value_text(value))) is type(value)


@given(st.text(max_size=60))
def test_field_path_accepts_only_identifier_keys(text):
    try:
        keys = field_path(text)
    except OperationError:
        return
    assert ".".join(keys) == text and all(k.isidentifier() and k.isascii() for k in keys)


@given(st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**63), 2**63 - 1))
def test_every_finite_number_is_a_value(number):
    assert check_value(number) == number


def test_dead_letter_search_by_key_id_text_and_payload_field():
    scene = build()
    dead_letter("billing", "p1", key="k9", payload={"order_id": 7, "customer": {"id": "c-1"}})
    dead_letter("shipping", "p2", error="TimeoutError", payload={"order_id": "7"})
    ids = lambda f: sorted(d.original_id for d in list_dead_letters(f).items)  # noqa: E731
    assert ids(DeadLetterFilter(key="k9")) == ["p1"]
    assert ids(DeadLetterFilter(id="o7")) == ["o7"]  # the original id
    assert ids(DeadLetterFilter(id="shipping:p2")) == ["p2"]  # the dead letter's own id
    assert ids(DeadLetterFilter(text="bad o1")) == ["o1"] and ids(DeadLetterFilter(text="BAD O1")) == ["o1"]
    assert ids(DeadLetterFilter(text="x.py")) == sorted(["o0", "o1", "o2", "o7", "p1", "p2"])
    assert ids(DeadLetterFilter(field="order_id", value=7)) == ["p1"]
    assert ids(DeadLetterFilter(field="order_id", value="7")) == ["p2"]
    assert ids(DeadLetterFilter(field="customer.id", value="c-1", group="billing", topic="orders")) == ["p1"]
    assert ids(DeadLetterFilter(field="order", value="o0")) == ["o0"]
    assert count_dead_letters(DeadLetterFilter(field="order_id", value=7, text="bad p1")) == 1
    old = timezone.now() - dt.timedelta(hours=2)
    assert count_dead_letters(DeadLetterFilter(field="order_id", value=7, failed_before=old)) == 0
    with pytest.raises(OperationError, match=f"at most {MAX_TEXT_LENGTH}"):
        DeadLetterFilter(text="x" * (MAX_TEXT_LENGTH + 1))
    assert len(scene.dead) == 4


def test_every_new_field_flows_through_as_query_and_describe():
    now = timezone.now()
    f = DeadLetterFilter(topic="orders", key="k1", id="o7", text="bad", field="customer.id", value=42).resolved(now)
    q = f.as_query()
    assert q == {
        "topic": "orders",
        "failed_after": (now - DEFAULT_WINDOW).isoformat(),
        "failed_before": now.isoformat(),
        "key": "k1",
        "id": "o7",
        "text": "bad",
        "field": "customer.id",
        "value": "42",
    }
    assert f.describe().endswith("key=k1, id=o7, text=bad, payload customer.id = 42")


def test_replay_matching_a_payload_search_replays_exactly_the_matching_ones():
    build()
    dead_letter("billing", "p1", payload={"order_id": 7})
    dead_letter("billing", "p2", payload={"order_id": 8})
    result = replay_matching(DeadLetterFilter(field="order_id", value=7), actor="t", batch_size=1)
    assert result.done == 1
    assert sorted(d.original_id for d in list_dead_letters().items) == ["o0", "o1", "o2", "o7", "p2"]


def test_list_pages_load_payload_starts_only():
    big = {"blob": "é" * 5000}
    publish_many("big", [{"payload": big, "id": "b1"}, {"payload": {"n": 1}, "id": "b2"}])
    dead_letter("billing", "d1", payload=big)
    with CaptureQueriesContext(connection) as queries:
        page = browse(MessageFilter(topic="big"), preview=True)
        dead = list_dead_letters(preview=True).items[0]
    whole = json.dumps(big, separators=(",", ":"), ensure_ascii=False)
    selects = " ".join(q["sql"] for q in queries.captured_queries)
    assert len(selects) < 10_000  # no payload came back as a parameter or in a follow-up query
    p_big, p_small = page.previews[1], page.previews[0]
    assert p_small.text == '{"n":1}' and not p_small.cut and p_small.size == 7
    assert p_big.cut and p_big.text == whole[: len(p_big.text)] and 150 <= len(p_big.text) <= 200
    assert p_big.size >= len(whole.encode()) and p_big.length >= len(whole)
    assert dead.payload is None and dead.payload_preview is not None and dead.payload_preview.cut
    assert dead.error_class == "builtins.ValueError"
    assert "payload" not in page.items[0].__dict__  # deferred, never loaded
    assert Message.objects.get(topic="big", id="b1").payload == big


def test_the_window_bounds_are_inclusive_with_slack_around_them():
    publish_orders()
    first = Message.objects.filter(topic="shop").order_by("seq").first()
    assert first is not None
    assert found("order_id", 42, after=first.published_at) == ["s0", "s2"]
    assert found("order_id", 42, before=first.published_at) == ["s0", "s2"]  # one statement: one time
    assert found("order_id", 42, before=first.published_at - dt.timedelta(microseconds=1)) == []
    assert TIME_SLACK > 0
