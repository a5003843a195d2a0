"""The queue's tables.

Table and column names follow the RFC where they can, so operators can read them with
plain SQL:

- ``queue_messages``: the immutable log, shared by every consumer group. Publishers only
  ever INSERT into it; a message gets its ``offset`` later, from the sequencer.
- ``queue_topics``: the registry of consumed topics and their partition counts.
- ``queue_partitions``: one head row per (topic, partition): the highest offset the
  sequencer has handed out. Only the sequencer writes it (see ``sequencer.py``).
- ``queue_delivery_state``: per-group visibility, retry count and ack of a message.
- ``queue_partition_leases``: which subscriber of a group owns a partition.
- ``queue_offsets``: per-group contiguous acked watermark of a partition.
- ``queue_subscriber_heartbeats``: live subscribers of a group, for fair share.
- ``queue_paused_topics``: (group, topic) pairs an operator paused.
- ``queue_topic_hours``: messages per topic per hour, counted by the sequencer (they
  outlive the log's garbage collection; the report reads them).
- ``queue_history``: per group, topic and minute, the group's running totals (published,
  handled, failed, retried, dead-lettered) and its lag, sampled (the console's charts).

Rows of the partition, lease and offset tables grow with groups x topics x partitions,
never with the number of message keys (except for topics that opt into one partition per
key). Times are Django ``DateTimeField`` (UTC). Lease, heartbeat, visibility and
delivery times are always taken from the database clock.
"""

from __future__ import annotations

from django.db import models

# Column widths and name rules live in a leaf (no model or settings import): re-exported
# here because the models are where readers look for them.
from .rules.limits import (
    CONSUMER_GROUP_LENGTH,
    KEY_LENGTH,
    MESSAGE_ID_LENGTH,
    SUBSCRIBER_NAME_LENGTH,
    TOPIC_COLUMN_LENGTH,
)


class Message(models.Model):
    """One message of the log.

    ``seq`` is the insertion number (AUTO_INCREMENT / identity). It only identifies the
    row: it is handed out at INSERT time but becomes visible at COMMIT, so it says
    nothing about the order in which messages can be seen.

    ``offset`` numbers the messages of one partition 1, 2, 3, ... in the order they
    became visible. It is NULL when the message is published and is assigned after the
    publishing transaction committed, by the sequencer (``sequencer.py``), in a short
    transaction of its own that holds the partition's head row. Consumers read
    ``offset > watermark``: a message that commits late simply gets a later offset, so
    it can never be skipped.

    ``partition`` is ``crc32(key) % partitions`` for hashed topics (see
    ``partitioning.py``), or ``crc32(key)`` for topics with one partition per key.
    """

    seq = models.BigAutoField(primary_key=True)
    topic = models.CharField(max_length=TOPIC_COLUMN_LENGTH)
    partition = models.BigIntegerField()
    #: The ordering scope chosen by the publisher ("" when none was given).
    key = models.CharField(max_length=KEY_LENGTH, blank=True, default="")
    offset = models.BigIntegerField(null=True, blank=True)
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
        constraints = [
            # Idempotent publish: one id is stored at most once per topic.
            models.UniqueConstraint(fields=["topic", "id"], name="queue_msg_unique_id"),
            # The consumer's fetch (offset > watermark ORDER BY offset) and GC's range
            # delete. Unsequenced rows have a NULL offset, which UNIQUE allows many times;
            # on MySQL they sort first and, InnoDB secondary indexes ending in the primary
            # key, in seq order: the sequencer's read is a range of this index there.
            # (PostgreSQL and SQLite get a partial index instead, migration 0003.)
            models.UniqueConstraint(fields=["topic", "partition", "offset"], name="queue_msg_offset"),
        ]
        indexes = [
            # Browsing a topic newest first (console, exports) without scanning the log.
            models.Index(fields=["topic", "seq"], name="queue_msg_topic_seq"),
        ]

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset} id={self.id}"

    @property
    def is_dead_letter(self) -> bool:
        """Return whether this row is a dead letter (moved here after failing)."""
        return bool(self.original_topic)


class Topic(models.Model):
    """A topic some consumer group consumes, with its partition count.

    Workers register the topics they consume (``partitions`` from ``SQLQUEUE``). A
    registered count is only changed by an explicit operation (``manage.py queue_topic
    repartition``), because it moves keys to other partitions. ``partitions`` is NULL for
    a topic with one partition per key.
    """

    topic = models.CharField(max_length=TOPIC_COLUMN_LENGTH, primary_key=True)
    partitions = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "queue_topics"

    def __str__(self) -> str:
        return f"{self.topic} ({'one per key' if self.partitions is None else self.partitions} partitions)"

    @property
    def per_key(self) -> bool:
        return self.partitions is None


class Partition(models.Model):
    """The head row of a partition: the highest offset the sequencer handed out.

    Only the sequencer writes it, holding its row lock for one short transaction while it
    numbers the partition's newly committed messages. Publishers never touch it.
    """

    pk = models.CompositePrimaryKey("topic", "partition")
    topic = models.CharField(max_length=TOPIC_COLUMN_LENGTH)
    partition = models.BigIntegerField()
    head_offset = models.BigIntegerField(default=0)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "queue_partitions"

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}] head={self.head_offset}"


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

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition", "message_offset")
    consumer_group = models.CharField(max_length=CONSUMER_GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_COLUMN_LENGTH)
    partition = models.BigIntegerField()
    message_offset = models.BigIntegerField()
    acked = models.BooleanField(default=False)
    #: Meaningful only when not acked: in the future = in flight or nack delay.
    invisible_until = models.DateTimeField()
    retry_count = models.PositiveIntegerField(default=0)
    status = models.PositiveSmallIntegerField(choices=Status.choices, default=Status.IN_FLIGHT)
    #: The error of the last failed attempt (type, message, traceback tail), written by the
    #: nack; NULL until an attempt fails. A dead letter carries it on into the DLQ. NULL
    #: rather than "": the engine's raw INSERTs leave it out, and MySQL gives TEXT no default.
    last_error = models.TextField(null=True, blank=True)  # noqa: DJ001

    class Meta:
        db_table = "queue_delivery_state"
        indexes = [
            # The due fetch: unacked rows of a partition whose invisible_until has passed,
            # without walking acked rows piled up behind a stuck watermark.
            models.Index(
                fields=["consumer_group", "topic", "partition", "acked", "invisible_until"],
                name="queue_delivery_due",
            )
        ]

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic}[{self.partition}]@{self.message_offset}"


class PartitionLease(models.Model):
    """Which subscriber of a consumer group owns a partition."""

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition")
    consumer_group = models.CharField(max_length=CONSUMER_GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_COLUMN_LENGTH)
    partition = models.BigIntegerField()
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
        return f"{self.consumer_group}:{self.topic}[{self.partition}] by {self.leased_by}"


class ConsumerOffset(models.Model):
    """A consumer group's contiguous acked watermark in one partition.

    Every message of the partition at or below ``offset_acked`` is processed by the group.
    The RFC's ``(consumer_group)`` index is the leftmost prefix of the primary key, so it
    is not created again.
    """

    pk = models.CompositePrimaryKey("consumer_group", "topic", "partition")
    consumer_group = models.CharField(max_length=CONSUMER_GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_COLUMN_LENGTH)
    partition = models.BigIntegerField()
    offset_acked = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField()
    #: Running totals of the group's outcomes in this partition, added by the transactions
    #: that commit them (the ack's watermark move, the nack, the dead letter): the console's
    #: history samples them (``db/store/history.py``).
    handled_total = models.BigIntegerField(db_default=0)
    failed_total = models.BigIntegerField(db_default=0)
    retried_total = models.BigIntegerField(db_default=0)
    dead_lettered_total = models.BigIntegerField(db_default=0)

    class Meta:
        db_table = "queue_offsets"
        indexes = [models.Index(fields=["topic"], name="queue_offsets_topic")]

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic}[{self.partition}]={self.offset_acked}"


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


class PausedTopic(models.Model):
    """A consumer group's consumption of a topic, paused by an operator.

    While a row exists, the group's workers hold no lease of the topic's partitions
    (they give them up at their next lease round and take none), so nothing of the
    topic is delivered to the group; messages keep accumulating and lag grows. Deleting
    the row resumes consumption where the watermarks stand.
    """

    pk = models.CompositePrimaryKey("consumer_group", "topic")
    consumer_group = models.CharField(max_length=CONSUMER_GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_COLUMN_LENGTH)
    paused_at = models.DateTimeField()
    #: Who paused it (a username, or "cli"), for the console.
    paused_by = models.CharField(max_length=150, blank=True, default="")
    reason = models.TextField(blank=True, default="")

    class Meta:
        db_table = "queue_paused_topics"

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.topic} paused"


#: Counter rows per (topic, hour): the sequencer adds each numbered message to slot
#: ``partition % TOPIC_HOUR_SLOTS``, so sequencers of different partitions of a topic seldom
#: update the same row (the hot row of the current hour is striped, not shared).
TOPIC_HOUR_SLOTS = 16


class TopicHour(models.Model):
    """Messages of a topic per hour (of ``published_at``, UTC), counted as they are sequenced.

    The log loses its messages to garbage collection; these counters do not, so the
    report's "messages per hour" still shows a topic whose messages were consumed and
    collected. The sequencer adds the messages it numbers in the same transaction that
    numbers them (``Dialect.count_sequenced``), so each message is counted exactly once,
    or not at all if that transaction rolls back (and then counted by the round that
    numbers it). A (topic, hour) total is the sum of its ``slot`` rows. Rows older than
    ``SQLQUEUE["STATS_RETENTION"]`` are deleted by garbage collection.
    """

    pk = models.CompositePrimaryKey("topic", "hour", "slot")
    topic = models.CharField(max_length=TOPIC_COLUMN_LENGTH)
    #: Start of the hour (UTC).
    hour = models.DateTimeField()
    #: ``partition % TOPIC_HOUR_SLOTS`` of the counted messages.
    slot = models.PositiveSmallIntegerField()
    messages = models.BigIntegerField(default=0)

    class Meta:
        db_table = "queue_topic_hours"
        indexes = [
            # The report's window and the pruning of old hours.
            models.Index(fields=["hour"], name="queue_topic_hours_hour"),
        ]

    def __str__(self) -> str:
        return f"{self.topic} {self.hour:%Y-%m-%d %H:00} [{self.slot}]: {self.messages}"


class QueueConsole(models.Model):
    """The operator console's entry in the admin, and the holder of its permissions.

    No table (``managed = False``): the admin cannot register the queue's models, whose
    composite primary keys it does not support, so the console hangs custom views off
    this placeholder (``django_sqlqueue.admin``). An unmanaged model still has a
    migration, which is what creates its content type and permissions.
    """

    class Meta:
        managed = False
        default_permissions = ()
        verbose_name = "queue console"
        verbose_name_plural = "queue console"
        permissions = [
            ("view_queue", "Can view the queue console"),
            ("replay_deadletter", "Can replay dead letters"),
            ("purge_deadletter", "Can purge dead letters"),
            ("seek_group", "Can rewind or fast-forward a consumer group"),
            ("pause_group", "Can pause and resume a consumer group"),
            ("drop_group", "Can drop a retired consumer group"),
            ("release_lease", "Can release a partition lease"),
            ("purge_topic", "Can purge a topic"),
            ("cancel_task", "Can cancel a task"),
        ]

    def __str__(self) -> str:
        return "queue console"


# The console's history (kept in its own module).
from .history_models import HistoryMinute  # noqa: E402, F401

# The django.tasks backend's and the schedules' tables (kept in their own module).
from .task_models import (  # noqa: E402, F401
    ConcurrencySlot,
    RateLimitState,
    ScheduleState,
    TaskBatch,
    TaskResultRecord,
    TaskUniqueLock,
)
