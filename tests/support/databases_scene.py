"""Issue 32: a queue in two databases for the operator tests (ops, commands, console).

With the ``second_routes`` fixture (``second.*`` lives in the alias ``second``), each
database holds one topic and the same group ``ledger``:

- ``default``: ``first.orders`` (1 partition, registered), 3 messages sequenced, ``ledger`` at 0 (lag 3),
  one dead letter of ``ledger`` in ``first.orders_dlq``;
- ``second``: ``second.orders`` (1 partition), the same.

Written through the public API (``publish_many`` routes by topic) and the store.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils import timezone

from django_sqlqueue import publish_many
from django_sqlqueue.conf import get_settings
from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.db.store import QueueStore
from django_sqlqueue.db.store.messages import write_dead_letter
from django_sqlqueue.models import ConsumerOffset, Message

TOPICS = {"default": "first.orders", "second": "second.orders"}
GROUP = "ledger"
#: One partition each, so the tests can name it.
SETTINGS_TOPICS = {topic: {"partitions": 1} for topic in TOPICS.values()}


@dataclass
class Scene:
    #: Alias -> seq of its one dead letter (seqs are per database: they may be equal).
    dead: dict[str, int]


def build() -> Scene:
    dead = {}
    for alias, topic in TOPICS.items():
        assert get_settings().database_for(topic) == alias
        publish_many(topic, [{"payload": {"n": i}, "key": "k", "id": f"{alias}-{i}"} for i in range(3)])
        sequence(topic, using=alias)
        QueueStore(alias).register_topic(topic, 1)  # what a worker consuming it does
        ConsumerOffset.objects.using(alias).create(
            consumer_group=GROUP, topic=topic, partition=0, offset_acked=0, updated_at=timezone.now()
        )
        write_dead_letter(
            f"{topic}_dlq",
            key="k",
            id=f"{GROUP}:{alias}-0",
            payload={"n": 0},
            metadata={
                "dead_letter": {
                    "consumer_group": GROUP,
                    "original_offset": 1,
                    "original_id": f"{alias}-0",
                    "original_partition": 0,
                }
            },
            created_at=timezone.now(),
            failure_count=5,
            last_error=f"builtins.ValueError: bad in {alias}\nTraceback (most recent call last):\n",
            original_topic=topic,
            using=alias,
        )
        dead[alias] = Message.objects.using(alias).get(topic=f"{topic}_dlq").seq
    return Scene(dead)


def topics_of(alias: str) -> list[str]:
    """The topics with messages in ``alias``'s log, sorted, with repeats."""
    return sorted(Message.objects.using(alias).values_list("topic", flat=True))
