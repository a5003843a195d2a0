"""The schema: RFC table and column names, keys and indexes, on the real database."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection

from django_sqlqueue import models

from . import factories

pytestmark = pytest.mark.django_db(transaction=True)

EXPECTED_COLUMNS = {
    "queue_messages": {
        "offset",
        "topic",
        "partition_key",
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
    "queue_delivery_state": {
        "consumer_group",
        "topic",
        "partition_key",
        "message_offset",
        "acked",
        "invisible_until",
        "retry_count",
        "status",
    },
    "queue_partition_leases": {
        "consumer_group",
        "topic",
        "partition_key",
        "leased_by",
        "leased_at",
        "lease_renewed_at",
    },
    "queue_offsets": {"consumer_group", "topic", "partition_key", "offset_acked", "updated_at"},
    "queue_subscriber_heartbeats": {"consumer_group", "topic", "subscriber_name", "heartbeat_at", "deregistered_at"},
    "queue_partitions": {"topic", "partition_key", "head_offset", "created_at"},
}

EXPECTED_PRIMARY_KEYS = {
    "queue_messages": ["topic", "partition_key", "offset"],
    "queue_delivery_state": ["consumer_group", "topic", "partition_key", "message_offset"],
    "queue_partition_leases": ["consumer_group", "topic", "partition_key"],
    "queue_offsets": ["consumer_group", "topic", "partition_key"],
    "queue_subscriber_heartbeats": ["consumer_group", "topic", "subscriber_name"],
    "queue_partitions": ["topic", "partition_key"],
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
    # The fetch's (topic, partition_key, offset) index is the clustered primary key.
    assert ["topic", "partition_key", "offset"] in column_sets("queue_messages", primary_key=True)
    assert ["topic", "partition_key", "id"] in column_sets("queue_messages", unique=True)


def test_lease_and_offset_indexes():
    assert ["leased_by"] in column_sets("queue_partition_leases", index=True)
    assert ["lease_renewed_at"] in column_sets("queue_partition_leases", index=True)
    assert ["topic"] in column_sets("queue_offsets", index=True)


def test_unique_message_id_per_partition_is_enforced_by_the_database():
    factories.MessageFactory(topic="t", partition_key="p", id="x")
    with pytest.raises(IntegrityError):
        factories.MessageFactory(topic="t", partition_key="p", id="x")


def test_composite_keys_round_trip_through_the_orm():
    lease = factories.PartitionLeaseFactory(partition_key="p1")
    offset = factories.ConsumerOffsetFactory(partition_key="p1", offset_acked=41)
    state = factories.DeliveryStateFactory(message_offset=7, retry_count=2)
    heartbeat = factories.SubscriberHeartbeatFactory(subscriber_name="host:1")
    factories.PartitionFactory(partition_key="p1", head_offset=3)
    assert models.PartitionLease.objects.get(pk=("billing", "factory.topic", "p1")).leased_by == lease.leased_by
    assert models.ConsumerOffset.objects.get(pk=offset.pk).offset_acked == 41
    assert models.DeliveryState.objects.get(pk=state.pk).retry_count == 2
    assert models.SubscriberHeartbeat.objects.get(pk=heartbeat.pk).deregistered_at is None
    assert models.Partition.objects.get(pk=("factory.topic", "p1")).head_offset == 3
    with pytest.raises(IntegrityError):
        factories.PartitionLeaseFactory(partition_key="p1")


def test_message_str_and_dead_letter_flag():
    message = factories.MessageFactory(topic="t", partition_key="p", id="m")
    assert str(message) == f"t[p]@{message.offset} id=m"
    assert not message.is_dead_letter
