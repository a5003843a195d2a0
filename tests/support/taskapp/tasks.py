"""Tasks of the django.tasks backend tests (module-level, as the contract requires)."""

from __future__ import annotations

import asyncio
import os
import threading
import time

from django_sqlqueue.tasks import task_timeout
from django_sqlqueue.tasks.compat import TaskContext, task_finished
from tests.support.taskapp.models import Run

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task  # type: ignore[no-redef]


def record(label: str, key: str = "", seq: int = 0, started: float | None = None) -> Run:
    return Run.objects.create(
        label=label, key=key, seq=seq, pid=os.getpid(), started=started or time.time(), finished=time.time()
    )


@task()
def add(a: int, b: int) -> int:
    record("add")
    return a + b


@task()
def flaky(label: str, failures: int) -> str:
    """Fails its first ``failures`` attempts (counted in Run rows), then succeeds."""
    record(label)
    if Run.objects.filter(label=label).count() <= failures:
        raise ValueError(f"{label}: planned failure")
    return "ok"


@task()
def always_fails(label: str) -> None:
    record(label)
    raise RuntimeError(f"{label}: always fails")


@task(takes_context=True)
def attempt_number(context: TaskContext, label: str) -> int:
    record(label)
    return context.attempt


@task()
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0.01)
    return a + b


@task()
def sleepy(label: str, seconds: float) -> str:
    """Records its start, sleeps, records its end: a task to kill a worker in the middle of."""
    started = time.time()
    Run.objects.create(label=f"{label}:start", pid=os.getpid(), started=started)
    time.sleep(seconds)
    record(label, started=started)
    return "slept"


@task()
def keyed(label: str, key: str, seq: int) -> None:
    record(label, key=key, seq=seq)


@task()
def tick(label: str) -> None:
    record(label)


def _linger_after_finish(sender: object, task_result: object, **kwargs: object) -> None:
    """``task_finished`` is sent after the result is written and before the ack: record
    that moment and wait, for a test to kill the worker there."""
    Run.objects.create(label="finished-signal", pid=os.getpid(), started=time.time())
    time.sleep(float(os.environ["TSK_LINGER_AFTER_FINISH"]))


if os.environ.get("TSK_LINGER_AFTER_FINISH"):  # runconsumer processes of tests/processes/test_tasks.py
    task_finished.connect(_linger_after_finish, weak=False)


def plain_function() -> None:
    """Not a task: for validation tests."""


#: Set by tests/tasks/test_timeouts.py at teardown, so that hung tasks return.
RELEASE = threading.Event()


@task()
@task_timeout(0.4)
def hangs(label: str) -> str:
    """Hangs (until RELEASE) past its own timeout of 0.4 s, whatever its queue's."""
    record(label)
    RELEASE.wait()
    return "too late"


@task()
def hangs_on_queue(label: str) -> str:
    """Hangs until RELEASE, with the queue's timeout (OPTIONS["TIMEOUT"])."""
    record(label)
    RELEASE.wait()
    return "too late"


@task()
@task_timeout(None)
def slow_but_unlimited(label: str, seconds: float) -> str:
    """Runs past its queue's timeout, which it opts out of."""
    record(label)
    time.sleep(seconds)
    return "done"


# Imported with this module (runconsumer's autodiscovery), not by a handler thread on the
# first message: trust.py would find a module another thread is still importing and refuse.
from tests.support.taskapp import limit_tasks as limit_tasks  # noqa: E402
