"""Dead-lettering a delivery: its copy in the dead-letter topic and its ack, in one transaction.

Fenced by the subscriber's lease like every outcome in ``acks.py``; the copy is appended
with ``messages.write_dead_letter`` (the log's writer), the ack flags the delivery row.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction

from ...exceptions import InvalidMessage
from ...rules.dlq import UNDECODABLE_KEY, dead_letter_id, dead_letter_metadata
from ...rules.validation import encode_json
from . import history
from .base import StoreBase
from .delivery import FetchedMessage
from .messages import write_dead_letter
from .settle import Settling, report


class DeadLetteringStore(StoreBase):
    def dead_letter(
        self,
        group: str,
        topic: str,
        name: str,
        message: FetchedMessage,
        *,
        dlq_topic: str,
        attempts: int,
        error: str,
        settling: Settling | None = None,
    ) -> bool:
        """Copy the message to the dead-letter topic and ack it for ``group``, atomically.

        The copy is published first and both writes commit together, so the message is
        never in zero places. The original stays in the log: other consumer groups still
        get it, and GC removes it once every group is past it. The copy's id is
        ``<group>:<original id>``, so two groups' dead letters of one message do not
        collide; its metadata names the group and the original position. Returns False
        (nothing written) if ``name`` no longer holds the partition.

        A row that could not be decoded arrives with the failed column already wrapped
        (``store/delivery.py``); a decoded value that cannot be stored again (NaN, a lone
        surrogate: JSON some databases accept and ``publish()`` refuses) is wrapped here
        the same way, so that a dead letter never fails on its own content.

        ``settling``: report the message as settled for good (``settle.py``), in this
        transaction, if its delivery row was still unacked.
        """
        payload = _storable(message.payload)
        original_metadata = _storable(message.metadata)
        with transaction.atomic(using=self.using), self.connection.cursor() as cursor:
            if not self.lock_held(cursor, group, topic, name, [message.partition]):
                return False
            # The running totals (lease, watermark, deliveries: the lock order); taken back
            # below if a retry of this transaction finds the delivery acked already.
            history.add_totals(self, cursor, group, topic, message.partition, failed=1, dead_lettered=1)
            metadata = dead_letter_metadata(
                original_metadata,
                group=group,
                partition=message.partition,
                offset=message.offset,
                original_id=message.id,
            )
            write_dead_letter(
                dlq_topic,
                key=message.key,
                id=dead_letter_id(group, message.id),
                payload=payload,
                metadata=metadata,
                created_at=message.created_at,
                failure_count=attempts,
                last_error=error,
                original_topic=topic,
                using=self.using,
            )
            key = (message.partition, message.offset)
            claimed = settling.claim(self, cursor, group, topic, [key]) if settling is not None else []
            cursor.execute(
                "UPDATE queue_delivery_state SET acked = TRUE WHERE consumer_group = %s AND topic = %s "
                f"AND {self.P} = %s AND message_offset = %s AND acked = FALSE",
                [group, topic, message.partition, message.offset],
            )
            if not cursor.rowcount:
                history.add_totals(self, cursor, group, topic, message.partition, failed=-1, dead_lettered=-1)
            report(settling, cursor, (), claimed)
        return True


def _storable(value: Any) -> Any:
    """Return ``value`` if it can be stored as JSON again, else ``{UNDECODABLE_KEY: its JSON text}``."""
    try:
        encode_json(value, "dead letter").encode("utf-8")
    except (InvalidMessage, UnicodeEncodeError):
        return {UNDECODABLE_KEY: json.dumps(value, ensure_ascii=True, default=str)}
    return value
