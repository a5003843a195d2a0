"""The storage of messages: the append behind ``publish()``, ``publish_many()``, dead letters
and replayed copies.

Every INSERT into ``queue_messages`` starts here (the vendor statement is the dialect's
``insert_messages``). The write joins the caller's transaction when there is one (the
outbox: the rows commit or roll back with the caller's work) and takes no lock another
publisher waits for: explicit ids are looked up first with a plain read, then the INSERT
skips ids a concurrent publisher committed meanwhile (``skip_duplicates``), so only two
transactions publishing the *same* id to a topic ever wait on each other. Messages get no
offset here: the sequencer (``db/sequencer.py``) numbers them once committed.

``publisher.py`` above validates and traces a publish and announces it; the worker's
dead letters (``acks.py``) and the operators' replays (``ops/replay.py``) call
:func:`write_messages` and :func:`write_dead_letter` directly.
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import OperationalError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ...conf import QueueSettings, get_settings
from ...exceptions import IdempotencyConflict, OutboxWarning, PayloadTooLarge
from ...models import Message
from ...rules.dlq import displaced_dead_letter_id
from ...rules.limits import MESSAGE_ID_LENGTH
from ...rules.notify_channels import channel_for
from ...rules.partitioning import partition_for
from ...rules.validation import MAX_ERROR_LENGTH, PreparedMessage, encode_json
from ..dialects import get_dialect
from ..dialects.base import Dialect, MessageRow
from .base import preparing_cursor

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublishedMessage:
    """What is known about a message when ``publish()`` returns.

    Its ``offset`` is not: the sequencer assigns it after the publishing transaction
    committed (see ``Message.offset``). ``created`` is False when the id had been
    published before and this call stored nothing.
    """

    topic: str
    key: str
    partition: int
    id: str
    created: bool = True


def write_messages(
    topic: str,
    messages: list[PreparedMessage],
    *,
    using: str,
    conf: QueueSettings | None = None,
    compare: bool = True,
    stacklevel: int = 4,
) -> list[PublishedMessage]:
    """Store validated messages (the engine behind publish/publish_many/dead letters).

    Explicit ids are looked up first with a plain (non-locking) read: a re-publish
    writes nothing and takes no lock. The INSERT then skips ids that a concurrent
    publisher committed meanwhile. ``compare`` checks that a re-published id carries the
    same payload and key. ``stacklevel``: of an ``OutboxWarning`` (4: our caller's caller).
    """
    conf = conf or get_settings()
    partitions = conf.partitions_for(topic)
    connection = connections[using]
    _warn_if_outside_callers_transaction(connection, stacklevel)
    dialect = get_dialect(connection)

    described: dict[str, PublishedMessage] = {}
    first: dict[str, PreparedMessage] = {}
    rows: list[MessageRow] = []
    for m in messages:
        if m.id in first:
            if compare:
                _check_same(topic, m, first[m.id].key, json.loads(first[m.id].payload_json))
            continue  # the same id twice in one batch: stored once
        first[m.id] = m
    explicit = [m.id for m in first.values() if m.explicit_id]
    with _writing(connection, dialect, single=len(first) == 1) as cursor:
        limit = dialect.max_statement_bytes(cursor)
        # A plain read of the ids on the caller's connection: no lock (see existing_messages).
        existing = dialect.existing_messages(cursor, topic, explicit) if explicit else {}
        for message_id, m in first.items():
            if message_id in existing:
                stored_key, stored_partition, stored_payload = existing[message_id]
                if compare:
                    _check_same(topic, m, stored_key, stored_payload)
                described[message_id] = PublishedMessage(topic, stored_key, stored_partition, message_id, False)
                continue
            row = MessageRow(
                partition=partition_for(m.key, partitions),
                key=m.key,
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
            if limit is not None and len(row.payload_json) + len(row.metadata_json) > limit // 4:
                size = len(row.payload_json.encode()) + len(row.metadata_json.encode())
                if size > limit:
                    raise PayloadTooLarge(
                        f"message {m.id!r}: payload and metadata are {size} bytes as JSON, more than this "
                        f"database server accepts in one statement (about {limit} bytes: raise MySQL's "
                        "max_allowed_packet, or lower SQLQUEUE['MAX_PAYLOAD_BYTES'])."
                    )
            rows.append(row)
            described[message_id] = PublishedMessage(topic, m.key, row.partition, m.id, True)
        if rows:
            try:
                # On PostgreSQL the INSERT also notifies the topic's channel (delivered on
                # commit only): workers listening for it poll at once (worker/threads/listener.py).
                notify = channel_for(topic) if conf.NOTIFY and dialect.supports_notify else None
                raced = dialect.insert_messages(cursor, topic, rows, skip_duplicates=bool(explicit), notify=notify)
            except OperationalError as exc:
                if dialect.is_too_large(exc):
                    raise PayloadTooLarge(f"the database server refused the messages as too large: {exc}") from exc
                raise
            if raced:
                # Committed by a concurrent publisher of the same ids while we waited.
                found = dialect.existing_messages(cursor, topic, sorted(raced))
                for message_id in raced:
                    stored_key, stored_partition, stored_payload = found[message_id]
                    if compare:
                        _check_same(topic, first[message_id], stored_key, stored_payload)
                    described[message_id] = PublishedMessage(topic, stored_key, stored_partition, message_id, False)
    return [described[m.id] for m in messages]


def _same_json(a: Any, b: Any) -> bool:
    """Whether two decoded JSON values are the same document.

    Python's ``==`` takes ``True`` for ``1``: JSON does not. Numbers compare by value, and
    a float equals the integer of its decimal digits: PostgreSQL's jsonb gives
    ``3.970804388347017e+16`` back as ``39708043883470170``, which is not the float's exact
    binary value. Everything else compares exactly.
    """
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) and type(b) is int:
        a, b = b, a
    if type(a) is int and isinstance(b, float):
        return a == b or (math.isfinite(b) and Decimal(repr(b)) == a)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same_json, a, b))
    return bool(a == b)


def _check_same(topic: str, m: PreparedMessage, stored_key: str, stored_payload: Any) -> None:
    if stored_key != m.key or not _same_json(stored_payload, json.loads(m.payload_json)):
        what = "key" if stored_key != m.key else "payload"
        raise IdempotencyConflict(
            f"message id {m.id!r} was already published to topic {topic!r} with a different {what}; "
            "an id may be published again only with the same payload and key (nothing was written)."
        )


@contextmanager
def _writing(connection: BaseDatabaseWrapper, dialect: Dialect, *, single: bool) -> Iterator[Any]:
    """Yield a cursor inside the caller's transaction, or inside one of our own.

    In a transaction, join it without a savepoint (a savepoint costs two round trips
    and the caller's rollback undoes our writes anyway). In autocommit mode, one
    message is one INSERT, atomic on its own (the look-up of an explicit id before it
    writes nothing); a batch is wrapped in ``atomic()`` so that it is all or nothing.
    A single message's statements are prepared where the database allows
    (:func:`~.base.preparing_cursor`); a batch's vary in length and are not.
    """
    if single:
        # One message: a statement of a fixed shape (one per insert plan, ``insert_plan``),
        # prepared on PostgreSQL -- parsed and planned once per connection instead of at
        # each publish, which made publish() take 1.13x as long (docs/benchmarks.md, stop 42).
        with preparing_cursor(connection, dialect) as cursor:
            yield cursor
        return
    if connection.in_atomic_block or not connection.get_autocommit():
        with connection.cursor() as cursor:
            yield cursor
        return
    with transaction.atomic(using=connection.alias, savepoint=False), connection.cursor() as cursor:
        yield cursor


def _warn_if_outside_callers_transaction(connection: BaseDatabaseWrapper, stacklevel: int) -> None:
    """Warn when the caller's ``atomic()`` is on another alias than the queue's.

    The publish then commits on its own, at once, and survives the caller's rollback:
    the outbox guarantee is gone. Name both aliases so the fix is obvious.
    """
    if connection.in_atomic_block or len(settings.DATABASES) == 1:
        return
    others = [
        c.alias for c in connections.all(initialized_only=True) if c.alias != connection.alias and c.in_atomic_block
    ]
    if others:
        warnings.warn(
            f"publish() writes to database {connection.alias!r} (the topic's: SQLQUEUE['TOPIC_DATABASES'], else "
            f"SQLQUEUE['DATABASE']), which is not in a transaction, while a transaction is open on "
            f"{', '.join(map(repr, others))}: the message commits on its own now and is not rolled back with that "
            f"transaction. Open the atomic() block on {connection.alias!r}, or route the topic to "
            f"{others[0]!r} (SQLQUEUE['TOPIC_DATABASES']) if its queue tables live there.",
            OutboxWarning,
            stacklevel=stacklevel,
        )


def write_dead_letter(
    topic: str,
    *,
    key: str,
    id: str,
    payload: Any,
    metadata: dict[str, Any],
    created_at: Any,
    failure_count: int,
    last_error: str,
    original_topic: str,
    using: str,
) -> PublishedMessage:
    """Store a dead letter in ``topic`` (the DLQ topic) in the current transaction.

    Like a publish (append-only, idempotent on ``id``), plus the dead-letter columns:
    ``failed_at`` is the database's now and ``created_at`` the original's. The payload
    is not size-checked again: it was valid when first published. A dead letter of the
    same id stored before (the message failed again after a seek back) is kept as it is.

    A row holding the id that is *not* a dead letter (no ``original_topic``: written around
    ``publish()``, which refuses dead-letter topics) must not swallow the dead letter: it is
    then stored under :func:`~django_sqlqueue.rules.dlq.displaced_dead_letter_id` instead,
    a random suffix no one can take in advance, and a warning is logged.
    """
    prepared = PreparedMessage(
        key=key,
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
    written = write_messages(topic, [prepared], using=using, compare=False)[0]
    if written.created or _is_dead_letter(topic, id, using):
        return written
    suffix_room = MESSAGE_ID_LENGTH - len(displaced_dead_letter_id("", "0" * 12))
    displaced = displaced_dead_letter_id(id[:suffix_room], os.urandom(6).hex())
    logger.warning(
        "dead letter id=%r of topic=%s is held by a row that is not a dead letter; stored as id=%r",
        id,
        topic,
        displaced,
    )
    return write_messages(topic, [replace(prepared, id=displaced)], using=using, compare=False)[0]


def _is_dead_letter(topic: str, id: str, using: str) -> bool:
    """Whether the row ``(topic, id)`` is a dead letter (the engine's), not a row written around ``publish()``."""
    return Message.objects.using(using).filter(topic=topic, id=id).exclude(original_topic="").exists()
