"""Topics: every topic in the log (also those nobody consumes), purging one, changing its partition count.

**Purging a topic, step by step.** Every argument is checked first (the name, ``batch_size``
from 1 to ``MAX_BATCH_SIZE``), before anything is written: a size of 0 used to commit step 1
and then delete nothing. Then:

1. the fence, in one transaction: every lease of the topic is deleted, every watermark
   moves to its partition's head and the topic's delivery state goes -- no group will
   deliver a message of the topic stored before the call;
2. the messages up to the largest ``seq`` read at the start are deleted in batches, each
   its own transaction.

The order is chosen so that stopping anywhere leaves a state a rerun completes: after
step 1 every group is past the messages, so the ones step 2 has not deleted yet are
merely garbage; a rerun fences again (nothing left to move) and deletes them. The
reverse order would let workers deliver messages while their neighbours are being
deleted. ``on_batch(TopicPurge)`` is called inside each transaction after its writes:
once for step 1 (``messages=0``, its ``delivery_states`` and ``leases``) and once per
batch of step 2 (its ``messages`` only); their sum is the result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import transaction

from ..conf import MAX_PARTITIONS, get_settings
from ..rules.limits import MAX_BATCH_SIZE, TOPIC_COLUMN_LENGTH
from ..rules.validation import validate_topic
from .base import NotFound, OperationError, check_count, listing_aliases, store, topic_alias

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
    #: Of a dead-letter topic: the topic whose dead letters it holds ("" for any other topic).
    original_topic: str = ""
    #: How long garbage collection leaves its messages, in words (:func:`kept_for`).
    kept: str = ""
    #: The database alias that holds the topic.
    database: str = ""

    @property
    def unconsumed(self) -> bool:
        """No group consumes it (a fact; whether that is a problem is :attr:`orphaned`)."""
        return not self.consumed_by

    @property
    def orphaned(self) -> bool:
        """Consumed by no group and not a dead-letter topic: nothing reads its messages and
        garbage collection never deletes them (a typo in a topic name, a retired consumer).

        A dead-letter topic is consumed by no group by design: its dead letters wait for an
        operator, who replays or purges them (both delete them), so it is not orphaned.
        """
        return self.unconsumed and not self.dead_letter_topic


def log_topics(using: str | None = None) -> list[str]:
    """Return every topic that has messages in ``queue_messages``, sorted (a loose index scan)."""
    return store(using).log_topics()


def consuming_groups(using: str | None = None) -> dict[str, list[str]]:
    """Return ``{topic: [group, ...]}`` of groups with a watermark row or a heartbeat (the GC's definition)."""
    groups: dict[str, list[str]] = {}
    for group, topic in store(using).consumer_pairs():
        groups.setdefault(topic, []).append(group)
    return groups


def list_topics(using: str | None = None) -> list[TopicInfo]:
    """Return every topic: in the log, registered by a worker, or consumed by a group; sorted by name.

    Of database ``using``; without it, of every database (each topic names its ``database``).
    """
    return [info for db in listing_aliases(None, using) for info in _topics(db)]


def _topics(using: str) -> list[TopicInfo]:
    conf = get_settings()
    s = store(using)
    registered = s.registered_topics()
    consumers = consuming_groups(using)
    names = set(s.log_topics()) | set(registered) | set(consumers)
    out = []
    for name in sorted(names):
        dead_letters = conf.is_dlq_topic(name)
        consumed_by = consumers.get(name, [])
        out.append(
            TopicInfo(
                topic=name,
                partitions=registered.get(name),
                registered=name in registered,
                consumed_by=consumed_by,
                dead_letter_topic=dead_letters,
                original_topic=name[: -len(conf.DLQ_SUFFIX)] if dead_letters else "",
                kept=kept_for(bool(consumed_by), dead_letters, conf.RETENTION),
                database=using,
            )
        )
    return out


def kept_for(consumed: bool, dead_letter_topic: bool, retention: float) -> str:
    """Say how long garbage collection leaves a topic's messages (what ``collect_garbage`` does).

    GC deletes a message once every group consuming its topic has acked it (and, with
    ``SQLQUEUE["RETENTION"]``, once it is that old); it never touches a topic nobody
    consumes. Dead letters are deleted by a replay (which appends a copy to the original
    topic) or a purge, whatever RETENTION says.
    """
    if not consumed:
        return "until replayed or purged" if dead_letter_topic else "forever: no group consumes it"
    if retention <= 0:
        return "until every consuming group has handled them"
    return f"{duration_text(retention)} after every consuming group has handled them"


def duration_text(seconds: float) -> str:
    """``seconds`` in the largest whole unit: "7 days", "1 hour", "90 seconds"."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}{'' if n == 1 else 's'}"
    return f"{seconds:g} second{'' if seconds == 1 else 's'}"


@dataclass(frozen=True)
class TopicPurge:
    topic: str
    messages: int
    delivery_states: int = 0
    leases: int = 0
    dry_run: bool = False


#: Messages per transaction of a topic purge.
DEFAULT_PURGE_BATCH = 1000


def purge_topic(
    topic: str,
    *,
    dry_run: bool = False,
    batch_size: int = DEFAULT_PURGE_BATCH,
    using: str | None = None,
    on_batch: Callable[[TopicPurge], None] | None = None,
) -> TopicPurge:
    """Delete every message of ``topic`` stored before the call, in batches (see the module docstring).

    First, in one transaction: every group's lease of the topic is deleted (the lease
    fence: a worker busy with a message of it can no longer ack, and drops the
    partitions at its next lease round), every watermark moves up to its partition's
    head and the topic's delivery state goes. Then the messages are deleted in batches
    of ``batch_size`` by ``seq`` (index ``(topic, seq)``), each batch its own short
    transaction, up to the largest ``seq`` seen at the start: a message published
    meanwhile is kept and delivered normally. Offsets keep counting up from the head
    (they are never reused). ``dry_run`` only counts. ``on_batch`` receives each
    transaction's own :class:`TopicPurge`, inside it (not on a dry run).
    """
    validate_topic(topic, max_length=TOPIC_COLUMN_LENGTH)
    size = check_count(batch_size, "batch_size", MAX_BATCH_SIZE)
    s = store(topic_alias(topic, using))
    max_seq, count, known = s.topic_extent(topic)
    if not max_seq and not known:
        raise NotFound(f"topic {topic!r} has no messages and no consumer.")
    if dry_run:
        return TopicPurge(topic, count, dry_run=True)
    fenced = None if on_batch is None else (lambda leases, states: on_batch(TopicPurge(topic, 0, states, leases)))
    deleted_batch = None if on_batch is None else (lambda n: on_batch(TopicPurge(topic, n)))
    # Fence first (one transaction): the lease rows go before anything else is touched,
    # so a worker's fenced ack waits for it and then finds no lease.
    leases, states = s.skip_topic(topic, then=fenced)
    deleted = s.delete_messages(topic, max_seq, size, on_batch=deleted_batch) if max_seq else 0
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
    s = store(topic_alias(topic, using))
    registered, old = s.registered_partitions(topic)
    if registered and old is None:
        raise OperationError(f"topic {topic!r} is registered with one partition per key; it cannot be repartitioned.")
    if dry_run:
        return Repartition(topic, old if registered else None, partitions)
    with transaction.atomic(using=s.using):
        previous, new = s.repartition(topic, partitions)
    logger.warning("repartitioned topic=%s partitions=%s->%s", topic, previous, new)
    return Repartition(topic, previous, new)
