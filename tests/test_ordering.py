"""Offsets within a partition follow commit order, proven with concurrent connections.

A "follower" reads like a naive consumer: ``offset > last_seen`` in a tight loop. If a
smaller offset ever became visible after a larger one, the follower would skip it for
good. The control test shows the follower does catch that with plain AUTO_INCREMENT
inserts; the other tests show publish() never lets it happen.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from django.db import connection, transaction

from django_sqlqueue import publish, publish_many
from django_sqlqueue.models import Message

pytestmark = pytest.mark.django_db(transaction=True)


class Follower:
    """Polls ``offset > last_seen`` for one partition on its own connection."""

    def __init__(self, spawn, topic: str, key: str, table: str = "queue_messages") -> None:
        self.topic, self.key, self.table = topic, key, table
        self.seen: list[int] = []
        self.stop = threading.Event()
        self.thread = spawn(self._run, name="follower")

    def _run(self) -> None:
        last = 0
        while True:
            stopping = self.stop.is_set()
            offset = connection.ops.quote_name("offset")
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT {offset} FROM {self.table} WHERE topic = %s AND partition_key = %s AND {offset} > %s "
                    f"ORDER BY {offset}",
                    [self.topic, self.key, last],
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
        return self.seen


def all_offsets(topic: str, key: str) -> list[int]:
    return list(Message.objects.filter(topic=topic, partition_key=key).order_by("offset").values_list("offset", flat=True))


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
        cursor.execute(f"INSERT INTO ctl_autoinc_log (topic, partition_key) VALUES ('t', 'p') RETURNING {offset}"
                       if connection.vendor == "postgresql" else
                       "INSERT INTO ctl_autoinc_log (topic, partition_key) VALUES ('t', 'p')")
        return cursor.fetchone()[0] if connection.vendor == "postgresql" else cursor.lastrowid


def test_control_plain_autoincrement_insert_is_skipped_by_follower(spawn, autoinc_table):
    """Without the head-row counter a late-committing insert is skipped: the harness sees it."""
    inserted, release = threading.Event(), threading.Event()

    def slow_plain_insert():
        with transaction.atomic():
            offset = plain_insert()
            inserted.set()
            assert release.wait(10)
        return offset

    follower = Follower(spawn, "t", "p", table=autoinc_table)
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


def test_publisher_of_same_partition_waits_for_open_transaction(spawn):
    """A transaction holding a partition open for seconds: others queue behind it."""
    published, release = threading.Event(), threading.Event()
    holder_offset: list[int] = []

    def holder():
        with transaction.atomic():
            holder_offset.append(publish("t", "first", partition_key="p").offset)
            published.set()
            assert release.wait(10)

    follower = Follower(spawn, "t", "p")
    h = spawn(holder, name="holder")
    assert published.wait(10)
    waiters = [spawn(lambda i=i: publish("t", f"later-{i}", partition_key="p").offset) for i in range(3)]
    other = spawn(lambda: publish("t", "other", partition_key="q").offset)
    other.join_ok(5)  # another partition is not blocked
    time.sleep(1.5)
    assert all(w.is_alive() for w in waiters), "publishers of the held partition must wait for its commit"
    release.set()
    h.join_ok()
    later = sorted(w.join_ok() for w in waiters)
    assert holder_offset[0] < later[0]
    seen = follower.finish()
    assert seen == all_offsets("t", "p") == [holder_offset[0], *later]


def test_offsets_follow_commit_order_under_concurrent_transactions(spawn):
    """Transactions held open in different orders and lengths: nothing is ever skipped."""
    follower = Follower(spawn, "t", "p")
    start = threading.Barrier(5)

    def producer(n: int) -> list[int]:
        rng = random.Random(n)
        start.wait()
        mine: list[int] = []
        for i in range(60):
            with transaction.atomic():
                # Other work first (not holding the partition), then publish, then hold.
                time.sleep(rng.random() * 0.003)
                for j in range(rng.randint(1, 3)):
                    mine.append(publish("t", {"producer": n, "i": i, "j": j}, partition_key="p").offset)
                if n == 0 and i == 10:
                    time.sleep(2)  # one long transaction while the others keep trying
                else:
                    time.sleep(rng.random() * 0.003)
        return mine

    producers = [spawn(lambda n=n: producer(n), name=f"producer-{n}") for n in range(4)]
    start.wait()
    results = [p.join_ok(60) for p in producers]
    seen = follower.finish()
    stored = all_offsets("t", "p")
    assert len(stored) == sum(len(r) for r in results)
    assert seen == stored, f"follower skipped {sorted(set(stored) - set(seen))}"
    for mine in results:  # each producer's own messages keep their order
        assert mine == sorted(mine)


def test_concurrent_publish_many_in_opposite_key_orders_never_deadlocks(spawn):
    keys = [f"k{i:02d}" for i in range(20)]
    start = threading.Barrier(2)

    def batch(order: list[str]) -> int:
        start.wait()
        total = 0
        for i in range(25):
            with transaction.atomic():
                total += len(publish_many("many", [{"payload": i, "partition_key": k} for k in order]))
                time.sleep(0.002)
        return total

    a = spawn(lambda: batch(keys))
    b = spawn(lambda: batch(list(reversed(keys))))
    assert a.join_ok(60) == b.join_ok(60) == 500
    assert Message.objects.filter(topic="many").count() == 1000
