"""The sequencer (django_sqlqueue/db/sequencer.py): dense offsets for what has committed.

Direct calls on the real database. Offsets in visibility order under concurrent
publishers are proven in tests/worker/test_ordering.py; a ``kill -9`` mid-sequencing in
tests/processes/test_sequencing.py.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_sqlqueue import publish, publish_many
from django_sqlqueue.db.sequencer import ReadAhead, Sequencer, sequence
from django_sqlqueue.models import Message, Partition

from ..support.engine_helpers import key_for_partition, not_on_sqlite

pytestmark = pytest.mark.django_db(transaction=True)


def all_offsets(topic: str, partition: int = 0) -> list[int]:
    return list(
        Message.objects.filter(topic=topic, partition=partition).order_by("offset").values_list("offset", flat=True)
    )


def offsets_by_seq(topic: str, partition: int = 0) -> list[int | None]:
    return list(
        Message.objects.filter(topic=topic, partition=partition).order_by("seq").values_list("offset", flat=True)
    )


def offset_write(sql: str) -> bool:
    """Whether ``sql`` is step (3) of sequencer.py (on PostgreSQL with (5) in its WITH)."""
    return sql.startswith(("UPDATE", "WITH numbered AS (UPDATE")) and "IS NULL" in sql


def unsequenced_reads(queries: CaptureQueriesContext) -> int:
    """How many reads of unsequenced rows (step (2) of sequencer.py) the block ran."""
    return sum(1 for q in queries.captured_queries if "IS NULL" in q["sql"] and not offset_write(q["sql"]))


def read_ahead_round(topic: str, ahead: ReadAhead, limit: int, partition: int = 0) -> tuple[dict[int, int], int, int]:
    """One round of the bulk path: the new heads, and the reads of unsequenced rows and the
    offset UPDATEs it ran (an UPDATE that found a row gone is rolled back and retried)."""
    with CaptureQueriesContext(connection) as queries:
        heads = Sequencer("default").sequence(topic, [partition], limit=limit, read_ahead=ahead)
    writes = sum(1 for q in queries.captured_queries if offset_write(q["sql"]))
    return heads, unsequenced_reads(queries), writes


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


def test_bulk_sequence_reads_ahead_once_and_numbers_over_several_transactions():
    k = key_for_partition(0)
    sequence("s.ahead", [0])  # the head row
    publish_many("s.ahead", [{"payload": i, "key": k} for i in range(7)])
    ahead = ReadAhead(size=10)
    assert read_ahead_round("s.ahead", ahead, 3) == ({0: 3}, 1, 1)  # reads all 7, numbers 3
    assert read_ahead_round("s.ahead", ahead, 3) == ({0: 6}, 0, 1)  # head unchanged since: no read
    assert read_ahead_round("s.ahead", ahead, 3) == ({0: 7}, 0, 1)
    assert read_ahead_round("s.ahead", ahead, 3) == ({}, 1, 0)  # used up: reads again, finds nothing
    assert offsets_by_seq("s.ahead") == [1, 2, 3, 4, 5, 6, 7]


def test_read_ahead_is_dropped_when_another_sequencer_numbered_in_between():
    """Rows read ahead are reused only if the head is the one this sequencer left."""
    k = key_for_partition(0)
    sequence("s.other", [0])
    publish_many("s.other", [{"payload": i, "key": k} for i in range(8)])
    ahead = ReadAhead(size=10)
    assert read_ahead_round("s.other", ahead, 2) == ({0: 2}, 1, 1)
    # A worker's sequencer (no read-ahead) numbers the next two read-ahead rows meanwhile.
    assert Sequencer("default").sequence("s.other", [0], limit=2) == {0: 4}
    # The head moved under us: the read-ahead is stale and is read again, not reused --
    # reusing it would try to number messages 3 and 4 a second time (which the UPDATE's
    # "offset IS NULL" would catch, rolling back: two UPDATEs instead of one).
    assert read_ahead_round("s.other", ahead, 2) == ({0: 6}, 1, 1)
    assert read_ahead_round("s.other", ahead, 2) == ({0: 8}, 0, 1)
    assert offsets_by_seq("s.other") == [1, 2, 3, 4, 5, 6, 7, 8]
    assert sequence("s.other") == {}


def test_a_read_ahead_row_deleted_before_its_turn_leaves_no_gap():
    """A purge may delete unsequenced rows: the round rolls back and reads again."""
    k = key_for_partition(0)
    sequence("s.gone", [0])
    publish_many("s.gone", [{"payload": i, "key": k} for i in range(6)])
    ahead = ReadAhead(size=10)
    assert read_ahead_round("s.gone", ahead, 2) == ({0: 2}, 1, 1)
    third = Message.objects.filter(topic="s.gone", offset__isnull=True).order_by("seq").first()
    assert third is not None and third.payload == 2
    third.delete()
    # Rolled back (the UPDATE found one row fewer than it was given), then read afresh.
    assert read_ahead_round("s.gone", ahead, 2) == ({0: 4}, 1, 2)
    assert sorted(Message.objects.filter(topic="s.gone").values_list("payload", "offset")) == [
        (0, 1),
        (1, 2),
        (3, 3),
        (4, 4),
        (5, None),
    ]
    assert sequence("s.gone") == {0: 5}


@not_on_sqlite("one writer: the second publish would wait for the open transaction at BEGIN IMMEDIATE")
def test_a_message_committed_during_the_read_ahead_is_numbered_after_it(spawn):
    """Its seq is lower (inserted first) but it became visible after the rows read ahead."""
    k = key_for_partition(0)
    sequence("s.late", [0])
    inside, release = threading.Event(), threading.Event()

    def open_publisher() -> None:
        with transaction.atomic():
            publish("s.late", "late", key=k)
            inside.set()
            release.wait(10)

    t = spawn(open_publisher)
    assert inside.wait(10)
    publish_many("s.late", [{"payload": f"m{i}", "key": k} for i in range(4)])
    ahead = ReadAhead(size=10)
    assert read_ahead_round("s.late", ahead, 2) == ({0: 2}, 1, 1)  # reads m0..m3 ("late" is open)
    release.set()
    t.join_ok()
    assert read_ahead_round("s.late", ahead, 2) == ({0: 4}, 0, 1)  # m2, m3 from the read-ahead
    assert read_ahead_round("s.late", ahead, 2) == ({0: 5}, 1, 1)  # then "late"
    by_payload = dict(Message.objects.filter(topic="s.late").values_list("payload", "offset"))
    assert by_payload == {"m0": 1, "m1": 2, "m2": 3, "m3": 4, "late": 5}
    late = Message.objects.get(topic="s.late", payload="late")
    assert late.seq < Message.objects.get(topic="s.late", payload="m0").seq


def test_bulk_sequence_numbers_many_partitions_densely_in_seq_order():
    keys = [key_for_partition(p) for p in range(4)]
    publish_many("s.bulk", [{"payload": i, "key": keys[i % 4]} for i in range(400)])
    assert sequence("s.bulk") == dict.fromkeys(range(4), 100)
    for p in range(4):
        assert offsets_by_seq("s.bulk", p) == list(range(1, 101))


def test_the_round_as_a_fragment_of_a_poll_exists_only_where_the_database_has_the_function():
    sequencer = Sequencer("default")
    fragment = sequencer.round_fragment("t.frag", "todo.parts", limit=7)
    if connection.vendor == "postgresql":
        assert fragment == ("sqlqueue_sequence_round(%s, todo.parts, %s::integer, %s::integer)", ["t.frag", 7, 16])
    else:
        assert fragment is None  # MySQL/MariaDB and SQLite: the worker sequences apart from its poll
