"""Rate- and concurrency-limited tasks (django_sqlqueue/tasks/limits.py) of tests/tasks/test_limits.py,
tests/processes/test_limits.py and bench/limits.py.

In an installed app, so that ``runconsumer`` processes run them too. Each run records a
``Run`` row with its start and end (wall clock), to count starts per second and overlaps.
"""

from __future__ import annotations

import os
import time

from django_sqlqueue.tasks import concurrency_limit, rate_limit
from tests.support.taskapp.models import Run

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task  # type: ignore[no-redef]


def _run(label: str, key: str, seconds: float) -> None:
    started = time.time()
    if seconds:
        time.sleep(seconds)
    Run.objects.create(label=label, key=key, pid=os.getpid(), started=started, finished=time.time())


@task()
@rate_limit("20/s")
def twenty_a_second(label: str) -> None:
    _run(label, "", 0)


@task()
@rate_limit("1/3s", key="customer")
def one_per_3s(label: str, customer: str) -> None:
    _run(label, customer, 0)


@task()
@concurrency_limit(2, key="account")
def two_at_a_time(label: str, account: str, seconds: float) -> None:
    _run(label, account, seconds)


@task()
def unlimited(label: str, account: str, seconds: float) -> None:
    _run(label, account, seconds)


@task()
@rate_limit("5/m", key="customer", burst=2)
@concurrency_limit(2, key=lambda account, customer: f"{account}-{customer}")
def sync(account: str, customer: str) -> None:
    _run("sync", account, 0)


@rate_limit("5/s", key="label")  # on top of @task: it marks the task's function
@task(takes_context=True)
def with_context(context: object, label: str) -> None:
    _run(label, "", 0)
