"""Unique tasks (django_sqlqueue/tasks/uniqueness.py) of tests/tasks/test_uniqueness.py and bench/unique.py.

In an installed app, so that ``runconsumer`` processes run them too.
"""

from __future__ import annotations

import threading
from typing import Any

from django_sqlqueue.tasks import unique
from tests.support.taskapp.tasks import record

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task  # type: ignore[no-redef]

#: Set by the tests to let ``held`` return.
RELEASE = threading.Event()


@task()
@unique(keys=("user_id",))
def digest(user_id: int, day: str = "mon") -> str:
    """One per user_id while waiting or running (the default states)."""
    record(f"digest:{user_id}:{day}")
    return day


@task()
@unique()
def every_argument(a: int, b: Any = 1, **extra: Any) -> None:
    """Unique on all its arguments, defaults included."""
    record(f"every:{a}:{b}")


@task()
@unique(keys=("label",))
def held(label: str) -> str:
    """Runs until RELEASE: a task that stays RUNNING."""
    record(label)
    RELEASE.wait(30)
    return label


@task()
@unique(keys=("label",), states=("waiting",))
def held_waiting_only(label: str) -> str:
    """Counts only while not started: a running one does not stop another."""
    record(label)
    RELEASE.wait(30)
    return label


@task()
@unique(keys=("label",), period=60, states=("waiting", "running", "finished"))
def once_a_minute(label: str) -> str:
    """A finished one counts too, for a minute after its enqueue."""
    record(label)
    return label


@task()
@unique(period=0.5)
def short_period(label: str) -> None:
    """Its claim lapses 0.5 s after its enqueue, whatever its state."""
    record(label)


@task(takes_context=True)
@unique(keys=("label",))
def with_context(context: Any, label: str, n: int = 0) -> int:
    record(label)
    return n


@task()
@unique(keys=("label",))
def bench_unique(label: str) -> None:
    """The task of the concurrent-enqueue tests and bench/unique.py: records its run."""
    record(label)
