"""Topics: every topic in the log (also those nobody consumes), purging one, changing its partition count."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.db import transaction

from ..conf import MAX_PARTITIONS, get_settings
from ..dialects.console import distinct_topics_sql
from ..limits import TOPIC_COLUMN_LENGTH
from ..validation import validate_topic
from . import _db
from ._db import NotFound, OperationError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicInfo:
    """One topic as the console shows it."""

    topic: str
    #: Registered partition count (``queue_topics``); None when unregistered or per key.
    partitions: int | None
    registered: bool
    #: Groups with a watermark or a subscriber on the topic.
    consumed_by: list[str] = field(default_factory=list)
    #: ``<original><DLQ_SUFFIX>``: a dead-letter topic.
    dead_letter_topic: bool = False

    @property
    def unconsumed(self) -> bool:
        return not self.consumed_by


def log_topics(using: str | None = None) -> list[str]:
    """Every topic that has messages in ``queue_messages`` (a loose index scan, see dialects.console)."""
    return [row[0] for row in _db.fetchall(distinct_topics_sql(_db.connection(using)), using=using)]


def consuming_groups(using: str | None = None) -> dict[str, list[str]]:
    """``{topic: [group, ...]}`` of groups with a watermark row or a heartbeat (the GC's definition)."""
    rows = _db.fetchall(
        "SELECT DISTINCT topic, consumer_group FROM queue_offsets UNION "
        "SELECT DISTINCT topic, consumer_group FROM queue_subscriber_heartbeats",
        using=using,
    )
    groups: dict[str, list[str]] = {}
    for topic, group in rows:
        groups.setdefault(topic, []).append(group)
    return {topic: sorted(set(g)) for topic, g in groups.items()}


def list_topics(using: str | None = None) -> list[TopicInfo]:
    """Every topic: in the log, registered by a worker, or consumed by a group; sorted by name."""
    suffix = get_settings().DLQ_SUFFIX
    registered = dict(_db.fetchall("SELECT topic, partitions FROM queue_topics", using=using))
    consumers = consuming_groups(using)
    names = set(log_topics(using)) | set(registered) | set(consumers)
    return [
        TopicInfo(
            topic=name,
            partitions=registered.get(name),
            registered=name in registered,
            consumed_by=consumers.get(name, []),
            dead_letter_topic=name.endswith(suffix) and len(name) > len(suffix),
        )
        for name in sorted(names)
    ]


@dataclass(frozen=True)
class TopicPurge:
    topic: str
    messages: int
    delivery_states: int = 0
    leases: int = 0
    dry_run: bool = False


def purge_topic(topic: str, *, dry_run: bool = False, batch_size: int = 1000, using: str | None = None) -> TopicPurge:
    """Delete every message of ``topic`` stored before the call, in batches.

    First, in one transaction: every group's lease of the topic is deleted (the lease
    fence: a worker busy with a message of it can no longer ack, and drops the
    partitions at its next lease round), every watermark moves up to its partition's
    head and the topic's delivery state goes. Then the messages are deleted in batches
    of ``batch_size`` by ``seq`` (index ``(topic, seq)``), each batch its own short
    transaction, up to the largest ``seq`` seen at the start: a message published
    meanwhile is kept and delivered normally. Offsets keep counting up from the head
    (they are never reused). ``dry_run`` only counts.
    """
    validate_topic(topic, max_length=TOPIC_COLUMN_LENGTH)
    using = _db.alias(using)
    rows = _db.fetchall("SELECT MAX(seq), COUNT(*) FROM queue_messages WHERE topic = %s", [topic], using)
    max_seq, count = rows[0]
    known = _db.fetchall(
        "SELECT 1 FROM queue_topics WHERE topic = %s UNION ALL SELECT 1 FROM queue_offsets WHERE topic = %s",
        [topic, topic],
        using,
    )
    if not max_seq and not known:
        raise NotFound(f"topic {topic!r} has no messages and no consumer.")
    if dry_run:
        return TopicPurge(topic, int(count or 0), dry_run=True)
    p = _db.qn("partition", using)
    with transaction.atomic(using=using):
        # Fence first: the lease rows go before anything else is touched, so a worker's
        # fenced ack waits for this transaction and then finds no lease.
        leases = _db.execute("DELETE FROM queue_partition_leases WHERE topic = %s", [topic], using)
        _db.execute(
            f"UPDATE queue_offsets SET offset_acked = (SELECT head_offset FROM queue_partitions h "
            f"WHERE h.topic = queue_offsets.topic AND h.{p} = queue_offsets.{p}), "
            f"updated_at = {_db.dialect(using).now_sql} "
            f"WHERE topic = %s AND EXISTS (SELECT 1 FROM queue_partitions h2 WHERE h2.topic = queue_offsets.topic "
            f"AND h2.{p} = queue_offsets.{p} AND h2.head_offset > queue_offsets.offset_acked)",
            [topic],
            using,
        )
        states = _db.execute("DELETE FROM queue_delivery_state WHERE topic = %s", [topic], using)
    deleted = 0
    while max_seq:
        with transaction.atomic(using=using):
            seqs = [
                r[0]
                for r in _db.fetchall(
                    "SELECT seq FROM queue_messages WHERE topic = %s AND seq <= %s ORDER BY seq LIMIT %s",
                    [topic, max_seq, batch_size],
                    using,
                )
            ]
            if not seqs:
                break
            deleted += _db.execute(f"DELETE FROM queue_messages WHERE seq IN ({_db.in_list(seqs)})", seqs, using)
    return TopicPurge(topic, deleted, states, leases)


@dataclass(frozen=True)
class Repartition:
    """A topic's partition count before and after ``repartition_topic``."""

    topic: str
    #: None when the topic was not registered yet.
    old: int | None
    new: int


def repartition_topic(topic: str, partitions: int, *, dry_run: bool = False, using: str | None = None) -> Repartition:
    """Change a hashed topic's partition count in the registry (and create the new head rows).

    Publishers and workers hash keys with the count in their ``SQLQUEUE`` settings, so the
    settings must say ``partitions`` already: change ``SQLQUEUE["TOPICS"]`` first, then run
    this, then restart the workers (a worker whose settings disagree with the registry
    refuses to start). Keys move to other partitions: messages of a key published before
    and after the change are each in order, but not with each other -- drain the topic
    first if that matters. Partitions beyond a smaller count keep their messages and are
    still consumed. Topics with one partition per key cannot be repartitioned.
    """
    from ..store import QueueStore

    validate_topic(topic)
    if isinstance(partitions, bool) or not isinstance(partitions, int) or not 0 < partitions <= MAX_PARTITIONS:
        raise OperationError(f"partitions must be an integer from 1 to {MAX_PARTITIONS}, got {partitions!r}.")
    configured = get_settings().partitions_for(topic)
    if configured is None:
        raise OperationError(
            f"topic {topic!r} has one partition per key (SQLQUEUE['TOPICS']); it has no count to change."
        )
    if configured != partitions:
        raise OperationError(
            f"SQLQUEUE gives topic {topic!r} {configured} partitions, not {partitions}: publishers hash keys with "
            f"the settings, so set SQLQUEUE['TOPICS'][{topic!r}] = {{'partitions': {partitions}}} first."
        )
    store = QueueStore(using or get_settings().DATABASE)
    registered, old = store.registered_partitions(topic)
    if registered and old is None:
        raise OperationError(f"topic {topic!r} is registered with one partition per key; it cannot be repartitioned.")
    if dry_run:
        return Repartition(topic, old if registered else None, partitions)
    with transaction.atomic(using=store.using):
        previous, new = store.repartition(topic, partitions)
    logger.warning("repartitioned topic=%s partitions=%s->%s", topic, previous, new)
    return Repartition(topic, previous, new)
