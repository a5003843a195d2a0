"""instruments.py: the hooks a worker calls for polls, batches, sequencer runs and lease changes.

A real Worker on a thread and a real database; the hooks' Prometheus side: tests/metrics/.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import pytest
from django.db import connections

from django_sqlqueue import publish_many
from django_sqlqueue.conf import DEFAULT_PARTITIONS
from django_sqlqueue.consumers import ConsumerSpec
from django_sqlqueue.instruments import NO_INSTRUMENTS, Instruments
from django_sqlqueue.worker.loop import Worker

from .support.engine_helpers import fast_conf, wait_until

TOPIC = "instruments.orders"
MESSAGES = 12


class Recorder(Instruments):
    """Every hook call, by hook (the poll loop and the lease keeper call from two threads)."""

    def __init__(self) -> None:
        self.calls: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
        self.lock = threading.Lock()

    def _add(self, hook: str, *args: Any) -> None:
        with self.lock:
            self.calls[hook].append(args)

    def polled(self, group: str, topic: str, seconds: float, batches: int) -> None:
        assert seconds >= 0
        self._add("polled", group, topic, batches)

    def batch(self, group: str, topic: str, size: int) -> None:
        self._add("batch", group, topic, size)

    def sequenced(self, topic: str, seconds: float, numbered: int) -> None:
        self._add("sequenced", topic, numbered)

    def leases(self, group: str, topic: str, *, acquired: int = 0, released: int = 0, lost: int = 0) -> None:
        self._add("leases", group, topic, acquired, released, lost)


def test_the_base_hooks_do_nothing() -> None:
    assert NO_INSTRUMENTS.polled("g", "t", 0.1, 1) is None
    assert NO_INSTRUMENTS.batch("g", "t", 5) is None
    assert NO_INSTRUMENTS.sequenced("t", 0.1, 5) is None
    assert NO_INSTRUMENTS.leases("g", "t", acquired=1) is None


@pytest.mark.django_db(transaction=True)
def test_a_worker_reports_its_sequencer_runs_batches_polls_and_leases() -> None:
    handled: list[int] = []
    publish_many(TOPIC, [{"payload": {"n": i}, "key": f"k{i}"} for i in range(MESSAGES)])
    spec = ConsumerSpec(topic=TOPIC, group="g", handler=lambda m: handled.append(m.payload["n"]), batch_size=5)
    recorder = Recorder()
    worker = Worker([spec], name="instr", conf=fast_conf(), instruments=recorder)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test thread
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(handled) == MESSAGES, 20, "every message handled")
    finally:
        worker.stop()
        thread.join(15)
    assert not thread.is_alive() and not errors
    calls = recorder.calls
    assert sum(n for topic, n in calls["sequenced"] if topic == TOPIC) == MESSAGES
    assert all(group == "g" and topic == TOPIC and 0 < size <= 5 for group, topic, size in calls["batch"])
    assert sum(size for _, _, size in calls["batch"]) == MESSAGES
    assert any(batches > 0 for _, _, batches in calls["polled"]) and {c[:2] for c in calls["polled"]} == {("g", TOPIC)}
    acquired = sum(c[2] for c in calls["leases"])
    released = sum(c[3] for c in calls["leases"])
    assert acquired == DEFAULT_PARTITIONS and released == acquired  # all taken, all given back at the stop
