"""GCStore (``store/gc.py``): deleting what every consuming group has processed, and
nothing else."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections, transaction

from django_sqlqueue.db.store import gc as gc_module
from django_sqlqueue.db.store.gc import GCPass, GCStore
from django_sqlqueue.models import ConsumerOffset, Message

from ...support.engine_helpers import age_messages, publish_to, sequence
from ...support.factories import ConsumerOffsetFactory, SubscriberHeartbeatFactory
from .helpers import A, B, C, T, fill, stored_offsets

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


def interleave(partitions: list[int], rounds: int, topic: str = T) -> None:
    """Publish one message to each of ``partitions`` per round, so the log interleaves them
    (what a walk in seq order meets), then sequence them."""
    for _ in range(rounds):
        for p in partitions:
            publish_to(topic, p, 1, seq=False)
    sequence(topic)


def watermarks(**floors: int) -> None:
    for name, acked in floors.items():
        ConsumerOffsetFactory(consumer_group="g1", topic=T, partition="ABCDEF".index(name), offset_acked=acked)


def test_a_walk_in_short_statements_deletes_exactly_the_eligible_rows(monkeypatch):
    # Spans of a few rows: the walk takes many statements over the interleaved partitions.
    monkeypatch.setattr(gc_module, "FIRST_SPAN", 3)
    monkeypatch.setattr(gc_module, "MIN_SPAN", 3)
    monkeypatch.setattr(gc_module, "MAX_SPAN", 3)
    interleave([A, B, C], 10)
    watermarks(A=7, B=2, C=0)
    assert gc().garbage_pass(T, None, 0) == GCPass(9, True)
    assert stored_offsets(partition=A) == [8, 9, 10]
    assert stored_offsets(partition=B) == list(range(3, 11))
    assert stored_offsets(partition=C) == list(range(1, 11))


def test_a_pass_out_of_budget_says_where_to_resume_and_the_next_pass_finishes(monkeypatch):
    monkeypatch.setattr(gc_module, "FIRST_SPAN", 4)
    monkeypatch.setattr(gc_module, "MAX_SPAN", 4)
    interleave([A, B], 10)
    watermarks(A=10, B=10)
    ticks = iter(range(1000))
    first = gc().garbage_pass(T, None, 0, budget=2.5, clock=lambda: float(next(ticks)))
    assert not first.done and 0 < first.deleted < 20 and first.resume > 0
    rest = gc().garbage_pass(T, None, 0, start=first.resume)
    assert rest.done and first.deleted + rest.deleted == 20
    assert Message.objects.filter(topic=T).count() == 0


def test_a_message_numbered_before_the_floor_but_stored_after_it_goes_too():
    # The late committer: x is inserted first (lower seq) but commits after y, so the
    # sequencer numbers y 1 and x 2. With the floor at 2 the floor's row is x, and y sits
    # after it in the log: the walk ends at x, the straggler step takes y.
    if connections["default"].vendor == "sqlite":
        pytest.skip("SQLite has one writer at a time: a row cannot commit before an earlier one")
    with transaction.atomic():
        (x,) = publish_to(T, A, 1, seq=False)
        assert _elsewhere(_publish_and_sequence) == {A: 1}  # y, committed and numbered
    assert sequence(T) == {A: 2}
    x_row, y_row = Message.objects.get(id=x.id), Message.objects.exclude(id=x.id).get(topic=T)
    assert (y_row.offset, x_row.offset) == (1, 2) and y_row.seq > x_row.seq
    watermarks(A=2)
    assert gc().garbage_pass(T, None, 0) == GCPass(2, True)
    assert Message.objects.filter(topic=T).count() == 0


def _publish_and_sequence() -> dict[int, int]:
    publish_to(T, A, 1, seq=False)
    return sequence(T)


def _elsewhere(work):
    """Run ``work`` on another thread: its own connection, its own transactions."""

    def run():
        try:
            return work()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def test_topics_with_many_partitions_are_collected_partition_by_partition(monkeypatch):
    monkeypatch.setattr(gc_module, "MAX_CASE_PARTITIONS", 2)
    monkeypatch.setattr(gc_module, "FIRST_SPAN", 2)
    monkeypatch.setattr(gc_module, "MAX_SPAN", 2)
    interleave([A, B, C], 5)
    watermarks(A=5, B=3, C=1)
    age_messages(T, A, [5], 7200)
    assert gc().garbage_pass(T, None, 0) == GCPass(9, True)
    assert stored_offsets(partition=A) == []
    assert stored_offsets(partition=B) == [4, 5]
    assert stored_offsets(partition=C) == [2, 3, 4, 5]


def test_with_a_retention_the_walk_stops_at_the_first_young_message(monkeypatch):
    monkeypatch.setattr(gc_module, "FIRST_SPAN", 2)
    monkeypatch.setattr(gc_module, "MAX_SPAN", 2)
    interleave([A, B], 6)
    watermarks(A=6, B=6)
    for p in (A, B):
        age_messages(T, p, [1, 2, 3], 7200)
    assert gc().garbage_pass(T, None, 3600) == GCPass(6, True)
    assert stored_offsets(partition=A) == [4, 5, 6]
    assert stored_offsets(partition=B) == [4, 5, 6]
