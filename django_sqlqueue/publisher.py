"""``publish()`` and ``publish_many()``: the transactional outbox, append-only.

A publish writes on the caller's connection and joins the caller's transaction: if the
caller's ``atomic()`` block rolls back, the message never existed; if it commits, the
message is there. Outside a transaction the publish commits on return.

A publish only INSERTs rows into ``queue_messages``. It locks or updates no row that
another publisher touches, so publishers never wait for each other and cannot deadlock
with each other, whatever partitions they publish to, in whatever order, in whatever
transactions. The one exception is uniqueness: two transactions publishing the *same*
idempotency id to a topic wait on each other, because the database has to decide which
one stores it.

A new message has no offset. The sequencer (``sequencer.py``), running inside the
workers, numbers each partition's messages after they committed, in the order they
became visible; consumers read ``offset > watermark`` and so never skip a message
whose transaction commits late.

Idempotency: a message published again with the same (topic, id) is not stored again.
If the payload and key are the same, the publish returns the earlier message's
description (``created=False``); if they differ, :class:`IdempotencyConflict` is raised
and nothing of the call is written -- most idempotency-key APIs answer a reused key with
a different request this way, and silently returning the first payload would hide a bug.
A duplicate never raises a database error inside the caller's transaction (which would
poison it on PostgreSQL).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from functools import partial
from typing import Any

from django.conf import settings
from django.db import OperationalError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from . import signals, tracing
from .conf import QueueSettings, get_settings
from .db.dialects import get_dialect
from .db.dialects.base import MessageRow
from .exceptions import ConfigurationError, IdempotencyConflict, InvalidMessage, OutboxWarning, PayloadTooLarge
from .rules.notify_channels import channel_for
from .rules.partitioning import partition_for
from .rules.validation import (
    MAX_ERROR_LENGTH,
    MESSAGE_KEYS,
    PreparedMessage,
    encode_json,
    prepare_message,
    validate_topic,
)


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


def publish(
    topic: str,
    payload: Any,
    *,
    key: Any = "",
    id: Any = None,
    metadata: dict[str, Any] | None = None,
    delay: Any = None,
    deliver_at: Any = None,
    using: str | None = None,
) -> PublishedMessage:
    """Publish one message to ``topic`` in the caller's transaction and describe it.

    ``payload`` and ``metadata`` must be JSON-serializable (Decimal, datetime and UUID
    values are stored as strings). ``key`` (str, int or UUID) is the ordering scope:
    messages with the same key go to the same partition and are delivered in publish
    order; without a key, messages are spread over the topic's partitions. ``id``
    (str, int or UUID) defaults to a fresh unique id; publishing an id again stores
    nothing. ``delay`` (seconds or timedelta, from the database clock) or an aware
    ``deliver_at`` postpone delivery. ``using`` is a database alias, by default
    ``SQLQUEUE["DATABASE"]``.

    Raise :class:`~django_sqlqueue.exceptions.InvalidMessage` (nothing written) on bad
    input and :class:`~django_sqlqueue.exceptions.IdempotencyConflict` when ``id`` was
    published with another payload or key.
    """
    return publish_message(
        topic,
        payload,
        key=key,
        id=id,
        metadata=metadata,
        delay=delay,
        deliver_at=deliver_at,
        using=using,
        stacklevel=5,  # OutboxWarning names publish()'s caller, one frame further
    )


def publish_message(
    topic: str,
    payload: Any,
    *,
    key: Any = "",
    id: Any = None,
    metadata: dict[str, Any] | None = None,
    delay: Any = None,
    deliver_at: Any = None,
    using: str | None = None,
    span_attributes: Mapping[str, Any] | None = None,
    stacklevel: int = 4,
) -> PublishedMessage:
    """:func:`publish`, plus attributes for its ``send`` span (the tasks backend names the task).

    ``stacklevel``: of an ``OutboxWarning``, counted from ``write_messages``'s warning (4:
    this function's caller).
    """
    conf = get_settings()
    validate_topic(topic)
    # One check when tracing is off or no span is active (tracing.py).
    span = tracing.start_send(topic, attributes=span_attributes) if tracing.ENABLED else None
    try:
        if span is not None:
            metadata = span.inject(metadata)
        prepared = prepare_message(
            payload,
            key=key,
            id=id,
            metadata=metadata,
            delay=delay,
            deliver_at=deliver_at,
            max_payload_bytes=conf.MAX_PAYLOAD_BYTES,
        )
        alias = _alias(using, conf)
        written = write_messages(topic, [prepared], using=alias, conf=conf, stacklevel=stacklevel)
        published = _announce(written, alias, [prepared])
    except BaseException as exc:
        if span is not None:
            span.end(exc)
        raise
    if span is not None:
        span.end(None, published)
    return published[0]


def publish_many(
    topic: str, messages: Iterable[Mapping[str, Any]], *, using: str | None = None
) -> list[PublishedMessage]:
    """Publish many messages to ``topic`` in as few statements as possible.

    Each item is a mapping with ``payload`` and optionally ``key``, ``id``,
    ``metadata``, ``delay`` and ``deliver_at`` (as for :func:`publish`). Every item is
    validated before anything is written. Returns the messages in input order.
    """
    conf = get_settings()
    validate_topic(topic)
    if isinstance(messages, (str, bytes, Mapping)):
        raise InvalidMessage("publish_many() takes an iterable of message dicts, not a single value.")
    try:
        items = iter(messages)
    except TypeError:
        raise InvalidMessage(
            f"publish_many() takes an iterable of message dicts, not {type(messages).__name__}."
        ) from None
    # Listed first for messaging.batch.message_count. With a span active, one send span covers
    # the validation and the write, and its context goes into each item's metadata (tracing.py).
    batch = list(items)
    span = tracing.start_send(topic, count=len(batch)) if tracing.ENABLED and batch else None
    try:
        prepared: list[PreparedMessage] = []
        for index, item in enumerate(batch):
            where = f"message #{index}"
            if not isinstance(item, Mapping):
                raise InvalidMessage(f"{where}: expected a dict, got {type(item).__name__}.")
            unknown = sorted(map(str, set(item) - MESSAGE_KEYS))  # str: keys of any type sort
            if unknown:
                raise InvalidMessage(
                    f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(MESSAGE_KEYS))}."
                )
            if "payload" not in item:
                raise InvalidMessage(f"{where}: missing 'payload'.")
            if span is not None:
                item = {**item, "metadata": span.inject(item.get("metadata"))}
            prepared.append(prepare_message(**item, max_payload_bytes=conf.MAX_PAYLOAD_BYTES, position=where))
        if not prepared:
            return []
        alias = _alias(using, conf)
        published = _announce(write_messages(topic, prepared, using=alias, conf=conf), alias, prepared)
    except BaseException as exc:
        if span is not None:
            span.end(exc)
        raise
    if span is not None:
        span.end(None, published)
    return published


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
    same id stored before (the message failed again after a replay) is kept as it is.
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
    return write_messages(topic, [prepared], using=using, compare=False)[0]


def _announce(published: list[PublishedMessage], using: str, prepared: list[PreparedMessage]) -> list[PublishedMessage]:
    """Send ``message_published`` for the messages stored, once their transaction commits.

    Nothing is done (not even the JSON kept) when no receiver is connected. Each stored
    message is announced once, even if a batch named its id twice.
    """
    if signals.message_published.receivers:
        documents = {m.id: (m.payload_json, m.metadata_json) for m in prepared}
        created: dict[str, tuple[PublishedMessage, str, str]] = {}
        for m in published:
            if m.created and m.id not in created:
                created[m.id] = (m, *documents[m.id])
        if created:
            transaction.on_commit(partial(send_published, list(created.values())), using=using)
    return published


def send_published(messages: list[tuple[PublishedMessage, str, str]]) -> None:
    """Send ``message_published`` for ``(message, payload JSON, metadata JSON)`` triples
    (the on-commit callback of a publish; ``django_sqlqueue.testing`` reads its pending ones)."""
    for message, payload_json, metadata_json in messages:
        signals.send(
            signals.message_published,
            message.topic,
            message=message,
            payload=json.loads(payload_json),
            metadata=json.loads(metadata_json),
        )


def _alias(using: str | None, conf: QueueSettings) -> str:
    alias = using or conf.DATABASE
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        raise ConfigurationError(
            f"database alias {alias!r} is not in settings.DATABASES (known: {', '.join(sorted(settings.DATABASES))})."
        )
    return alias


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
    with _writing(connection, single=len(first) == 1) as cursor:
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
                # commit only): workers listening for it poll at once (notifications.py).
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
def _writing(connection: BaseDatabaseWrapper, *, single: bool) -> Iterator[Any]:
    """Yield a cursor inside the caller's transaction, or inside one of our own.

    In a transaction, join it without a savepoint (a savepoint costs two round trips
    and the caller's rollback undoes our writes anyway). In autocommit mode, one
    message is one INSERT, atomic on its own (the look-up of an explicit id before it
    writes nothing); a batch is wrapped in ``atomic()`` so that it is all or nothing.
    """
    if single or connection.in_atomic_block or not connection.get_autocommit():
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
            f"publish() writes to database {connection.alias!r} (SQLQUEUE['DATABASE'] or using=), which is not "
            f"in a transaction, while a transaction is open on {', '.join(map(repr, others))}: the message "
            "commits on its own now and is not rolled back with that transaction. Publish with "
            f"using={others[0]!r} if the queue tables live there, or open the atomic() block on "
            f"{connection.alias!r}.",
            OutboxWarning,
            stacklevel=stacklevel,
        )
