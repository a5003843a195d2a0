"""One batch (django_sqlqueue/worker/batch/runner.py): handlers run, outcomes decided and written.

No worker and no thread: each test leases a partition, records the deliveries the way a
poll does (``mark_delivered``) and runs ``BatchRunner.run`` on this thread against the
real database.
"""

from __future__ import annotations

import asyncio
import math
import sys
import threading

import pytest

from django_sqlqueue import Reject, Retry
from django_sqlqueue.rules.dlq import REPLAY_KEY, UNDECODABLE_KEY
from django_sqlqueue.worker.batch.handlers import HandlerRunner
from django_sqlqueue.worker.batch.outcomes import BatchHooks
from django_sqlqueue.worker.batch.runner import handler_timeout
from tests.support.engine_helpers import (
    IN_FLIGHT,
    RETRY,
    SCHEDULED,
    dead_letters,
    delivery_rows,
    fetch_fresh,
    row,
    watermark,
)
from tests.support.poison import store_raw

from .helpers import leased_batch

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "batch.t"


def setup(handler, n: int = 3, *, max_attempts: int = 5, metadata=None, stop: threading.Event | None = None):
    """Lease partition 0 to w1, publish ``n`` messages, record their delivery; return
    (runner, subscription, fetched messages, stats)."""
    return leased_batch(TOPIC, handler, n, max_attempts=max_attempts, metadata=metadata, stop=stop)


def test_a_batch_of_acks_moves_the_watermark_and_drops_its_rows():
    seen = []
    runner, sub, fetched, stats = setup(lambda m: seen.append(m.offset))
    assert runner.run(sub, fetched, {0: 0}, HandlerRunner()) == 3
    assert seen == [1, 2, 3]
    assert watermark("g", TOPIC) == 3
    assert delivery_rows("g", TOPIC) == []  # deleted with the watermark move
    assert (stats.delivered, stats.acked, stats.nacked, stats.dead_lettered) == (3, 3, 0, 0)


def test_a_calls_timeout_is_what_timeout_for_chooses_else_the_consumers():
    """Per-message timeouts (the tasks backend's per-task ones): a number wins, ``math.inf``
    means no limit, None falls back to the consumer's ``timeout``."""
    chosen = {1: 2.5, 2: math.inf, 3: None}
    runner, sub, fetched, _ = leased_batch(TOPIC, print, 3, timeout=7, timeout_for=lambda r: chosen[r.offset])
    received = [runner.received(sub, m, None) for m in fetched]
    assert [handler_timeout(sub, r) for r in received] == [2.5, None, 7]
    runner, sub, fetched, _ = leased_batch("batch.untimed", print, 1, timeout=None)
    assert handler_timeout(sub, runner.received(sub, fetched[0], None)) is None


def test_a_failed_handler_nacks_with_its_error_and_the_watermark_stops_before_it():
    def handler(m):
        if m.offset == 2:
            raise ValueError("boom")

    runner, sub, fetched, stats = setup(handler)
    runner.run(sub, fetched, {0: 0}, HandlerRunner())
    assert watermark("g", TOPIC) == 0  # offset 2 is not done: acks are flagged only
    failed = row("g", TOPIC, 0, 2)
    assert failed.status == RETRY and not failed.acked
    assert failed.last_error.startswith("builtins.ValueError: boom")
    assert row("g", TOPIC, 0, 1).acked and row("g", TOPIC, 0, 3).acked
    assert (stats.acked, stats.nacked) == (2, 1)


def test_retry_with_a_delay_is_a_nack_and_reject_is_a_dead_letter():
    def handler(m):
        if m.offset == 1:
            raise Retry(delay=60)
        raise Reject("poison")

    runner, sub, fetched, stats = setup(handler, 2)
    runner.run(sub, fetched, {0: 0}, HandlerRunner())
    assert row("g", TOPIC, 0, 1).status == RETRY
    (dead,) = dead_letters(f"{TOPIC}_dlq")
    assert dead.id == f"g:{fetched[1].id}" and dead.failure_count == 1
    assert dead.last_error.startswith("django_sqlqueue.exceptions.Reject: poison")
    assert row("g", TOPIC, 0, 2).acked  # acked for the group with its dead letter
    assert (stats.nacked, stats.dead_lettered) == (1, 1)


def test_the_last_attempt_that_fails_is_dead_lettered_not_retried():
    runner, sub, fetched, stats = setup(lambda m: 1 / 0, 1, max_attempts=1)
    runner.run(sub, fetched, {0: 0}, HandlerRunner())
    assert stats.dead_lettered == 1 and stats.nacked == 0
    # Acked for the group with its dead letter; a later poll's advance_watermark passes it.
    assert row("g", TOPIC, 0, 1).acked and watermark("g", TOPIC) == 0


def test_a_replay_meant_for_another_group_is_acked_without_calling_the_handler():
    seen = []
    runner, sub, fetched, stats = setup(seen.append, 2)
    # What a replay copy (ops.replay) carries; publish() refuses the engine's metadata namespace.
    for m in fetched:
        m.metadata = {REPLAY_KEY: {"consumer_group": "other"}}
    runner.run(sub, fetched, {0: 0}, HandlerRunner())
    assert seen == [] and watermark("g", TOPIC) == 2
    assert stats.delivered == 0 and stats.acked == 2


def test_a_stopping_worker_hands_the_rest_of_the_batch_back_uncounted():
    stop = threading.Event()
    seen = []

    def handler(m):
        seen.append(m.offset)
        stop.set()  # a SIGTERM arrives during the first message

    runner, sub, fetched, _stats = setup(handler, 3, stop=stop)
    assert runner.run(sub, fetched, {0: 0}, HandlerRunner()) == 1
    assert seen == [1] and watermark("g", TOPIC) == 1
    for offset in (2, 3):
        r = row("g", TOPIC, 0, offset)
        assert r.status == SCHEDULED and r.retry_count == 0 and not r.acked  # due now, attempt not counted


def test_a_partition_lost_mid_batch_is_not_handled_further_nor_written():
    seen = []
    runner, sub, fetched, _ = setup(lambda m: seen.append(m.offset) or setattr(sub, "held", frozenset()), 3)
    runner.run(sub, fetched, {0: 0}, HandlerRunner())
    assert seen == [1]
    # The lease row still names w1 here, so its ack of offset 1 is written; the rest are
    # handed back for the next holder.
    assert watermark("g", TOPIC) == 1
    assert [r.status for r in delivery_rows("g", TOPIC)] == [SCHEDULED, SCHEDULED]


# -- rows that cannot be decoded ---------------------------------------------------------


def test_a_row_that_cannot_be_decoded_is_dead_lettered_without_a_handler_call_and_the_rest_go_on():
    seen = []
    runner, sub, fetched, stats = setup(lambda m: seen.append(m.offset), 3)
    # A row another program wrote: metadata that is not an object (possible on every database).
    fetched = [fetched[0], *refetch_with_raw_metadata(fetched[1], "[1, 2]"), fetched[2]]
    runner.run(sub, fetched, {0: 0}, HandlerRunner())
    assert seen == [1, 3]
    (dead,) = dead_letters(f"{TOPIC}_dlq")
    assert dead.id == f"g:{fetched[1].id}" and dead.failure_count == 1
    assert dead.last_error.startswith("undecodable row: metadata is not a JSON object (a JSON array)")
    assert dead.metadata[UNDECODABLE_KEY].replace(" ", "") == "[1,2]"
    assert dead.metadata["dead_letter"]["original_offset"] == 2
    assert dead.payload == {"p": 0, "i": 2}  # the column that decoded is kept as it was
    # The dead letter is acked with the batch: the watermark passes all three at once.
    assert watermark("g", TOPIC) == 3 and delivery_rows("g", TOPIC) == []
    assert (stats.delivered, stats.acked, stats.dead_lettered) == (2, 2, 1)


def refetch_with_raw_metadata(message, text):
    store_raw(TOPIC, message.id, "metadata", text)
    return [m for m in fetch_fresh("g", TOPIC, 0) if m.offset == message.offset]


def test_a_decoded_value_that_cannot_be_stored_again_is_dead_lettered_as_text():
    # NaN decodes in Python but is not JSON publish() writes: the dead letter must not fail on it.
    runner, sub, fetched, _ = setup(lambda m: 1 / 0, 1, max_attempts=1)
    fetched[0].payload = {"x": float("nan")}
    runner.run(sub, fetched, {0: 0}, HandlerRunner())
    (dead,) = dead_letters(f"{TOPIC}_dlq")
    assert dead.payload == {UNDECODABLE_KEY: '{"x": NaN}'}
    assert row("g", TOPIC, 0, 1).acked


# -- exceptions that are not Exception ------------------------------------------------------


class LibraryAbort(BaseException):
    """A library's own BaseException subclass (as some test and async frameworks have)."""


@pytest.mark.parametrize("exc", [LibraryAbort("abort"), asyncio.CancelledError()], ids=["custom", "cancelled"])
def test_a_handler_raising_another_base_exception_fails_its_attempt_and_the_batch_goes_on(exc):
    seen = []

    def handler(m):
        seen.append(m.offset)
        if m.offset == 1:
            raise exc

    runner, sub, fetched, stats = setup(handler, 3)
    assert runner.run(sub, fetched, {0: 0}, HandlerRunner()) == 3
    assert seen == [1, 2, 3] and runner.interrupted is None and not runner.stop_event.is_set()
    failed = row("g", TOPIC, 0, 1)
    assert failed.status == RETRY and not failed.acked
    assert failed.last_error.startswith(f"{type(exc).__module__}.{type(exc).__qualname__}")
    assert (stats.acked, stats.nacked) == (2, 1)


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()], ids=["SystemExit", "KeyboardInterrupt"])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_system_exit_or_keyboard_interrupt_nacks_hands_the_rest_back_and_stops_the_worker(exc, is_async, caplog):
    seen = []

    def sync_handler(m):
        seen.append(m.offset)
        if m.offset == 2:
            raise exc

    async def async_handler(m):
        sync_handler(m)

    runner, sub, fetched, stats = setup(async_handler if is_async else sync_handler, 3)
    runner.run(sub, fetched, {0: 0}, HandlerRunner())  # does not raise: the worker re-raises once drained
    assert seen == [1, 2]
    assert runner.interrupted is exc and runner.stop_event.is_set()
    assert watermark("g", TOPIC) == 1  # the ack before it is written
    failed = row("g", TOPIC, 0, 2)
    assert failed.status == RETRY and not failed.acked and failed.retry_count == 0  # attempt 1 failed
    assert failed.last_error.startswith(f"builtins.{type(exc).__name__}")
    rest = row("g", TOPIC, 0, 3)
    assert (rest.status, rest.retry_count, rest.acked) == (SCHEDULED, 0, False)  # handed back, not counted
    assert (stats.acked, stats.nacked) == (1, 1)
    assert f"handler raised {type(exc).__name__}(" in caplog.text and "the worker stops" in caplog.text


def test_system_exit_on_the_last_attempt_dead_letters():
    runner, sub, fetched, stats = setup(lambda m: sys.exit("bye"), 1, max_attempts=1)
    runner.run(sub, fetched, {0: 0}, HandlerRunner())
    (dead,) = dead_letters(f"{TOPIC}_dlq")
    assert dead.last_error.startswith("builtins.SystemExit: bye")
    assert isinstance(runner.interrupted, SystemExit) and stats.dead_lettered == 1


def test_a_batch_killed_outside_its_handlers_hands_back_what_did_not_run(monkeypatch):
    seen = []
    runner, sub, fetched, _ = setup(lambda m: seen.append(m.offset), 3)
    original = runner._handle  # the batch loop's call for each message

    def handle(sub, m, outcomes, invoke, progress, index):
        recorded = original(sub, m, outcomes, invoke, progress, index)
        if m.offset == 1:
            raise SystemExit  # as an asynchronous exception raised into the thread would
        return recorded

    monkeypatch.setattr(runner, "_handle", handle)
    with pytest.raises(SystemExit):
        runner.run(sub, fetched, {0: 0}, HandlerRunner())
    assert seen == [1]
    assert row("g", TOPIC, 0, 1).status == IN_FLIGHT  # its outcome was not written: back after the timeout
    for offset in (2, 3):
        r = row("g", TOPIC, 0, offset)
        assert (r.status, r.retry_count) == (SCHEDULED, 0)  # due now, attempt not counted


# -- the hooks' seam -------------------------------------------------------------------------


class StopAfter(BatchHooks):
    def __init__(self, n: int) -> None:
        self.seen: list[int] = []
        self.n = n

    def on_handled(self, sub, message) -> bool:
        self.seen.append(message.offset)
        return len(self.seen) >= self.n


def test_on_handled_sees_each_message_and_may_stop_the_worker_handing_the_rest_back():
    hooks = StopAfter(2)
    seen = []
    runner, sub, fetched, stats = leased_batch(TOPIC, lambda m: seen.append(m.offset), 4, hooks=hooks)
    assert runner.run(sub, fetched, {0: 0}, HandlerRunner()) == 2
    assert hooks.seen == seen == [1, 2] and runner.stop_event.is_set()
    assert watermark("g", TOPIC) == 2
    for offset in (3, 4):
        r = row("g", TOPIC, 0, offset)
        assert (r.status, r.retry_count, r.acked) == (SCHEDULED, 0, False)  # handed back, not counted
    assert (stats.delivered, stats.acked) == (2, 2)
