"""The queue's tables.

Table and column names follow the RFC so operators can read them with plain SQL:

- ``queue_messages``: the immutable log, shared by every consumer group.
- ``queue_partitions``: one head row per (topic, partition_key). ``publish()`` locks it
  inside the caller's transaction, which makes offsets within a partition follow commit
  order; it doubles as the partition registry for discovery and lag.
- ``queue_delivery_state``: per-group visibility, retry count and ack of a message.
- ``queue_partition_leases``: which subscriber of a group owns a partition.
- ``queue_offsets``: per-group contiguous acked watermark of a partition.
- ``queue_subscriber_heartbeats``: live subscribers of a group, for fair share.

Times are Django ``DateTimeField`` (UTC) rather than the RFC's epoch milliseconds. Lease,
heartbeat, visibility and delivery times are always taken from the database clock.
"""

from __future__ import annotations

from django.db import models

from .conf import MAX_DLQ_SUFFIX_LENGTH, MAX_TOPIC_LENGTH

#: Column widths. Keys are bounded so every composite index stays under InnoDB's
#: 3072-byte limit in utf8mb4.
TOPIC_COLUMN_LENGTH = MAX_TOPIC_LENGTH + MAX_DLQ_SUFFIX_LENGTH
PARTITION_KEY_LENGTH = 128
#: Publishers' ids are at most MAX_MESSAGE_ID_LENGTH; the column is wider because a dead
#: letter's id is "<consumer group>:<original id>".
MAX_MESSAGE_ID_LENGTH = 128
MESSAGE_ID_LENGTH = 300
CONSUMER_GROUP_LENGTH = 128
SUBSCRIBER_NAME_LENGTH = 255


class Message(models.Model):
    """One message of the log.

    ``offset`` numbers the messages of one partition 1, 2, 3, ... in commit order: it is
    handed out from the partition's :class:`Partition` head row, whose row lock the
    publishing transaction holds until it ends (see ``publisher.py``). Offsets of
    different partitions are unrelated. The primary key (topic, partition_key, offset)
    clusters each partition's messages together in offset order, which is exactly the
    consumer's fetch.
    """

    pk = models.CompositePrimaryKey("topic", "partition_key", "offset")
    topic = models.CharField(max_length=TOPIC_COLUMN_LENGTH)
    partition_key = models.CharField(max_length=PARTITION_KEY_LENGTH, blank=True, default="")
    offset = models.BigIntegerField()
    id = models.CharField(max_length=MESSAGE_ID_LENGTH)
    payload = models.JSONField()
    metadata = models.JSONField(default=dict, blank=True)
    #: Not delivered before this time (equals ``published_at`` unless delayed).
    deliver_at = models.DateTimeField()
    # Dead-letter fields: empty for normal messages, set when moved to ``<topic><DLQ_SUFFIX>``.
    failed_at = models.DateTimeField(null=True, blank=True)
    failure_count = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    original_topic = models.CharField(max_length=TOPIC_COLUMN_LENGTH, blank=True, default="")
    #: When the message was first published (kept when it moves to the DLQ).
    created_at = models.DateTimeField()
    #: When this row was written (differs from ``created_at`` for dead letters).
    published_at = models.DateTimeField()

    class Meta:
        db_table = "queue_messages"
        # The RFC's (topic, partition_key, offset) index is the primary key itself.
        constraints = [
            # Idempotent publish: one (topic, partition_key, id) is stored at most once.
            models.UniqueConstraint(fields=["topic", "partition_key", "id"], name="queue_msg_unique_id"),
        ]

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition_key}]@{self.offset} id={self.id}"

    @property
    def is_dead_letter(self) -> bool:
        """Return whether this row is a dead letter (moved here after failing)."""
        return bool(self.original_topic)


class Partition(models.Model):
    """The head row of a partition: its offset counter and the registry of partitions.

    ``head_offset`` is the highest offset handed out in the partition. ``publish()``
    increments it first thing in the caller's transaction: the row lock this takes is
    held until that transaction ends, so a later publisher of the same partition waits,
    then gets the next offsets, and commits after it.
    """

    pk = models.CompositePrimaryKey("topic", "partition_key")
    topic = models.CharField(max_length=TOPIC_COLUMN_LENGTH)
    partition_key = models.CharField(max_length=PARTITION_KEY_LENGTH, blank=True, default="")
    head_offset = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "queue_partitions"

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition_key}] head={self.head_offset}"


class DeliveryState(models.Model):
    """Per-consumer-group delivery state of one message.

    ``status`` is an addition to the RFC's columns: it tells a message being worked on
    (``IN_FLIGHT``) from one waiting for a retry after a nack (``RETRY``) or not yet
    delivered (``SCHEDULED``: a delayed message the fetch passed over, or a delivery
    handed back on shutdown). Strict serialization and ``queue_status`` need the
    difference; ``invisible_until`` alone cannot show it.
    """

    class Status(models.IntegerChoices):
        SCHEDULED = 0, "scheduled"
        IN_FLIGHT = 1, "in flight"
        RETRY = 2, "waiting for retry"

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition_key", "message_offset")
    consumer_group = models.CharField(max_length=CONSUMER_GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_COLUMN_LENGTH)
    partition_key = models.CharField(max_length=PARTITION_KEY_LENGTH, blank=True, default="")
    message_offset = models.BigIntegerField()
    acked = models.BooleanField(default=False)
    #: Meaningful only when not acked: in the future = in flight or nack delay.
    invisible_until = models.DateTimeField()
    retry_count = models.PositiveIntegerField(default=0)
    status = models.PositiveSmallIntegerField(choices=Status.choices, default=Status.IN_FLIGHT)

    class Meta:
        db_table = "queue_delivery_state"
        indexes = [
            # The due fetch: unacked rows of a partition whose invisible_until has passed,
            # without walking acked rows piled up behind a stuck watermark.
            models.Index(
                fields=["consumer_group", "topic", "partition_key", "acked", "invisible_until"],
                name="queue_delivery_due",
            )
        ]

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic}[{self.partition_key}]@{self.message_offset}"


class PartitionLease(models.Model):
    """Which subscriber of a consumer group owns a partition."""

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition_key")
    consumer_group = models.CharField(max_length=CONSUMER_GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_COLUMN_LENGTH)
    partition_key = models.CharField(max_length=PARTITION_KEY_LENGTH, blank=True, default="")
    leased_by = models.CharField(max_length=SUBSCRIBER_NAME_LENGTH)
    leased_at = models.DateTimeField()
    lease_renewed_at = models.DateTimeField()

    class Meta:
        db_table = "queue_partition_leases"
        indexes = [
            models.Index(fields=["leased_by"], name="queue_lease_leased_by"),
            models.Index(fields=["lease_renewed_at"], name="queue_lease_renewed_at"),
        ]

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic}[{self.partition_key}] by {self.leased_by}"


class ConsumerOffset(models.Model):
    """A consumer group's contiguous acked watermark in one partition.

    Every message of the partition at or below ``offset_acked`` is processed by the group.
    The RFC's ``(consumer_group)`` index is the leftmost prefix of the primary key, so it
    is not created again.
    """

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition_key")
    consumer_group = models.CharField(max_length=CONSUMER_GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_COLUMN_LENGTH)
    partition_key = models.CharField(max_length=PARTITION_KEY_LENGTH, blank=True, default="")
    offset_acked = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "queue_offsets"
        indexes = [models.Index(fields=["topic"], name="queue_offsets_topic")]

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic}[{self.partition_key}]={self.offset_acked}"


class SubscriberHeartbeat(models.Model):
    """A subscriber's liveness within (consumer_group, topic), for fair share."""

    pk = models.CompositePrimaryKey("consumer_group", "topic", "subscriber_name")
    consumer_group = models.CharField(max_length=CONSUMER_GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_COLUMN_LENGTH)
    subscriber_name = models.CharField(max_length=SUBSCRIBER_NAME_LENGTH)
    heartbeat_at = models.DateTimeField()
    #: Set on graceful shutdown; NULL while the subscriber is active.
    deregistered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "queue_subscriber_heartbeats"

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic} {self.subscriber_name}"
