"""Pause and resume a consumer group's consumption of a topic (``queue_paused_topics``).

A paused (group, topic) holds no lease: the pause deletes the leases in its own
transaction and the workers' lease keepers take none while the row exists (see
``leasing.py``). Resuming deletes the row; the next lease round takes partitions again.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db import transaction

from ..dialects.console import for_update
from ..validation import validate_group, validate_topic
from . import _db


def pause(group: str, topic: str, *, by: str = "", reason: str = "", using: str | None = None) -> bool:
    """Pause ``group``'s consumption of ``topic``; return False if it was paused already.

    Also deletes the group's leases of the topic in the same transaction, so the pause
    takes effect at the workers' next lease round even before they read the pause row;
    the lease keeper then takes none while the row exists.
    """
    validate_group(group)
    validate_topic(topic, max_length=10_000)
    using = _db.alias(using)
    d = _db.dialect(using)
    with transaction.atomic(using=using):
        exists = _db.fetchall(
            "SELECT 1 FROM queue_paused_topics WHERE consumer_group = %s AND topic = %s"
            + for_update(_db.connection(using)),
            [group, topic],
            using,
        )
        if exists:
            return False
        _db.execute(
            "DELETE FROM queue_partition_leases WHERE consumer_group = %s AND topic = %s", [group, topic], using
        )
        _db.execute(
            "INSERT INTO queue_paused_topics (consumer_group, topic, paused_at, paused_by, reason) "
            f"VALUES (%s, %s, {d.now_sql}, %s, %s)",
            [group, topic, by[:150], reason],
            using,
        )
    return True


def resume(group: str, topic: str, *, using: str | None = None) -> bool:
    """Resume a paused (group, topic); return False if it was not paused."""
    return bool(
        _db.execute("DELETE FROM queue_paused_topics WHERE consumer_group = %s AND topic = %s", [group, topic], using)
    )


@dataclass(frozen=True)
class PausedTopic:
    group: str
    topic: str
    paused_at: dt.datetime | None
    paused_by: str
    reason: str


def paused_topics(using: str | None = None) -> list[PausedTopic]:
    d = _db.dialect(using)
    return [
        PausedTopic(g, t, d.to_datetime(at), by, reason)
        for g, t, at, by, reason in _db.fetchall(
            "SELECT consumer_group, topic, paused_at, paused_by, reason FROM queue_paused_topics "
            "ORDER BY consumer_group, topic",
            using=using,
        )
    ]
