"""Dead-letter conventions: names, ids, metadata and the replay marker, in one leaf.

Everything that writes, reads or replays a dead letter uses these functions, so the rule
exists once. The module imports nothing of the package (the worker, the store, ``ops``,
the tasks backend and Spark may all import it).

**Names.** A message that exhausted its attempts for consumer group ``g`` on topic ``t``
is copied to the dead-letter topic ``<t><DLQ_SUFFIX>`` (:func:`dlq_topic`) under the id
``<g>:<original id>`` (:func:`dead_letter_id`), so two groups' dead letters of one
message do not collide, and a group's dead letters are a prefix range of the
``(topic, id)`` index. The copy's metadata keeps the original's and adds
``metadata["dead_letter"]`` (:func:`dead_letter_metadata`): the group and the original
position. A row that could not be decoded (not JSON, or metadata not an object) is
dead-lettered with the stored text of the failed column under :data:`UNDECODABLE_KEY`.

**Replay.** A dead letter belongs to the one group whose handler failed it; the other
groups of the topic handled the original fine. A replay (``ops`` replay) therefore
appends a *copy* of the dead letter to the original topic -- a new message with a new id
(:func:`replay_id`), so idempotency cannot swallow it and it works after the original
was garbage-collected -- whose metadata carries :data:`REPLAY_KEY`
(:func:`replay_metadata`)::

    {"sqlqueue_replay": {"consumer_group": "billing", "dead_letter_seq": 123, ...}}

The engine hook: a worker of any *other* group acks such a message without calling its
handler (:func:`is_for_other_group`).

**Reserved names.** Only the engine writes dead letters, replay markers and replay ids:
``publish()`` refuses dead-letter topics (:func:`is_dlq_topic`), metadata keys starting with
:data:`RESERVED_METADATA_PREFIX` and ids holding a replay suffix (:data:`REPLAY_ID_RE`), so
a publisher can neither pre-empt a dead letter nor a replayed copy, nor route a message to
one group. The engine builds its rows without that validation.

**Replay hooks.** An integration whose messages carry state outside the log (the tasks
backend's result rows) registers a hook (:func:`register_replay_hook`) that the replay
calls, inside its transaction, for every dead letter it copies back.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

#: Metadata key of a dead letter's origin (group, original partition, offset and id).
DEAD_LETTER_KEY = "dead_letter"
#: Metadata keys starting with this are the engine's (``publish()`` refuses them).
RESERVED_METADATA_PREFIX = "sqlqueue_"
#: Metadata key of a replayed copy. In the reserved namespace, so that no publisher can
#: forge it (a forged marker would hide the message from every other group).
REPLAY_KEY = "sqlqueue_replay"
#: Characters of the last error kept in a replay marker.
REPLAY_ERROR_LENGTH = 500
#: The key under which a dead letter keeps the stored text of a payload or metadata
#: column that could not be decoded (``{"sqlqueue_undecodable": "<text as stored>"}``):
#: a row written by another program, dead-lettered without calling the handler.
UNDECODABLE_KEY = "sqlqueue_undecodable"


# -- names ------------------------------------------------------------------------------


def dlq_topic(topic: str, suffix: str) -> str:
    """Return the dead-letter topic of ``topic``: ``<topic><suffix>``."""
    return f"{topic}{suffix}"


def is_dlq_topic(topic: str, suffix: str) -> bool:
    """Return True when ``topic`` is a dead-letter topic (``<something><suffix>``)."""
    return topic.endswith(suffix) and len(topic) > len(suffix)


def dead_letter_id(group: str, original_id: str) -> str:
    """Return the id of ``group``'s dead letter of the message ``original_id``."""
    return f"{group}:{original_id}"


def dead_letter_id_prefix(group: str) -> str:
    """Return the prefix every dead-letter id of ``group`` starts with."""
    return f"{group}:"


def displaced_dead_letter_id(dead_id: str, token: str) -> str:
    """Return the id a dead letter takes when a row that is not a dead letter holds ``dead_id``.

    Only a row written around ``publish()`` (which refuses dead-letter topics) can hold it;
    ``token`` is random, so such a row cannot be placed in advance to swallow the dead letter.
    """
    return f"{dead_id}#{token}"


def parse_dead_letter_id(id: str) -> tuple[str, str]:
    """Split a dead-letter id into (group, original id)."""
    group, _, original = id.partition(":")
    return group, original


# -- metadata ---------------------------------------------------------------------------


def dead_letter_metadata(
    metadata: Mapping[str, Any] | None, *, group: str, partition: int, offset: int, original_id: str
) -> dict[str, Any]:
    """Return a dead letter's metadata: the original's plus :data:`DEAD_LETTER_KEY`."""
    return {
        **(metadata or {}),
        DEAD_LETTER_KEY: {
            "consumer_group": group,
            "original_partition": partition,
            "original_offset": offset,
            "original_id": original_id,
        },
    }


def dead_letter_info(metadata: Any) -> dict[str, Any]:
    """Return the :data:`DEAD_LETTER_KEY` part of a dead letter's metadata ({} if absent)."""
    info = metadata.get(DEAD_LETTER_KEY) if isinstance(metadata, dict) else None
    return info if isinstance(info, dict) else {}


def replay_marker(metadata: Any) -> dict[str, Any]:
    """Return the :data:`REPLAY_KEY` part of a message's metadata ({} if absent)."""
    marker = metadata.get(REPLAY_KEY) if isinstance(metadata, dict) else None
    return marker if isinstance(marker, dict) else {}


#: What :func:`replay_id` appends: ids holding it are the engine's (``publish()`` refuses
#: them, so that no publisher can take a replayed copy's id before the replay writes it).
REPLAY_ID_RE = re.compile(r"@replay[0-9]")


def replay_id(original_id: str, dead_letter_seq: int) -> str:
    """Return the id of the copy that replays dead letter ``dead_letter_seq``."""
    return f"{original_id}@replay{dead_letter_seq}"


def is_reserved_metadata_key(key: object) -> bool:
    """Return True when a metadata key is in the engine's namespace (:data:`RESERVED_METADATA_PREFIX`)."""
    return str(key).startswith(RESERVED_METADATA_PREFIX)


def replay_metadata(
    metadata: Mapping[str, Any],
    *,
    group: str,
    dead_letter_seq: int,
    dead_letter_id: str,
    original_id: str,
    original_offset: int | None,
    original_partition: int,
    failure_count: int,
    last_error: str,
    actor: str,
) -> dict[str, Any]:
    """Return the metadata of a replayed copy: the dead letter's, without its dead-letter
    part, plus a :data:`REPLAY_KEY` marker routing it to ``group``.

    A copy of a copy keeps the first original position and counts the replays.
    """
    previous = replay_marker(metadata)
    meta = {k: v for k, v in metadata.items() if k not in (DEAD_LETTER_KEY, REPLAY_KEY)}
    meta[REPLAY_KEY] = {
        "consumer_group": group,
        "dead_letter_seq": dead_letter_seq,
        "dead_letter_id": dead_letter_id,
        "original_id": original_id,
        "original_offset": previous.get("original_offset", original_offset),
        "original_partition": previous.get("original_partition", original_partition),
        "failure_count": failure_count,
        "last_error": last_error.split("\n", 1)[0][:REPLAY_ERROR_LENGTH],
        "replayed_by": actor,
        "replays": int(previous.get("replays", 0)) + 1,
    }
    return meta


def replay_group(metadata: Any) -> str | None:
    """Return the consumer group a message was replayed for, or None for a normal message."""
    group = replay_marker(metadata).get("consumer_group")
    return group if isinstance(group, str) else None


def is_for_other_group(metadata: Any, group: str) -> bool:
    """Return True when the message is a replay meant for another group than ``group``.

    The worker of ``group`` must then ack it without calling the handler. (Asked of every
    delivery: a message without the marker returns at the first test.)
    """
    if not isinstance(metadata, dict) or REPLAY_KEY not in metadata:
        return False
    target = replay_group(metadata)
    return target is not None and target != group


# -- replay hooks -----------------------------------------------------------------------

#: ``hook(original_topic, payload, metadata, original_id, using) -> payload``: called by a
#: replay for each dead letter it copies back, inside the replay's transaction; returns
#: the payload of the copy (the one it was given when the message is not its own).
ReplayHook = Callable[[str, Any, Mapping[str, Any], str, str], Any]

_replay_hooks: list[ReplayHook] = []


def register_replay_hook(hook: ReplayHook) -> None:
    """Have every replay call ``hook`` (once, however often it is registered)."""
    if hook not in _replay_hooks:
        _replay_hooks.append(hook)


def prepare_replay_payload(topic: str, payload: Any, metadata: Mapping[str, Any], original_id: str, using: str) -> Any:
    """Run the registered replay hooks over a dead letter's payload; return the copy's payload."""
    for hook in _replay_hooks:
        payload = hook(topic, payload, metadata, original_id, using)
    return payload
