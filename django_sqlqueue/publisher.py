"""``publish()`` and ``publish_many()``: the transactional outbox.

A publish writes on the caller's connection and joins the caller's transaction: if the
caller's ``atomic()`` block rolls back, the message never existed; if it commits, the
message is there. Outside a transaction the publish commits on return.

Ordering: each partition has a head row in ``queue_partitions`` holding its offset
counter. A publish first increments the counters of its partitions (in sorted order,
see ``Dialect.allocate``), which locks those rows until the caller's transaction ends,
then inserts its messages with the offsets it reserved. The next publisher of the
partition gets its offsets only after this transaction committed or rolled back (a
rollback also undoes the increment, so offsets stay dense). Offsets within a partition
therefore increase in commit order, and a consumer that reads ``offset > watermark`` can
never skip a message that commits late -- unlike AUTO_INCREMENT, whose values are handed
out at insert time but become visible at commit. The price: a long
transaction that published to a partition blocks other publishers of that partition
until it ends. Keep publishing transactions short.

Idempotency: a message published again with the same (topic, partition_key, id) is not
stored again; the original is returned. The check runs while the head lock is held, so
two publishers of the same id cannot both insert it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Q
from django.db.models.base import ModelState

from .conf import get_settings
from .dialects import get_dialect
from .dialects.base import MessageRow
from .exceptions import InvalidMessage
from .models import Message
from .validation import MESSAGE_KEYS, PreparedMessage, encode_json, prepare_message, validate_topic


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


#: Longest ``last_error`` stored with a dead letter.
MAX_ERROR_LENGTH = 8000


def write_dead_letter(
    topic: str,
    *,
    partition_key: str,
    id: str,
    payload: Any,
    metadata: dict[str, Any],
    created_at: dt.datetime,
    failure_count: int,
    last_error: str,
    original_topic: str,
    using: str,
) -> Message:
    """Store a dead letter in ``topic`` (the DLQ topic) in the current transaction.

    Like a publish (same head-row ordering, idempotent on ``id``), plus the dead-letter
    columns: ``failed_at`` is the database's now and ``created_at`` the original's. The
    payload is not size-checked again: it was valid when first published.
    """
    prepared = PreparedMessage(
        partition_key=partition_key,
        id=id,
        payload_json=encode_json(payload, "payload"),
        metadata_json=encode_json(metadata, "metadata"),
        delay=None,
        deliver_at=None,
        explicit_id=True,
        failed=True,
        failure_count=failure_count,
        last_error=last_error[:MAX_ERROR_LENGTH],
        original_topic=original_topic,
        created_at=created_at,
    )
    return write_messages(topic, [prepared], using=using)[0]


def write_messages(topic: str, messages: list[PreparedMessage], *, using: str) -> list[Message]:
    """Store validated messages (the engine behind publish/publish_many)."""
    connection = connections[using]
    dialect = get_dialect(connection)
    with _in_transaction(connection, dialect.begin_sql) as cursor:
        counts = Counter(m.partition_key for m in messages)
        heads = dialect.allocate(cursor, topic, counts)
        next_offset = {key: heads[key] - count + 1 for key, count in counts.items()}

        stored: dict[tuple[str, str], Message | None] = dict(
            _load_existing(using, topic, [(m.partition_key, m.id) for m in messages if m.explicit_id])
        )
        rows: list[MessageRow] = []
        for m in messages:
            if (m.partition_key, m.id) in stored:
                continue  # published before, or earlier in this batch
            stored[(m.partition_key, m.id)] = None
            rows.append(
                MessageRow(
                    partition_key=m.partition_key,
                    offset=next_offset[m.partition_key],
                    id=m.id,
                    payload_json=m.payload_json,
                    metadata_json=m.metadata_json,
                    deliver_at=m.deliver_at,
                    delay_us=round(m.delay * 1_000_000) if m.delay else 0,
                    failed=m.failed,
                    failure_count=m.failure_count,
                    last_error=m.last_error,
                    original_topic=m.original_topic,
                    created_at=m.created_at,
                )
            )
            next_offset[m.partition_key] += 1
        # Duplicates leave reserved offsets unused: give them back so offsets stay dense.
        unused = {key: heads[key] + 1 - nxt for key, nxt in next_offset.items() if nxt <= heads[key]}
        if unused:
            dialect.release(cursor, topic, unused)
        if rows:
            dialect.insert_messages(cursor, topic, rows)
    for row in rows:
        stored[(row.partition_key, row.id)] = _as_message(using, topic, row)
    return [stored[(m.partition_key, m.id)] for m in messages]  # type: ignore[misc]


@contextmanager
def _in_transaction(connection: BaseDatabaseWrapper, begin_sql: str) -> Iterator[Any]:
    """Yield a cursor inside the caller's transaction, or inside one of our own.

    In a transaction, join it without a savepoint (a savepoint costs two round trips
    and the caller's rollback undoes our writes anyway). In autocommit mode, the
    head-row lock must last until the messages are visible, so wrap the writes in a
    transaction: an explicit BEGIN ... COMMIT costs one round trip fewer than
    ``atomic()``, which switches autocommit off and on again.
    """
    if connection.in_atomic_block or not connection.get_autocommit():
        with transaction.atomic(using=connection.alias, savepoint=False), connection.cursor() as cursor:
            yield cursor
        return
    with connection.cursor() as cursor:
        cursor.execute(begin_sql)
        try:
            yield cursor
        except BaseException:
            try:
                cursor.execute("ROLLBACK")
            except Exception:  # noqa: BLE001 - the original error matters more
                pass
            raise
        cursor.execute("COMMIT")


def _decode(text: str) -> Any:
    return {} if text == "{}" else json.loads(text)


def _as_message(using: str, topic: str, row: MessageRow) -> Message:
    """Build the stored message without reading it back.

    The times were set by the database clock, so they are left out: Django treats
    attributes missing from ``__dict__`` as deferred fields and loads ``created_at``,
    ``published_at`` or a delayed ``deliver_at`` on first access. Skipping
    ``Model.__init__`` (as ``QuerySet`` iteration's ``from_db`` would not) keeps large
    batches cheap; no ``pre_init``/``post_init`` signal is sent.
    """
    message = Message.__new__(Message)
    values = message.__dict__
    values.update(
        _state=ModelState(),
        topic=topic,
        partition_key=row.partition_key,
        offset=row.offset,
        id=row.id,
        payload=_decode(row.payload_json),
        metadata=_decode(row.metadata_json),
        failure_count=row.failure_count,
        last_error=row.last_error,
        original_topic=row.original_topic,
    )
    if not row.failed:
        values["failed_at"] = None
    if row.created_at is not None:
        values["created_at"] = row.created_at
    if row.deliver_at is not None:
        values["deliver_at"] = row.deliver_at
    message._state.adding = False
    message._state.db = using
    return message


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
