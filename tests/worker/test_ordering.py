"""Offsets follow the order in which messages became visible, proven with concurrent connections.

A "follower" reads like a naive consumer: ``offset > last_seen`` in a tight loop, running
the sequencer before each read as a worker's poll does. If a smaller offset ever became
visible after a larger one, the follower would skip it for good. The control test shows
the follower does catch that with plain AUTO_INCREMENT inserts; the other tests show that
with append-only publishing and the sequencer it never happens, while publishers never
wait for each other.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from django.db import connection, transaction
from django.test import override_settings

from django_sqlqueue import publish, publish_many
from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.models import Message

from ..support.engine_helpers import not_on_sqlite

pytestmark = pytest.mark.django_db(transaction=True)

#: One partition: every message of the topic in one offset sequence.
ONE_PARTITION = override_settings(SQLQUEUE={"TOPICS": {"t": {"partitions": 1}}})


class Follower:
    """Polls ``offset > last_seen`` for one partition on its own connection."""

    def __init__(self, spawn, topic: str, partition: int = 0, table: str = "queue_messages", sequencer: bool = True):
        self.topic, self.partition, self.table, self.sequencer = topic, partition, table, sequencer
        self.seen: list[int] = []
        self.stop = threading.Event()
        self.thread = spawn(self._run, name="follower")

    def _run(self) -> None:
        last = 0
        column = "partition" if self.table == "queue_messages" else "partition_key"
        qn = connection.ops.quote_name
        while True:
            stopping = self.stop.is_set()
            if self.sequencer:
                sequence(self.topic, [self.partition])
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT {qn('offset')} FROM {self.table} WHERE topic = %s AND {qn(column)} = %s "
                    f"AND {qn('offset')} > %s ORDER BY {qn('offset')}",
                    [self.topic, self.partition, last],
                )
                rows = [row[0] for row in cursor.fetchall()]
            if rows:
                self.seen.extend(rows)
                last = rows[-1]
            if stopping:
                return
            time.sleep(0.001)

    def finish(self) -> list[int]:
        self.stop.set()
        self.thread.join_ok()
        if self.sequencer:
            self.stop.clear()
        return self.seen


def all_offsets(topic: str, partition: int = 0) -> list[int]:
    return list(
        Message.objects.filter(topic=topic, partition=partition).order_by("offset").values_list("offset", flat=True)
    )


@pytest.fixture
def autoinc_table():
    """A plain AUTO_INCREMENT log, as the RFC and watermill have it."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                'CREATE TABLE ctl_autoinc_log ("offset" BIGSERIAL PRIMARY KEY, topic VARCHAR(50), '
                "partition_key VARCHAR(50))"
            )
        else:
            cursor.execute(
                "CREATE TABLE ctl_autoinc_log (`offset` BIGINT AUTO_INCREMENT PRIMARY KEY, topic VARCHAR(50), "
                "partition_key VARCHAR(50))"
            )
    yield "ctl_autoinc_log"
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE ctl_autoinc_log")


def plain_insert() -> int:
    with connection.cursor() as cursor:
        offset = connection.ops.quote_name("offset")
        cursor.execute(
            f"INSERT INTO ctl_autoinc_log (topic, partition_key) VALUES ('t', 'p') RETURNING {offset}"
            if connection.vendor == "postgresql"
            else "INSERT INTO ctl_autoinc_log (topic, partition_key) VALUES ('t', 'p')"
        )
        return cursor.fetchone()[0] if connection.vendor == "postgresql" else cursor.lastrowid


@not_on_sqlite("the control needs a second writer to commit while the first insert's transaction is open")
def test_control_plain_autoincrement_insert_is_skipped_by_follower(spawn, autoinc_table):
    """Offsets handed out at INSERT time: a late-committing insert is skipped -- the harness sees it."""
    inserted, release = threading.Event(), threading.Event()

    def slow_plain_insert():
        with transaction.atomic():
            offset = plain_insert()
            inserted.set()
            assert release.wait(10)
        return offset

    follower = Follower(spawn, "t", "p", table=autoinc_table, sequencer=False)
    slow = spawn(slow_plain_insert)
    assert inserted.wait(10)
    fast = plain_insert()  # autocommits while the smaller offset is still uncommitted
    deadline = time.monotonic() + 5
    while fast not in follower.seen and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    slow_offset = slow.join_ok()
    seen = follower.finish()
    assert slow_offset < fast
    assert seen == [fast]  # the smaller offset committed later and was skipped for good


@not_on_sqlite("SQLite has one writer: an open transaction holds the database write lock")
@ONE_PARTITION
def test_publisher_of_the_same_partition_does_not_wait_and_late_commit_is_not_skipped(spawn):
    """A transaction holding its publish open for seconds delays nobody, and is numbered when it commits."""
    published, release = threading.Event(), threading.Event()

    def holder():
        with transaction.atomic():
            publish("t", "first", key="p", id="held")
            published.set()
            assert release.wait(20)

    follower = Follower(spawn, "t")
    h = spawn(holder, name="holder")
    assert published.wait(10)
    # Same key, same partition, while the holder's transaction is open: none of them waits.
    others = [spawn(lambda i=i: publish("t", f"later-{i}", key="p", id=f"later-{i}")) for i in range(3)]
    for other in others:
        other.join_ok(5)
    assert h.is_alive(), "the holder is still open: the other publishers did not wait for it"
    deadline = time.monotonic() + 5
    while len(follower.seen) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert follower.seen == [1, 2, 3]  # committed messages are delivered meanwhile
    release.set()
    h.join_ok()
    deadline = time.monotonic() + 5
    while len(follower.seen) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    seen = follower.finish()
    assert seen == all_offsets("t") == [1, 2, 3, 4]
    assert Message.objects.get(id="held").offset == 4  # numbered in the order it became visible


@ONE_PARTITION
def test_offsets_follow_visibility_order_under_concurrent_transactions(spawn):
    """Transactions held open in different orders and lengths: nothing is ever skipped."""
    follower = Follower(spawn, "t")
    start = threading.Barrier(5)

    def producer(n: int) -> list[str]:
        rng = random.Random(n)
        start.wait()
        mine: list[str] = []
        for i in range(60):
            with transaction.atomic():
                time.sleep(rng.random() * 0.003)
                for j in range(rng.randint(1, 3)):
                    mine.append(publish("t", {"producer": n, "i": i, "j": j}, key=f"producer-{n}").id)
                if n == 0 and i == 10:
                    time.sleep(2)  # one long transaction while the others keep publishing
                else:
                    time.sleep(rng.random() * 0.003)
        return mine

    producers = [spawn(lambda n=n: producer(n), name=f"producer-{n}") for n in range(4)]
    start.wait()
    results = [p.join_ok(60) for p in producers]
    deadline = time.monotonic() + 10
    total = sum(len(r) for r in results)
    while len(follower.seen) < total and time.monotonic() < deadline:
        time.sleep(0.01)
    seen = follower.finish()
    stored = all_offsets("t")
    assert len(stored) == total
    assert seen == stored == list(range(1, total + 1)), f"follower skipped {sorted(set(stored) - set(seen))}"
    offsets = dict(Message.objects.filter(topic="t").values_list("id", "offset"))
    for mine in results:  # each producer's (each key's) messages keep their publish order
        assert [offsets[i] for i in mine] == sorted(offsets[i] for i in mine)


def test_concurrent_publish_many_in_opposite_key_orders_never_deadlocks(spawn):
    keys = [f"k{i:02d}" for i in range(20)]
    start = threading.Barrier(2)

    def batch(order: list[str]) -> int:
        start.wait()
        total = 0
        for i in range(25):
            with transaction.atomic():
                total += len(publish_many("many", [{"payload": i, "key": k} for k in order]))
                time.sleep(0.002)
        return total

    a = spawn(lambda: batch(keys))
    b = spawn(lambda: batch(list(reversed(keys))))
    assert a.join_ok(60) == b.join_ok(60) == 500
    assert Message.objects.filter(topic="many").count() == 1000


@not_on_sqlite("SQLite has one writer: the second view's transaction waits at BEGIN IMMEDIATE")
def test_two_views_publishing_to_two_partitions_in_opposite_order_both_commit(spawn):
    """The head-row design deadlocked here (1213); appending cannot."""
    both_published_first = threading.Barrier(2, timeout=10)

    def view(first: str, second: str) -> str:
        with transaction.atomic():
            publish("views", {"step": 1}, key=first)
            both_published_first.wait()
            publish("views", {"step": 2}, key=second)
            time.sleep(0.2)  # more work before commit
        return "committed"

    for _ in range(5):
        a = spawn(lambda: view("a", "b"))
        b = spawn(lambda: view("b", "a"))
        assert a.join_ok(20) == b.join_ok(20) == "committed"
        both_published_first.reset()
    assert Message.objects.filter(topic="views").count() == 20
