"""Task priorities (issue 30's aim): with a backlog of 5,000 priority -10 tasks, 20 tasks of
priority 50 enqueued after them all start before 100 more of the backlog start (one
``runconsumer --concurrency 1``).

    BENCH_DATABASE_URL=mysql://root@127.0.0.1:3306/bench_prio .venv/bin/python -m bench.priorities
    BENCH_DATABASE_URL=postgres://root@127.0.0.1:5432/bench_prio .venv/bin/python -m bench.priorities

The backlog is enqueued first (one transaction), the worker started, and once ``--head``
backlog tasks have run the 20 high-priority tasks are enqueued (one transaction). Reported:
how many backlog tasks started between that commit and the start of the last high-priority
task (the aim: fewer than 100), the high tasks' wait from commit to start, and the
backlog's drain rate with levels on.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = "tests.support.taskapp.process_settings"
LEVELS = "-10,0,50"


def run(url: str, backlog: int, high: int, head: int, levels: str = LEVELS) -> dict[str, float]:
    from django.db import transaction

    from tests.support.taskapp import tasks
    from tests.support.taskapp.models import Run

    Run.objects.all().delete()
    low = tasks.keyed.using(priority=-10 if levels == LEVELS else 0)
    with transaction.atomic():
        for i in range(backlog):
            low.enqueue("low", "", i)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS, "DATABASE_URL": url, "TSK_PRIORITIES": levels}
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "runconsumer", "--name", "bench-prio", "--concurrency", "1", "-v", "0"],
        cwd=ROOT,
        env=env,
    )
    try:
        while Run.objects.filter(label="low").count() < head:
            time.sleep(0.01)
        with transaction.atomic():
            for i in range(high):
                tasks.keyed.using(priority=50).enqueue("high", "", i)
        committed = time.time()
        while Run.objects.filter(label="high").count() < high:
            time.sleep(0.01)
        highs = sorted(Run.objects.filter(label="high").values_list("started", flat=True)) or [committed]
        between = Run.objects.filter(label="low", started__gt=committed, started__lt=highs[-1]).count()
        while Run.objects.filter(label="low").count() < backlog:
            time.sleep(0.05)
        lows = sorted(Run.objects.filter(label="low").values_list("started", flat=True))
    finally:
        worker.terminate()
        worker.wait(30)
    return {
        "backlog_started_between": between,
        "high_wait_p50_ms": statistics.median(h - committed for h in highs) * 1000,
        "high_wait_max_ms": (highs[-1] - committed) * 1000,
        "backlog_per_s": (len(lows) - 1) / (lows[-1] - lows[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlog", type=int, default=5000)
    parser.add_argument("--high", type=int, default=20)
    parser.add_argument("--head", type=int, default=500, help="backlog tasks run before the high ones are enqueued")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    os.environ["TSK_PRIORITIES"] = LEVELS
    from bench.common import BENCH_URL, setup_django

    url = os.environ.get("BENCH_DATABASE_URL", BENCH_URL)
    setup_django(url)
    results = [run(url, args.backlog, args.high, args.head) for _ in range(args.rounds)]
    # The same backlog on a queue with one level (no PRIORITIES): what the levels cost the drain.
    plain = [run(url, args.backlog, 0, args.head, levels="0") for _ in range(args.rounds)]
    print(
        f"priorities: backlog {args.backlog} at -10, {args.high} at 50 after {args.head} ran; 1 worker, --concurrency 1"
    )
    for key in results[0]:
        values = [r[key] for r in results]
        print(f"  {key:26} median {statistics.median(values):>9.1f}   runs {', '.join(f'{v:.1f}' for v in values)}")
    rates = [r["backlog_per_s"] for r in plain]
    per_s = statistics.median(rates)
    print(
        f"  one level (no PRIORITIES), backlog_per_s median {per_s:.1f}   runs {', '.join(f'{v:.1f}' for v in rates)}"
    )
    print(f"  drain with 3 levels vs one: {statistics.median(r['backlog_per_s'] for r in results) / per_s:.2f}x")
    worst = max(r["backlog_started_between"] for r in results)
    verdict = "met" if worst < 100 else "MISSED"
    print(f"  aim (< 100 backlog tasks started before the last high one): {verdict} (worst {worst})")


if __name__ == "__main__":
    main()
