"""Side threads and their supervision (django_sqlqueue/worker/threads/service.py).

A side thread that ends without being asked to -- a crash in the lease keeper's code --
must stop the worker, which hands back what it can and exits non-zero, instead of
polling on with leases nobody renews. Proven in-process on ``ServiceThread`` and
``Worker``, and on a real ``runconsumer`` whose lease-keeper thread is killed.
"""

from __future__ import annotations

import threading
import time

import pytest

from django_sqlqueue import publish
from django_sqlqueue.exceptions import WorkerCrashed
from django_sqlqueue.models import PartitionLease
from django_sqlqueue.worker.outage import OutageReporter
from django_sqlqueue.worker.threads.service import ServiceThread
from tests.support.consumerapp.models import Handled
from tests.support.engine_helpers import fast_conf, key_for_partition, spec, store
from tests.support.processes import wait_until


class Crashing(ServiceThread):
    """A side thread whose body fails after ``after`` seconds (or runs until stopped)."""

    thread_name = "test-crashing"
    title = "crashing service"

    def __init__(self, after: float | None) -> None:
        super().__init__(using="default", outage=OutageReporter(alias="default", report_interval=30), stop_timeout=5)
        self.after = after

    def body(self) -> None:
        if self.after is None:
            self.stop_event.wait()
            return
        self.stop_event.wait(self.after)
        raise RuntimeError("bug in the service")


def test_a_service_thread_that_crashes_reports_its_death_with_the_error(caplog):
    died = threading.Event()
    service = Crashing(after=0.01)
    service.start(on_death=lambda s: died.set())
    assert died.wait(5)
    # on_death runs on the dying thread, just before it ends: wait for the end before asking.
    assert service._thread is not None
    service._thread.join(5)
    assert service.died and not service.is_alive()
    assert isinstance(service.error, RuntimeError) and str(service.error) == "bug in the service"
    assert "crashing service thread died: RuntimeError: bug in the service" in caplog.text


def test_a_service_thread_that_is_stopped_is_not_a_death():
    died = threading.Event()
    service = Crashing(after=None)
    service.start(on_death=lambda s: died.set())
    service.stop()
    assert not service.is_alive() and not service.died and service.error is None
    assert not died.wait(0.2)


def test_a_body_that_returns_unasked_is_a_death():
    class Quitter(ServiceThread):
        title = "quitter"

        def body(self) -> None:
            return

    died = threading.Event()
    service = Quitter(using="default", outage=OutageReporter(alias="default", report_interval=30), stop_timeout=5)
    service.start(on_death=lambda s: died.set())
    assert died.wait(5)
    assert "returned without being asked to stop" in str(service.error)


@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_side_thread_dies_releases_its_leases_and_raises(caplog):
    from django_sqlqueue.worker.loop import Worker

    topic = "svc.crash"
    handled = []
    worker = Worker([spec(topic, "g", handled.append)], name="w-crash", conf=fast_conf())
    crashing = Crashing(after=0.5)
    # A side thread of the worker's, supervised like the lease keeper and the scheduler.
    worker.scheduler = crashing  # type: ignore[assignment]
    publish(topic, {"n": 1}, key="k")
    started = time.monotonic()
    with pytest.raises(WorkerCrashed, match="crashing service thread died \\(RuntimeError: bug in the service\\)"):
        worker.run()
    assert time.monotonic() - started < 10
    assert len(handled) == 1  # it worked until then
    assert not PartitionLease.objects.filter(leased_by="w-crash").exists()  # handed back, not left to expire
    assert "worker exiting subscriber=w-crash: its crashing service thread died" in caplog.text
    assert not worker.keeper.is_alive()
    assert store().now()  # the test's connection is fine


PROC_TOPIC = "proc.events"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_runconsumer_whose_lease_keeper_thread_dies_exits_non_zero_and_another_takes_over(runconsumer, settings):
    """Kill the lease-keeper thread of a real ``runconsumer`` (SystemExit raised in it by
    a handler, tests/consumerapp): the process logs why, releases its leases and exits 1;
    the other worker takes every partition at once and nothing is lost."""
    a = runconsumer("a", "--group", "g1", "--topic", PROC_TOPIC)
    a.expected_status = 1
    wait_until(lambda: PartitionLease.objects.filter(consumer_group="g1", leased_by="a").count() == 8, 15, "a leases")
    b = runconsumer("b", "--group", "g1", "--topic", PROC_TOPIC)
    wait_until(
        lambda: PartitionLease.objects.filter(consumer_group="g1", leased_by="b").count() == 4, 15, "4 partitions each"
    )
    a_part = PartitionLease.objects.filter(consumer_group="g1", leased_by="a").values_list("partition", flat=True)[0]
    poison = publish(PROC_TOPIC, {"kill_thread": "sqlqueue-lease-keeper"}, key=key_for_partition(a_part))
    wait_until(lambda: not a.alive(), 20, "a exits")
    assert a.proc.returncode == 1, a.log()[-3000:]
    log = a.log()
    assert "lease keeper thread died: SystemExit" in log, log[-3000:]
    assert "worker exiting subscriber=a: its lease keeper thread died" in log, log[-3000:]
    assert "released all leases group=g1" in log, log[-3000:]
    assert "CommandError" in log and "the worker stopped so that it can be restarted" in log, log[-3000:]
    exited = time.monotonic()
    wait_until(
        lambda: PartitionLease.objects.filter(consumer_group="g1", leased_by="b").count() == 8, 15, "b takes all"
    )
    assert time.monotonic() - exited < 3, "handed over, not left to expire"
    after = [publish(PROC_TOPIC, {"n": i}, key=key_for_partition(i % 8)) for i in range(16)]
    wait_until(
        lambda: Handled.objects.filter(group="g1", message_id__in=[m.id for m in after]).count() == 16,
        20,
        "b handles what comes next",
    )
    assert Handled.objects.filter(group="g1", message_id=poison.id, worker="a").exists()
    assert b.alive()
    assert b.terminate() == 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_runconsumer_whose_handler_raises_system_exit_loses_nothing(runconsumer):
    """A handler of a real ``runconsumer`` raises ``SystemExit(3)`` (a library calling
    ``sys.exit(3)``): its attempt is recorded as failed, the process hands back the rest,
    releases its leases and exits 3 as asked; the other worker handles the message again
    (attempt 2) and everything else, at once rather than after a visibility timeout."""
    a = runconsumer("a", "--group", "g1", "--topic", PROC_TOPIC, "--concurrency", "2")
    a.expected_status = 3
    wait_until(lambda: PartitionLease.objects.filter(consumer_group="g1", leased_by="a").count() == 8, 15, "a leases")
    b = runconsumer("b", "--group", "g1", "--topic", PROC_TOPIC)
    wait_until(
        lambda: PartitionLease.objects.filter(consumer_group="g1", leased_by="b").count() == 4, 15, "4 partitions each"
    )
    a_part = PartitionLease.objects.filter(consumer_group="g1", leased_by="a").values_list("partition", flat=True)[0]
    key = key_for_partition(a_part)
    exiting = publish(PROC_TOPIC, {"exit_first": 3}, key=key)
    wait_until(lambda: not a.alive(), 20, "a exits")
    assert a.proc.returncode == 3, a.log()[-3000:]
    log = a.log()
    assert "handler raised SystemExit(3), the worker stops" in log, log[-3000:]
    assert "worker exiting subscriber=a: a handler raised SystemExit" in log, log[-3000:]
    assert "released all leases group=g1" in log, log[-3000:]
    exited = time.monotonic()
    wait_until(
        lambda: Handled.objects.filter(group="g1", message_id=exiting.id, attempt=2, worker="b").exists(),
        15,
        "b handles it again",
    )
    assert time.monotonic() - exited < 8, "handed over with the leases, not left to the visibility timeout"
    attempts = list(Handled.objects.filter(group="g1", message_id=exiting.id).values_list("worker", "attempt"))
    assert attempts == [("a", 1), ("b", 2)]
    after = [publish(PROC_TOPIC, {"n": i}, key=key_for_partition(i % 8)) for i in range(16)]
    wait_until(
        lambda: Handled.objects.filter(group="g1", message_id__in=[m.id for m in after]).count() == 16,
        20,
        "b handles what comes next",
    )
    assert b.alive()
    assert b.terminate() == 0
