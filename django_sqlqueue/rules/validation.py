"""Checks on names and messages, run before anything touches the database."""

from __future__ import annotations

import datetime as dt
import os
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from ..exceptions import InvalidMessage, PayloadTooLarge
from .dlq import REPLAY_ID_RE, RESERVED_METADATA_PREFIX, is_dlq_topic, is_reserved_metadata_key
from .limits import (
    CONSUMER_GROUP_LENGTH,
    KEY_LENGTH,
    MAX_JSON_DEPTH,
    MAX_MESSAGE_ID_LENGTH,
    MAX_SECONDS,
    MAX_TOPIC_LENGTH,
    TOPIC_RE,
)

#: Characters no key or id may hold, because they act on whoever displays it: C0 and C1
#: controls (U+009B is the 8-bit CSI, an escape sequence of its own for some terminals), the
#: line and paragraph separators, and the bidirectional controls (U+202E shows
#: ``exe.gnp`` as ``png.exe``) -- in a terminal (``queue_dlq list``), a log or the console.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
#: Lone surrogates: a Python str may hold them, but they are not text and UTF-8 (every
#: database driver's encoding) cannot encode them.
_SURROGATE = re.compile("[\ud800-\udfff]")
#: The JSON escape of NUL, not preceded by an escaping backslash (``"\\u0000"`` is the text
#: ``\u0000``, harmless).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
#: Keys a ``publish_many`` message dict may have.
MESSAGE_KEYS = frozenset({"payload", "key", "id", "metadata", "delay", "deliver_at"})
#: Longest ``last_error`` stored (a dead letter's, a retrying delivery's); longer ones are cut.
MAX_ERROR_LENGTH = 8000


def validate_topic(topic: Any, *, what: str = "topic", max_length: int = MAX_TOPIC_LENGTH) -> str:
    """Return ``topic`` if it is 1..max_length characters of ``[A-Za-z0-9._-]``."""
    if not isinstance(topic, str):
        raise InvalidMessage(f"{what} must be a str, got {type(topic).__name__}.")
    if not topic:
        raise InvalidMessage(f"{what} must not be empty.")
    if len(topic) > max_length:
        raise InvalidMessage(f"{what} is {len(topic)} characters long; the maximum is {max_length}.")
    if not topic.strip("."):
        raise InvalidMessage(
            f"{what} {topic!r} is made only of dots: '.' and '..' are path segments, so links to it would "
            "lead elsewhere; use at least one letter, digit, '_' or '-'."
        )
    if not TOPIC_RE.match(topic):
        raise InvalidMessage(
            f"{what} {topic!r} has characters outside [A-Za-z0-9._-] (ASCII letters, digits, '.', '_', '-')."
        )
    return topic


def validate_publish_topic(topic: Any, dlq_suffix: str) -> str:
    """Return ``topic`` if a publisher may write to it: a valid name, not a dead-letter topic.

    Only the engine writes dead letters: a row published to ``<topic><DLQ_SUFFIX>`` could take
    the id of a later dead letter and swallow it (``db.store.messages.write_dead_letter``).
    """
    validate_topic(topic)
    if is_dlq_topic(topic, dlq_suffix):
        raise InvalidMessage(
            f"topic {topic!r} is a dead-letter topic (it ends with SQLQUEUE['DLQ_SUFFIX'] {dlq_suffix!r}): only "
            "the engine writes dead letters; publish to the original topic, or replay a dead letter "
            "(queue_dlq replay, ops.replay())."
        )
    return topic


def validate_group(group: Any) -> str:
    """Return a consumer group name (same rules as topics)."""
    return validate_topic(group, what="consumer group", max_length=CONSUMER_GROUP_LENGTH)


def _validate_key(value: Any, what: str, max_length: int, *, allow_empty: bool) -> str:
    # Keys and ids are often database ids or UUIDs: take them as their canonical text.
    if (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, uuid.UUID):
        value = str(value)
    if not isinstance(value, str):
        raise InvalidMessage(f"{what} must be a str, int or UUID, got {type(value).__name__}.")
    if not value and not allow_empty:
        raise InvalidMessage(f"{what} must not be empty.")
    if len(value) > max_length:
        raise InvalidMessage(f"{what} is {len(value)} characters long; the maximum is {max_length}.")
    if value != value.strip():
        # MySQL's PAD SPACE collations compare 'a' and 'a ' equal: refuse the ambiguity.
        raise InvalidMessage(f"{what} {value!r} must not start or end with whitespace.")
    control = _CONTROL.search(value)
    if control:
        raise InvalidMessage(
            f"{what} {value!r} must not contain control characters (C0, C1, line separators or "
            f"bidirectional controls); found U+{ord(control.group()):04X}."
        )
    if _SURROGATE.search(value):
        raise InvalidMessage(f"{what} {value!r} must not contain lone surrogates (they are not text).")
    return value


def validate_key(key: Any) -> str:
    """Return ``key`` as a str of at most 128 characters ("" = no key; ints and UUIDs as text)."""
    return _validate_key(key, "key", KEY_LENGTH, allow_empty=True)


def validate_message_id(message_id: Any) -> str:
    """Return the message id as a str (ints and UUIDs are accepted and converted).

    Refuse the replay suffix (``@replay<digits>``): those ids are the copies a dead-letter
    replay writes, and one published first would make the replay's copy vanish.
    """
    value = _validate_key(message_id, "id", MAX_MESSAGE_ID_LENGTH, allow_empty=False)
    if REPLAY_ID_RE.search(value):
        raise InvalidMessage(
            f"id {value!r} contains '@replay' followed by a digit, which is reserved for the copies a "
            "dead-letter replay writes."
        )
    return value


def validate_metadata_keys(metadata: dict[Any, Any]) -> None:
    """Refuse metadata keys in the engine's namespace (``sqlqueue_...``, e.g. the replay marker)."""
    reserved = sorted(str(k) for k in metadata if is_reserved_metadata_key(k))
    if reserved:
        named = ", ".join(repr(k[:100]) for k in reserved[:5]) + (", ..." if len(reserved) > 5 else "")
        raise InvalidMessage(
            f"metadata key(s) {named} start with {RESERVED_METADATA_PREFIX!r}, "
            "which is reserved for the engine's own keys."
        )


def new_message_id() -> str:
    """Return a fresh unique message id: 32 hex digits, time-ordered (as UUIDv7).

    The first 12 digits are the Unix time in milliseconds and the other 20 are 80 random
    bits: unguessable and unique, and ids published one after another sort one after
    another. So the unique ``(topic, id)`` index of the log grows at its right edge, as the
    primary key does: a publish touches its last pages, and garbage collection, which
    deletes in publishing order, empties whole pages of it in turn, instead of one entry in
    each of millions of pages that no longer fit in memory (docs/design.md, "Garbage
    collection at the speed of the log").
    """
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"


_ENCODER = DjangoJSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode_json(value: Any, what: str) -> str:
    """Serialize ``value`` as compact JSON (Decimal, datetime, UUID become strings).

    Refuse what JSON cannot carry (NaN, sets, objects) and what some database cannot
    store, on every database, so that a message is valid wherever it is published: NUL
    (PostgreSQL's jsonb has no place for it), lone surrogates (no driver can encode them)
    and nesting deeper than ``MAX_JSON_DEPTH`` (MariaDB's JSON_VALID refuses it).
    """
    too_deep = f"{what} is nested more than {MAX_JSON_DEPTH} arrays/objects deep (the most MariaDB's JSON takes)."
    try:
        text = _ENCODER.encode(value)
    except RecursionError:
        raise InvalidMessage(too_deep) from None
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(f"{what} is not JSON-serializable: {exc}") from exc
    # Counting brackets is cheap and bounds the depth; walk the value only when it might be deep.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _depth_exceeds(value, MAX_JSON_DEPTH):
        raise InvalidMessage(too_deep)
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise InvalidMessage(
            f"{what} contains the character NUL (U+0000), which PostgreSQL cannot store in JSON; "
            "the queue refuses it on every database."
        )
    if not text.isascii():
        surrogate = _SURROGATE.search(text)
        if surrogate:
            raise InvalidMessage(
                f"{what} contains a lone surrogate ({surrogate.group()!r}), which is not text: UTF-8 cannot encode it."
            )
    return text


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` dicts/lists/tuples (iterative: no recursion limit)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


#: The delivery times every database stores (a MySQL DATETIME: years 1000 to 9999).
_EARLIEST = dt.datetime(1000, 1, 1, tzinfo=dt.UTC)
_LATEST = dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)


def _utc(deliver_at: dt.datetime) -> dt.datetime:
    try:
        utc = deliver_at.astimezone(dt.UTC)
    except OverflowError:
        utc = None
    if utc is None or not _EARLIEST <= utc <= _LATEST:
        raise InvalidMessage(
            f"deliver_at {deliver_at.isoformat()} is out of range: it must be in the years 1000 to 9999 in UTC."
        )
    return utc


@dataclass(frozen=True)
class PreparedMessage:
    """A validated message, ready to insert."""

    key: str
    id: str
    payload_json: str
    metadata_json: str
    #: Seconds after the database's "now" (``delay``), or None.
    delay: float | None
    #: Absolute delivery time (``deliver_at``), or None.
    deliver_at: dt.datetime | None
    explicit_id: bool
    # Dead-letter fields (see ``db.store.messages.write_dead_letter``); empty for a publish.
    failed: bool = False
    failure_count: int = 0
    last_error: str = ""
    original_topic: str = ""
    created_at: dt.datetime | None = None


def prepare_message(
    payload: Any,
    *,
    key: Any = "",
    id: Any = None,
    metadata: Any = None,
    delay: Any = None,
    deliver_at: Any = None,
    max_payload_bytes: int,
    position: str = "",
) -> PreparedMessage:
    """Validate one message; raise :class:`InvalidMessage` naming the problem."""
    where = f"{position}: " if position else ""
    try:
        message_key = validate_key(key)
        explicit = id is not None
        message_id = validate_message_id(id) if explicit else new_message_id()
        if metadata is None or metadata == {}:
            metadata_json = "{}"
        elif isinstance(metadata, dict):
            validate_metadata_keys(metadata)
            metadata_json = encode_json(metadata, "metadata")
        else:
            raise InvalidMessage(f"metadata must be a dict, got {type(metadata).__name__}.")
        payload_json = encode_json(payload, "payload")
        # A character is at most 4 bytes in UTF-8: count bytes only when it could matter.
        chars = len(payload_json) + len(metadata_json)
        size = chars if chars * 4 <= max_payload_bytes else len(payload_json.encode()) + len(metadata_json.encode())
        if size > max_payload_bytes:
            raise PayloadTooLarge(
                f"payload and metadata are {size} bytes as JSON; SQLQUEUE['MAX_PAYLOAD_BYTES'] is {max_payload_bytes}."
            )
        if delay is not None and deliver_at is not None:
            raise InvalidMessage("pass either delay or deliver_at, not both.")
        seconds: float | None = None
        if delay is not None:
            if isinstance(delay, dt.timedelta):
                seconds = delay.total_seconds()
            elif isinstance(delay, (int, float)) and not isinstance(delay, bool):
                seconds = float(delay)
            else:
                raise InvalidMessage(f"delay must be seconds (int/float) or a timedelta, got {type(delay).__name__}.")
            if not seconds >= 0:  # also rejects NaN
                raise InvalidMessage(f"delay must not be negative, got {delay!r}.")
            if not seconds <= MAX_SECONDS:  # also rejects infinity
                raise InvalidMessage(f"delay must be at most {MAX_SECONDS} seconds (100 years), got {delay!r}.")
        if deliver_at is not None:
            if not isinstance(deliver_at, dt.datetime):
                raise InvalidMessage(f"deliver_at must be a datetime, got {type(deliver_at).__name__}.")
            if deliver_at.tzinfo is None or deliver_at.utcoffset() is None:
                raise InvalidMessage(
                    f"deliver_at {deliver_at.isoformat()} is naive; pass an aware datetime "
                    "(e.g. django.utils.timezone.now() + timedelta(...))."
                )
            deliver_at = _utc(deliver_at)
    except InvalidMessage as exc:
        if where:
            raise type(exc)(f"{where}{exc}") from exc.__cause__
        raise
    return PreparedMessage(
        key=message_key,
        id=message_id,
        payload_json=payload_json,
        metadata_json=metadata_json,
        delay=seconds,
        deliver_at=deliver_at,
        explicit_id=explicit,
    )
