"""Limits checked before the handler (django_sqlqueue/worker/limits.py), through a real batch
runner against the real database: a message over its limit is handed back to wait, not an
attempt; a slot is held while the handler runs; a plain consumer pays nothing."""

from __future__ import annotations

import itertools
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_sqlqueue import ConfigurationError, consumer
from django_sqlqueue.consumers import registry
from django_sqlqueue.rules.rates import Limits, parse_rate
from django_sqlqueue.task_models import ConcurrencySlot
from django_sqlqueue.worker.batch.handlers import HandlerRunner
from django_sqlqueue.worker.limits import CONCURRENCY_RECHECK, FULL_FOR, WAIT_IN_PROCESS
from tests.support.engine_helpers import SCHEDULED, db_now, delivery_rows, row, store, watermark

from .batch.helpers import leased_batch

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "limits.t"


def test_a_consumer_over_its_rate_runs_one_and_hands_the_others_back_to_wait() -> None:
    seen: list[int] = []
    runner, sub, fetched, stats = leased_batch(TOPIC, lambda m: seen.append(m.offset), 3, rate_limit="1/m")
    before = db_now()
    assert runner.run(sub, fetched, {0: 0}, HandlerRunner()) == 3
    assert seen == [1]
    assert (stats.delivered, stats.acked, stats.nacked, stats.postponed) == (1, 1, 0, 2)
    assert watermark("g", TOPIC) == 1
    for offset in (2, 3):
        waiting = row("g", TOPIC, 0, offset)
        assert (waiting.status, waiting.retry_count) == (SCHEDULED, 0) and not waiting.last_error
        # Due again when the next admission could pass: about a minute on (the second one
        # spaced one interval after the first, without asking the database again).
        assert (waiting.invisible_until - before).total_seconds() > 55


def test_the_second_refusal_of_a_known_full_rate_costs_no_statement() -> None:
    runner, sub, fetched, _ = leased_batch(TOPIC, print, 3, rate_limit="1/m")
    with CaptureQueriesContext(connection) as queries:
        runner.run(sub, fetched, {0: 0}, HandlerRunner())
    limit_statements = [q["sql"] for q in queries.captured_queries if "queue_rate_limits" in q["sql"]]
    # First message: the admission (an UPDATE that misses), the read that finds no row, the
    # row created, the UPDATE again. Second: one refused UPDATE and the read of the next
    # admission time. Third: nothing (known to refuse until then).
    assert [sql.split()[0] for sql in limit_statements] == ["UPDATE", "SELECT", "INSERT", "UPDATE", "UPDATE", "SELECT"]


def test_a_plain_consumer_runs_no_limit_statement() -> None:
    runner, sub, fetched, stats = leased_batch(TOPIC, print, 3)
    with CaptureQueriesContext(connection) as queries:
        runner.run(sub, fetched, {0: 0}, HandlerRunner())
    assert stats.acked == 3 and stats.postponed == 0
    assert not [q for q in queries.captured_queries if "queue_rate_limits" in q["sql"] or "concurrency" in q["sql"]]


def _by_offset(name: str, n: int):
    return lambda received: Limits(concurrency=(f"{name}:{received.offset % 2}", n))


def test_a_slot_is_held_while_the_handler_runs_and_freed_after_it_returned_or_raised() -> None:
    held: list[list[str]] = []

    def handler(m):
        held.append(list(ConcurrencySlot.objects.exclude(holder="").values_list("name", flat=True)))
        if m.offset == 2:
            raise ValueError("boom")

    runner, sub, fetched, stats = leased_batch(TOPIC, handler, 2, limits_for=_by_offset("c", 1))
    runner.run(sub, fetched, {0: 0}, HandlerRunner())
    assert held == [["c:1"], ["c:0"]]
    assert stats.nacked == 1 and stats.acked == 1 and stats.postponed == 0
    assert not ConcurrencySlot.objects.exclude(holder="").exists()


def test_a_full_key_waits_and_other_keys_run() -> None:
    seen: list[int] = []
    s = store()
    assert s.acquire_slot("k:1", 1, "someone else", 60) == 0  # key 1 is full
    runner, sub, fetched, stats = leased_batch(TOPIC, lambda m: seen.append(m.offset), 4, limits_for=_by_offset("k", 1))
    runner.run(sub, fetched, {0: 0}, HandlerRunner())
    assert seen == [2, 4]  # key 0; key 1's messages (1 and 3) wait
    assert stats.postponed == 2
    waiting = [(r.message_offset, r.status, r.retry_count) for r in delivery_rows("g", TOPIC) if not r.acked]
    assert waiting == [(1, SCHEDULED, 0), (3, SCHEDULED, 0)]
    # Due again in this process's queue of returns for the limit: the first soon (FULL_FOR),
    # the next one spacing later (a run's assumed length / n, no run timed yet), +-10% jitter.
    due = [(row("g", TOPIC, 0, offset).invisible_until - db_now()).total_seconds() for offset in (1, 3)]
    assert 0 < due[0] <= 1.1 * FULL_FOR + 0.02
    assert 0.9 * (FULL_FOR + CONCURRENCY_RECHECK) - 0.05 <= due[1] <= 1.1 * (FULL_FOR + CONCURRENCY_RECHECK)
    assert row("g", TOPIC, 0, 2).acked and row("g", TOPIC, 0, 4).acked


def test_a_rate_refusal_due_within_a_tenth_of_a_second_waits_in_process() -> None:
    started: list[float] = []
    runner, sub, fetched, stats = leased_batch(TOPIC, lambda m: started.append(time.monotonic()), 3, rate_limit="20/s")
    runner.run(sub, fetched, {0: 0}, HandlerRunner())
    # Not handed back (the next admission was 50 ms away): waited for in the handler
    # thread, so each admission is taken when it comes, none lost to a poll's delay.
    assert (stats.acked, stats.postponed) == (3, 0)
    gaps = [b - a for a, b in itertools.pairwise(started)]
    assert all(0.04 <= gap < 0.05 + WAIT_IN_PROCESS for gap in gaps), gaps


def test_a_rate_refusal_due_later_than_that_is_handed_back() -> None:
    runner, sub, fetched, stats = leased_batch(TOPIC, print, 2, rate_limit="5/s")  # 200 ms apart
    began = time.monotonic()
    runner.run(sub, fetched, {0: 0}, HandlerRunner())
    assert (stats.acked, stats.postponed) == (1, 1)
    assert time.monotonic() - began < 0.15  # not waited for
    due_in = (row("g", TOPIC, 0, 2).invisible_until - db_now()).total_seconds()
    assert 0.05 < due_in <= 0.2


@pytest.mark.parametrize("atomic", [True, "batch"])
def test_atomic_consumers_check_their_limits_outside_the_transaction(atomic: bool | str) -> None:
    seen: list[tuple[int, bool]] = []

    def handler(m):
        seen.append((m.offset, connection.in_atomic_block))

    runner, sub, fetched, stats = leased_batch(TOPIC, handler, 3, atomic=atomic, rate_limit="1/m")
    runner.run(sub, fetched, {0: 0}, HandlerRunner())
    assert seen == [(1, True)]
    assert stats.postponed == 2 and stats.acked == 1
    assert row("g", TOPIC, 0, 2).status == SCHEDULED


def test_a_bad_consumer_rate_limit_is_refused_with_the_consumer_named() -> None:
    with pytest.raises(ConfigurationError, match=r"consumer g:limits\.bad: rate limit '20 per second' is not"):

        @consumer("limits.bad", group="g", rate_limit="20 per second")
        def handler(m) -> None: ...

    assert ("g", "limits.bad") not in {(s.group, s.topic) for s in registry.all()}
    assert parse_rate("30/10s").interval == pytest.approx(1 / 3)


def test_refusals_of_a_rate_come_back_one_interval_apart_in_a_queue_that_outlives_them() -> None:
    runner, sub, fetched, stats = leased_batch(TOPIC, print, 4, rate_limit="1/m")
    runner.run(sub, fetched, {0: 0}, HandlerRunner())
    assert (stats.acked, stats.postponed) == (1, 3)
    due = [(row("g", TOPIC, 0, offset).invisible_until - db_now()).total_seconds() for offset in (2, 3, 4)]
    assert [round(d / 60) for d in due] == [1, 2, 3]  # the next admissions, one each
