"""``bench/growth_fill.py`` writes what ``publish_many`` and the sequencer write (issue 32).

The growth benchmark fills its log with bulk ``INSERT ... SELECT`` instead of publishing it;
its figures hold only if the rows, heads and counters are the ones the product leaves.
"""

from __future__ import annotations

import zlib

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from bench.common import partition_keys
from bench.growth_fill import PARTITIONS, TOPIC, fill
from django_sqlqueue import publish_many
from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.models import ConsumerOffset, Message, Partition, TopicHour

from .support.engine_helpers import not_on_sqlite

PUBLISHED = "bench.published"
N = 1_003  # not a multiple of the partitions: the heads differ by one


def rows(topic: str) -> list[tuple[int, str, int]]:
    """(partition, key, offset) of each message of ``topic``, in seq order."""
    return list(Message.objects.filter(topic=topic).order_by("seq").values_list("partition", "key", "offset"))


@not_on_sqlite("the fill reads MariaDB's sequence tables or PostgreSQL's generate_series")
@pytest.mark.django_db(transaction=True)
def test_the_fill_writes_what_publish_many_and_the_sequencer_write() -> None:
    topics = {**settings.SQLQUEUE.get("TOPICS", {}), PUBLISHED: {"partitions": PARTITIONS}}
    with override_settings(SQLQUEUE={**settings.SQLQUEUE, "TOPICS": topics}):
        fill(N)
        keys = partition_keys(PARTITIONS)
        publish_many(PUBLISHED, [{"payload": {"i": i}, "key": keys[i % PARTITIONS]} for i in range(N)])
        sequence(PUBLISHED)

    filled, published = rows(TOPIC), rows(PUBLISHED)
    assert filled == published
    assert all(zlib.crc32(key.encode()) % PARTITIONS == partition for partition, key, _ in filled)

    def heads(topic: str) -> dict[int, int]:
        return dict(Partition.objects.filter(topic=topic).values_list("partition", "head_offset"))

    assert heads(TOPIC) == heads(PUBLISHED)
    # Every group of the big topic is at the head; the per-hour counters count every message.
    marks = ConsumerOffset.objects.filter(topic=TOPIC)
    assert {(m.partition, m.offset_acked) for m in marks if m.consumer_group == "bench"} == set(heads(TOPIC).items())
    assert sum(TopicHour.objects.filter(topic=TOPIC).values_list("messages", flat=True)) == N
    # The next message published gets the next seq (PostgreSQL's sequence was moved past the fill).
    with connection.cursor() as c:
        c.execute("SELECT MAX(seq) FROM queue_messages")
        (highest,) = c.fetchone()
    (message,) = publish_many(TOPIC, [{"payload": {}, "key": keys[0]}])
    assert Message.objects.get(topic=TOPIC, id=message.id).seq > highest
