"""Unique tasks (issue 30's aim): 2 processes x 500 concurrent ``enqueue()`` of the same
unique task -> 1 task, 1 run (by a real ``runconsumer``); and what a unique enqueue costs
next to a plain one.

    BENCH_DATABASE_URL=mysql://root@127.0.0.1:3306/bench_unique .venv/bin/python -m bench.unique
    BENCH_DATABASE_URL=postgres://root@127.0.0.1:5432/bench_unique .venv/bin/python -m bench.unique

- ``aim``: two processes, each with ``--threads`` threads (own connections) enqueueing the
  same task ``--each`` times, all released at one instant; then one ``runconsumer`` runs
  what was enqueued. Reports the tasks, the runs and the enqueue wall time.
- ``cost``: ``--n`` enqueues one by one (autocommit) of a plain task, of a unique task
  with a new key each time (claim + message), and of a duplicate (the claim read and the
  existing task's result); medians of ``--repeats``, and the ratio to plain.

``python -m bench.unique enqueue ...`` is the child process of ``aim`` (Django already set up
by ``DJANGO_SETTINGS_MODULE``/``DATABASE_URL``); it prints the ids it got.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = "tests.support.taskapp.process_settings"


def child(threads: int, each: int, label: str, start_at: float) -> None:
    import django

    django.setup()
    from django.db import connections

    from tests.support.taskapp.unique_tasks import bench_unique

    ids: set[str] = set()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            time.sleep(max(0.0, start_at - time.time()))
            for _ in range(each):
                ids.add(bench_unique.enqueue(label).id)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    if errors:
        raise errors[0]
    print(",".join(sorted(ids)))


def aim(url: str, threads: int, each: int) -> str:
    from tests.support.taskapp.models import Run
    from tests.support.taskapp.unique_tasks import bench_unique

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS, "DATABASE_URL": url}
    start_at = time.time() + 4  # both processes set up Django meanwhile
    command = [sys.executable, "-m", "bench.unique", "enqueue", "--threads", str(threads), "--each", str(each)]
    command += ["--label", "aim", "--start-at", str(start_at)]
    procs = [subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    ids: set[str] = set()
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        if proc.returncode:
            raise SystemExit(f"an enqueueing process failed ({proc.returncode})")
        ids |= set(out.split()[-1].split(","))
    wall = time.time() - start_at
    from django_sqlqueue.models import Message

    tasks = Message.objects.filter(topic="tasks.default").count()
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "runconsumer", "--name", "bench-unique"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.time() + 60
        while not all(bench_unique.get_result(i).is_finished for i in ids) and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(2)  # a second run, if there were one, would show by now
    finally:
        worker.terminate()
        worker.wait(30)
    runs = Run.objects.filter(label="aim").count()
    total = 2 * threads * each
    return (
        f"aim: 2 processes x {threads} threads x {each} = {total} concurrent enqueue() of one unique task: "
        f"{len(ids)} result id(s), {tasks} task message(s), {runs} run(s); enqueues took {wall:.2f}s "
        f"({total / wall:,.0f}/s)"
    )


def cost(n: int, repeats: int) -> str:
    from tests.support.taskapp.tasks import add
    from tests.support.taskapp.unique_tasks import bench_unique

    def timed(fn: object) -> float:
        begin = time.perf_counter()
        for i in range(n):
            fn(i)  # type: ignore[operator]
        return time.perf_counter() - begin

    rows: dict[str, list[float]] = {"plain": [], "unique, new key": [], "unique, duplicate": []}
    for rep in range(repeats):
        rows["plain"].append(timed(lambda i: add.enqueue(i, 1)))
        rows["unique, new key"].append(timed(lambda i, rep=rep: bench_unique.enqueue(f"c{rep}-{i}")))
        bench_unique.enqueue(f"dup{rep}")
        rows["unique, duplicate"].append(timed(lambda i, rep=rep: bench_unique.enqueue(f"dup{rep}")))
    plain = statistics.median(rows["plain"])
    lines = [f"cost: {n} enqueue() one by one, autocommit, medians of {repeats}"]
    for label, values in rows.items():
        median = statistics.median(values)
        lines.append(f"  {label:18} {n / median:>8,.0f}/s  x{median / plain:.2f} of plain")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", default="all", choices=["all", "aim", "cost", "enqueue"])
    parser.add_argument("--threads", type=int, default=50)
    parser.add_argument("--each", type=int, default=10)
    parser.add_argument("--label", default="aim")
    parser.add_argument("--start-at", type=float, default=0.0)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.mode == "enqueue":
        child(args.threads, args.each, args.label, args.start_at)
        return
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    from bench.common import BENCH_URL, setup_django

    url = os.environ.get("BENCH_DATABASE_URL", BENCH_URL)
    setup_django(url)
    if args.mode in ("all", "aim"):
        print(aim(url, args.threads, args.each), flush=True)
    if args.mode in ("all", "cost"):
        print(cost(args.n, args.repeats), flush=True)


if __name__ == "__main__":
    main()
