from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections
from hypothesis import HealthCheck, settings

from django_sqlqueue.models import Message

from .support.databases_scene import Scene

# Property tests (tests/test_*_properties.py) are reproducible: the same examples on every run
# and every machine, no example database on disk, and no per-example deadline (a database round
# trip is slow and its time varies). HYPOTHESIS_PROFILE=explore searches at random, for a hunt.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile(
    "explore",
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def count_messages() -> Callable[..., int]:
    """Count stored messages, optionally filtered (reads on this thread's connection)."""

    def count(**filters: Any) -> int:
        return Message.objects.filter(**filters).count()

    return count


class Worker(threading.Thread):
    """A thread with its own database connection; re-raises its exception on join."""

    def __init__(self, target: Callable[[], Any], name: str = "") -> None:
        super().__init__(name=name or None, daemon=True)
        self._target_fn = target
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self._target_fn()
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc
        finally:
            connections.close_all()

    def join_ok(self, timeout: float = 30) -> Any:
        self.join(timeout)
        assert not self.is_alive(), f"thread {self.name} did not finish in {timeout}s"
        if self.error is not None:
            raise self.error
        return self.result


@pytest.fixture
def spawn() -> Iterator[Callable[..., Worker]]:
    """Start a function on a thread with its own connection."""
    started: list[Worker] = []

    def start(target: Callable[[], Any], name: str = "") -> Worker:
        worker = Worker(target, name)
        worker.start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.join(30)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report on the item, so fixtures can tell whether the test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
def runconsumer(request: pytest.FixtureRequest, transactional_db: None) -> Iterator[Callable[..., Any]]:
    """Start real ``runconsumer`` processes (tests/support/processes.py); any still running is killed at teardown.

    A process that exited on its own with an unexpected status fails the test, with its log.
    When the test failed, the end of every process's log is printed (pytest shows it under
    "Captured stdout teardown"): a timed-out wait then says what the workers were doing.
    """
    import signal

    from tests.support.processes import ConsumerProcess

    started: list[ConsumerProcess] = []

    def start(name: str, *args: str, **kwargs: Any) -> ConsumerProcess:
        process = ConsumerProcess(name, *args, **kwargs)
        started.append(process)
        return process

    yield start
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        for process in started:
            print(f"\n----- runconsumer {process.name} (pid {process.pid}) log, last 6000 characters -----")
            print(process.log()[-6000:])
    failed = []
    for process in started:
        expected = (0, -signal.SIGKILL, 143, process.expected_status)
        if not process.alive() and process.proc.returncode not in expected:
            failed.append(f"{process.name} exited {process.proc.returncode}:\n{process.log()[-3000:]}")
        process.cleanup()
    assert not failed, "\n".join(failed)


@pytest.fixture
def second_routes() -> Iterator[None]:
    """Route ``second.*`` to the alias ``second`` (a database of its own, tests/support/settings.py)."""
    from django.conf import settings as django_settings
    from django.test import override_settings

    from .support.settings import SECOND_ROUTES

    with override_settings(SQLQUEUE={**django_settings.SQLQUEUE, "TOPIC_DATABASES": SECOND_ROUTES}):
        yield


@pytest.fixture
def two_databases(second_routes: None) -> Iterator[Scene]:
    """The queue in two databases, one topic and the group ``ledger`` in each (tests/support/databases_scene.py)."""
    from django.conf import settings as django_settings
    from django.test import override_settings

    from .support import databases_scene

    with override_settings(SQLQUEUE={**django_settings.SQLQUEUE, "TOPICS": databases_scene.SETTINGS_TOPICS}):
        yield databases_scene.build()
