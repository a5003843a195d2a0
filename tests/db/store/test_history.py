"""The console's per-minute history (django_sqlqueue/db/store/history.py): counted by the
real transactions of a running worker (acks, nacks, dead letters, atomic acks, the
sequencer's round), sampled lags, pruning, and nothing at all when it is turned off."""

from __future__ import annotations

import pytest
from django.db.models import Max, Sum

from django_sqlqueue.db.store.history import MINUTE
from django_sqlqueue.models import HISTORY_SLOTS, HistoryMinute, Message

from ...support.engine_helpers import caught_up, fast_conf, publish_to, running, spec, store, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def totals(group: str, topic: str) -> dict[str, int | None]:
    rows = HistoryMinute.objects.filter(consumer_group=group, topic=topic)
    got = rows.aggregate(
        handled=Sum("handled"), failed=Sum("failed"), retried=Sum("retried"), dead_lettered=Sum("dead_lettered")
    )
    return {k: v or 0 for k, v in got.items()}


def published(topic: str) -> int:
    return HistoryMinute.objects.filter(consumer_group="", topic=topic).aggregate(n=Sum("published"))["n"] or 0


def test_a_worker_counts_handled_failed_retried_and_dead_lettered_exactly():
    topic = "hist.outcomes"
    attempts: dict[str, int] = {}

    def handler(message):
        i = message.payload["i"]
        attempts[i] = attempts.get(i, 0) + 1
        if i % 5 == 0:  # 2 of 10: fail every attempt (2 attempts, then a dead letter)
            raise RuntimeError(f"always {i}")
        if i % 3 == 0 and attempts[i] == 1:  # 3, 6, 9: fail once, then succeed
            raise RuntimeError(f"once {i}")

    publish_to(topic, 1, 6)
    publish_to(topic, 6, 4, payload=lambda i: {"i": i + 6})
    assert published(topic) == 10  # counted by the sequencer's rounds, per minute of published_at
    with running([spec(topic, "hg", handler, max_attempts=2)], conf=fast_conf(BACKOFF_MIN=0.01, BACKOFF_MAX=0.02)):
        wait_until(lambda: caught_up("hg", topic), 30, "the group to be at the heads")
    assert totals("hg", topic) == {"handled": 8, "failed": 3 + 2 * 2, "retried": 3 + 2, "dead_lettered": 2}
    # Striped per partition: 1 and 6 are slots 1 and 2.
    slots = set(HistoryMinute.objects.filter(consumer_group="hg", topic=topic).values_list("slot", flat=True))
    assert slots <= {0, 1 % HISTORY_SLOTS, 6 % HISTORY_SLOTS} and {1, 2} <= slots
    # The worker sampled the lag of every group into slot 0 of the current minute.
    assert HistoryMinute.objects.filter(consumer_group="hg", topic=topic, slot=0, lag__isnull=False).exists()


def test_atomic_consumers_count_their_acks_in_the_handler_transaction():
    topic = "hist.atomic"
    publish_to(topic, 3, 5)
    with running([spec(topic, "ha", lambda m: None, atomic=True)]):
        wait_until(lambda: caught_up("ha", topic), 30, "the atomic group to be at the heads")
    assert totals("ha", topic)["handled"] == 5


def test_the_lag_sample_is_every_groups_lag_now():
    topic = "hist.lag"
    publish_to(topic, 2, 7)
    s = store()
    s.register_topic(topic, 8)
    s.ensure_offsets("idle", topic, list(range(8)))  # a group that handles nothing: lag 7
    assert s.record_lags(s.lags(s.consumer_pairs(topic=topic))) == 1
    row = HistoryMinute.objects.get(consumer_group="idle", topic=topic, slot=0)
    assert row.lag == 7 and row.minute == s.now_minute()
    publish_to(topic, 2, 3)
    s.record_lags(s.lags(s.consumer_pairs(topic=topic)))  # the minute keeps its last sample
    assert HistoryMinute.objects.get(consumer_group="idle", topic=topic, slot=0, minute=row.minute).lag in (10, 7)


def test_minutes_are_the_database_clocks():
    s = store()
    before = s.now()
    minute = s.now_minute()
    assert abs(minute * MINUTE - before.timestamp()) < 2 * MINUTE


def test_pruning_deletes_only_minutes_older_than_the_retention():
    s = store()
    now = s.now_minute()
    for age in (0, 59, 61, 60 * 24 * 8):
        HistoryMinute.objects.create(consumer_group="g", topic="hist.prune", minute=now - age, slot=0, handled=1)
    assert s.prune_history(3600) == 2
    left = sorted(now - m for m in HistoryMinute.objects.values_list("minute", flat=True))
    assert left == [0, 59]


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


def test_published_counts_outlive_the_messages():
    topic = "hist.gc"
    publish_to(topic, 4, 3)
    with running([spec(topic, "hgc", lambda m: None)], conf=fast_conf(GC_INTERVAL=0.05)):
        wait_until(lambda: caught_up("hgc", topic), 30, "the group to be at the heads")
        wait_until(lambda: not Message.objects.filter(topic=topic).exists(), 10, "GC to delete the messages")
    assert published(topic) == 3 and totals("hgc", topic)["handled"] == 3
    assert HistoryMinute.objects.aggregate(m=Max("minute"))["m"] <= store().now_minute()
