"""Handler timeouts (django_sqlqueue/worker/threads/watchdog.py): Worker.run() on a thread, real database.

A handler that hangs (it waits on an Event the test sets at the end, so its thread can
finish) is given up after its consumer's ``timeout``: the attempt fails with a
``HandlerTimeout``, its partition is released, the others go on; async handlers are
cancelled for real; ``extend_visibility`` is progress.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time

import pytest

from django_sqlqueue import ConfigurationError, consumer
from django_sqlqueue.consumers import DEFAULT, registry
from django_sqlqueue.exceptions import HandlersStuck
from django_sqlqueue.models import PartitionLease
from django_sqlqueue.worker.budget import connection_budget
from django_sqlqueue.worker.loop import Worker
from django_sqlqueue.worker.threads.watchdog import CHECK_INTERVAL, STACK_FRAMES, Watchdog

from ...support.engine_helpers import (
    RETRY,
    Calls,
    caught_up,
    dead_letters,
    fast_conf,
    offset_of,
    publish_to,
    row,
    running,
    spec,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "wd.events"


@pytest.fixture
def release() -> threading.Event:
    """Set at teardown, so that hung handlers return and their threads end."""
    event = threading.Event()
    yield event
    event.set()


def hanging(calls: Calls, release: threading.Event):
    """A handler that hangs on messages whose payload says ``hang``, else records them."""

    def handle(message):
        calls.add((message.partition, message.offset, message.attempt))
        if message.payload.get("hang"):
            release.wait()

    return handle


def warnings_of(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


def test_a_hung_handler_gives_its_partition_up_and_the_others_go_on(release, caplog):
    caplog.set_level(logging.INFO, logger="django_sqlqueue")
    hung = publish_to(TOPIC, 0, 1, payload=lambda i: {"hang": True})[0]
    publish_to(TOPIC, 0, 3)  # behind the hung one, same partition
    for partition in range(1, 8):
        publish_to(TOPIC, partition, 5)
    calls = Calls()
    handler = hanging(calls, release)
    conf = fast_conf(MAX_ATTEMPTS=3)
    specs = [spec(TOPIC, "g", handler, timeout=0.5, visibility_timeout=30)]
    with running(specs, conf=conf, concurrency=3) as worker:
        # Everything but the hung message is handled (partition 0's three after it too):
        # each stuck thread was replaced.
        wait_until(lambda: all(caught_up("g", TOPIC, [p]) for p in range(1, 8)), 20, "the other partitions")
        wait_until(lambda: len([c for c in calls.list() if c[0] == 0 and c[1] > 1]) == 3, 20, "partition 0's rest")
        timed_out = wait_until(lambda: warnings_of(caplog, "handler timed out"), 10, "the WARNING")
        record = timed_out[0].getMessage()
        assert f"offset={offset_of(TOPIC, hung.id)}" in record and f"id={hung.id}" in record and "partition=0" in record
        assert "handler=tests.worker.threads.test_watchdog.hanging.<locals>.handle" in record
        assert "timeout=0.5s" in record and re.search(r" ran=\d+\.\ds ", record)
        assert "stuck at:" in record and "release.wait()" in record  # where the thread hangs
        assert 1 <= record.split("stuck at:\n", 1)[1].count('  File "') <= STACK_FRAMES  # its innermost frames
        # Each attempt times out; the last one is dead-lettered with the timeout error.
        wait_until(lambda: dead_letters(f"{TOPIC}_dlq"), 20, "the dead letter")
        (dead,) = dead_letters(f"{TOPIC}_dlq")
        assert dead.failure_count == 3
        assert dead.last_error.startswith("django_sqlqueue.exceptions.HandlerTimeout: handler ")
        assert "over its timeout of 0.5s without progress; its thread was abandoned" in dead.last_error
        assert len(warnings_of(caplog, "handler timed out")) == 3  # one per timed-out attempt
        assert not warnings_of(caplog, "handler failed")  # and no second line for the same attempt
        assert "the attempt failed (retried after the backoff)" in timed_out[0].getMessage()
        assert [c[2] for c in calls.list() if c[:2] == (0, offset_of(TOPIC, hung.id))] == [1, 2, 3]
        wait_until(lambda: caught_up("g", TOPIC, [0]), 10, "partition 0 past the dead letter")
        assert worker.executor is not None and worker.executor.stuck == 3  # not more than --concurrency 3
        assert not worker.stop_event.is_set()
    assert not PartitionLease.objects.filter(leased_by="t1").exists()


def test_the_next_look_is_at_the_running_handlers_deadline_at_most_a_check_interval_away(release, caplog):
    publish_to(TOPIC, 0, 1, payload=lambda i: {"hang": True})
    calls = Calls()
    with running([spec(TOPIC, "g", hanging(calls, release), timeout=5)]) as worker:
        watchdog = worker.watchdog
        assert isinstance(watchdog, Watchdog)
        wait_until(lambda: len(calls) == 1, 10, "the handler to start")
        # Its deadline is 5 s away: look again within CHECK_INTERVAL all the same (the batch's
        # next handler, with its own deadline, may start meanwhile).
        assert watchdog.next_check() == CHECK_INTERVAL
        # Seen 4.9 s later: the next look is just past its deadline (at most 0.1 s ahead).
        assert 0.01 <= watchdog.next_check(time.monotonic() + 4.9) <= 0.11 + 1e-9
        assert watchdog.next_check(time.monotonic() + 60) == pytest.approx(0.01)  # overdue: look now
        release.set()
        wait_until(lambda: caught_up("g", TOPIC), 10, "the message acked")
        # No batch in the executor: nothing to watch, the poll loop keeps its own cadence.
        wait_until(lambda: watchdog.next_check() is None, 5, "the executor idle")
    assert not warnings_of(caplog, "handler timed out")


def test_more_stuck_threads_than_concurrency_stop_the_worker_after_handing_back(release, caplog):
    for partition in range(3):
        publish_to(TOPIC, partition, 1, payload=lambda i: {"hang": True})
    publish_to(TOPIC, 3, 2)
    calls = Calls()
    worker = Worker([spec(TOPIC, "g", hanging(calls, release), timeout=0.3)], name="w-stuck", conf=fast_conf())
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - inspected below
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the worker did not stop"
    (error,) = errors
    assert isinstance(error, HandlersStuck)
    assert "2 handler threads are stuck" in str(error) and "--concurrency 1" in str(error)
    assert not PartitionLease.objects.filter(leased_by="w-stuck").exists()
    # Both timed-out attempts were failed (retried later), nothing was lost.
    assert sorted(r.partition for r in _retries()) == sorted({c[0] for c in calls.list() if c[0] < 3})


def _status(offset: int) -> str | None:
    from django_sqlqueue.models import DeliveryState

    state = DeliveryState.objects.filter(consumer_group="g", topic=TOPIC, partition=0, message_offset=offset).first()
    return None if state is None else state.status


def _retries():
    from django_sqlqueue.models import DeliveryState

    return DeliveryState.objects.filter(consumer_group="g", topic=TOPIC, status=RETRY)


def test_with_one_handler_thread_a_timeout_replaces_it_and_a_late_return_is_dropped(release, caplog):
    caplog.set_level(logging.INFO, logger="django_sqlqueue")
    hung = publish_to(TOPIC, 0, 1, payload=lambda i: {"hang": True})[0]
    for partition in range(1, 8):
        publish_to(TOPIC, partition, 2)
    calls = Calls()
    conf = fast_conf(MAX_ATTEMPTS=5, BACKOFF_MIN=30, BACKOFF_MAX=30)  # no second attempt during the test
    with running([spec(TOPIC, "g", hanging(calls, release), timeout=0.3)], conf=conf) as worker:
        wait_until(lambda: warnings_of(caplog, "handler timed out"), 10, "the timeout")
        assert worker.executor is not None and worker.executor.concurrency == 1
        wait_until(lambda: worker.executor.stuck == 1, 5, "one stuck thread")
        # The poll's other batches ran on the thread that took the stuck one's place.
        wait_until(lambda: all(caught_up("g", TOPIC, [p]) for p in range(1, 8)), 20, "the other partitions")
        release.set()  # the handler returns: too late
        wait_until(lambda: worker.executor.stuck == 0, 5, "the stuck thread to exit")
        late = [r for r in caplog.records if "timed-out handler returned after all" in r.getMessage()]
        assert len(late) == 1 and f"id={hung.id}" in late[0].getMessage()
    # Its ack was never written: the attempt stays failed, to be retried.
    state = row("g", TOPIC, 0, offset_of(TOPIC, hung.id))
    assert state.status == RETRY and "HandlerTimeout" in state.last_error


def test_an_async_handler_is_cancelled_at_its_timeout_without_losing_a_thread(caplog):
    cleaned = Calls()

    async def handler(message):
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.add(message.offset)

    published = publish_to(TOPIC, 0, 1)[0]
    conf = fast_conf(MAX_ATTEMPTS=5, BACKOFF_MIN=30, BACKOFF_MAX=30)
    with running([spec(TOPIC, "g", handler, timeout=0.3)], conf=conf) as worker:
        offset = offset_of(TOPIC, published.id)
        wait_until(lambda: _status(offset) == RETRY, 10, "the failed attempt")
        assert worker.executor is not None and worker.executor.stuck == 0
    state = row("g", TOPIC, 0, offset)
    assert state.last_error.startswith("django_sqlqueue.exceptions.HandlerTimeout: handler ")
    assert "it was cancelled" in state.last_error
    assert cleaned.list() == [offset]  # its finally ran: a real cancellation
    assert not warnings_of(caplog, "handler timed out")  # no thread was abandoned


def test_extend_visibility_is_progress_and_restarts_the_timeout():
    calls = Calls()

    def handler(message):
        for _ in range(6):  # 1.2s in all, four times its timeout
            time.sleep(0.2)
            assert message.extend_visibility(5)
        calls.add(message.offset)

    async def async_handler(message):
        for _ in range(6):
            await asyncio.sleep(0.2)
            assert await message.aextend_visibility(5)
        calls.add(("async", message.offset))

    publish_to(TOPIC, 0, 2)
    publish_to("wd.async", 0, 1)
    specs = [spec(TOPIC, "g", handler, timeout=0.3), spec("wd.async", "g", async_handler, timeout=0.3)]
    with running(specs):
        wait_until(lambda: caught_up("g", TOPIC) and caught_up("g", "wd.async"), 20, "all acked")
    assert sorted(calls.list(), key=str) == sorted([1, 2, ("async", 1)], key=str)


def test_without_a_timeout_handlers_run_on_the_poll_loop_and_budget_two_connections():
    publish_to(TOPIC, 0, 2)
    seen = Calls()
    with running([spec(TOPIC, "g", lambda m: seen.add(threading.current_thread().name), timeout=None)]) as worker:
        wait_until(lambda: caught_up("g", TOPIC), 10, "acked")
        assert worker.executor is None and not worker.uses_handler_threads
        assert worker.connections_needed().total == 2 + worker.connections_needed().listener
    assert set(seen.list()) == {"worker-t1"}  # the poll loop's thread (engine_helpers.running)


def test_by_default_the_timeout_is_the_visibility_timeout_on_one_handler_thread():
    resolved = spec(TOPIC, "g", print, visibility_timeout=7).resolve(fast_conf())
    assert resolved.timeout == 7
    assert spec(TOPIC, "g", print).resolve(fast_conf(VISIBILITY_TIMEOUT=11)).timeout == 11
    assert spec(TOPIC, "g", print, timeout=DEFAULT).resolve(fast_conf()).timeout == 30
    worker = Worker([spec(TOPIC, "g", print)], name="w-budget", conf=fast_conf(NOTIFY=False))
    assert worker.uses_handler_threads and worker.connections_needed().total == 3
    assert connection_budget(concurrency=4, scheduler=False, async_handlers=False, handler_threads=True).total == 6


@pytest.mark.parametrize("bad", [0, -1, "5", True])
def test_consumer_refuses_a_bad_timeout(bad):
    with pytest.raises(ConfigurationError, match="timeout must be a positive number"):
        consumer("wd.bad", group="g", timeout=bad)(print)
    assert ("g", "wd.bad") not in {(s.group, s.topic) for s in registry.all()}
