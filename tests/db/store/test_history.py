"""The console's history (django_sqlqueue/db/store/history.py): running totals added by
the real transactions of a running worker (acks, nacks, dead letters, atomic acks), samples
of every group's totals, heads and lag, pruning, and nothing at all when it is turned off."""

from __future__ import annotations

import pytest
from django.db.models import Sum

from django_sqlqueue.db.store.history import MINUTE
from django_sqlqueue.models import ConsumerOffset, HistoryMinute, Message

from ...support.engine_helpers import caught_up, fast_conf, publish_to, running, spec, store, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def totals(group: str, topic: str) -> dict[str, int]:
    got = ConsumerOffset.objects.filter(consumer_group=group, topic=topic).aggregate(
        handled=Sum("handled_total"),
        failed=Sum("failed_total"),
        retried=Sum("retried_total"),
        dead_lettered=Sum("dead_lettered_total"),
    )
    return {k: v or 0 for k, v in got.items()}


def test_a_worker_adds_handled_failed_retried_and_dead_lettered_exactly():
    topic = "hist.outcomes"
    attempts: dict[int, int] = {}

    def handler(message):
        i = message.payload["i"]
        attempts[i] = attempts.get(i, 0) + 1
        if i % 5 == 0:  # 2 of 10: fail every attempt (2 attempts, then a dead letter)
            raise RuntimeError(f"always {i}")
        if i % 3 == 0 and attempts[i] == 1:  # 3, 6, 9: fail once, then succeed
            raise RuntimeError(f"once {i}")

    publish_to(topic, 1, 6)
    publish_to(topic, 6, 4, payload=lambda i: {"i": i + 6})
    with running([spec(topic, "hg", handler, max_attempts=2)], conf=fast_conf(BACKOFF_MIN=0.01, BACKOFF_MAX=0.02)):
        wait_until(lambda: caught_up("hg", topic), 30, "the group to be at the heads")
    assert totals("hg", topic) == {"handled": 8, "failed": 3 + 2 * 2, "retried": 3 + 2, "dead_lettered": 2}
    # Per partition: 1 has i = 1..6 (3 and 6 retried once, 5 dead), 6 has 7..10 (9 once, 10 dead).
    p1 = ConsumerOffset.objects.get(consumer_group="hg", topic=topic, partition=1)
    assert (p1.handled_total, p1.failed_total, p1.dead_lettered_total) == (5, 4, 1)
    # The worker sampled every group at once when it started: a row of this minute.
    assert HistoryMinute.objects.filter(consumer_group="hg", topic=topic).exists()


def test_atomic_consumers_add_their_acks_in_the_handler_transaction():
    topic = "hist.atomic"
    publish_to(topic, 3, 5)
    with running([spec(topic, "ha", lambda m: None, atomic=True)]):
        wait_until(lambda: caught_up("ha", topic), 30, "the atomic group to be at the heads")
    assert totals("ha", topic)["handled"] == 5


def test_a_sample_stores_every_groups_totals_heads_and_lag_under_this_minute():
    topic = "hist.lag"
    publish_to(topic, 2, 7)
    s = store()
    s.register_topic(topic, 8)
    s.ensure_offsets("idle", topic, list(range(8)))  # a group that handles nothing: lag 7
    ConsumerOffset.objects.filter(consumer_group="idle", topic=topic, partition=2).update(handled_total=40)
    assert s.sample() == 1
    row = HistoryMinute.objects.get(consumer_group="idle", topic=topic)
    assert (row.published, row.handled, row.lag, row.minute) == (7, 40, 7, s.now_minute())
    publish_to(topic, 2, 3, seq=False)  # unsequenced: in the lag, not (yet) published
    s.sample()  # the minute keeps its last sample
    row = HistoryMinute.objects.get(consumer_group="idle", topic=topic, minute=row.minute)
    assert (row.published, row.lag) == (7, 10)
    # A sampler whose read is older never lowers a total; the lag is the last sample's.
    from django.db import connection

    with connection.cursor() as cursor:
        s.dialect.store_sample(cursor, [("idle", topic, [5, 1, 0, 0, 0], 3)])
    row = HistoryMinute.objects.get(consumer_group="idle", topic=topic, minute=row.minute)
    assert (row.published, row.handled, row.lag) == (7, 40, 3)


def test_minutes_are_the_database_clocks():
    s = store()
    before = s.now()
    assert abs(s.now_minute() * MINUTE - before.timestamp()) < 2 * MINUTE


def test_pruning_deletes_only_minutes_older_than_the_retention():
    s = store()
    now = s.now_minute()
    for age in (0, 59, 61, 60 * 24 * 8):
        HistoryMinute.objects.create(consumer_group="g", topic="hist.prune", minute=now - age, handled=1)
    assert s.prune_history(3600) == 2
    assert sorted(now - m for m in HistoryMinute.objects.values_list("minute", flat=True)) == [0, 59]


def test_history_off_writes_nothing(settings):
    settings.SQLQUEUE = {**settings.SQLQUEUE, "HISTORY_RETENTION": 0}
    topic = "hist.off"
    publish_to(topic, 0, 4)

    def fail_odd(message):
        if message.payload["i"] % 2:
            raise RuntimeError("odd")

    conf = fast_conf(HISTORY_RETENTION=0, BACKOFF_MIN=0.01, BACKOFF_MAX=0.02)
    with running([spec(topic, "hoff", fail_odd, max_attempts=1)], conf=conf):
        wait_until(lambda: caught_up("hoff", topic), 30, "the group to be at the heads")
    assert not HistoryMinute.objects.exists()
    assert totals("hoff", topic) == {"handled": 0, "failed": 0, "retried": 0, "dead_lettered": 0}


def test_the_totals_outlive_the_messages():
    topic = "hist.gc"
    publish_to(topic, 4, 3)
    with running([spec(topic, "hgc", lambda m: None)], conf=fast_conf(GC_INTERVAL=0.05)):
        wait_until(lambda: caught_up("hgc", topic), 30, "the group to be at the heads")
        wait_until(lambda: not Message.objects.filter(topic=topic).exists(), 10, "GC to delete the messages")
    store().sample()
    row = HistoryMinute.objects.get(consumer_group="hgc", topic=topic)
    assert (row.published, row.handled, row.lag) == (3, 3, 0)
