"""publish() and publish_many() under arbitrary input (Hypothesis).

The property: every call either stores its messages so that reading them back gives
exactly what was published (payload, metadata, key, id, delivery time), or raises a
``SQLQueueError`` whose message names the bad field, and writes nothing. Any other
exception is a bug. Each example runs in a transaction of its own, rolled back after it.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import unicodedata
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.test import override_settings
from hypothesis import example, given, settings
from hypothesis import strategies as st

from django_sqlqueue import SQLQueueError, publish, publish_many
from django_sqlqueue.conf import DEFAULT_MAX_PAYLOAD_BYTES
from django_sqlqueue.db.dialects import get_dialect
from django_sqlqueue.exceptions import IdempotencyConflict, InvalidMessage, PayloadTooLarge
from django_sqlqueue.models import Message
from django_sqlqueue.rules.limits import MAX_JSON_DEPTH
from django_sqlqueue.rules.validation import validate_message_id

from .support import strategies as s

pytestmark = pytest.mark.django_db

#: A small MAX_PAYLOAD_BYTES, so that payloads near the limit are cheap to draw and store.
LIMIT = 4096
#: The test settings' SQLQUEUE (MAX_PAYLOAD_BYTES at its default).
SQLQUEUE = dict(django_settings.SQLQUEUE)


@pytest.fixture(autouse=True)
def small_limit():
    with override_settings(SQLQUEUE={**SQLQUEUE, "MAX_PAYLOAD_BYTES": LIMIT}):
        yield


# -- what publish() takes: tests/support/strategies.py, less what only the engine writes --------

#: Characters of a key or id that act on a terminal or a reader (C1, line separators, bidi
#: controls): refused since issue 28, like the C0 controls the shared strategies leave out.
TERMINAL_CONTROLS = frozenset(
    map(
        chr, [*range(0x80, 0xA0), 0x61C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
    )
)
REPLAY_SUFFIX = re.compile(r"@replay[0-9]")


def printable_key(value: Any) -> bool:
    return not isinstance(value, str) or TERMINAL_CONTROLS.isdisjoint(value)


def valid_topics() -> st.SearchStrategy[str]:
    """Topics a publisher may use: not dots alone, not a dead-letter topic (the default ``_dlq``)."""
    return s.topics().filter(lambda t: t.strip(".") != "" and not t.endswith("_dlq"))


def valid_keys() -> st.SearchStrategy[Any]:
    return s.valid_keys().filter(printable_key)


def valid_ids() -> st.SearchStrategy[Any]:
    return s.valid_ids().filter(lambda i: printable_key(i) and not (isinstance(i, str) and REPLAY_SUFFIX.search(i)))


def valid_metadata() -> st.SearchStrategy[Any]:
    """Metadata without the engine's keys (``sqlqueue_...``)."""
    return s.valid_metadata().filter(lambda m: not m or not any(str(k).startswith("sqlqueue_") for k in m))


@contextmanager
def example_transaction() -> Iterator[None]:
    """Run one example in a savepoint that is rolled back: examples never see each other's rows."""
    with transaction.atomic():
        yield
        transaction.set_rollback(True)


# -- what "the same" means --------------------------------------------------------------------


def normalised(value: Any) -> Any:
    """``value`` after the documented conversions (Decimal, datetime, UUID -> str; tuple -> list)."""
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def json_bytes(value: Any) -> int:
    return len(json.dumps(value, cls=DjangoJSONEncoder, ensure_ascii=False, separators=(",", ":")).encode())


def same(stored: Any, want: Any) -> bool:
    """Equal and of the same JSON type, all the way down (``True == 1`` in Python, not in JSON).

    One exception, PostgreSQL's (not preserved, known): jsonb keeps numbers as ``numeric``,
    which has no negative zero and prints without an exponent, so ``-0.0`` comes back as
    ``0.0`` and a float written with an exponent (``1e+16``, ``1.5e+300``) as the integer of
    its decimal digits: the value published, to the digit, but an int.
    """
    if isinstance(want, float):
        if connection.vendor == "postgresql":
            if type(stored) is int:
                return stored == int(Decimal(repr(want)))
            return type(stored) is float and stored == want
        return type(stored) is float and stored == want and math.copysign(1, stored) == math.copysign(1, want)
    if isinstance(want, list):
        return type(stored) is list and len(stored) == len(want) and all(map(same, stored, want))
    if isinstance(want, dict):
        return type(stored) is dict and stored.keys() == want.keys() and all(same(stored[k], want[k]) for k in want)
    if want is not None and type(want) in (int, str, bool):
        return type(stored) is type(want) and stored == want
    return stored == want and type(stored) is type(want)


def read_back(topic: str, message_id: str) -> tuple[Message, Any, Any]:
    """The stored row (ORM), and its payload and metadata as a consumer decodes them (raw SQL)."""
    row = Message.objects.get(topic=topic, id=message_id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT payload, metadata FROM queue_messages WHERE seq = %s", [row.seq])
        payload, metadata = cursor.fetchone()
    dialect = get_dialect(connection)
    return row, dialect.load_json(payload), dialect.load_json(metadata)


def as_text(value: Any) -> str:
    return str(value)


def assert_stored(topic: str, message_id: str, *, payload: Any, key: Any, metadata: Any, when: dict) -> None:
    row, raw_payload, raw_metadata = read_back(topic, message_id)
    want_payload, want_metadata = normalised(payload), normalised(metadata or {})
    for stored in (row.payload, raw_payload):
        assert same(stored, want_payload), (stored, want_payload)
    for stored in (row.metadata, raw_metadata):
        assert same(stored, want_metadata), (stored, want_metadata)
    assert row.key == as_text(key) and row.id == message_id
    assert row.offset is None and not row.original_topic
    # SQLite's strftime() keeps milliseconds of a delay; the other databases microseconds.
    slack = dt.timedelta(milliseconds=2)
    when = {name: value for name, value in when.items() if value is not None}  # None: not given
    if "deliver_at" in when:
        assert row.deliver_at == when["deliver_at"]
    elif "delay" in when:
        delay = when["delay"] if isinstance(when["delay"], dt.timedelta) else dt.timedelta(seconds=when["delay"])
        assert abs(row.deliver_at - row.published_at - delay) <= slack
    else:
        assert row.deliver_at == row.published_at


def names(exc: BaseException, *fields: str) -> bool:
    """Whether the error message names one of ``fields`` (as a word)."""
    text = str(exc)
    return any(re.search(rf"(?<![\w']){re.escape(f)}(?![\w'])", text) for f in fields)


FIELD_WORDS = {
    "topic": ("topic",),
    "payload": ("payload",),
    "metadata": ("metadata",),
    "key": ("key",),
    "id": ("id",),
    "schedule": ("delay", "deliver_at"),
}


# -- publish() ----------------------------------------------------------------------------------


def bad(field: str, **changes: Any) -> tuple[str, dict[str, Any]]:
    """An explicit example for the wild test: a minimal call with ``changes``."""
    return field, {"topic": "t", "payload": 1, "key": "", "id": None, "metadata": None, "when": {}, **changes}


@st.composite
def valid_calls(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "topic": draw(valid_topics()),
        "payload": draw(st.one_of(s.json_values(), s.long_payloads(LIMIT))),
        "key": draw(valid_keys()),
        "id": draw(valid_ids()),
        "metadata": draw(valid_metadata()),
        "when": draw(s.valid_schedule()),
    }


WILD = {
    "topic": s.any_topic(),
    "payload": s.any_payload(),
    "metadata": s.any_metadata(),
    "key": s.any_key(),
    "id": s.any_id(),
    "schedule": s.any_schedule(),
}


@st.composite
def wild_calls(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A valid call with one field replaced by anything."""
    call = draw(valid_calls())
    field = draw(st.sampled_from(sorted(WILD)))
    call["when" if field == "schedule" else field] = draw(WILD[field])
    return field, call


def call_publish(call: dict[str, Any]) -> Any:
    return publish(
        call["topic"], call["payload"], key=call["key"], id=call["id"], metadata=call["metadata"], **call["when"]
    )


@settings(max_examples=120)
@given(call=valid_calls())
@example(call={**bad("payload")[1], "payload": "\U0001f600" * 1000})
@example(call={**bad("payload")[1], "payload": {"a": [1e16, 1.5e300, -0.0, 2**64, 1e-7]}, "key": 7, "id": 7})
def test_valid_messages_are_stored_exactly(call):
    size = json_bytes(call["payload"]) + json_bytes(call["metadata"] or {})
    with example_transaction():
        try:
            published = call_publish(call)
        except PayloadTooLarge as exc:
            assert size > LIMIT, exc
            assert not Message.objects.exists()
            return
        assert size <= LIMIT
        assert published.created and published.topic == call["topic"]
        assert Message.objects.count() == 1
        assert_stored(
            call["topic"],
            published.id,
            payload=call["payload"],
            key=call["key"],
            metadata=call["metadata"],
            when=call["when"],
        )


@settings(max_examples=150)
@given(wild=wild_calls())
@example(wild=bad("topic", topic="orders\n"))
@example(wild=bad("payload", payload="a\x00b"))
@example(wild=bad("payload", payload=["\ud800"]))
@example(wild=bad("payload", payload=s.nested(MAX_JSON_DEPTH)))  # stored everywhere
@example(wild=bad("payload", payload=s.nested(MAX_JSON_DEPTH + 1, "dict")))  # MariaDB: IntegrityError
@example(wild=bad("metadata", metadata=s.nested(MAX_JSON_DEPTH, "dict")))  # stored everywhere
@example(wild=bad("metadata", metadata=s.nested(MAX_JSON_DEPTH + 1, "dict", [])))
@example(wild=bad("payload", payload=s.nested(5000)))  # RecursionError
@example(wild=bad("metadata", metadata={"\x00": 1}))
@example(wild=bad("key", key="k\udc80"))
@example(wild=bad("id", id="\ud800"))
@example(wild=bad("schedule", when={"delay": 1e300}))
@example(wild=bad("schedule", when={"delay": math.inf}))
@example(wild=bad("schedule", when={"delay": None, "deliver_at": None}))
@example(wild=bad("schedule", when={"delay": dt.timedelta.max}))
@example(wild=bad("schedule", when={"deliver_at": dt.datetime.max.replace(tzinfo=dt.timezone(-dt.timedelta(hours=5)))}))
@example(wild=bad("schedule", when={"deliver_at": dt.datetime.min.replace(tzinfo=dt.UTC)}))
@example(wild=bad("topic", topic=".."))
@example(wild=bad("topic", topic="orders_dlq"))
@example(wild=bad("key", key="k\x9b31m"))
@example(wild=bad("id", id="id\u202egnp.exe"))
@example(wild=bad("id", id="victim-1@replay7"))
@example(wild=bad("metadata", metadata={"sqlqueue_replay": {"consumer_group": "g"}}))
def test_any_publish_is_stored_exactly_or_refused_naming_the_field(wild):
    field, call = wild
    with example_transaction():
        try:
            published = call_publish(call)
        except SQLQueueError as exc:
            assert isinstance(exc, InvalidMessage), repr(exc)
            # The valid payload drawn for the other fields may be too large on its own.
            fields = FIELD_WORDS[field] + (("payload",) if isinstance(exc, PayloadTooLarge) else ())
            assert names(exc, *fields), f"{field}: {exc}"
            assert not Message.objects.exists()
            return
        assert Message.objects.count() == 1
        assert re.fullmatch(r"[A-Za-z0-9._-]{1,128}", call["topic"]), call["topic"]  # the documented rule
        assert_publishable(call["topic"], call["key"], call["id"], call["metadata"])
        assert_stored(
            call["topic"],
            published.id,
            payload=call["payload"],
            key=call["key"],
            metadata=call["metadata"],
            when=call["when"],
        )


def assert_publishable(topic: str, key: Any, message_id: Any, metadata: Any) -> None:
    """What publish() took obeys the reserved-name rules (issue 28): nothing only the engine writes."""
    assert topic.strip(".") and not topic.endswith("_dlq"), topic
    assert printable_key(key) and printable_key(message_id), (key, message_id)
    assert not (isinstance(message_id, str) and REPLAY_SUFFIX.search(message_id)), message_id
    assert not any(str(k).startswith("sqlqueue_") for k in metadata or {}), metadata


@settings(max_examples=60)
@given(
    text=s.key_text(40, 1),
    char=st.sampled_from(sorted(TERMINAL_CONTROLS)),
    at=st.integers(min_value=0, max_value=40),
    field=st.sampled_from(["key", "id"]),
)
def test_a_terminal_control_anywhere_in_a_key_or_id_is_refused_naming_the_field(text, char, at, field):
    value = text[:at] + char + text[at:]
    with example_transaction():
        with pytest.raises(InvalidMessage) as caught:
            publish("t", 1, **{field: value})
        assert names(caught.value, field), str(caught.value)
        assert char not in str(caught.value)  # shown escaped
        assert not Message.objects.exists()


@settings(max_examples=20)
@given(char=st.sampled_from(["a", "é", "€", "\U0001f600", '"']), slack=st.integers(min_value=-8, max_value=8))
def test_payloads_at_the_default_limit_are_measured_in_utf8_bytes(char, slack):
    width = len(json.dumps(char, ensure_ascii=False)[1:-1].encode())  # '"' is 2 bytes as JSON: \"
    payload = char * ((DEFAULT_MAX_PAYLOAD_BYTES + slack - 4) // width)
    size = json_bytes(payload) + json_bytes({})  # the limit is on payload and metadata together
    with override_settings(SQLQUEUE=SQLQUEUE), example_transaction():
        try:
            published = publish("t", payload)
        except PayloadTooLarge as exc:
            assert size > DEFAULT_MAX_PAYLOAD_BYTES and str(size) in str(exc)
            assert not Message.objects.exists()
            return
        assert size <= DEFAULT_MAX_PAYLOAD_BYTES
        assert same(read_back("t", published.id)[1], payload)


def test_dict_keys_that_are_not_str_become_str_as_in_json():
    """Not preserved (reported): JSON object keys are strings, so an int key comes back a str."""
    with example_transaction():
        published = publish("t", {1: "a", None: "b"})
        assert Message.objects.get(id=published.id).payload == {"1": "a", "null": "b"}


# -- publish_many() ---------------------------------------------------------------------------

#: A few ids, so that batches repeat some (same payload: stored once; another: a conflict).
SHARED_IDS = st.sampled_from(["a", "b", 3])


@st.composite
def valid_items(draw: st.DrawFn) -> dict[str, Any]:
    item: dict[str, Any] = {"payload": draw(st.one_of(s.json_values(8), st.sampled_from([1, "x"])))}
    for name, strategy in (
        ("key", valid_keys()),
        ("id", st.one_of(valid_ids(), SHARED_IDS)),
        ("metadata", valid_metadata()),
    ):
        if draw(st.booleans()):
            item[name] = draw(strategy)
    item.update(draw(s.valid_schedule()))
    return item


@st.composite
def wild_items(draw: st.DrawFn) -> Any:
    item = dict(draw(valid_items()))
    change = draw(st.sampled_from(["payload", "key", "id", "metadata", "schedule", "unknown", "missing", "not a dict"]))
    if change == "schedule":
        item.pop("delay", None), item.pop("deliver_at", None)
        item.update(draw(s.any_schedule()))
    elif change == "unknown":
        item[draw(st.one_of(st.text(max_size=10), st.integers(), st.sampled_from([None, (1,), "partition"])))] = 1
    elif change == "missing":
        item.pop("payload")
    elif change == "not a dict":
        return draw(st.one_of(s.wild_scalars(), st.lists(st.integers(), max_size=2)))
    else:
        item[change] = draw(WILD[change])
    return item


def wild_batches() -> st.SearchStrategy[Any]:
    items = st.one_of(valid_items(), wild_items())
    return st.one_of(
        st.lists(valid_items(), max_size=6),
        st.lists(items, max_size=6),
        st.lists(items, max_size=4).map(tuple),
        st.lists(items, max_size=4).map(lambda xs: (x for x in xs)),
        s.wild_scalars(),
        st.just({"payload": 1}),
        st.text(max_size=5),
    )


def first_by_id(items: list[dict[str, Any]], ids: list[str]) -> dict[str, dict[str, Any]]:
    first: dict[str, dict[str, Any]] = {}
    for item, message_id in zip(items, ids, strict=True):
        first.setdefault(message_id, item)
    return first


@settings(max_examples=150)
@given(topic=st.one_of(valid_topics(), s.any_topic()), batch=wild_batches())
@example(topic="t", batch=[{"payload": 1, 2: "x", "k": 3}])
@example(topic="t", batch=5)
@example(topic="t", batch=[{"payload": 1, "id": "a"}, {"payload": 2, "id": "a"}])
@example(topic="t", batch=[{"payload": 1, "id": "a"}, {"payload": 1, "id": "a"}])
@example(topic="t", batch=[{"payload": 1}, {"payload": "\x00"}])
def test_any_batch_is_stored_exactly_or_refused_whole(topic, batch):
    listed = list(batch) if isinstance(batch, (list, tuple)) else None
    with example_transaction():
        try:
            published = publish_many(topic, batch)
        except SQLQueueError as exc:
            assert isinstance(exc, InvalidMessage), repr(exc)
            assert str(exc)
            if isinstance(exc, IdempotencyConflict):
                assert names(exc, "id")
            assert not Message.objects.exists()
            return
        if listed is None:
            # Any other iterable is taken too: a generator (consumed, so not compared here; see
            # test_generators_are_published_like_lists) or an empty set.
            assert published == [] or isinstance(batch, type(x for x in ())), f"accepted {batch!r}"
            return
        ids = [p.id for p in published]
        assert len(published) == len(listed)
        first = first_by_id(listed, ids)
        assert Message.objects.count() == len(first)
        for message_id, item in first.items():
            assert_publishable(topic, item.get("key", ""), item.get("id"), item.get("metadata"))
            assert_stored(
                topic,
                message_id,
                payload=item["payload"],
                key=item.get("key", ""),
                metadata=item.get("metadata"),
                when={k: item[k] for k in ("delay", "deliver_at") if k in item},
            )


def test_generators_are_published_like_lists():
    with example_transaction():
        published = publish_many("t", ({"payload": i, "id": i} for i in range(3)))
        assert [p.id for p in published] == ["0", "1", "2"]
        assert sorted(Message.objects.values_list("payload", flat=True)) == [0, 1, 2]


def test_uuid_and_int_keys_are_stored_as_text():
    key = uuid.UUID(int=5)
    with example_transaction():
        published = publish("t", 1, key=key, id=-(10**30))
        row = Message.objects.get(id=published.id)
        assert (row.key, row.id) == (str(key), str(-(10**30)))


# -- ids are compared exactly ---------------------------------------------------------------


def look_alikes(text: str) -> list[str]:
    """Other ids a case- or accent-insensitive collation would take for ``text``."""
    return [
        text.swapcase(),
        unicodedata.normalize("NFD", text),
        unicodedata.normalize("NFKC", text),
        text.replace("ss", "ß"),
        text + "\u200b",
        "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text),  # full-width
    ]


@settings(max_examples=60)
@given(
    first=st.one_of(
        st.sampled_from(["Straße", "strasse", "é", "ÉCOLE", "abc", "ﬁ", "Ａ"]), s.key_text(40, 1).filter(printable_key)
    ),
    pick=st.integers(min_value=0, max_value=5),
)
def test_ids_and_keys_that_differ_are_different(first, pick):
    second = look_alikes(first)[pick]
    try:
        validate_message_id(second)
    except InvalidMessage:
        return
    if second == first:
        return
    with example_transaction():
        a = publish("t", 1, id=first, key=first)
        b = publish("t", 2, id=second, key=second)
        assert a.created and b.created, (first, second)
        assert Message.objects.get(topic="t", id=first).key == first
        assert Message.objects.get(topic="t", id=second).payload == 2
        assert Message.objects.filter(topic="t", key=first).count() == 1


# -- idempotency: the same id again ---------------------------------------------------------


def look_alike_values(value: Any) -> Any:
    """``value`` with booleans and numbers swapped for ones Python's ``==`` takes as equal."""
    if isinstance(value, dict):
        return {k: look_alike_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [look_alike_values(v) for v in value]
    if isinstance(value, bool):
        return int(value)
    if type(value) is int and value in (0, 1):
        return bool(value)
    return value


def same_document(a: Any, b: Any) -> bool:
    """JSON's equality: booleans are not numbers; numbers compare by their decimal value."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) and isinstance(b, float):
        return a == b
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_document(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same_document, a, b))
    return a == b


@settings(max_examples=60)
@given(
    first=s.json_values(8),
    change=st.sampled_from(["same", "look-alike", "other"]),
    other=s.json_values(4),
    in_batch=st.booleans(),
)
@example(first={"flag": True}, change="look-alike", other=None, in_batch=False)
@example(first=[1, 0], change="look-alike", other=None, in_batch=True)
@example(first={"n": 1e16, "z": -0.0}, change="same", other=None, in_batch=False)
@example(first=3.970804388347017e16, change="same", other=None, in_batch=False)  # PostgreSQL: a conflict
def test_an_id_published_again_stores_nothing_or_conflicts(first, change, other, in_batch):
    second = {"same": first, "look-alike": look_alike_values(first), "other": other}[change]
    with example_transaction():
        if in_batch:
            calls = [{"payload": first, "id": "x"}, {"payload": second, "id": "x"}]
            try:
                publish_many("t", calls)
            except IdempotencyConflict as exc:
                assert not same_document(first, second) and names(exc, "id")
                assert not Message.objects.exists()
                return
        else:
            publish("t", first, id="x")
            try:
                again = publish("t", second, id="x")
            except IdempotencyConflict as exc:
                assert not same_document(first, second) and names(exc, "id")
                assert Message.objects.count() == 1
                return
            assert not again.created
        assert same_document(first, second), (first, second)
        assert Message.objects.count() == 1
