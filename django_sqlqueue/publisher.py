"""``publish()`` and ``publish_many()``: the transactional outbox.

A publish writes on the caller's connection and joins the caller's transaction: if the
caller's ``atomic()`` block rolls back, the message never existed; if it commits, the
message is there. Outside a transaction the publish commits on return.

Ordering: each partition has a head row in ``queue_partitions``. A publish locks the
head rows of its partitions first (sorted, see ``Dialect.lock_partitions``), inserts
its messages and records the new head offset. The lock is held until the caller's
transaction ends, so the next publisher of the partition inserts -- and is given its
AUTO_INCREMENT offset -- only after this one committed or rolled back. Offsets within a
partition therefore increase in commit order, and a consumer that reads
``offset > watermark`` can never skip a message that commits late. The price: a long
transaction that published to a partition blocks other publishers of that partition
until it ends. Keep publishing transactions short.

Idempotency: a message published again with the same (topic, partition_key, id) is not
stored again; the original is returned. The check runs while the head lock is held, so
two publishers of the same id cannot both insert it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import connections, transaction
from django.db.models import Q

from .conf import get_settings
from .dialects import get_dialect
from .exceptions import InvalidMessage
from .models import Message
from .validation import MESSAGE_KEYS, PreparedMessage, prepare_message, validate_topic


def publish(
    topic: str,
    payload: Any,
    *,
    partition_key: str = "",
    id: str | int | None = None,
    metadata: dict[str, Any] | None = None,
    delay: float | dt.timedelta | None = None,
    deliver_at: dt.datetime | None = None,
    using: str | None = None,
) -> Message:
    """Publish one message to ``topic`` in the caller's transaction and return it.

    ``payload`` and ``metadata`` must be JSON-serializable (Decimal, datetime and UUID
    values are stored as strings). ``partition_key`` selects the partition: messages of
    one partition are delivered in order. ``id`` defaults to a fresh unique id; a second
    publish of the same (topic, partition_key, id) stores nothing and returns the first
    message. ``delay`` (seconds or timedelta, from the database clock) or an aware
    ``deliver_at`` postpone delivery. ``using`` is a database alias, by default
    ``SQLQUEUE["DATABASE"]``.

    Raise :class:`~django_sqlqueue.exceptions.InvalidMessage` (nothing written) on bad
    input.
    """
    conf = get_settings()
    validate_topic(topic)
    prepared = prepare_message(
        payload,
        partition_key=partition_key,
        id=id,
        metadata=metadata,
        delay=delay,
        deliver_at=deliver_at,
        max_payload_bytes=conf.MAX_PAYLOAD_BYTES,
    )
    return write_messages(topic, [prepared], using=using or conf.DATABASE)[0]


def publish_many(topic: str, messages: Iterable[Mapping[str, Any]], *, using: str | None = None) -> list[Message]:
    """Publish many messages to ``topic`` in as few statements as possible.

    Each item is a mapping with ``payload`` and optionally ``partition_key``, ``id``,
    ``metadata``, ``delay`` and ``deliver_at`` (as for :func:`publish`). Every item is
    validated before anything is written. Returns the stored messages in input order
    (for a duplicate id, the message stored first).
    """
    conf = get_settings()
    validate_topic(topic)
    if isinstance(messages, (str, bytes, Mapping)):
        raise InvalidMessage("publish_many() takes an iterable of message dicts, not a single value.")
    prepared: list[PreparedMessage] = []
    for index, item in enumerate(messages):
        where = f"message #{index}"
        if not isinstance(item, Mapping):
            raise InvalidMessage(f"{where}: expected a dict, got {type(item).__name__}.")
        unknown = sorted(set(item) - MESSAGE_KEYS)
        if unknown:
            raise InvalidMessage(
                f"{where}: unknown key(s) {', '.join(map(str, unknown))}; allowed: {', '.join(sorted(MESSAGE_KEYS))}."
            )
        if "payload" not in item:
            raise InvalidMessage(f"{where}: missing 'payload'.")
        prepared.append(prepare_message(**item, max_payload_bytes=conf.MAX_PAYLOAD_BYTES, position=where))
    if not prepared:
        return []
    return write_messages(topic, prepared, using=using or conf.DATABASE)


def write_messages(topic: str, messages: list[PreparedMessage], *, using: str) -> list[Message]:
    """Store validated messages (the engine behind publish/publish_many)."""
    connection = connections[using]
    dialect = get_dialect(connection)
    # savepoint=False: join the caller's transaction without a savepoint round trip;
    # in autocommit mode this opens (and commits) a transaction of its own, which the
    # head-row lock needs to last until the insert is visible.
    with transaction.atomic(using=using, savepoint=False), connection.cursor() as cursor:
        keys = sorted({m.partition_key for m in messages})
        heads, now = dialect.lock_partitions(cursor, topic, keys)

        existing = _load_existing(using, topic, [(m.partition_key, m.id) for m in messages if m.explicit_id])
        stored: dict[tuple[str, str], Message] = dict(existing)
        new: list[PreparedMessage] = []
        for m in messages:
            if (m.partition_key, m.id) not in stored:
                stored[(m.partition_key, m.id)] = None  # type: ignore[assignment] # filled below
                new.append(m)
        if new:
            ts = dialect.adapt_datetime(now)
            deliver = [_deliver_at(m, now) for m in new]
            rows = [
                (
                    topic,
                    m.partition_key,
                    m.id,
                    m.payload_json,
                    m.metadata_json,
                    dialect.adapt_datetime(when),
                    None,
                    0,
                    "",
                    "",
                    ts,
                    ts,
                )
                for m, when in zip(new, deliver)
            ]
            single = dialect.insert_messages(cursor, rows)
            if single is not None:
                offsets = {new[0].partition_key: [single]}
            else:
                offsets = dialect.read_new_offsets(
                    cursor, topic, {m.partition_key: heads[m.partition_key] for m in new}
                )
            dialect.set_heads(cursor, topic, {key: offs[-1] for key, offs in offsets.items()})
            positions = {key: iter(offs) for key, offs in offsets.items()}
            for m, when in zip(new, deliver):
                message = Message(
                    offset=next(positions[m.partition_key]),
                    topic=topic,
                    partition_key=m.partition_key,
                    id=m.id,
                    payload=json.loads(m.payload_json),
                    metadata=json.loads(m.metadata_json),
                    deliver_at=when,
                    failed_at=None,
                    failure_count=0,
                    last_error="",
                    original_topic="",
                    created_at=now,
                    published_at=now,
                )
                message._state.adding = False
                message._state.db = using
                stored[(m.partition_key, m.id)] = message
    return [stored[(m.partition_key, m.id)] for m in messages]


def _deliver_at(message: PreparedMessage, now: dt.datetime) -> dt.datetime:
    if message.deliver_at is not None:
        return message.deliver_at
    if message.delay:
        return now + dt.timedelta(seconds=message.delay)
    return now


def _load_existing(using: str, topic: str, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], Message]:
    """Return already stored messages among (partition_key, id) pairs.

    Runs while the partitions' head rows are locked by us: no concurrent publisher can
    insert one of these ids until we commit, and under READ COMMITTED this read sees
    every id committed before we took the lock.
    """
    if not pairs:
        return {}
    by_key: dict[str, set[str]] = {}
    for key, message_id in pairs:
        by_key.setdefault(key, set()).add(message_id)
    condition = Q()
    for key, ids in by_key.items():
        condition |= Q(partition_key=key, id__in=sorted(ids))
    found = Message.objects.using(using).filter(condition, topic=topic)
    return {(m.partition_key, m.id): m for m in found}
