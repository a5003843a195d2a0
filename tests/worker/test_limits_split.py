"""Head of line under a concurrency limit (django_sqlqueue/worker/limits.py, "Head of line";
dispatch.py, "Detached batches"), through a real batch runner against the real database: a
batch's keyless concurrency-limited messages run after its other ones, or are handed back at
once when this process knows their limit is full; keyed ones keep their place; a detached
batch leaves its partition pollable but is waited for before a lease goes."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from django_sqlqueue.rules.rates import Limits
from django_sqlqueue.worker.batch.handlers import HandlerRunner
from django_sqlqueue.worker.dispatch import Inline
from django_sqlqueue.worker.subscription import PartitionsInFlight
from tests.support.engine_helpers import SCHEDULED, row, store

from .batch.helpers import leased_batch

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "limits.split"


def _odd_ones_limited(received):
    """Messages 1, 3, 5 are limited to one at a time (one limit), 2 and 4 are not."""
    return Limits(concurrency=("split:hot", 1)) if received.payload["i"] % 2 else None


def _scene(handler):
    """Five messages of partition 0: 1 and 3 keyless (limited), 2 and 4 keyless (plain), 5 keyed (limited)."""
    runner, sub, fetched, stats = leased_batch(TOPIC, handler, 5, limits_for=_odd_ones_limited)
    batch = [m if m.offset == 5 else replace(m, key="") for m in fetched]
    return runner, sub, batch, stats


def test_nothing_is_looked_at_before_a_concurrency_limited_delivery_was_seen() -> None:
    runner, sub, batch, _ = _scene(print)
    split = runner.limiter.split(sub, batch, lambda m: runner.received(sub, m, None))
    assert ([m.offset for m in split.head], split.tail, split.waiting) == ([1, 2, 3, 4, 5], [], [])


def test_keyless_limited_messages_run_after_the_others_and_keyed_ones_keep_their_place() -> None:
    calls: list[int] = []
    runner, sub, batch, stats = _scene(lambda m: calls.append(m.offset))
    runner.limiter.deferring.add((sub.group, sub.topic))  # as after a first limited delivery
    Inline(runner, HandlerRunner()).run(sub, {0: batch}, {0: 0})
    # 5 (keyed) took the slot in its place and freed it; 1 and 3, after the others, one at a time.
    assert calls == [2, 4, 5, 1, 3]
    assert (stats.acked, stats.postponed) == (5, 0)


def test_when_the_limit_is_known_full_they_are_handed_back_without_running() -> None:
    calls: list[int] = []
    runner, sub, batch, stats = _scene(lambda m: calls.append(m.offset))
    assert store().acquire_slot("split:hot", 1, "another worker", 60) == 0
    # A first refusal by the database: this process now knows the limit is full.
    assert runner.limiter.admit(sub, runner.received(sub, batch[4], None), None).wait is not None
    split = runner.limiter.split(sub, batch, lambda m: runner.received(sub, m, None))
    assert ([m.offset for m in split.head], split.tail) == ([2, 4, 5], [])
    assert [(p, o) for p, o, _ in split.waiting] == [(0, 1), (0, 3)]
    assert split.waiting[0][2] < split.waiting[1][2]  # one after the other in the queue of returns
    Inline(runner, HandlerRunner()).run(sub, {0: batch}, {0: 0})
    assert calls == [2, 4]  # 5 (keyed) was refused by the limit when its turn came
    assert (stats.acked, stats.postponed) == (2, 3)
    for offset in (1, 3, 5):
        assert (row("g", TOPIC, 0, offset).status, row("g", TOPIC, 0, offset).retry_count) == (SCHEDULED, 0)


def test_a_detached_batch_leaves_its_partition_pollable_and_a_lease_waits_for_it() -> None:
    busy = PartitionsInFlight()
    busy.add((3,))
    busy.add((3,), detached=True)
    busy.add((3,), detached=True)
    busy.discard((3,))
    assert busy.snapshot() == frozenset()  # the poll loop may fetch partition 3 again
    assert not busy.wait_idle([3], timeout=0.01)  # the lease keeper still waits
    busy.discard((3,), detached=True)
    assert not busy.wait_idle(None, timeout=0.01)  # counted: one detached batch is left
    threading.Timer(0.05, busy.discard, ((3,), True)).start()
    began = time.monotonic()
    assert busy.wait_idle([3], timeout=5)
    assert 0.03 < time.monotonic() - began < 4
