"""Replayed dead letters: the marker that routes a re-delivery to one consumer group.

A dead letter belongs to the one group whose handler failed it; the other groups of the
topic handled the original fine. A replay (``ops.deadletters.replay``) therefore
appends a *copy* of the dead letter to the original topic -- a new message with a new
id, so idempotency cannot swallow it and it works after the original was garbage-
collected -- whose metadata carries :data:`REPLAY_KEY`::

    {"sqlqueue_replay": {"consumer_group": "billing", "dead_letter_seq": 123, ...}}

The engine hook: a worker of any *other* group acks such a message without calling
its handler (:func:`is_for_other_group`). This module imports nothing of the engine,
so the worker may import it.
"""

from __future__ import annotations

from typing import Any

#: Metadata key of a replayed copy. Namespaced so that it cannot clash with a
#: publisher's own metadata keys.
REPLAY_KEY = "sqlqueue_replay"


def replay_group(metadata: Any) -> str | None:
    """Return the consumer group a message was replayed for, or None for a normal message."""
    if not isinstance(metadata, dict):
        return None
    marker = metadata.get(REPLAY_KEY)
    if isinstance(marker, dict) and isinstance(marker.get("consumer_group"), str):
        return marker["consumer_group"]
    return None


def is_for_other_group(metadata: Any, group: str) -> bool:
    """Return True when the message is a replay meant for another group than ``group``.

    The worker of ``group`` must then ack it without calling the handler.
    """
    target = replay_group(metadata)
    return target is not None and target != group
