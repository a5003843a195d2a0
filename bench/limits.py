"""Rate and concurrency limits (issue 30's aims), with real ``runconsumer`` processes.

    BENCH_DATABASE_URL=mysql://root@127.0.0.1:3306/bench_limits .venv/bin/python -m bench.limits

- ``rate``: ``--workers`` (4) workers drain ``--tasks`` (400) tasks limited to 20/s (burst 1).
  Reports the most starts in any one-second window (aim: <= 20 + burst - 1 = 20) and the
  time from the first start to the last against the ideal ``(tasks - 1) / 20`` s (aim: within 1.2x).
- ``concurrency``: 4 workers x ``--concurrency 4`` run 100 tasks of one account limited to 2
  at once (sleeping 0.2 s each) together with 100 unlimited tasks of other accounts (same
  sleep); then, in a fresh round, the 100 other tasks alone. Reports the most of the limited
  account running at once (aim: 2) and the other accounts' drain with the limited account
  present vs without it (aim: >= 0.9x).

Starts and ends are the ``Run`` rows each task writes (wall clock of the worker's host).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = "tests.support.taskapp.process_settings"


def _workers(url: str, n: int, *args: str) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS, "DATABASE_URL": url}
    command = [sys.executable, "manage.py", "runconsumer", "--group", "tasks", *args]
    return [
        subprocess.Popen(
            [*command, "--name", f"bench-limits-{i}"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        for i in range(n)
    ]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(60)


def _wait_runs(label_prefix: str, n: int, timeout: float) -> None:
    from tests.support.taskapp.models import Run

    deadline = time.time() + timeout
    while Run.objects.filter(label__startswith=label_prefix).count() < n:
        if time.time() > deadline:
            raise SystemExit(f"timed out: {Run.objects.filter(label__startswith=label_prefix).count()}/{n} ran")
        time.sleep(0.2)


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} (1 / 5 min, {os.cpu_count()} CPUs, shared machine)"


def rate(url: str, workers: int, tasks: int) -> str:
    from bench.common import truncate_queue
    from tests.support.taskapp.limit_tasks import twenty_a_second
    from tests.support.taskapp.models import Run

    truncate_queue()
    Run.objects.all().delete()
    for i in range(tasks):
        twenty_a_second.enqueue(f"rate{i}")
    procs = _workers(url, workers)
    try:
        _wait_runs("rate", tasks, 600)
    finally:
        _stop(procs)
    starts = sorted(Run.objects.filter(label__startswith="rate").values_list("started", flat=True))
    most = max(sum(1 for s in starts[i:] if s < t + 1.0) for i, t in enumerate(starts))
    span, ideal = starts[-1] - starts[0], (tasks - 1) / 20
    return (
        f"rate: {workers} workers, 20/s (burst 1), {tasks} tasks: most starts in a 1 s window {most} (aim <= 20); "
        f"first to last start {span:.2f}s, ideal {ideal:.2f}s: x{span / ideal:.3f} (aim <= 1.2); {_load()}"
    )


def _drain(url: str, limited: int, others: int, tag: str) -> tuple[float, int]:
    """Run ``limited`` tasks of one limited account with ``others`` unlimited ones; return the
    unlimited ones' drain time (first start to last end) and the most limited ones at once."""
    from bench.common import truncate_queue
    from tests.support.taskapp.limit_tasks import two_at_a_time, unlimited
    from tests.support.taskapp.models import Run

    truncate_queue()
    Run.objects.all().delete()
    for i in range(max(limited, others)):
        if i < limited:
            two_at_a_time.enqueue(f"{tag}-lim{i}", "hot", 0.2)
        if i < others:
            unlimited.enqueue(f"{tag}-oth{i}", f"acct{i}", 0.2)
    procs = _workers(url, 4, "--concurrency", "4")
    try:
        _wait_runs(f"{tag}-", limited + others, 600)
    finally:
        _stop(procs)
    other = list(Run.objects.filter(label__startswith=f"{tag}-oth").values_list("started", "finished"))
    hot = list(Run.objects.filter(label__startswith=f"{tag}-lim").values_list("started", "finished"))
    drain = max(f for _, f in other) - min(s for s, _ in other)
    most = max((sum(1 for s2, f2 in hot if s2 <= s < f2) for s, _ in hot), default=0)
    return drain, most


def concurrency(url: str) -> str:
    with_hot, most = _drain(url, 100, 100, "with")
    alone, _ = _drain(url, 0, 100, "alone")
    return (
        f"concurrency: 4 workers x 4 threads, 100 tasks of one account limited to 2 at once (0.2 s each): "
        f"most at once {most} (aim 2); 100 tasks of other accounts drained in {with_hot:.2f}s beside it, "
        f"{alone:.2f}s alone: x{alone / with_hot:.3f} of the drain rate (aim >= 0.9); {_load()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", default="all", choices=["all", "rate", "concurrency"])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=400)
    args = parser.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    from bench.common import BENCH_URL, setup_django

    url = os.environ.get("BENCH_DATABASE_URL", BENCH_URL)
    setup_django(url)
    if args.mode in ("all", "rate"):
        print(rate(url, args.workers, args.tasks), flush=True)
    if args.mode in ("all", "concurrency"):
        print(concurrency(url), flush=True)


if __name__ == "__main__":
    main()
