"""The sequencer and partitioned topics, proven with real ``runconsumer`` processes.

Workers run ``tests/support/seqapp/consumers.py`` (groups s1 and s2 on ``seq.events``, 8
partitions; s1 on ``seq.one``, 1 partition) with the fast clocks of
tests/support/process_settings.py and record every delivery in ``Seen``. Nothing is mocked:
producers hold real transactions open, workers are started, SIGTERMed and ``kill -9``ed.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter, defaultdict

import pytest
from django.db import connection, transaction

from django_sqlqueue import publish, publish_many
from django_sqlqueue.models import Message, PartitionLease, TopicHour
from tests.support.processes import wait_until
from tests.support.seqapp.models import Seen

from ..support.engine_helpers import not_on_sqlite

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def lock_waits() -> int:
    """Sessions of the test database waiting for a row lock right now."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            # This database's sessions only, as on PostgreSQL: CI runs the chaos suite beside
            # this one, on the same server (its own database).
            cursor.execute(
                "SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT' AND "
                "trx_mysql_thread_id IN (SELECT id FROM information_schema.processlist WHERE db = DATABASE())"
            )
        else:
            cursor.execute(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        return int(cursor.fetchone()[0])


def hourly_count(topic: str) -> int:
    """Messages of ``topic`` in the sequencer's per-hour counters (``queue_topic_hours``)."""
    return sum(TopicHour.objects.filter(topic=topic).values_list("messages", flat=True))


def numbered_and_counted(topic: str) -> tuple[int, int]:
    """Messages of ``topic`` with an offset, and the count in its per-hour counters, read by
    one statement (one snapshot)."""
    q = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT (SELECT COUNT(*) FROM queue_messages WHERE topic = %s AND {q('offset')} IS NOT NULL), "
            f"(SELECT COALESCE(SUM({q('messages')}), 0) FROM queue_topic_hours WHERE topic = %s)",
            [topic, topic],
        )
        numbered, counted = cursor.fetchone()
    return int(numbered), int(counted)


@not_on_sqlite("the test blocks the sequencer with a row lock; SQLite has no row locks")
def test_kill_9_in_the_middle_of_sequencing_loses_and_duplicates_nothing(runconsumer, spawn):
    """A worker killed while its sequencing transaction is open: the next worker numbers everything once."""
    publish_many("seq.one", [{"payload": {"n": i}, "key": "k", "id": f"m{i}"} for i in range(300)])
    locked, release = threading.Event(), threading.Event()

    def hold_row_lock() -> None:
        # Lock one committed, unsequenced message: the sequencer's UPDATE will wait on it
        # while it holds the partition's head row -- in the middle of its transaction.
        with transaction.atomic():
            list(Message.objects.select_for_update().filter(topic="seq.one", id="m150"))
            locked.set()
            assert release.wait(60)

    holder = spawn(hold_row_lock)
    assert locked.wait(10)
    victim = runconsumer("victim", "--group", "s1", "--topic", "seq.one")
    wait_until(lambda: lock_waits() > 0, 20, "the worker's sequencer to block inside its transaction")
    assert Message.objects.filter(topic="seq.one", offset__isnull=False).count() == 0
    victim.kill9()
    release.set()
    holder.join_ok()
    wait_until(lambda: lock_waits() == 0, 20, "the killed session's statement to go on")
    # MySQL/MariaDB: the round is a transaction of several statements, and the server rolls
    # the killed session's back: nothing was numbered. PostgreSQL: the round is one
    # autocommitted statement (sqlqueue_sequence_round), which the server finishes and commits
    # after the lock is released, its client dead or not. Either way it is all or nothing:
    # the offsets and their per-hour counts, read in one snapshot, agree.
    numbered, counted = numbered_and_counted("seq.one")
    assert numbered == counted
    assert (numbered, counted) in ([(0, 0)] if connection.vendor == "mysql" else [(0, 0), (300, 300)])
    survivor = runconsumer("survivor", "--group", "s1", "--topic", "seq.one")
    wait_until(lambda: Seen.objects.filter(topic="seq.one").count() >= 300, 60, "all 300 messages to be handled")
    assert survivor.terminate() == 0
    # (Garbage collection may already have deleted the handled messages: read the deliveries.)
    seen = list(Seen.objects.filter(topic="seq.one").order_by("offset").values_list("offset", "message_id"))
    assert [o for o, _ in seen] == list(range(1, 301))  # dense offsets, each delivered once
    assert [m for _, m in seen] == [f"m{i}" for i in range(300)]  # in publish order
    assert hourly_count("seq.one") == 300  # counted once, by the round that numbered them


def test_open_transactions_of_random_length_and_two_groups_nothing_skipped_keys_in_order(runconsumer, spawn):
    """4 producers with transactions held open at random + 2 groups x 2 workers.

    Every message is delivered exactly once here, so the workers' leases must not expire
    during the run: they last 20 s (process_settings_steady_leases). With 3 s leases a loaded
    machine once stalled a SQLite worker's renewals behind the producers' write lock for
    longer than the lease; its partitions moved and their in-flight batches were delivered
    again (at-least-once, as designed), which this count reads as duplicates.
    """
    procs = [
        runconsumer(
            f"{group}-{i}",
            "--group",
            group,
            "--topic",
            "seq.events",
            settings="tests.support.process_settings_steady_leases",
        )
        for group in ("s1", "s2")
        for i in range(2)
    ]

    def balanced(group: str) -> bool:
        holders = Counter(
            PartitionLease.objects.filter(consumer_group=group, topic="seq.events").values_list("leased_by", flat=True)
        )
        return sorted(holders.values()) == [4, 4]

    # The leases settle before anything is published: this test is about open transactions
    # and the sequencer, not rebalancing. A partition handed over while its batch is still
    # in a handler is not waited for beyond a third of the lease (leasing.py), and on SQLite
    # a handler's write can wait that long behind a producer's open transaction (the single
    # write lock): a rebalance in the middle of the run could then reorder a key.
    for group in ("s1", "s2"):
        wait_until(lambda group=group: balanced(group), 60, f"group {group}'s leases to be shared 4 and 4")
    start = threading.Barrier(4)

    def producer(n: int) -> list[tuple[str, int]]:
        rng = random.Random(n)
        start.wait()
        sent: list[tuple[str, int]] = []
        counters: dict[str, int] = defaultdict(int)
        for i in range(40):
            with transaction.atomic():
                for _ in range(rng.randint(1, 4)):
                    key = f"p{n}-k{rng.randrange(6)}"
                    publish("seq.events", {"n": counters[key]}, key=key, id=f"{key}-{counters[key]}")
                    sent.append((key, counters[key]))
                    counters[key] += 1
                time.sleep(rng.random() * 0.05 if i != 7 else 1.5)  # one long transaction each
        return sent

    producers = [spawn(lambda n=n: producer(n), name=f"producer-{n}") for n in range(4)]
    sent = [m for p in producers for m in p.join_ok(120)]
    for group in ("s1", "s2"):
        wait_until(
            lambda group=group: Seen.objects.filter(group=group, topic="seq.events").count() >= len(sent),
            90,
            f"group {group} to handle all {len(sent)} messages",
        )
    for process in procs:
        assert process.terminate() == 0
    expected = Counter(f"{key}-{n}" for key, n in sent)
    # Four workers (two per group) sequenced the same partitions: each message counted once.
    assert hourly_count("seq.events") == len(sent)
    for group in ("s1", "s2"):
        rows = list(Seen.objects.filter(group=group, topic="seq.events").values_list("key", "n", "message_id"))
        assert Counter(m for _, _, m in rows) == expected, f"group {group} skipped or repeated messages"
        by_key: dict[str, list[int]] = defaultdict(list)
        for key, n, _ in rows:
            by_key[key].append(n)
        for key, ns in by_key.items():
            assert ns == sorted(ns), f"group {group}: key {key} delivered out of publish order: {ns}"
        if connection.vendor != "sqlite":  # one writer at a time: there one worker may outpace the other
            assert len(set(Seen.objects.filter(group=group).values_list("worker", flat=True))) == 2


def test_keys_spread_over_partitions_and_two_workers_started_together_share_them(runconsumer):
    publish_many("seq.events", [{"payload": {"n": i}, "key": f"customer-{i % 50}"} for i in range(400)])
    a = runconsumer("w-a", "--group", "s1", "--topic", "seq.events")
    b = runconsumer("w-b", "--group", "s1", "--topic", "seq.events")
    wait_until(lambda: Seen.objects.filter(group="s1").count() >= 400, 60, "all 400 messages handled")
    holders = Counter(
        PartitionLease.objects.filter(consumer_group="s1", topic="seq.events").values_list("leased_by", flat=True)
    )
    assert holders == {"w-a": 4, "w-b": 4}
    # Shared from the start: each worker's first acquisition is its fair share, not 7 of 8.
    for process in (a, b):
        first = re.search(r"acquired leases group=s1 topic=seq.events partitions=\[([0-9, ]*)\]", process.log())
        assert first is not None, process.log()[-2000:]
        assert len(first.group(1).split(",")) == 4, f"{process.name} first took {first.group(1)}"
    per_worker = Counter(Seen.objects.filter(group="s1").values_list("worker", flat=True))
    assert set(per_worker) == {"w-a", "w-b"}
    assert set(Seen.objects.filter(group="s1").values_list("partition", flat=True)) == set(range(8))
    assert a.terminate() == 0 and b.terminate() == 0


def test_per_key_topic_serializes_each_key_and_a_slow_key_holds_back_no_other(runconsumer):
    """Opt-in RFC partitions: one partition per key, strictly one message in flight per key.

    The head of key "slow" is nacked for 3 s; every other key flows meanwhile (a nacked
    message holds back no other key -- nor, as everywhere, its own partition's later
    messages: see docs/delivery-semantics.md).
    """
    publish("seq.perkey", {"n": 0, "retry_first": 3}, key="slow", id="slow-0")
    publish("seq.perkey", {"n": 1}, key="slow", id="slow-1")
    publish_many("seq.perkey", [{"payload": {"n": i}, "key": f"fast-{i % 3}", "id": f"fast-{i}"} for i in range(12)])
    worker = runconsumer("perkey", "--group", "s1", "--topic", "seq.perkey")
    wait_until(
        lambda: Seen.objects.filter(topic="seq.perkey", key__startswith="fast").count() >= 12,
        30,
        "the fast keys to be handled",
    )
    wait_until(lambda: Seen.objects.filter(topic="seq.perkey", key="slow").count() == 3, 30, "the slow key")
    retried = Seen.objects.filter(topic="seq.perkey", key="slow", n=0).order_by("id").last()
    assert not Seen.objects.filter(topic="seq.perkey", key__startswith="fast", id__gt=retried.id).exists(), (
        "every other key was handled while the slow key's head waited for its retry"
    )
    assert worker.terminate() == 0
    partitions = dict(Seen.objects.filter(topic="seq.perkey").values_list("key", "partition"))
    assert len(set(partitions.values())) == 4  # one partition per key
    assert PartitionLease.objects.filter(topic="seq.perkey").count() == 0  # released on SIGTERM
    for key in ("fast-0", "fast-1", "fast-2"):
        ns = list(Seen.objects.filter(topic="seq.perkey", key=key).values_list("n", flat=True))
        assert ns == sorted(ns)
