"""What cancelling costs a plain task (issue 30's aim: "a plain task pays nothing for this").

    BENCH_DATABASE_URL=mysql://root@127.0.0.1:3306/bench_cancel .venv/bin/python -m bench.task_cancel

The worker's side of cancelling is one ``SELECT id FROM queue_task_results WHERE id IN (...)``
per fetched batch (``tasks/precheck.py``). Two measures of ``--tasks`` plain tasks
(``tests.support.taskapp.tasks.tick``: one Run row each), enqueued in one transaction:

- ``statements``: ``drain_tasks()`` in this process, every statement it sends counted
  (exact, unlike timings on a shared machine);
- ``runconsumer``: one ``runconsumer --concurrency N`` drains them; the rate is the tasks'
  own start times, first to last (process start-up excluded), per round.

Run it in two checkouts -- with the change and without (``git archive`` of the commit
before it, or the tree with the two calls taken out) -- alternating the order per round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = "tests.support.taskapp.process_settings"


def drain(url: str, n: int, concurrency: int) -> float:
    """Enqueue ``n`` plain tasks, drain them with one runconsumer; tasks per second."""
    from django.db import transaction

    from bench.common import truncate_queue
    from tests.support.taskapp import tasks
    from tests.support.taskapp.models import Run

    truncate_queue()
    Run.objects.all().delete()
    with transaction.atomic():
        for _ in range(n):
            tasks.tick.enqueue("plain")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS, "DATABASE_URL": url}
    command = ["manage.py", "runconsumer", "--name", "bench-cancel", "--concurrency", str(concurrency), "-v", "0"]
    worker = subprocess.Popen(
        [sys.executable, *command],
        cwd=ROOT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 600
        while Run.objects.filter(label="plain").count() < n:
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError("the worker did not drain the tasks")
            time.sleep(0.1)
    finally:
        worker.terminate()
        worker.wait(30)
    starts = sorted(Run.objects.filter(label="plain").values_list("started", flat=True))
    return (n - 1) / (starts[-1] - starts[0])


def statements(n: int) -> dict[str, float]:
    """Enqueue ``n`` plain tasks, ``drain_tasks()`` them here; statements per task, by kind."""
    from collections import Counter

    from django.db import connection, transaction

    from bench.common import truncate_queue
    from django_sqlqueue.testing.tasks import drain_tasks
    from tests.support.taskapp import tasks

    truncate_queue()
    with transaction.atomic():
        for _ in range(n):
            tasks.tick.enqueue("plain")
    counts: Counter[str] = Counter()

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        verb = sql.lstrip(" (").split()[0].upper()
        counts[verb] += 1
        if "queue_task_results" in sql:
            counts[f"{verb} queue_task_results"] += 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        drain_tasks()
    total = sum(v for k, v in counts.items() if " " not in k)
    return {"all": total / n, **{k: v / n for k, v in sorted(counts.items())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", default=None, help="write the rates to this file")
    args = parser.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    from bench.common import BENCH_URL, setup_django

    url = os.environ.get("BENCH_DATABASE_URL", BENCH_URL)
    setup_django(url)
    counted = statements(args.tasks)
    print(f"statements per plain task, drain_tasks() of {args.tasks} ({ROOT}):")
    print("  " + ", ".join(f"{k} {v:.4f}" for k, v in counted.items()))
    rates = [drain(url, args.tasks, args.concurrency) for _ in range(args.rounds)]
    print(
        f"plain task drain ({ROOT}): {args.tasks} tasks, --concurrency {args.concurrency}: "
        f"median {statistics.median(rates):.0f} tasks/s (runs {', '.join(f'{r:.0f}' for r in rates)})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"rates": rates, "statements": counted}))


if __name__ == "__main__":
    main()
