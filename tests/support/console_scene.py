"""A small, realistic queue state for the console tests, written through the public API and the ORM.

- ``orders``: 2 partitions (SQLQUEUE TOPICS), 20 messages sequenced; group ``billing``
  2 behind per partition with a live subscriber and a lease; ``shipping`` caught up;
  ``retired`` at 0 with no subscriber (holds back GC).
- ``typo``: 3 messages, nobody consumes it.
- dead letters in ``orders_dlq``: 3 of ``billing`` (ValueError), 1 of ``shipping`` (KeyError).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.utils import timezone

from django_sqlqueue import publish_many
from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.db.store.messages import write_dead_letter
from django_sqlqueue.models import ConsumerOffset, PartitionLease, SubscriberHeartbeat
from django_sqlqueue.ops import groups

#: Keys k1, k2 hash to partition 1 of 2, k4, k5 to partition 0.
KEYS = ["k1", "k4", "k2", "k5"]
SETTINGS = {"TOPICS": {"orders": {"partitions": 2}}, "LEASE_DURATION": 30, "LEASE_RENEW_INTERVAL": 5}


@dataclass
class Scene:
    heads: dict[int, int]
    dead: list[int]


def dead_letter(
    group: str,
    original_id: str,
    *,
    error: str = "ValueError",
    topic: str = "orders",
    key: str = "k1",
    payload: object = None,
) -> int:
    from django_sqlqueue.models import Message

    write_dead_letter(
        f"{topic}_dlq",
        key=key,
        id=f"{group}:{original_id}",
        payload=payload if payload is not None else {"order": original_id},
        metadata={
            "trace": "abc",
            "dead_letter": {
                "consumer_group": group,
                "original_offset": 3,
                "original_id": original_id,
                "original_partition": 1,
            },
        },
        created_at=timezone.now(),
        failure_count=5,
        last_error=f'builtins.{error}: bad {original_id}\nTraceback (most recent call last):\n  File "x.py", line 1\n',
        original_topic=topic,
        using="default",
    )
    return Message.objects.get(topic=f"{topic}_dlq", id=f"{group}:{original_id}").seq


def build(now: dt.datetime | None = None) -> Scene:
    now = now or timezone.now()
    publish_many("orders", [{"payload": {"n": i}, "key": KEYS[i % 4], "id": f"o{i}"} for i in range(20)])
    publish_many("typo", [{"payload": {"n": i}} for i in range(3)])
    sequence("orders")
    heads = groups.heads("orders")
    per_partition = {part: head for (_, part), head in heads.items()}
    for part, head in per_partition.items():
        ConsumerOffset.objects.create(
            consumer_group="billing", topic="orders", partition=part, offset_acked=max(0, head - 2), updated_at=now
        )
        ConsumerOffset.objects.create(
            consumer_group="shipping", topic="orders", partition=part, offset_acked=head, updated_at=now
        )
        ConsumerOffset.objects.create(
            consumer_group="retired",
            topic="orders",
            partition=part,
            offset_acked=0,
            updated_at=now - dt.timedelta(days=30),
        )
        PartitionLease.objects.create(
            consumer_group="billing",
            topic="orders",
            partition=part,
            leased_by="w1",
            leased_at=now,
            lease_renewed_at=now,
        )
    SubscriberHeartbeat.objects.create(consumer_group="billing", topic="orders", subscriber_name="w1", heartbeat_at=now)
    SubscriberHeartbeat.objects.create(
        consumer_group="shipping", topic="orders", subscriber_name="w2", heartbeat_at=now
    )
    dead = [dead_letter("billing", f"o{i}") for i in range(3)] + [dead_letter("shipping", "o7", error="KeyError")]
    return Scene(per_partition, dead)


def wm(group: str, part: int) -> int:
    """The acked watermark of ``group`` on ``orders[part]``."""
    return ConsumerOffset.objects.get(consumer_group=group, topic="orders", partition=part).offset_acked
