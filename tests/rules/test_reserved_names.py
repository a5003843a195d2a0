"""What only the engine writes, and characters that act on whoever displays them, are refused
by ``publish()``/``publish_many()`` with an error naming the problem; nothing is written
(issue 28: items 3 and 8, and the dots of item 6).

- dead-letter topics (``<topic><DLQ_SUFFIX>``, also a DLQ's DLQ): a row published there
  could take the id of a later dead letter and swallow it;
- metadata keys of the engine (``sqlqueue_...``): a forged replay marker hid a message from
  every other group;
- ids with a replay suffix (``@replay<digits>``): one published first made a replay vanish;
- C1 controls, line separators and bidirectional controls in keys and ids;
- topic and group names made only of dots (``.``, ``..``: path segments in console links).
"""

from __future__ import annotations

import pytest
from django.test import override_settings
from django.utils import timezone

from django_sqlqueue import InvalidMessage, publish, publish_many
from django_sqlqueue.db.store.messages import write_dead_letter
from django_sqlqueue.models import Message
from django_sqlqueue.rules.dlq import REPLAY_KEY, is_for_other_group, replay_id
from django_sqlqueue.rules.validation import validate_group, validate_message_id, validate_topic

pytestmark = pytest.mark.django_db

#: C1 controls (U+009B is the 8-bit CSI), the line/paragraph separators, the bidi controls.
CONTROLS = [
    "\x80",
    "\x85",
    "\x9b",
    "\x9f",
    "\u061c",
    "\u200e",
    "\u200f",
    "\u2028",
    "\u2029",
    "\u202a",
    "\u202d",
    "\u202e",
    "\u2066",
    "\u2069",
]


@pytest.fixture(autouse=True)
def nothing_written():
    yield
    assert not Message.objects.exclude(topic="kept").exists()


# -- characters that act on a terminal or a reader ------------------------------------------


@pytest.mark.parametrize("char", CONTROLS)
def test_keys_and_ids_refuse_c1_line_and_bidi_controls(char: str) -> None:
    found = (
        r"must not contain control characters \(C0, C1, line separators or bidirectional controls\); "
        rf"found U\+{ord(char):04X}"
    )
    with pytest.raises(InvalidMessage, match=rf"^key .*{found}"):
        publish("t", 1, key=f"k{char}31m")
    with pytest.raises(InvalidMessage, match=rf"^id .*{found}"):
        publish("t", 1, id=f"id{char}gnp.exe")
    with pytest.raises(InvalidMessage, match=rf"^message #1: key .*{found}"):
        publish_many("t", [{"payload": 1}, {"payload": 2, "key": f"x{char}y"}])


def test_the_error_shows_the_control_escaped() -> None:
    """The message names the value as Python's repr, which escapes the control: safe to print."""
    with pytest.raises(InvalidMessage) as caught:
        publish("t", 1, id="id\u202egnp.exe")
    assert "\u202e" not in str(caught.value) and "\\u202e" in str(caught.value)


def test_text_next_to_the_controls_is_still_a_key() -> None:
    texts = ["a\xa0b", "x\u2027y", "x\u202fy", "x\u206ay", "x\u061by", "x\u200by", "שלום", "é\u0301"]
    published = publish_many("kept", [{"payload": i, "key": t, "id": t} for i, t in enumerate(texts)])
    assert [p.id for p in published] == texts and all(p.created for p in published)


# -- names made only of dots ------------------------------------------------------------------


@pytest.mark.parametrize("name", [".", "..", "...", "." * 128])
def test_names_made_only_of_dots_are_refused(name: str) -> None:
    with pytest.raises(InvalidMessage, match=r"^topic '\.+' is made only of dots"):
        publish(name, 1)
    with pytest.raises(InvalidMessage, match="made only of dots"):
        publish_many(name, [{"payload": 1}])
    with pytest.raises(InvalidMessage, match=r"^consumer group '\.+' is made only of dots"):
        validate_group(name)


@pytest.mark.parametrize("name", [".a", "a..", "_.", "..-", "a.b.c"])
def test_dots_with_anything_else_make_a_name(name: str) -> None:
    assert validate_topic(name) == name and validate_group(name) == name


# -- dead-letter topics -------------------------------------------------------------------------


@pytest.mark.parametrize("topic", ["orders_dlq", "orders_dlq_dlq", "a.b-c_dlq"])
def test_publish_refuses_dead_letter_topics(topic: str) -> None:
    error = rf"^topic '{topic}' is a dead-letter topic \(it ends with SQLQUEUE\['DLQ_SUFFIX'\] '_dlq'\)"
    with pytest.raises(InvalidMessage, match=error):
        publish(topic, {"decoy": True}, id="billing:victim-9")
    with pytest.raises(InvalidMessage, match=error):
        publish_many(topic, [{"payload": 1}])


def test_the_rule_follows_the_dlq_suffix() -> None:
    with override_settings(SQLQUEUE={"DLQ_SUFFIX": ".dead"}):
        with pytest.raises(InvalidMessage, match=r"'orders\.dead' is a dead-letter topic"):
            publish("orders.dead", 1)
        assert publish("kept", 1).created
    assert publish_many("kept", [{"payload": 1}])[0].created  # "_dlq" alone names no original topic


def test_the_engine_still_writes_dead_letters_there() -> None:
    written = write_dead_letter(
        "kept_dlq",
        key="k",
        id="billing:m1",
        payload={"n": 1},
        metadata={},
        created_at=timezone.now(),
        failure_count=1,
        last_error="boom",
        original_topic="kept",
        using="default",
    )
    assert written.created
    assert Message.objects.filter(topic="kept_dlq", original_topic="kept").count() == 1
    Message.objects.filter(topic="kept_dlq").delete()


# -- the engine's metadata and ids -------------------------------------------------------------


def test_publish_refuses_the_engines_metadata_namespace() -> None:
    forged = {REPLAY_KEY: {"consumer_group": "rtg"}}
    assert is_for_other_group(forged, "other")  # what the forged marker did: other groups skipped it
    with pytest.raises(InvalidMessage, match=r"^metadata key\(s\) 'sqlqueue_replay' start with 'sqlqueue_'"):
        publish("t", 1, metadata=forged)
    with pytest.raises(InvalidMessage, match=r"'sqlqueue_a', 'sqlqueue_b'"):
        publish("t", 1, metadata={"sqlqueue_b": 1, "ok": 2, "sqlqueue_a": 3})
    with pytest.raises(InvalidMessage, match=r"^message #1: metadata key\(s\) 'sqlqueue_undecodable'"):
        publish_many("t", [{"payload": 1}, {"payload": 2, "metadata": {"sqlqueue_undecodable": "x"}}])


def test_metadata_outside_the_namespace_is_kept() -> None:
    metadata = {"sqlqueue": 1, "my_sqlqueue_x": 2, "SQLQUEUE_REPLAY": 3, "nested": {REPLAY_KEY: {}}}
    published = publish("kept", 1, metadata=metadata)
    assert Message.objects.get(topic="kept", id=published.id).metadata == metadata


@pytest.mark.parametrize("message_id", [replay_id("o1", 5), "x@replay0tail", "a@replay9@replay"])
def test_publish_refuses_replay_ids(message_id: str) -> None:
    error = r"contains '@replay' followed by a digit, which is reserved for the copies a dead-letter replay writes"
    with pytest.raises(InvalidMessage, match=rf"^id '{message_id}' {error}"):
        publish("t", 1, id=message_id)
    with pytest.raises(InvalidMessage, match=rf"^message #0: id '{message_id}' {error}"):
        publish_many("t", [{"payload": 1, "id": message_id}])


@pytest.mark.parametrize("message_id", ["user@replay.example", "o1@replay", "o1@Replay5", "o1replay5"])
def test_ids_near_the_replay_suffix_are_ids(message_id: str) -> None:
    assert validate_message_id(message_id) == message_id
