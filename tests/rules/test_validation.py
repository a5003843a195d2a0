"""Bad input gets a clear error, subclass of SQLQueueError, and writes nothing."""

from __future__ import annotations

import datetime as dt

import pytest

from django_sqlqueue import InvalidMessage, PayloadTooLarge, SQLQueueError, publish, publish_many
from django_sqlqueue.models import Message, Partition

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def nothing_written():
    yield
    assert not Message.objects.exists()
    assert not Partition.objects.exists()


@pytest.mark.parametrize(
    ("topic", "error"),
    [
        ("", "topic must not be empty"),
        ("x" * 129, "topic is 129 characters long; the maximum is 128"),
        ("orders created", "outside [A-Za-z0-9._-]"),
        ("orders/created", "outside [A-Za-z0-9._-]"),
        ("ordérs", "outside [A-Za-z0-9._-]"),
        (None, "topic must be a str, got NoneType"),
    ],
)
def test_bad_topic(topic, error):
    with pytest.raises(InvalidMessage, match=error.replace("[", r"\[").replace("]", r"\]")):
        publish(topic, {"x": 1})


@pytest.mark.parametrize(
    ("key", "error"),
    [
        ("k" * 129, "key is 129 characters long; the maximum is 128"),
        (" padded", "must not start or end with whitespace"),
        ("tab\there", "control characters"),
        (4.2, "key must be a str, int or UUID, got float"),
        (None, "key must be a str, int or UUID, got NoneType"),
        (b"bytes", "key must be a str, int or UUID, got bytes"),
    ],
)
def test_bad_key(key, error):
    with pytest.raises(InvalidMessage, match=error):
        publish("t", {"x": 1}, key=key)


@pytest.mark.parametrize(
    ("message_id", "error"),
    [
        ("", "id must not be empty"),
        ("i" * 129, "maximum is 128"),
        (1.5, "id must be a str, int or UUID, got float"),
        (True, "id must be a str, int or UUID, got bool"),
    ],
)
def test_bad_id(message_id, error):
    with pytest.raises(InvalidMessage, match=error):
        publish("t", {"x": 1}, id=message_id)


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        ({"s": {1, 2}}, "payload is not JSON-serializable"),
        (float("nan"), "payload is not JSON-serializable"),
        (object(), "payload is not JSON-serializable"),
    ],
)
def test_payload_not_json(payload, error):
    with pytest.raises(InvalidMessage, match=error):
        publish("t", payload)


def test_metadata_must_be_json_dict():
    with pytest.raises(InvalidMessage, match="metadata must be a dict, got list"):
        publish("t", 1, metadata=["a"])
    with pytest.raises(InvalidMessage, match="metadata is not JSON-serializable"):
        publish("t", 1, metadata={"when": object()})


def test_payload_too_large(settings):
    settings.SQLQUEUE = {"MAX_PAYLOAD_BYTES": 100}
    publish_ok = {"x": "a" * 50}  # fits
    with pytest.raises(PayloadTooLarge, match=r"are 112 bytes as JSON; SQLQUEUE\['MAX_PAYLOAD_BYTES'\] is 100"):
        publish("t", {"x": "a" * 102})
    assert isinstance(PayloadTooLarge("x"), InvalidMessage)
    assert publish_ok


def test_default_max_payload_is_256_kib():
    with pytest.raises(PayloadTooLarge):
        publish("t", "x" * (256 * 1024))


def test_naive_deliver_at():
    with pytest.raises(InvalidMessage, match="deliver_at 2030-01-01T00:00:00 is naive"):
        publish("t", 1, deliver_at=dt.datetime(2030, 1, 1))


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"delay": -1}, "delay must not be negative"),
        ({"delay": "10"}, "delay must be seconds"),
        ({"delay": float("nan")}, "delay must not be negative"),
        ({"delay": 1, "deliver_at": dt.datetime(2030, 1, 1, tzinfo=dt.UTC)}, "either delay or deliver_at"),
        ({"deliver_at": "2030-01-01"}, "deliver_at must be a datetime"),
    ],
)
def test_bad_delay(kwargs, error):
    with pytest.raises(InvalidMessage, match=error):
        publish("t", 1, **kwargs)


def test_publish_many_one_bad_item_writes_nothing():
    items = [{"payload": i} for i in range(10)] + [{"payload": {1, 2}}]
    with pytest.raises(InvalidMessage, match=r"message #10: payload is not JSON-serializable"):
        publish_many("t", items)


@pytest.mark.parametrize(
    ("items", "error"),
    [
        ([{"payload": 1, "partition": "x"}], r"message #0: unknown key\(s\) partition"),
        ([{"partition_key": "x", "payload": 1}], r"message #0: unknown key\(s\) partition_key"),
        ([{"key": "x"}], "message #0: missing 'payload'"),
        ([1], "message #0: expected a dict, got int"),
        ({"payload": 1}, "iterable of message dicts"),
        ([{"payload": 1}, {"payload": 2, "key": " x"}], "message #1: key ' x'"),
    ],
)
def test_publish_many_bad_items(items, error):
    with pytest.raises(InvalidMessage, match=error):
        publish_many("t", items)


def test_errors_share_one_base_class():
    with pytest.raises(SQLQueueError):
        publish("", 1)
    assert issubclass(InvalidMessage, ValueError)


def test_json_is_refused_where_some_database_could_not_store_it():
    """encode_json: the same rule on every database -- no NUL, no lone surrogate, at most 31 levels deep."""
    from django_sqlqueue.rules.limits import MAX_JSON_DEPTH
    from django_sqlqueue.rules.validation import encode_json

    assert encode_json({"a": [1, "é"], "t": "\\u0000"}, "payload") == '{"a":[1,"é"],"t":"\\\\u0000"}'  # text, not NUL
    with pytest.raises(InvalidMessage, match="payload contains the character NUL"):
        encode_json({"t": "a\x00b"}, "payload")
    with pytest.raises(InvalidMessage, match="metadata contains a lone surrogate"):
        encode_json({"t": "\ud800"}, "metadata")
    deep: object = 0
    for _ in range(MAX_JSON_DEPTH):
        deep = [deep]
    assert encode_json(deep, "payload").count("[") == MAX_JSON_DEPTH
    with pytest.raises(InvalidMessage, match=f"nested more than {MAX_JSON_DEPTH}"):
        encode_json({"deep": deep}, "payload")


def test_new_message_ids_are_unique_hex_and_sort_in_publishing_order() -> None:
    import time

    from django_sqlqueue.rules.validation import new_message_id

    first = [new_message_id() for _ in range(1000)]
    time.sleep(0.002)
    later = new_message_id()
    assert len(set(first)) == 1000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in first)
    # The first 12 digits are the millisecond: a later id sorts after every earlier one.
    assert later > max(first)
    assert abs(int(later[:12], 16) - time.time_ns() // 1_000_000) < 60_000
    # The other 80 bits are random: ids of one millisecond still differ there.
    assert len({i[12:] for i in first}) == 1000
