"""A worker's garbage collection between polls (django_sqlqueue/worker/threads/collector.py)."""

from __future__ import annotations

import threading

import pytest

from django_sqlqueue.db.retry import Retrying
from django_sqlqueue.models import Message
from django_sqlqueue.worker.outage import OutageReporter
from django_sqlqueue.worker.subscription import Subscription
from django_sqlqueue.worker.threads.collector import GarbageCollector

from ...support.engine_helpers import Calls, caught_up, fast_conf, leased, publish_to, running, spec, store, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


class Clock:
    """The collector's interval clock (a worker-local monotonic clock, not the database's)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def collector(sub: Subscription, clock: Clock, **conf) -> GarbageCollector:
    return GarbageCollector(
        [sub],
        store(),
        fast_conf(**conf),
        db=Retrying("default", threading.Event()),
        outage=OutageReporter(alias="default", report_interval=30),
        clock=clock,
    )


def test_collects_only_the_held_partitions_and_only_when_due():
    topic = "col.held"
    publish_to(topic, 0, 3)
    publish_to(topic, 1, 2)
    s = store()
    s.ensure_offsets("g", topic, [0, 1])
    leased("g", topic, 0)
    leased("g", topic, 1)
    assert s.ack_contiguous("g", topic, "w1", [(0, 0, 3), (1, 0, 2)]) == []
    sub = Subscription.create(spec(topic, "g", lambda m: None), "w1", fast_conf())
    sub.held = frozenset({0})
    clock = Clock()
    gc = collector(sub, clock, GC_INTERVAL=60)
    gc.run_if_due()
    assert Message.objects.filter(topic=topic).count() == 5  # not due yet
    clock.now = 60
    gc.run_if_due()
    assert sorted(Message.objects.filter(topic=topic).values_list("partition", flat=True)) == [1, 1]
    clock.now = 90
    sub.held = frozenset({0, 1})
    gc.run_if_due()
    assert Message.objects.filter(topic=topic).count() == 2  # 30 s later: not due again yet
    assert gc.run() == 2


def test_a_worker_collects_what_its_group_acked_between_polls():
    topic = "col.worker"
    publish_to(topic, 0, 4)
    calls = Calls()
    with running([spec(topic, "g", calls.add)], conf=fast_conf(GC_INTERVAL=0.2)):
        wait_until(lambda: caught_up("g", topic), what="caught up")
        wait_until(lambda: not Message.objects.filter(topic=topic).exists(), what="collected by the worker")
    assert len(calls) == 4


def test_a_pass_cut_short_by_its_round_budget_goes_on_next_round_without_waiting(monkeypatch):
    from django_sqlqueue.db.store import gc as gc_store
    from django_sqlqueue.worker.threads import collector as collector_module

    topic = "col.backlog"
    publish_to(topic, 0, 12)
    s = store()
    s.ensure_offsets("g", topic, [0])
    leased("g", topic, 0)
    assert s.ack_contiguous("g", topic, "w1", [(0, 0, 12)]) == []
    sub = Subscription.create(spec(topic, "g", lambda m: None), "w1", fast_conf())
    sub.held = frozenset({0})
    # Statements of 3 rows and a round budget that one statement spends: 4 rounds.
    monkeypatch.setattr(gc_store, "FIRST_SPAN", 3)
    monkeypatch.setattr(gc_store, "MAX_SPAN", 3)
    monkeypatch.setattr(collector_module, "ROUND_BUDGET", 1e-9)
    clock = Clock()
    gc = collector(sub, clock, GC_INTERVAL=60)
    clock.now = 60
    left = []
    for _ in range(6):
        gc.run_if_due()  # the clock stays at 60: only the unfinished pass makes it due
        left.append(Message.objects.filter(topic=topic).count())
    assert left[0] in (9, 12) and left[-1] == 0
    assert left == sorted(left, reverse=True) and len(set(left)) >= 4
