"""publish() and publish_many(): the transactional outbox, idempotency, batching."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_sqlqueue import publish, publish_many
from django_sqlqueue.models import Message, Partition

pytestmark = pytest.mark.django_db(transaction=True)


def committed_count(spawn, **filters) -> int:
    """Count rows from another connection: what other transactions can see."""
    return spawn(lambda: Message.objects.filter(**filters).count()).join_ok()


def test_publish_returns_stored_message_with_offset():
    message = publish("orders.created", {"order": 1, "total": Decimal("9.50")}, partition_key="alice")
    stored = Message.objects.get(offset=message.offset)
    assert stored.topic == "orders.created"
    assert stored.partition_key == "alice"
    assert stored.id == message.id and len(message.id) == 32
    # Decimal is stored as a string; the returned message shows what consumers will get.
    assert stored.payload == message.payload == {"order": 1, "total": "9.50"}
    assert stored.metadata == {}
    assert stored.created_at == stored.published_at == stored.deliver_at == message.created_at
    assert stored.failed_at is None and stored.failure_count == 0 and stored.original_topic == ""
    assert Partition.objects.get(topic="orders.created", partition_key="alice").head_offset == message.offset


def test_publish_outside_transaction_autocommits(spawn):
    assert connection.get_autocommit()
    message = publish("t", {"x": 1})
    assert committed_count(spawn, offset=message.offset) == 1


def test_publish_in_committed_atomic_leaves_exactly_one_row(spawn):
    with transaction.atomic():
        message = publish("t", {"x": 1}, partition_key="p")
        # Not visible to other connections before the caller commits.
        assert committed_count(spawn, topic="t") == 0
    assert committed_count(spawn, topic="t") == 1
    assert Message.objects.get().offset == message.offset


def test_publish_in_rolled_back_atomic_leaves_nothing(spawn):
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with transaction.atomic():
            publish("t", {"x": 1}, partition_key="p")
            publish_many("t", [{"payload": i, "partition_key": "q"} for i in range(5)])
            raise Boom
    assert committed_count(spawn) == 0
    assert not Partition.objects.exists()  # the head rows rolled back too


def test_publish_in_rolled_back_savepoint_keeps_outer_work():
    with transaction.atomic():
        kept = publish("t", 1, partition_key="p")
        try:
            with transaction.atomic():
                publish("t", 2, partition_key="p")
                raise RuntimeError("inner")
        except RuntimeError:
            pass
        after = publish("t", 3, partition_key="p")
    assert list(Message.objects.values_list("payload", flat=True)) == [1, 3]
    assert kept.offset < after.offset
    assert Partition.objects.get(partition_key="p").head_offset == after.offset


def test_republishing_an_id_is_a_noop_returning_the_original():
    first = publish("t", {"v": 1}, partition_key="p", id="evt-1")
    again = publish("t", {"v": 2}, partition_key="p", id="evt-1")
    assert again.offset == first.offset
    assert again.payload == {"v": 1}
    assert Message.objects.count() == 1
    # The same id in another partition or topic is another message.
    other_key = publish("t", {"v": 3}, partition_key="q", id="evt-1")
    other_topic = publish("u", {"v": 4}, partition_key="p", id="evt-1")
    assert len({first.pk, other_key.pk, other_topic.pk}) == 3
    assert other_key.offset == other_topic.offset == 1  # offsets count per partition


def test_republish_inside_same_transaction_is_a_noop():
    with transaction.atomic():
        first = publish("t", 1, id=7)
        again = publish("t", 2, id="7")  # ints are ids too, compared as strings
    assert again.offset == first.offset and Message.objects.count() == 1


def test_publish_many_returns_messages_in_input_order_with_partition_order():
    items = [{"payload": i, "partition_key": f"k{i % 3}", "metadata": {"i": i}} for i in range(30)]
    messages = publish_many("batch", items)
    assert [m.payload for m in messages] == list(range(30))
    assert [m.metadata for m in messages] == [{"i": i} for i in range(30)]
    for key in ("k0", "k1", "k2"):
        offsets = [m.offset for m in messages if m.partition_key == key]
        assert offsets == sorted(offsets)
        stored = list(Message.objects.filter(partition_key=key).values_list("offset", "payload"))
        assert stored == [(m.offset, m.payload) for m in messages if m.partition_key == key]
        assert Partition.objects.get(topic="batch", partition_key=key).head_offset == offsets[-1]


def test_publish_many_deduplicates_against_stored_and_within_batch():
    original = publish("batch", "old", partition_key="a", id="dup")
    messages = publish_many(
        "batch",
        [
            {"payload": "new", "partition_key": "a", "id": "dup"},
            {"payload": "x1", "partition_key": "a", "id": "fresh"},
            {"payload": "x2", "partition_key": "a", "id": "fresh"},
            {"payload": "y", "partition_key": "b"},
        ],
    )
    assert messages[0].offset == original.offset and messages[0].payload == "old"
    assert messages[1].offset == messages[2].offset and messages[2].payload == "x1"
    assert Message.objects.count() == 3
    # Offsets given back: the head is the last stored offset, without holes.
    assert Partition.objects.get(partition_key="a").head_offset == messages[1].offset


def test_publish_many_all_duplicates_writes_nothing():
    publish_many("batch", [{"payload": i, "id": f"m{i}"} for i in range(3)])
    before = list(Message.objects.values_list("offset", flat=True))
    again = publish_many("batch", [{"payload": i, "id": f"m{i}"} for i in range(3)])
    assert [m.offset for m in again] == before
    assert list(Message.objects.values_list("offset", flat=True)) == before


def test_publish_many_large_batch_spans_statements():
    messages = publish_many("big", ({"payload": {"n": i}, "partition_key": f"p{i % 7}"} for i in range(3000)))
    assert len(messages) == 3000 == Message.objects.filter(topic="big").count()
    assert len({m.pk for m in messages}) == 3000
    for key in {m.partition_key for m in messages}:
        offsets = [m.offset for m in messages if m.partition_key == key]
        assert offsets == list(range(1, len(offsets) + 1))  # dense, in input order
    assert Partition.objects.filter(topic="big").count() == 7


def test_publish_many_empty_is_noop():
    assert publish_many("t", []) == []
    assert not Message.objects.exists()


def test_delay_uses_database_clock():
    before = publish("t", "now").published_at
    delayed = publish("t", "later", delay=60)
    assert delayed.deliver_at - delayed.published_at == dt.timedelta(seconds=60)
    assert delayed.published_at >= before
    stored = Message.objects.get(offset=delayed.offset)
    assert stored.deliver_at == delayed.deliver_at
    td = publish("t", "later-td", delay=dt.timedelta(minutes=2))
    assert td.deliver_at - td.published_at == dt.timedelta(minutes=2)


def test_deliver_at_absolute_time():
    when = timezone.now() + dt.timedelta(hours=1)
    message = publish("t", "x", deliver_at=when)
    assert Message.objects.get(offset=message.offset).deliver_at == when
    other_tz = dt.datetime(2030, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    message = publish("t", "y", deliver_at=other_tz)
    assert Message.objects.get(offset=message.offset).deliver_at == other_tz


def test_partition_keys_compare_exactly():
    # MySQL's default collation would fold these into one partition.
    a = publish("t", 1, partition_key="Key", id="same")
    b = publish("t", 2, partition_key="key", id="same")
    c = publish("t", 3, partition_key="kéy", id="same")
    assert len({a.pk, b.pk, c.pk}) == 3
    assert Partition.objects.filter(topic="t").count() == 3


def test_publish_on_explicit_database_alias():
    message = publish("t", "x", using="default")
    assert message._state.db == "default"


def test_offsets_are_dense_per_partition_even_after_rollbacks_and_duplicates():
    publish("t", 1, partition_key="p")
    with pytest.raises(ZeroDivisionError):
        with transaction.atomic():
            publish("t", 2, partition_key="p")
            raise ZeroDivisionError
    publish("t", 3, partition_key="p", id="x")
    publish_many("t", [{"payload": 4, "partition_key": "p", "id": "x"}, {"payload": 5, "partition_key": "p"}])
    assert list(Message.objects.filter(partition_key="p").values_list("offset", "payload")) == [(1, 1), (2, 3), (3, 5)]
    assert Partition.objects.get(partition_key="p").head_offset == 3


def test_returned_times_come_from_the_database_clock():
    message = publish("t", "x", delay=5)
    with connection.cursor() as cursor:
        cursor.execute("SELECT UTC_TIMESTAMP(6)" if connection.vendor == "mysql" else "SELECT CURRENT_TIMESTAMP")
        db_now = cursor.fetchone()[0]
    db_now = db_now.replace(tzinfo=dt.timezone.utc) if db_now.tzinfo is None else db_now
    assert abs((message.published_at - db_now).total_seconds()) < 5
    assert message.deliver_at - message.published_at == dt.timedelta(seconds=5)
