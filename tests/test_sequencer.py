"""The sequencer (django_sqlqueue/sequencer.py): dense offsets for what has committed.

Direct calls on the real database. Offsets in visibility order under concurrent
publishers are proven in tests/test_ordering.py; a ``kill -9`` mid-sequencing in
tests/test_sequencing_processes.py.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import transaction

from django_sqlqueue import publish, publish_many
from django_sqlqueue.models import Message, Partition
from django_sqlqueue.sequencer import Sequencer, sequence

from .engine_helpers import key_for_partition, not_on_sqlite

pytestmark = pytest.mark.django_db(transaction=True)


def all_offsets(topic: str, partition: int = 0) -> list[int]:
    return list(
        Message.objects.filter(topic=topic, partition=partition).order_by("offset").values_list("offset", flat=True)
    )


def test_numbers_each_partition_densely_in_insertion_order_and_moves_its_head():
    k0, k1 = key_for_partition(0), key_for_partition(1)
    first = publish_many("s.dense", [{"payload": i, "key": k0} for i in range(3)])
    second = publish_many("s.dense", [{"payload": i, "key": k1} for i in range(2)])
    assert sequence("s.dense") == {0: 3, 1: 2}
    offsets = dict(Message.objects.filter(topic="s.dense").values_list("id", "offset"))
    assert [offsets[m.id] for m in first] == [1, 2, 3]
    assert [offsets[m.id] for m in second] == [1, 2]
    heads = dict(Partition.objects.filter(topic="s.dense").values_list("partition", "head_offset"))
    assert heads[0] == 3 and heads[1] == 2
    assert sequence("s.dense") == {}  # nothing left: no new heads, nothing written
    publish("s.dense", "late", key=k0)
    assert sequence("s.dense") == {0: 4}


def test_a_pass_numbers_at_most_limit_messages_per_partition():
    k = key_for_partition(0)
    publish_many("s.limit", [{"payload": i, "key": k} for i in range(5)])
    sequence("s.limit", [0])  # creates the head row; runs until done
    publish_many("s.limit", [{"payload": i, "key": k} for i in range(5)])
    sequencer = Sequencer("default")
    assert sequencer.unsequenced_partitions("s.limit") == [0]
    assert sequencer.sequence("s.limit", [0], limit=2) == {0: 7}
    assert sequencer.sequence("s.limit", [0], limit=2) == {0: 9}
    assert sequencer.sequence("s.limit", [0], limit=2) == {0: 10}
    assert sequencer.unsequenced_partitions("s.limit") == []
    assert all_offsets("s.limit") == list(range(1, 11))


def test_partitions_without_a_head_row_wait_for_one():
    publish("s.nohead", "x", key=key_for_partition(3))
    assert Sequencer("default").sequence("s.nohead", [3]) == {}  # no head row: skipped
    assert Message.objects.get(topic="s.nohead").offset is None
    assert sequence("s.nohead") == {3: 1}  # the module function creates it


@not_on_sqlite("one writer: the second publish would wait for the open transaction at BEGIN IMMEDIATE")
def test_an_open_transaction_is_not_numbered_until_it_commits(spawn):
    k = key_for_partition(0)
    publish("s.open", "first", key=k)
    sequence("s.open")
    inside, release = threading.Event(), threading.Event()

    def open_publisher() -> None:
        with transaction.atomic():
            publish("s.open", "late", key=k)
            inside.set()
            release.wait(10)

    t = spawn(open_publisher)
    assert inside.wait(10)
    publish("s.open", "second", key=k)
    assert sequence("s.open") == {0: 2}  # "second" is numbered; "late" is invisible
    release.set()
    t.join_ok()
    assert sequence("s.open") == {0: 3}  # "late" gets the next offset once it commits
    by_payload = dict(Message.objects.filter(topic="s.open").values_list("payload", "offset"))
    assert by_payload == {"first": 1, "second": 2, "late": 3}


def test_concurrent_sequencers_never_number_a_message_twice(spawn):
    """Several workers' sequencers at once while producers publish: dense, unique offsets."""
    stop = threading.Event()

    def producer(n: int) -> int:
        count = 0
        while not stop.is_set():
            publish_many("c", [{"payload": [n, count, j], "key": f"k{(n + j) % 5}"} for j in range(5)])
            count += 1
        return count * 5

    def sequencer() -> None:
        while not stop.is_set():
            sequence("c")

    producers = [spawn(lambda n=n: producer(n)) for n in range(2)]
    sequencers = [spawn(sequencer) for _ in range(3)]
    time.sleep(3)
    stop.set()
    total = sum(p.join_ok() for p in producers)
    for s in sequencers:
        s.join_ok()
    sequence("c")
    assert Message.objects.filter(topic="c").count() == total
    for partition in set(Message.objects.filter(topic="c").values_list("partition", flat=True)):
        assert all_offsets("c", partition) == list(range(1, len(all_offsets("c", partition)) + 1))
