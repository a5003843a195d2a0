"""The console's Tasks tab against 200,000 task results (MariaDB unless BENCH_DATABASE_URL).

    BENCH_DATABASE_URL=mysql://root@127.0.0.1:3306/sqlqueue_tasks_bench .venv/bin/python bench/console_tasks.py

Loads the results with the ORM (``bulk_create``): 85% successful, 10% failed, 1% cancelled,
4% ready or running; then times the rendered pages (Django test client, a superuser, full
template rendering; the median of 5) and, side by side, the ``COUNT(*)`` a paginator would
add to every page.
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("BENCH_DATABASE_URL", "mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue_tasks_bench")

from bench.common import setup_django

RESULTS = 200_000
PATHS = [f"shop.tasks.job{n}" for n in range(20)]


def load() -> None:
    from django_sqlqueue.task_models import TaskResultRecord

    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    error = {"exception_class_path": "builtins.ValueError", "traceback": "Traceback ...\nValueError: declined\n"}
    cancelled = {"exception_class_path": "django_sqlqueue.exceptions.TaskCancelled", "traceback": "cancelled by ops"}
    batch = []
    began = time.perf_counter()
    for n in range(RESULTS):
        kind = n % 100
        status, errors = "SUCCESSFUL", []
        if kind < 10:
            status, errors = "FAILED", [error] * 3
        elif kind == 10:
            status, errors = "FAILED", [cancelled]
        elif kind < 15:
            status = "READY" if kind < 13 else "RUNNING"
        at = start + dt.timedelta(seconds=n)
        batch.append(
            TaskResultRecord(
                id=f"r{n:08d}",
                backend="default",
                queue_name="default" if n % 3 else "emails",
                topic="tasks.default",
                task_path=PATHS[n % len(PATHS)],
                status=status,
                args=[n, "x" * 100],
                kwargs={"order": n},
                enqueued_at=at,
                started_at=at,
                finished_at=at + dt.timedelta(seconds=1) if status in ("SUCCESSFUL", "FAILED") else None,
                errors=errors,
                worker_ids=["host:1"] * max(1, len(errors)),
            )
        )
        if len(batch) == 5_000:
            TaskResultRecord.objects.bulk_create(batch)
            batch = []
    print(f"loaded {RESULTS:,} results in {time.perf_counter() - began:.1f} s")


def timed(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> None:
    setup_django(os.environ["BENCH_DATABASE_URL"])
    from django.conf import settings

    settings.ALLOWED_HOSTS = ["*"]
    from django.contrib.auth.models import User
    from django.test import Client
    from django.urls import reverse

    from django_sqlqueue.ops import tasks
    from django_sqlqueue.task_models import TaskResultRecord

    load()
    User.objects.create_superuser("bench", "b@example.com", "pw")
    client = Client()
    client.force_login(User.objects.get(username="bench"))
    base = reverse("admin:django_sqlqueue_queueconsole_tasks")
    second = tasks.list_tasks(limit=50).next_cursor
    pages = {
        "all, newest": {},
        "all, page 2": {"cursor": second},
        "failed": {"status": "FAILED"},
        "cancelled": {"status": "CANCELLED"},
        "running": {"status": "RUNNING"},
        "task job7": {"task": "job7"},
        "failed job7 in emails": {"status": "FAILED", "task": "job7", "queue": "emails"},
    }
    for name, query in pages.items():

        def get(query: dict = query) -> None:
            assert client.get(base, query).status_code == 200

        print(f"{name:>24}: {timed(get):7.1f} ms")
    detail = reverse("admin:django_sqlqueue_queueconsole_task", args=["r00100010"])
    print(f"{'a task page':>24}: {timed(lambda: client.get(detail)):7.1f} ms")
    print(
        f"{'COUNT(*) of failed':>24}: {timed(lambda: TaskResultRecord.objects.filter(status='FAILED').count()):7.1f} ms"
    )
    print(f"{'COUNT(*) of all':>24}: {timed(lambda: TaskResultRecord.objects.count()):7.1f} ms")


if __name__ == "__main__":
    main()
