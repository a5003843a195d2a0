"""Tasks of the batch tests (tests/tasks/test_batches.py, the kill -9 test, bench/batches.py).

In the task test app, so that a ``runconsumer`` worker may look them up (``trust.py``).
"""

from __future__ import annotations

import time
from typing import Any

from django_sqlqueue.exceptions import Reject
from django_sqlqueue.tasks import task_max_attempts
from tests.support.taskapp.models import Run

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task  # type: ignore[no-redef]


def _record(label: str, key: str = "", seq: int = 0) -> None:
    import os

    now = time.time()
    Run.objects.create(label=label, key=key, seq=seq, pid=os.getpid(), started=now, finished=now)


@task()
def member(label: str, seq: int = 0, seconds: float = 0.0) -> int:
    """A member that succeeds (after ``seconds``)."""
    if seconds:
        time.sleep(seconds)
    _record(label, seq=seq)
    return seq


@task()
@task_max_attempts(2)
def failing_member(label: str) -> None:
    """Fails each of its 2 attempts: failed for good after the second."""
    _record(label)
    raise RuntimeError(f"{label}: planned failure")


@task()
def rejected_member(label: str) -> None:
    """Rejected at once (dead-lettered, no retry)."""
    _record(label)
    raise Reject(f"{label}: rejected")


@task()
def done(batch_id: str, total: int, succeeded: int, failed: int, metadata: dict[str, Any]) -> None:
    """The callback: one Run row per run, its label the counts."""
    _record(f"done:{total}:{succeeded}:{failed}", key=batch_id, seq=int(metadata.get("seq", 0)))


@task()
def done_with_kwargs(**kwargs: Any) -> None:
    """A callback that takes any keyword arguments."""
    _record("done-kwargs", key=kwargs["batch_id"])


@task()
def not_a_callback(label: str) -> None:
    """Does not take the callback's keyword arguments."""
