"""Messages per topic per hour (``queue_topic_hours``): counted by the sequencer, kept by GC.

The sequencer adds every message it numbers to its (topic, hour of ``published_at``,
``partition % TOPIC_HOUR_SLOTS``) counter in the numbering transaction; the report reads
the counters (``MessageReportStore.messages_per_hour``), so a topic whose log was
garbage-collected still shows; garbage collection prunes counters older than
``STATS_RETENTION``. The report's HTML over them: tests/spark/test_pipelines.py.
"""

from __future__ import annotations

import datetime as dt
import importlib
import threading
import types
from collections import Counter

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_sqlqueue import publish_many
from django_sqlqueue.db import sequencer as sequencer_module
from django_sqlqueue.db.retry import Retrying
from django_sqlqueue.db.sequencer import Sequencer, sequence
from django_sqlqueue.models import TOPIC_HOUR_SLOTS, ConsumerOffset, Message, Partition, TopicHour
from django_sqlqueue.ops.gc import collect_garbage
from django_sqlqueue.worker.outage import OutageReporter
from django_sqlqueue.worker.threads.collector import GarbageCollector

from ..support.engine_helpers import fast_conf, key_for_partition, not_on_sqlite, publish_to, store

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = dt.timedelta(hours=1)


def this_hour() -> dt.datetime:
    return timezone.now().replace(minute=0, second=0, microsecond=0)


def counters(topic: str) -> dict[tuple[dt.datetime, int], int]:
    """{(hour, slot): messages} of ``topic``."""
    return {(h, s): n for h, s, n in TopicHour.objects.filter(topic=topic).values_list("hour", "slot", "messages")}


def per_hour(topic: str) -> dict[dt.datetime, int]:
    return dict(store().messages_per_hour(this_hour() - 48 * HOUR).get(topic, []))


def log_per_hour_and_slot(topic: str) -> Counter[tuple[dt.datetime, int]]:
    """What the counters must say, counted from the log (Python, not SQL)."""
    return Counter(
        (published.replace(minute=0, second=0, microsecond=0), partition % TOPIC_HOUR_SLOTS)
        for partition, published in Message.objects.filter(topic=topic, offset__isnull=False).values_list(
            "partition", "published_at"
        )
    )


def publish_unsequenced(topic: str, partition: int, n: int) -> None:
    publish_to(topic, partition, n, seq=False)


def test_each_numbered_message_is_counted_once_in_its_hour_and_slot():
    for partition, n in ((0, 5), (1, 3), (5, 2)):
        publish_unsequenced("th.count", partition, n)
    # Two of partition 0's messages were published two hours ago (still unsequenced).
    early = Message.objects.filter(topic="th.count", partition=0).order_by("seq").values_list("seq", flat=True)[:2]
    Message.objects.filter(seq__in=list(early)).update(published_at=timezone.now() - 2 * HOUR)
    assert TopicHour.objects.filter(topic="th.count").count() == 0  # publishing counts nothing
    sequence("th.count")
    assert counters("th.count") == dict(log_per_hour_and_slot("th.count"))
    assert sum(counters("th.count").values()) == 10
    hours = per_hour("th.count")
    assert sum(hours.values()) == 10 and hours[this_hour() - 2 * HOUR] == 2
    before = counters("th.count")
    assert sequence("th.count") == {}  # nothing new: nothing counted
    publish_unsequenced("th.count", 1, 4)
    Sequencer("default").sequence("th.count", [1], limit=3)  # a round numbering part of the backlog
    Sequencer("default").sequence("th.count", [1], limit=3)
    after = counters("th.count")
    assert sum(after.values()) == 14 and after == dict(log_per_hour_and_slot("th.count"))
    assert after[(max(h for h, _ in before), 1)] == before[(max(h for h, _ in before), 1)] + 4


def test_a_round_that_rolls_back_counts_nothing_and_the_next_counts_it():
    publish_unsequenced("th.rollback", 2, 6)
    sequence("th.rollback", [2])  # head row; numbers the 6
    publish_unsequenced("th.rollback", 2, 3)
    with pytest.raises(RuntimeError), transaction.atomic():
        assert Sequencer("default").sequence("th.rollback", [2]) == {2: 9}
        raise RuntimeError("the round's transaction fails after counting")
    assert sum(counters("th.rollback").values()) == 6
    assert Partition.objects.get(topic="th.rollback", partition=2).head_offset == 6
    assert sequence("th.rollback") == {2: 9}
    assert sum(counters("th.rollback").values()) == 9


def test_topics_compare_exactly():
    """Topics differing in case are two counters (MySQL: the table's binary collation)."""
    publish_to("th.Case", 0, 2)
    publish_to("th.case", 0, 3)
    assert sum(counters("th.Case").values()) == 2
    assert sum(counters("th.case").values()) == 3


@not_on_sqlite("one writer: sequencers take turns at BEGIN IMMEDIATE, nothing runs concurrently")
@pytest.mark.parametrize("slots", [TOPIC_HOUR_SLOTS, 2, 1], ids=["striped", "two-shared-rows", "one-shared-row"])
def test_concurrent_sequencers_count_every_message_exactly_once(spawn, monkeypatch, slots):
    """A publisher and four sequencers at once: two numbering every partition (they take
    turns on the head locks) and two numbering halves of the partitions (they run side by
    side). With one slot every round of the topic updates the same counter row."""
    monkeypatch.setattr(sequencer_module, "TOPIC_HOUR_SLOTS", slots)
    topic = "th.concurrent"
    partitions = list(range(8))
    keys = [key_for_partition(p) for p in partitions]
    sequence(topic, partitions)  # head rows
    done = threading.Event()
    rounds = Counter[str]()

    def publisher() -> None:
        try:
            for batch in range(40):
                publish_many(topic, [{"payload": i, "key": keys[(batch + i) % 8]} for i in range(25)])
        finally:
            done.set()

    def sequencer(name: str, wanted: list[int]) -> None:
        s = Sequencer("default")
        while not done.is_set():
            if s.sequence(topic, wanted, limit=7):
                rounds[name] += 1
        while s.sequence(topic, wanted, limit=7):
            rounds[name] += 1

    workers = [spawn(publisher, "publisher")]
    workers += [spawn(lambda n=n: sequencer(n, partitions), n) for n in ("all-1", "all-2")]
    workers += [spawn(lambda: sequencer("low", partitions[:4]), "low")]
    workers += [spawn(lambda: sequencer("high", partitions[4:]), "high")]
    for worker in workers:
        worker.join(60)
    assert sequence(topic) == {}
    assert Message.objects.filter(topic=topic, offset__isnull=True).count() == 0
    assert sum(rounds.values()) > 8, rounds
    expected = Counter(
        (published.replace(minute=0, second=0, microsecond=0), partition % slots)
        for partition, published in Message.objects.filter(topic=topic).values_list("partition", "published_at")
    )
    assert counters(topic) == dict(expected)
    assert sum(counters(topic).values()) == 1000


def consume_everything(group: str, topic: str) -> None:
    now = timezone.now()
    for head in Partition.objects.filter(topic=topic):
        ConsumerOffset.objects.update_or_create(
            consumer_group=group,
            topic=topic,
            partition=head.partition,
            defaults={"offset_acked": head.head_offset, "updated_at": now},
        )


def test_a_topic_consumed_and_garbage_collected_still_has_its_messages_per_hour():
    publish_to("th.gone", 0, 7)
    publish_to("th.gone", 3, 5)
    assert store().register_topic("th.gone", 8) == 8
    consume_everything("g", "th.gone")
    assert collect_garbage(topics=["th.gone"]) == {"th.gone": 12}
    assert not Message.objects.filter(topic="th.gone").exists()
    assert "th.gone" not in store().log_topics()
    assert per_hour("th.gone") == {this_hour(): 12}


def test_garbage_collection_prunes_counters_older_than_stats_retention():
    hour = this_hour()
    for age in (0, 2, 5, 30):
        TopicHour.objects.create(topic="th.prune", hour=hour - age * HOUR, slot=0, messages=age + 1)
    TopicHour.objects.create(topic="th.prune.other", hour=hour - 30 * HOUR, slot=3, messages=9)
    with override_settings(SQLQUEUE={"STATS_RETENTION": 4 * 3600}):
        collect_garbage(topics=[])  # the counters of every topic, whatever topics are collected
    assert sorted(counters("th.prune")) == [(hour - 2 * HOUR, 0), (hour, 0)]
    assert not TopicHour.objects.filter(topic="th.prune.other").exists()
    # The default keeps 30 days.
    TopicHour.objects.create(topic="th.prune", hour=hour - 29 * 24 * HOUR, slot=0, messages=1)
    TopicHour.objects.create(topic="th.prune", hour=hour - 31 * 24 * HOUR, slot=0, messages=1)
    collect_garbage(topics=[])
    assert sorted(h for h, _ in counters("th.prune")) == [hour - 29 * 24 * HOUR, hour - 2 * HOUR, hour]


def test_a_workers_garbage_collection_prunes_the_counters_too():
    hour = this_hour()
    TopicHour.objects.create(topic="th.worker", hour=hour - 3 * HOUR, slot=0, messages=1)
    TopicHour.objects.create(topic="th.worker", hour=hour, slot=0, messages=1)
    collector = GarbageCollector(
        [],
        store(),
        fast_conf(STATS_RETENTION=3600.0),
        db=Retrying("default", threading.Event()),
        outage=OutageReporter(alias="default", report_interval=30),
    )
    collector.run()
    assert list(counters("th.worker")) == [(hour, 0)]


def test_the_migrations_backfill_counts_the_numbered_messages_still_in_the_log():
    publish_to("th.backfill", 0, 4)
    publish_to("th.backfill", 6, 2)
    publish_unsequenced("th.backfill", 6, 3)  # not numbered yet: the sequencer will count them
    TopicHour.objects.all().delete()
    migration = importlib.import_module("django_sqlqueue.migrations.0007_topic_hours")
    migration.backfill(None, types.SimpleNamespace(connection=connection))
    assert counters("th.backfill") == dict(log_per_hour_and_slot("th.backfill"))
    assert sum(counters("th.backfill").values()) == 6
    sequence("th.backfill")
    assert sum(counters("th.backfill").values()) == 9
