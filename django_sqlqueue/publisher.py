"""``publish()`` and ``publish_many()``: the transactional outbox, append-only.

A publish writes on the caller's connection and joins the caller's transaction: if the
caller's ``atomic()`` block rolls back, the message never existed; if it commits, the
message is there. Outside a transaction the publish commits on return.

The connection is the one of the database that holds the topic: ``SQLQUEUE["DATABASE"]``,
or the alias ``SQLQUEUE["TOPIC_DATABASES"]`` routes it to (``rules/routes.py``). The outbox
is per database: a message of a topic routed to ``orders`` exists exactly when the
transaction on ``orders`` that wrote it commits, whatever happens to a transaction on
another alias. An explicit ``using=`` naming another alias is refused
(``ConfigurationError``, nothing written): the message would sit where no worker serves
its topic.

A publish only INSERTs rows into ``queue_messages``. It locks or updates no row that
another publisher touches, so publishers never wait for each other and cannot deadlock
with each other, whatever partitions they publish to, in whatever order, in whatever
transactions. The one exception is uniqueness: two transactions publishing the *same*
idempotency id to a topic wait on each other, because the database has to decide which
one stores it.

The storage itself -- the INSERT, idempotency, the statement-size check -- is the data
layer's (``db/store/messages.py``); this module validates, traces and announces.

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
import re
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

from django.apps import apps
from django.conf import settings
from django.db import DatabaseError, transaction

from . import signals, tracing
from .conf import QueueSettings, get_settings
from .exceptions import ConfigurationError, InvalidMessage, NotInstalled, QueueTablesMissing
from .rules.validation import (
    MESSAGE_KEYS,
    PreparedMessage,
    prepare_message,
    validate_publish_topic,
)

APP = "django_sqlqueue"
#: How each database says a table is missing ("no such table: queue_messages", "relation
#: "queue_messages" does not exist", "Table 'db.queue_messages' doesn't exist") or lacks a
#: column a later migration adds ("table queue_messages has no column named ...").
_MISSING_TABLE = re.compile(
    r"queue_messages\b.*(does not exist|doesn't exist)|no such table: queue_messages\b|queue_messages has no column"
)

try:
    # The data layer imports the models, which Django refuses to load outside an installed
    # app ("Model class ... isn't in an application in INSTALLED_APPS"): say what to do.
    from .db.store.messages import PublishedMessage, write_messages
except RuntimeError:
    if apps.is_installed(APP):
        raise
    raise NotInstalled(
        f"'{APP}' is not in INSTALLED_APPS: add it there (then run `manage.py migrate {APP}`) to publish."
    ) from None


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
    ``deliver_at`` postpone delivery. The message is written to the database that holds
    ``topic`` (``SQLQUEUE["TOPIC_DATABASES"]``, else ``SQLQUEUE["DATABASE"]``) and joins
    that database's transaction; ``using``, if given, must name that same alias.

    Raise :class:`~django_sqlqueue.exceptions.InvalidMessage` (nothing written) on bad
    input -- also for what only the engine writes: a dead-letter topic
    (``<topic><DLQ_SUFFIX>``), metadata keys starting with ``sqlqueue_`` and ids holding a
    replay suffix (``@replay<digits>``) -- and :class:`~django_sqlqueue.exceptions.IdempotencyConflict` when ``id`` was
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
    validate_publish_topic(topic, conf.DLQ_SUFFIX)
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
        alias = _alias(topic, using, conf)
        try:
            written = write_messages(topic, [prepared], using=alias, conf=conf, stacklevel=stacklevel)
        except DatabaseError as exc:
            _raise_if_tables_missing(exc, alias)
            raise
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
    validate_publish_topic(topic, conf.DLQ_SUFFIX)
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
        alias = _alias(topic, using, conf)
        try:
            written = write_messages(topic, prepared, using=alias, conf=conf)
        except DatabaseError as exc:
            _raise_if_tables_missing(exc, alias)
            raise
        published = _announce(written, alias, prepared)
    except BaseException as exc:
        if span is not None:
            span.end(exc)
        raise
    if span is not None:
        span.end(None, published)
    return published


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


def _alias(topic: str, using: str | None, conf: QueueSettings) -> str:
    """The alias ``topic`` is written to: its route (``conf.database_for``); an explicit
    ``using`` must name that same alias, or the message would land where no worker serves it."""
    routed = conf.database_for(topic)
    if using is None:
        return routed
    if not isinstance(using, str) or using not in settings.DATABASES:
        raise ConfigurationError(
            f"database alias {using!r} is not in settings.DATABASES (known: {', '.join(sorted(settings.DATABASES))})."
        )
    if using != routed:
        raise ConfigurationError(
            f"publish to topic {topic!r} with using={using!r}, but the topic lives in database {routed!r} "
            "(by SQLQUEUE['TOPIC_DATABASES'], else SQLQUEUE['DATABASE']), where `runconsumer` consumes it: "
            f"leave out using=, or route the topic there with SQLQUEUE['TOPIC_DATABASES'] = {{{topic!r}: {using!r}}}."
        )
    return using


def _raise_if_tables_missing(error: DatabaseError, alias: str) -> None:
    """Raise the one-line error for a write that failed because the queue's tables are not
    there; return for any other database error. Only on the error path: a publish pays nothing."""
    first_line = str(error).strip().split("\n", 1)[0]
    if not _MISSING_TABLE.search(first_line):
        return
    if not apps.is_installed(APP):
        raise NotInstalled(
            f"'{APP}' is not in INSTALLED_APPS, so its tables were never created on database {alias!r}: "
            f"add it to INSTALLED_APPS, then run `manage.py migrate {APP} --database {alias}`."
        ) from error
    raise QueueTablesMissing(
        f"the queue's tables are missing or out of date on database {alias!r} ({first_line}): "
        f"run `manage.py migrate {APP} --database {alias}`."
    ) from error
