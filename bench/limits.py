"""Rate and concurrency limits (issue 30's aims), with real ``runconsumer`` processes.

    BENCH_DATABASE_URL=mysql://root@127.0.0.1:3306/bench_limits .venv/bin/python -m bench.limits

- ``rate``: ``--workers`` (4) workers drain ``--tasks`` (400) tasks limited to 20/s (burst 1).
  Reports the most starts in any one-second window (aim: <= 20 + burst - 1 = 20) and the
  time from the first start to the last against the ideal ``(tasks - 1) / 20`` s (aim: within 1.2x).
- ``concurrency``: 4 workers x ``--concurrency 4`` run 100 tasks of one account limited to 2
  at once (sleeping 0.2 s each) together with ``--others`` (1,000) unlimited tasks of other
  accounts sleeping ``--other-seconds`` (0.01 s), enqueued in a shuffled order; then, in a
  fresh round, the other tasks alone. Reports the most of the limited account running at
  once (aim: 2) and the other accounts' drain with the limited account present vs without
  it (aim: >= 0.9x), and how many deliveries the workers handed back to wait.

  What the aim measures: the limited account's 2 running tasks are entitled to 2 handler
  threads; the question is what its *waiting* tasks and the limit machinery cost the
  others, and whether a running limited task holds up the tasks fetched with it or after
  it. So the other tasks are many and short (their drain shows the workers' and the
  database's work per task, which hand-backs and head-of-line waits add to), and the topic
  keeps the project's 8 partitions (``--partitions``): a worker runs one batch per
  partition at a time, so 4 x 4 threads leave 8 threads beside the 8 partitions' batches --
  with 16 partitions every thread has a batch and 2 threads running limited tasks cap the
  others at 14/16 by thread count alone. The first version of this bench ran 100 other
  tasks of 0.2 s (``--others 100 --other-seconds 0.2``) alternated with the limited ones --
  which, unkeyed tasks going to the partitions round-robin, put all the limited tasks in
  the even partitions and all the others in the odd ones: the others had half the
  partitions (0.52-0.64x). The order is shuffled now.

Starts and ends are the ``Run`` rows each task writes (wall clock of the worker's host).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = "bench.limits_settings"


Workers = list[tuple[subprocess.Popen[bytes], IO[bytes]]]


def _workers(url: str, n: int, *args: str) -> Workers:
    """Start ``n`` workers, each logging to a temporary file (read back by :func:`_stop`)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS, "DATABASE_URL": url}  # BENCH_PARTITIONS too
    command = [sys.executable, "manage.py", "runconsumer", "--group", "tasks", *args]
    procs: Workers = []
    for i in range(n):
        log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by _stop()
        proc = subprocess.Popen(
            [*command, "--name", f"bench-limits-{i}"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        procs.append((proc, log))
    return procs


def _stop(procs: Workers) -> int | None:
    """Stop the workers; return how many deliveries they postponed in all (their "worker
    stopped ... postponed=N" lines; None if a worker logged none)."""
    for proc, _ in procs:
        proc.terminate()
    for proc, _ in procs:
        proc.wait(60)
    total: int | None = 0
    for _, log in procs:
        log.seek(0)
        found = re.findall(rb"worker stopped .* postponed=(\d+)", log.read())
        log.close()
        total = None if total is None or not found else total + sum(int(x) for x in found)
    return total


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
        postponed = _stop(procs)
    starts = sorted(Run.objects.filter(label__startswith="rate").values_list("started", flat=True))
    most = max(sum(1 for s in starts[i:] if s < t + 1.0) for i, t in enumerate(starts))
    span, ideal = starts[-1] - starts[0], (tasks - 1) / 20
    return (
        f"rate: {workers} workers, 20/s (burst 1), {tasks} tasks: most starts in a 1 s window {most} (aim <= 20); "
        f"first to last start {span:.2f}s, ideal {ideal:.2f}s: x{span / ideal:.3f} (aim <= 1.2); "
        f"{postponed} deliveries handed back to wait; {_load()}"
    )


def _drain(url: str, limited: int, others: int, other_seconds: float, tag: str) -> tuple[float, int, int | None]:
    """Run ``limited`` tasks of one limited account with ``others`` unlimited ones; return the
    unlimited ones' drain time (first start to last end), the most limited ones at once and
    how many deliveries were handed back to wait."""
    from bench.common import truncate_queue
    from tests.support.taskapp.limit_tasks import two_at_a_time, unlimited
    from tests.support.taskapp.models import Run

    truncate_queue()
    Run.objects.all().delete()
    # In a shuffled order (the same every round), not alternating: see the module docstring.
    order = [("lim", i) for i in range(limited)] + [("oth", i) for i in range(others)]
    random.Random(30).shuffle(order)
    for kind, i in order:
        if kind == "lim":
            two_at_a_time.enqueue(f"{tag}-lim{i}", "hot", 0.2)
        else:
            unlimited.enqueue(f"{tag}-oth{i}", f"acct{i}", other_seconds)
    procs = _workers(url, 4, "--concurrency", "4")
    try:
        _wait_runs(f"{tag}-", limited + others, 600)
    finally:
        postponed = _stop(procs)
    other = list(Run.objects.filter(label__startswith=f"{tag}-oth").values_list("started", "finished"))
    hot = list(Run.objects.filter(label__startswith=f"{tag}-lim").values_list("started", "finished"))
    drain = max(f for _, f in other) - min(s for s, _ in other)
    most = max((sum(1 for s2, f2 in hot if s2 <= s < f2) for s, _ in hot), default=0)
    return drain, most, postponed


def concurrency(url: str, others: int, other_seconds: float, rounds: int) -> str:
    partitions = os.environ.get("BENCH_PARTITIONS", "default")
    lines = []
    for r in range(rounds):  # with, alone, with, alone...: interleaved on a shared machine
        with_hot, most, postponed = _drain(url, 100, others, other_seconds, f"with{r}")
        alone, _, _ = _drain(url, 0, others, other_seconds, f"alone{r}")
        lines.append(
            f"concurrency round {r + 1}: 4 workers x 4 threads, {partitions} partitions, 100 tasks of one account "
            f"limited to 2 at once (0.2 s each): most at once {most} (aim 2); {others} tasks of other accounts "
            f"({other_seconds:g} s each) drained in {with_hot:.2f}s beside it, {alone:.2f}s alone: "
            f"x{alone / with_hot:.3f} of the drain rate (aim >= 0.9); {postponed} deliveries handed back to wait "
            f"(all 100 limited ones drained); {_load()}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", default="all", choices=["all", "rate", "concurrency"])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--others", type=int, default=1000, help="concurrency: tasks of other accounts")
    parser.add_argument("--other-seconds", type=float, default=0.01, help="concurrency: each one's sleep")
    parser.add_argument("--partitions", type=int, default=8, help="the task topic's partitions")
    parser.add_argument("--rounds", type=int, default=1, help="concurrency: rounds of (with, alone)")
    args = parser.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    os.environ["BENCH_PARTITIONS"] = str(args.partitions)
    from bench.common import BENCH_URL, setup_django

    url = os.environ.get("BENCH_DATABASE_URL", BENCH_URL)
    setup_django(url)
    if args.mode in ("all", "rate"):
        print(rate(url, args.workers, args.tasks), flush=True)
    if args.mode in ("all", "concurrency"):
        print(concurrency(url, args.others, args.other_seconds, args.rounds), flush=True)


if __name__ == "__main__":
    main()
