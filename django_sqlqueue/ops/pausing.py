"""Pause and resume a consumer group's consumption of a topic (``queue_paused_topics``).

A paused (group, topic) holds no lease: the pause deletes the leases in its own
transaction and the workers' lease keepers take none while the row exists (see
``leasing.py`` and :meth:`~django_sqlqueue.db.store.positions.PositionStore.pause`).
Resuming deletes the row; the next lease round takes partitions again.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from ..rules.limits import TOPIC_COLUMN_LENGTH
from ..rules.validation import validate_group, validate_topic
from .base import OperationError, listing_aliases, store, topic_alias

#: Characters of ``paused_by`` kept (the column's width).
PAUSED_BY_LENGTH = 150
#: Longest pause reason: a note for the other operators (the overview's problems and
#: ``queue_status`` show it), not a document; the column is a TEXT and would take anything.
REASON_LENGTH = 500


def pause(group: str, topic: str, *, by: str = "", reason: str = "", using: str | None = None) -> bool:
    """Pause ``group``'s consumption of ``topic``; return False if it was paused already.

    Also deletes the group's leases of the topic in the same transaction, so the pause
    takes effect at the workers' next lease round even before they read the pause row;
    the lease keeper then takes none while the row exists. A ``reason`` longer than
    REASON_LENGTH characters is refused (OperationError): nothing is written.
    """
    validate_group(group)
    validate_topic(topic, max_length=TOPIC_COLUMN_LENGTH)  # the width of the row it writes
    if not isinstance(reason, str):
        raise OperationError(f"the pause reason must be a string, got {type(reason).__name__}.")
    if len(reason) > REASON_LENGTH:
        raise OperationError(
            f"the pause reason is {len(reason)} characters long; at most {REASON_LENGTH} are kept. Nothing was paused."
        )
    return store(topic_alias(topic, using)).pause(group, topic, by[:PAUSED_BY_LENGTH], reason)


def resume(group: str, topic: str, *, using: str | None = None) -> bool:
    """Resume a paused (group, topic); return False if it was not paused."""
    return store(topic_alias(topic, using)).resume(group, topic)


@dataclass(frozen=True)
class PausedTopic:
    group: str
    topic: str
    paused_at: dt.datetime | None
    paused_by: str
    reason: str
    #: The database alias that holds the pause.
    database: str = ""


def paused_topics(using: str | None = None) -> list[PausedTopic]:
    """Return every paused (group, topic), sorted, of database ``using`` (default: every database)."""
    return [PausedTopic(*row, database=db) for db in listing_aliases(None, using) for row in store(db).paused_topics()]
