"""LimitStore (``store/limits.py``): GCRA admissions, concurrency slots and postponed
deliveries, against real rows, the database clock and concurrent connections."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest

from django_sqlqueue.db.store.limits import LimitStore
from django_sqlqueue.task_models import ConcurrencySlot, RateLimitState

from ...support.engine_helpers import IN_FLIGHT, RETRY, SCHEDULED, db_now, fetch_due, row, store
from .helpers import A, B, G, T, deliver, fill

pytestmark = pytest.mark.django_db(transaction=True)


# -- rate limits (GCRA) ----------------------------------------------------------------------


def test_the_first_admission_creates_the_row_and_the_next_waits_one_interval():
    s = LimitStore("default")
    assert s.admit_rate("r", 10.0, 1) is None
    assert RateLimitState.objects.filter(name="r").count() == 1
    wait = s.admit_rate("r", 10.0, 1)
    assert wait is not None and 9.0 < wait <= 10.0
    # The refusal wrote nothing: the next admission time did not move.
    again = s.admit_rate("r", 10.0, 1)
    assert again is not None and again <= wait


def test_a_burst_is_admitted_at_once_then_one_per_interval():
    s = store()
    assert [s.admit_rate("b", 0.2, 3) for _ in range(3)] == [None, None, None]
    wait = s.admit_rate("b", 0.2, 3)
    # The database's clock in epoch seconds: SQLite's julianday() keeps milliseconds in a
    # double, so the wait may be off by a few parts in 10**7.
    assert wait is not None and 0.1 < wait <= 0.2 + 1e-3
    time.sleep(wait + 0.02)
    assert s.admit_rate("b", 0.2, 3) is None
    assert s.admit_rate("b", 0.2, 3) is not None


def test_limits_are_independent_by_name():
    s = store()
    assert s.admit_rate("task:x:customer-1", 60.0, 1) is None
    assert s.admit_rate("task:x:customer-1", 60.0, 1) is not None
    assert s.admit_rate("task:x:customer-2", 60.0, 1) is None


def test_concurrent_admissions_never_pass_more_than_the_burst(spawn):
    """Ten connections race for a limit of 4 at once (one a minute after that): 4 admitted,
    whether the row exists already or all of them create it."""
    for name in ("fresh", "existing"):
        if name == "existing":
            store().admit_rate(name, 0.001, 1)  # the row exists, its time is past
            time.sleep(0.01)
        start = threading.Barrier(10)

        def admit(name: str = name, start: threading.Barrier = start) -> bool:
            start.wait(10)
            return store().admit_rate(name, 60.0, 4) is None

        workers = [spawn(admit, name=f"{name}-{i}") for i in range(10)]
        assert sum(w.join_ok() for w in workers) == 4, name


# -- concurrency slots -----------------------------------------------------------------------


def test_slots_are_taken_up_to_the_limit_and_freed_by_their_holder_only():
    s = store()
    assert s.acquire_slot("c", 2, "h1", 60) == 0
    assert s.acquire_slot("c", 2, "h2", 60) == 1
    assert s.acquire_slot("c", 2, "h3", 60) is None
    assert not s.release_slot("c", 0, "h2")  # not its slot
    assert s.release_slot("c", 0, "h1")
    assert s.acquire_slot("c", 2, "h3", 60) == 0
    assert sorted(ConcurrencySlot.objects.filter(name="c").values_list("holder", flat=True)) == ["h2", "h3"]


def test_a_raised_limit_adds_slots_and_a_lowered_one_ignores_the_others():
    s = store()
    assert s.acquire_slot("c", 1, "h1", 60) == 0
    assert s.acquire_slot("c", 1, "h2", 60) is None
    assert s.acquire_slot("c", 3, "h2", 60) == 1
    assert s.acquire_slot("c", 3, "h3", 60) == 2
    assert s.release_slot("c", 0, "h1")
    # Limit 1 again: slots 1 and 2 are not its; slot 0 is free.
    assert s.acquire_slot("c", 1, "h4", 60) == 0
    assert s.acquire_slot("c", 1, "h5", 60) is None


def test_an_expired_slot_is_taken_over_and_its_late_holder_cannot_free_it():
    s = store()
    assert s.acquire_slot("c", 1, "dead", 0.2) == 0
    assert s.acquire_slot("c", 1, "other", 60) is None
    time.sleep(0.3)
    assert s.acquire_slot("c", 1, "other", 60) == 0
    assert not s.release_slot("c", 0, "dead")
    assert ConcurrencySlot.objects.get(name="c", slot=0).holder == "other"


def test_concurrent_acquirers_get_distinct_slots_up_to_the_limit(spawn):
    start = threading.Barrier(8)

    def acquire(i: int) -> int | None:
        start.wait(10)
        return store().acquire_slot("k", 3, f"h{i}", 60)

    workers = [spawn(lambda i=i: acquire(i), name=f"acquirer-{i}") for i in range(8)]
    got = [w.join_ok() for w in workers]
    assert sorted(g for g in got if g is not None) == [0, 1, 2]
    assert ConcurrencySlot.objects.filter(name="k").exclude(holder="").count() == 3


# -- postponing ------------------------------------------------------------------------------


def test_postponed_deliveries_come_back_after_their_delay_without_counting_an_attempt():
    fill(A, 3)
    deliver(A, [1, 2, 3])
    s = store()
    # Offset 2 is on its second attempt: nacked once, then delivered again.
    s.nack(G, T, "w1", [(A, 2, 0.0)], {})
    (due,) = [m for m in fetch_due(G, T, A) if m.offset == 2]
    s.mark_delivered(G, T, "w1", [], [due], [], 60)
    assert (row(G, T, A, 2).retry_count, row(G, T, A, 2).status) == (1, IN_FLIGHT)
    before = db_now()
    s.postpone_deliveries(G, T, "w1", [(A, 1, 30.0), (A, 2, 0.0)])
    first, second = row(G, T, A, 1), row(G, T, A, 2)
    assert (first.status, first.retry_count) == (SCHEDULED, 0)
    assert (second.status, second.retry_count) == (RETRY, 0)
    assert before + dt.timedelta(seconds=29) < first.invisible_until < before + dt.timedelta(seconds=32)
    assert row(G, T, A, 3).status == IN_FLIGHT  # untouched
    # Delivered again: the same attempt numbers as before the postponement.
    (again,) = [m for m in fetch_due(G, T, A) if m.offset == 2]
    s.mark_delivered(G, T, "w1", [], [again], [], 60)
    assert row(G, T, A, 2).retry_count == 1


def test_postponing_writes_only_the_partitions_still_held():
    fill(A, 1)
    fill(B, 1)
    deliver(A, [1])
    deliver(B, [1])
    store().release_leases(G, T, "w1", [B])  # B is no longer w1's
    store().postpone_deliveries(G, T, "w1", [(A, 1, 5.0), (B, 1, 5.0)])
    assert row(G, T, A, 1).status == SCHEDULED
    assert row(G, T, B, 1).status == IN_FLIGHT
