"""Poison never stops a worker (issue 14, item 4), through a real in-process ``Worker``.

- A row that cannot be decoded -- written by another program with raw SQL (see
  ``tests/support/poison.py`` for what each database lets through) -- is dead-lettered with an
  error naming the column, and the partition goes on. Before, the fetch raised for the
  whole poll: every partition of the subscription stalled, forever.
- A handler raising ``SystemExit`` or ``KeyboardInterrupt`` fails its attempt (recorded,
  counted), the worker drains and ``run()`` re-raises it; the message is handled again by
  the next worker. Before, the exception left ``run()`` with the batch's outcomes
  unwritten: its messages waited out the visibility timeout, and the error was nowhere.
- A handler thread that dies (``--concurrency``) stops the worker with ``WorkerCrashed``
  instead of leaving its partitions busy forever.

The real ``runconsumer`` case is in ``tests/worker/threads/test_service.py``.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

from django_sqlqueue import publish_many
from django_sqlqueue.exceptions import WorkerCrashed
from django_sqlqueue.models import PartitionLease
from django_sqlqueue.rules.dlq import UNDECODABLE_KEY
from django_sqlqueue.worker.loop import Worker
from django_sqlqueue.worker.threads.executor import DeadThread, PartitionExecutor, PartitionsInFlight
from tests.support.consumerapp.consumers import kill_thread
from tests.support.engine_helpers import (
    RETRY,
    Calls,
    caught_up,
    dead_letters,
    fast_conf,
    key_for_partition,
    publish_to,
    row,
    running,
    spec,
    wait_until,
)
from tests.support.poison import HUGE_INTEGER, store_invalid, store_raw

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "poison.t"


@pytest.mark.parametrize(
    ("column", "text", "invalid", "error"),
    [
        ("payload", '{"total": 12.5', True, "payload could not be decoded as JSON"),
        ("metadata", "not json", True, "metadata could not be decoded as JSON"),
        ("payload", HUGE_INTEGER, False, "payload could not be decoded as JSON (ValueError: Exceeds the limit"),
        ("metadata", '"a string"', False, "metadata is not a JSON object (a JSON string)"),
    ],
    ids=["invalid-payload", "invalid-metadata", "huge-integer-payload", "string-metadata"],
)
def test_a_row_written_by_another_program_is_dead_lettered_and_the_partitions_go_on(column, text, invalid, error):
    good = publish_to(TOPIC, 0, 2)
    poison, *after = publish_to(TOPIC, 0, 3)
    others = publish_to(TOPIC, 1, 2)
    (store_invalid if invalid else store_raw)(TOPIC, poison.id, column, text)
    calls = Calls()
    with running([spec(TOPIC, "g", lambda m: calls.add(m.id))]):
        wait_until(lambda: caught_up("g", TOPIC, [0, 1]), 15, "both partitions past the poison row")
    assert sorted(calls.list()) == sorted(m.id for m in [*good, *after, *others])  # never the poison row
    (dead,) = dead_letters(f"{TOPIC}_dlq")
    assert dead.id == f"g:{poison.id}" and dead.failure_count == 1
    assert dead.last_error.startswith(f"undecodable row: {error}"), dead.last_error
    assert getattr(dead, column)[UNDECODABLE_KEY].replace(" ", "") == text.replace(" ", "")
    assert dead.metadata["dead_letter"]["original_offset"] == 3


@pytest.mark.parametrize("concurrency", [1, 2])
@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()], ids=["SystemExit", "KeyboardInterrupt"])
def test_a_handler_asking_the_process_to_stop_loses_nothing(exc, concurrency, caplog):
    key = key_for_partition(0)
    published = publish_many(TOPIC, [{"payload": {"i": i}, "key": key} for i in range(1, 4)])
    calls = Calls()

    def handler(m):
        calls.add((m.payload["i"], m.attempt))
        if m.payload["i"] == 2 and m.attempt == 1:
            raise exc

    worker = Worker([spec(TOPIC, "g", handler)], name="w-exit", conf=fast_conf(), concurrency=concurrency)
    with pytest.raises(type(exc)) as raised:
        worker.run()
    assert raised.value is exc
    assert calls.list() == [(1, 1), (2, 1)]
    failed = row("g", TOPIC, 0, 2)
    assert failed.status == RETRY and failed.last_error.startswith(f"builtins.{type(exc).__name__}")
    assert not PartitionLease.objects.filter(leased_by="w-exit").exists()  # released, not left to expire
    assert f"worker exiting subscriber=w-exit: a handler raised {type(exc).__name__}" in caplog.text
    # The next worker handles the failed one again (attempt 2) and the one handed back (attempt 1).
    with running([spec(TOPIC, "g", handler)], name="w-next"):
        wait_until(lambda: caught_up("g", TOPIC, [0]), 15, "the next worker catches up")
    assert sorted(calls.list()[2:]) == [(2, 2), (3, 1)]  # a nack does not hold 3 back
    assert len(published) == 3


def test_a_handler_thread_that_dies_is_reported_and_the_others_go_on():
    died: list[DeadThread] = []
    executor = PartitionExecutor(2, name="test-poison-handler", on_death=died.append)
    in_flight = PartitionsInFlight()
    ran = threading.Event()
    try:
        # An exception raised into an idle thread arrives when it takes its next batch.
        assert kill_thread("test-poison-handler-0") == 1
        for partition in range(50):
            executor.submit(in_flight, partition, lambda runner: ran.set())
            if wait_for(lambda: died, 0.05):
                break
        wait_until(lambda: died, 5, "the death reported")
        executor.submit(in_flight, 99, lambda runner: ran.set())
        assert ran.wait(5)  # the other thread runs batches
    finally:
        executor.shutdown(5)
    (dead,) = died
    assert dead.title == "handler test-poison-handler-0" and isinstance(dead.error, SystemExit)


def wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return bool(predicate())


def test_a_worker_whose_handler_thread_dies_stops_with_worker_crashed():
    publish_to(TOPIC, 0, 1, payload=lambda i: {"kill": True})

    def handler(m):
        if m.payload.get("kill"):
            # Kill the other (idle) handler thread: it dies when it takes its next batch.
            me = threading.current_thread().name
            assert kill_thread("sqlqueue-handler-1" if me.endswith("-0") else "sqlqueue-handler-0") == 1

    worker = Worker([spec(TOPIC, "g", handler)], name="w-dead", conf=fast_conf(), concurrency=2)
    errors: list[BaseException] = []
    thread = threading.Thread(target=_run, args=(worker, errors), daemon=True)
    thread.start()
    try:
        wait_until(lambda: caught_up("g", TOPIC, [0]), 10, "the killing message handled")
        for partition in range(1, 8):  # batches until the doomed thread takes one
            publish_to(TOPIC, partition, 1)
            if wait_for(lambda: worker.crashed is not None, 0.5):
                break
    finally:
        thread.join(15)
    assert not thread.is_alive()
    assert isinstance(worker.crashed, DeadThread) and worker.crashed.title.startswith("handler sqlqueue-handler-")
    (error,) = errors
    assert isinstance(error, WorkerCrashed) and "thread died (SystemExit" in str(error)
    assert not PartitionLease.objects.filter(leased_by="w-dead").exists()


def _run(worker: Worker, errors: list[BaseException]) -> None:
    try:
        worker.run()
    except BaseException as exc:  # noqa: BLE001 - checked by the test
        errors.append(exc)
    finally:
        connections.close_all()
