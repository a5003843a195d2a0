"""store/messages.py: the storage behind ``publish()``, dead letters and replayed copies.

``write_messages`` and ``write_dead_letter`` called directly, as the worker's dead letters
(``acks.py``) and the operators' replays (``ops/replay.py``) call them; ``publish()`` on top
of them is tested in tests/test_publisher.py.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from django_sqlqueue.conf import get_settings
from django_sqlqueue.db.store.messages import PublishedMessage, write_dead_letter, write_messages
from django_sqlqueue.exceptions import IdempotencyConflict
from django_sqlqueue.models import Message
from django_sqlqueue.rules.partitioning import partition_for
from django_sqlqueue.rules.validation import MAX_ERROR_LENGTH, PreparedMessage, prepare_message

from ...support.engine_helpers import db_now, fast_conf

pytestmark = pytest.mark.django_db(transaction=True)

T, DLQ = "orders", "orders_dlq"


class Boom(Exception):
    pass


def prepared(payload: Any, key: str = "", id: str | None = None) -> PreparedMessage:
    return prepare_message(payload, key=key, id=id, max_payload_bytes=1 << 20)


def committed(spawn, **filters: Any) -> int:
    """Count rows from another connection: what other transactions can see."""
    return spawn(lambda: Message.objects.filter(**filters).count()).join_ok()


def dead_letter(id: str = "billing:m1", **changes: Any) -> PublishedMessage:
    fields: dict[str, Any] = {
        "key": "alice",
        "id": id,
        "payload": {"order": 1},
        "metadata": {"trace": "t1"},
        "created_at": timezone.now() - dt.timedelta(days=2),
        "failure_count": 3,
        "last_error": "boom",
        "original_topic": T,
        "using": "default",
    }
    return write_dead_letter(DLQ, **{**fields, **changes})


def test_write_messages_describes_every_input_and_stores_each_id_once_without_offset():
    conf = fast_conf(TOPICS={T: {"partitions": 3}})
    batch = [prepared(1, "alice", "a"), prepared(2, "bob"), prepared(1, "alice", "a"), prepared(3, "carol", "c")]
    published = write_messages(T, batch, using="default", conf=conf)
    assert [(m.id, m.key, m.created) for m in published] == [
        ("a", "alice", True),
        (batch[1].id, "bob", True),
        ("a", "alice", True),  # the same id twice in one batch: stored once, described twice
        ("c", "carol", True),
    ]
    assert all(m.topic == T and m.partition == partition_for(m.key, 3) for m in published)
    stored = {m.id: m for m in Message.objects.filter(topic=T)}
    assert sorted(stored) == sorted(["a", batch[1].id, "c"])
    assert all(m.offset is None for m in stored.values())  # numbered by the sequencer once committed
    assert {(m.key, m.partition, m.payload) for m in stored.values()} == {
        ("alice", partition_for("alice", 3), 1),
        ("bob", partition_for("bob", 3), 2),
        ("carol", partition_for("carol", 3), 3),
    }


def test_write_messages_joins_the_callers_transaction_and_a_rollback_leaves_nothing(spawn):
    with transaction.atomic():
        write_messages(T, [prepared(1, "k", "one")], using="default")
        write_messages(T, [prepared(i, "k") for i in range(3)], using="default")
        assert Message.objects.filter(topic=T).count() == 4  # the caller sees its own writes
        assert committed(spawn, topic=T) == 0  # nobody else does before the caller commits
    assert committed(spawn, topic=T) == 4
    with pytest.raises(Boom), transaction.atomic():
        write_messages(T, [prepared(1, "k", "two")], using="default")
        write_messages(T, [prepared(i, "k") for i in range(3)], using="default")
        raise Boom
    assert committed(spawn, topic=T) == 4
    assert not Message.objects.filter(id="two").exists()


def test_a_republished_id_stores_nothing_and_only_compare_checks_its_payload():
    (first,) = write_messages(T, [prepared({"v": 1}, "alice", "x")], using="default")
    assert first.created
    with pytest.raises(IdempotencyConflict, match="different payload"):
        write_messages(T, [prepared({"v": 2}, "alice", "x")], using="default")
    with pytest.raises(IdempotencyConflict, match="different key"):
        write_messages(T, [prepared({"v": 1}, "bob", "x")], using="default")
    # compare=False (dead letters, replayed copies): the stored message is described as it is.
    (again,) = write_messages(T, [prepared({"v": 2}, "bob", "x")], using="default", compare=False)
    assert again == PublishedMessage(T, "alice", first.partition, "x", created=False)
    assert list(Message.objects.values_list("key", "payload")) == [("alice", {"v": 1})]


def test_write_dead_letter_stores_the_dead_letter_columns():
    created_at = timezone.now() - dt.timedelta(days=2)
    before = db_now()
    published = dead_letter(created_at=created_at, last_error="x" * (MAX_ERROR_LENGTH + 10))
    after = db_now()
    assert published == PublishedMessage(
        DLQ, "alice", partition_for("alice", get_settings().partitions_for(DLQ)), "billing:m1"
    )
    m = Message.objects.get(topic=DLQ)
    assert (m.key, m.id, m.partition, m.payload, m.metadata) == (
        "alice",
        "billing:m1",
        published.partition,
        {"order": 1},
        {"trace": "t1"},
    )
    assert (m.original_topic, m.failure_count, m.last_error) == (T, 3, "x" * MAX_ERROR_LENGTH)
    assert before <= m.failed_at <= after  # the database's clock
    assert abs(m.created_at - created_at) < dt.timedelta(milliseconds=1)  # the original's time
    assert before <= m.published_at <= after and m.offset is None


def test_write_dead_letter_is_idempotent_on_id():
    first = dead_letter()
    # The message failed again after a replay: the dead letter stored before is kept as it is.
    again = dead_letter(payload={"order": 2}, failure_count=9, last_error="again", key="bob")
    assert again == PublishedMessage(DLQ, "alice", first.partition, "billing:m1", created=False)
    m = Message.objects.get(topic=DLQ)
    assert (m.key, m.payload, m.failure_count, m.last_error) == ("alice", {"order": 1}, 3, "boom")
    other = dead_letter(id="billing:m2")
    assert other.created and Message.objects.filter(topic=DLQ).count() == 2


def test_a_row_that_is_not_a_dead_letter_cannot_swallow_one(caplog):
    """A row written into the DLQ topic around publish() (which refuses it) holding the dead
    letter's id: the dead letter is stored under an id of its own, the row is left alone."""
    (decoy,) = write_messages(DLQ, [prepared({"decoy": True}, "alice", "billing:m1")], using="default")
    assert decoy.created
    stored = dead_letter()
    assert stored.created and stored.id.startswith("billing:m1#") and len(stored.id) == len("billing:m1#") + 12
    assert "is held by a row that is not a dead letter" in caplog.text
    real = Message.objects.get(topic=DLQ, id=stored.id)
    assert (real.original_topic, real.payload, real.failure_count) == (T, {"order": 1}, 3)
    assert Message.objects.get(topic=DLQ, id="billing:m1").payload == {"decoy": True}
    # Failing again: the decoy still holds the id, and the dead letter is kept once more (never dropped).
    assert dead_letter().created and Message.objects.filter(topic=DLQ).exclude(original_topic="").count() == 2


def test_a_displaced_dead_letter_id_fits_the_column():
    long_id = "g" * 128 + ":" + "o" * 128 + "@replay" + "9" * 19 + "x" * 17  # 300, the column's width
    write_messages(DLQ, [PreparedMessage("", long_id, "1", "{}", None, None, True)], using="default")
    stored = dead_letter(id=long_id)
    assert stored.created and len(stored.id) == 300
    assert Message.objects.get(topic=DLQ, id=stored.id).original_topic == T
