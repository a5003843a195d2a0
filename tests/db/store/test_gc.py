"""GCStore (``store/gc.py``): deleting what every consuming group has processed, and
nothing else."""

from __future__ import annotations

import pytest

from django_sqlqueue.db.store.gc import GCStore
from django_sqlqueue.models import ConsumerOffset, Message

from ...support.engine_helpers import age_messages, publish_to, sequence
from ...support.factories import ConsumerOffsetFactory, SubscriberHeartbeatFactory
from .helpers import A, B, T, fill, stored_offsets

pytestmark = pytest.mark.django_db(transaction=True)


def gc() -> GCStore:
    """The module's store on its own (no other store mixin behind it): what these tests exercise."""
    return GCStore("default")


def test_collect_garbage_never_deletes_above_the_lowest_watermark():
    fill(A, 10)
    fill(B, 10)
    for p, g1, g2 in ((A, 7, 5), (B, 10, 3)):
        ConsumerOffsetFactory(consumer_group="g1", topic=T, partition=p, offset_acked=g1)
        ConsumerOffsetFactory(consumer_group="g2", topic=T, partition=p, offset_acked=g2)
    s = gc()
    assert s.consuming_groups(T) == {"g1", "g2"}
    assert s.collect_garbage(T, None, 0) == 8
    assert stored_offsets(partition=A) == list(range(6, 11))
    assert stored_offsets(partition=B) == list(range(4, 11))
    assert s.collect_garbage(T, None, 0) == 0

    ConsumerOffset.objects.filter(consumer_group="g2", partition=A).update(offset_acked=9)
    assert s.collect_garbage(T, [B], 0) == 0  # only B is looked at
    assert s.collect_garbage(T, [], 0) == 0
    assert s.collect_garbage(T, [A], 0) == 2  # 6, 7: g1 is at 7
    assert Message.objects.filter(partition=A).count() == 3


def test_collect_garbage_never_deletes_unsequenced_messages():
    fill(A, 3)
    publish_to(T, A, 2, seq=False)
    ConsumerOffsetFactory(consumer_group="g1", topic=T, partition=A, offset_acked=3)
    assert gc().collect_garbage(T, None, 0) == 3
    assert list(Message.objects.filter(topic=T).values_list("offset", flat=True)) == [None, None]
    assert sequence(T) == {A: 5}


def test_collect_garbage_counts_a_group_without_watermark_rows_as_zero():
    fill(A, 5)
    ConsumerOffsetFactory(consumer_group="g1", topic=T, partition=A, offset_acked=5)
    SubscriberHeartbeatFactory(consumer_group="g2", topic=T)  # g2 consumes, no watermark yet
    s = gc()
    assert s.consuming_groups(T) == {"g1", "g2"}
    assert s.collect_garbage(T, None, 0) == 0
    assert Message.objects.count() == 5
    ConsumerOffsetFactory(consumer_group="g2", topic=T, partition=A, offset_acked=2)
    assert s.collect_garbage(T, None, 0) == 2


def test_collect_garbage_keeps_every_message_of_a_topic_nobody_consumes():
    fill(A, 5, topic="lonely")
    fill(A, 5)
    ConsumerOffsetFactory(consumer_group="g1", topic=T, partition=A, offset_acked=5)
    s = gc()
    assert s.consuming_groups("lonely") == set()
    assert s.collect_garbage("lonely", None, 0) == 0
    assert Message.objects.filter(topic="lonely").count() == 5
    assert s.collect_garbage(T, None, 0) == 5


def test_collect_garbage_honours_retention():
    fill(A, 6)
    ConsumerOffsetFactory(consumer_group="g1", topic=T, partition=A, offset_acked=5)
    age_messages(T, A, [1, 2, 6], 7200)
    s = gc()
    assert s.collect_garbage(T, None, 3600) == 2  # 1 and 2; 3..5 are too young, 6 not acked
    assert stored_offsets() == [3, 4, 5, 6]
    assert s.collect_garbage(T, None, 0) == 3
    assert stored_offsets() == [6]
