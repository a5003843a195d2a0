"""``Worker(concurrency=N)`` in process: drain on stop, nothing lost or run twice, connections closed."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

from django_sqlqueue import publish_many
from django_sqlqueue.conf import get_settings
from django_sqlqueue.consumers import registry
from django_sqlqueue.worker.loop import Worker
from django_sqlqueue.worker.subscription import PartitionsInFlight
from django_sqlqueue.worker.threads.executor import PartitionExecutor
from tests.support.task_helpers import task_settings, wait_until
from tests.support.taskapp.consumers import CONC_GROUP, CONC_TOPIC
from tests.support.taskapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def conc_worker(name: str, concurrency: int) -> tuple[Worker, threading.Thread]:
    import tests.support.taskapp.consumers  # noqa: F401 - registers the consumer

    specs = registry.select([CONC_GROUP], [CONC_TOPIC])
    worker = Worker(specs, name=name, conf=get_settings(), concurrency=concurrency)

    def run() -> None:
        try:
            worker.run()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return worker, thread


def test_stop_drains_in_flight_batches_and_a_later_worker_finishes_the_rest() -> None:
    with task_settings():
        publish_many(CONC_TOPIC, [{"payload": {"run": "drain", "seq": i}, "key": f"k{i % 16}"} for i in range(400)])
        worker, thread = conc_worker("tsk-drain-1", 8)
        wait_until(lambda: Run.objects.filter(label="drain").count() >= 40, 30, "some messages handled")
        worker.stop()
        thread.join(30)
        assert not thread.is_alive()
        assert worker.executor is not None and not any(t.is_alive() for t in worker.executor._threads)
        assert all(not sub.in_flight.snapshot() for sub in worker.subscriptions)
        handled_first = Run.objects.filter(label="drain").count()
        assert handled_first < 400
        worker2, thread2 = conc_worker("tsk-drain-2", 8)
        wait_until(lambda: Run.objects.filter(label="drain").count() >= 400, 60, "the rest handled")
        worker2.stop()
        thread2.join(30)
    seqs = list(Run.objects.filter(label="drain").values_list("seq", flat=True))
    assert sorted(seqs) == list(range(400))  # each once: a graceful stop hands messages back, none redone


def test_executor_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="positive"):
        PartitionExecutor(0)
    from django_sqlqueue.exceptions import ConfigurationError

    with task_settings(), pytest.raises(ConfigurationError, match="concurrency"):
        Worker(registry.all() or [object()], name="x", concurrency=0)  # type: ignore[list-item]


def test_executor_threads_close_their_connections() -> None:
    executor = PartitionExecutor(2)
    in_flight = PartitionsInFlight()
    opened: list[object] = []

    def job(runner: object) -> None:
        # This thread's own connection object (``django.db.connection`` is a proxy that
        # would resolve to the asserting thread's connection later).
        mine = connections["default"]
        mine.ensure_connection()
        opened.append(mine)
        time.sleep(0.05)

    executor.submit(in_flight, 0, job)
    executor.submit(in_flight, 1, job)
    assert in_flight.wait_idle(None, timeout=10)
    assert executor.shutdown(10)
    assert len(opened) == 2 and all(c.connection is None for c in opened)  # type: ignore[attr-defined]


def test_an_executor_built_unstarted_runs_nothing_until_started() -> None:
    """The worker builds its executor with its other parts and starts the threads in run()."""
    executor = PartitionExecutor(2, name="sqlqueue-handler-later", start=False)
    in_flight = PartitionsInFlight()
    ran = threading.Event()
    executor.submit(in_flight, 3, lambda runner: ran.set())
    assert not [t for t in threading.enumerate() if t.name.startswith("sqlqueue-handler-later")]
    assert not ran.wait(0.1) and in_flight.snapshot() == frozenset({3}) and executor.free == 1
    executor.start()
    executor.start()  # once: later calls do nothing
    assert ran.wait(5) and in_flight.wait_idle(None, timeout=5)
    assert len([t for t in threading.enumerate() if t.name.startswith("sqlqueue-handler-later")]) == 2
    assert executor.shutdown(10)
