"""The schema: RFC table and column names, keys and indexes, on the real database."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection

from django_sqlqueue import models

from .support import factories

pytestmark = pytest.mark.django_db(transaction=True)

EXPECTED_COLUMNS = {
    "queue_messages": {
        "seq",
        "topic",
        "partition",
        "key",
        "offset",
        "id",
        "payload",
        "metadata",
        "failed_at",
        "failure_count",
        "last_error",
        "original_topic",
        "created_at",
        "published_at",
        "deliver_at",
    },
    "queue_topics": {"topic", "partitions", "created_at", "updated_at"},
    "queue_delivery_state": {
        "consumer_group",
        "topic",
        "partition",
        "message_offset",
        "acked",
        "invisible_until",
        "retry_count",
        "status",
        "last_error",
    },
    "queue_partition_leases": {
        "consumer_group",
        "topic",
        "partition",
        "leased_by",
        "leased_at",
        "lease_renewed_at",
    },
    "queue_offsets": {
        "consumer_group",
        "topic",
        "partition",
        "offset_acked",
        "updated_at",
        # The history's running totals (migration 0010).
        "handled_total",
        "failed_total",
        "retried_total",
        "dead_lettered_total",
    },
    "queue_subscriber_heartbeats": {"consumer_group", "topic", "subscriber_name", "heartbeat_at", "deregistered_at"},
    "queue_partitions": {"topic", "partition", "head_offset", "created_at"},
    "queue_paused_topics": {"consumer_group", "topic", "paused_at", "paused_by", "reason"},
}

EXPECTED_PRIMARY_KEYS = {
    # The insertion number: publishers only append; the offset comes later (the sequencer).
    "queue_messages": ["seq"],
    "queue_topics": ["topic"],
    "queue_delivery_state": ["consumer_group", "topic", "partition", "message_offset"],
    "queue_partition_leases": ["consumer_group", "topic", "partition"],
    "queue_offsets": ["consumer_group", "topic", "partition"],
    "queue_subscriber_heartbeats": ["consumer_group", "topic", "subscriber_name"],
    "queue_partitions": ["topic", "partition"],
    "queue_paused_topics": ["consumer_group", "topic"],
}


def table_constraints(table: str) -> dict:
    with connection.cursor() as cursor:
        return connection.introspection.get_constraints(cursor, table)


@pytest.mark.parametrize("table", sorted(EXPECTED_COLUMNS))
def test_tables_have_rfc_columns(table):
    with connection.cursor() as cursor:
        columns = {c.name for c in connection.introspection.get_table_description(cursor, table)}
    assert columns == EXPECTED_COLUMNS[table]


@pytest.mark.parametrize("table", sorted(EXPECTED_PRIMARY_KEYS))
def test_primary_keys(table):
    (pk,) = [c for c in table_constraints(table).values() if c["primary_key"]]
    assert pk["columns"] == EXPECTED_PRIMARY_KEYS[table]


def column_sets(table: str, **flags) -> list[list[str]]:
    return [c["columns"] for c in table_constraints(table).values() if all(c[k] == v for k, v in flags.items())]


def test_message_indexes():
    unique = column_sets("queue_messages", unique=True)
    # The fetch's (topic, partition, offset) range read; idempotency per (topic, id).
    assert ["topic", "partition", "offset"] in unique
    assert ["topic", "id"] in unique
    assert ["topic", "seq"] in column_sets("queue_messages", index=True)
    if connection.vendor in ("postgresql", "sqlite"):
        # The sequencer's read of unsequenced rows: a partial index (MySQL uses the unique one).
        assert ["topic", "partition", "seq"] in column_sets("queue_messages", index=True)


def test_lease_and_offset_indexes():
    assert ["leased_by"] in column_sets("queue_partition_leases", index=True)
    assert ["lease_renewed_at"] in column_sets("queue_partition_leases", index=True)
    assert ["topic"] in column_sets("queue_offsets", index=True)


def test_unique_message_id_per_topic_is_enforced_by_the_database():
    factories.MessageFactory(topic="t", partition=0, id="x")
    factories.MessageFactory(topic="other", partition=0, id="x")  # another topic: fine
    with pytest.raises(IntegrityError):
        factories.MessageFactory(topic="t", partition=1, id="x")


def test_offsets_are_unique_per_partition_but_many_may_wait_for_the_sequencer():
    factories.MessageFactory(topic="t", partition=0, offset=1)
    factories.MessageFactory(topic="t", partition=1, offset=1)
    factories.MessageFactory(topic="t", partition=0, offset=None)
    factories.MessageFactory(topic="t", partition=0, offset=None)
    with pytest.raises(IntegrityError):
        factories.MessageFactory(topic="t", partition=0, offset=1)


def test_composite_keys_round_trip_through_the_orm():
    lease = factories.PartitionLeaseFactory(partition=1)
    offset = factories.ConsumerOffsetFactory(partition=1, offset_acked=41)
    state = factories.DeliveryStateFactory(message_offset=7, retry_count=2)
    heartbeat = factories.SubscriberHeartbeatFactory(subscriber_name="host:1")
    factories.PartitionFactory(partition=1, head_offset=3)
    paused = factories.PausedTopicFactory(reason="maintenance")
    assert models.PartitionLease.objects.get(pk=("billing", "factory.topic", 1)).leased_by == lease.leased_by
    assert models.ConsumerOffset.objects.get(pk=offset.pk).offset_acked == 41
    assert models.DeliveryState.objects.get(pk=state.pk).retry_count == 2
    assert models.SubscriberHeartbeat.objects.get(pk=heartbeat.pk).deregistered_at is None
    assert models.Partition.objects.get(pk=("factory.topic", 1)).head_offset == 3
    assert models.PausedTopic.objects.get(pk=("billing", "factory.topic")).reason == paused.reason
    with pytest.raises(IntegrityError):
        factories.PartitionLeaseFactory(partition=1)


def test_partition_numbers_of_per_key_topics_fit():
    """Per-key topics use crc32(key) itself, up to 2**32 - 1, as the partition number."""
    big = 2**32 - 1
    factories.MessageFactory(topic="t", partition=big, offset=1)
    factories.PartitionFactory(topic="t", partition=big, head_offset=1)
    factories.PartitionLeaseFactory(topic="t", partition=big)
    assert models.Message.objects.get(topic="t").partition == big
    assert models.Partition.objects.get(topic="t").partition == big


def test_str_of_the_models():
    message = factories.MessageFactory(topic="t", partition=3, id="m")
    assert str(message) == f"t[3]@{message.offset} id=m"
    assert not message.is_dead_letter
    assert str(factories.TopicFactory(topic="a", partitions=4)) == "a (4 partitions)"
    per_key = factories.TopicFactory(topic="b", partitions=None)
    assert str(per_key).startswith("b (one per key") and per_key.per_key
