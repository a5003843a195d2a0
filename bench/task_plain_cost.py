"""What a plain task costs the worker, counted (issue 30: "a plain task pays nothing").

    .venv/bin/python bench/task_plain_cost.py [--root DIR] [--tasks 2000] [--db bench_cost] [--worker]

The peer harness's tasks adapter (``bench/peers/sqlqueuetasks``: the task ``record`` inserts
one row into ``bench_done`` over its own connection) in this process: ``--tasks`` plain tasks
(no priority levels, no unique, no limits, no batch) enqueued in one transaction, then
``drain_tasks()`` runs them (the worker's poll, dispatch, handler and ack, inline), twice:

- statements per task on the worker's connection, by verb (``execute_wrapper``);
- Python function calls per task (``sys.setprofile``, every thread), and the calls per
  function whose count differs most between checkouts (``--top``).

``--worker`` counts a ``Worker.run()`` as ``runconsumer`` runs it instead (handler threads:
a task queue has per-task timeouts), its statements on every thread's connection.

Counts do not depend on the machine's load. ``--root DIR`` runs another checkout's engine
(``git archive`` of an older commit), e.g. 03d7b06 or the tree before issue 30. Needs the
shared peer harness (``../shared/peer-bench`` or ``PEER_BENCH``) for ``benchlib``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run_worker(target: int) -> None:
    """Run a worker as ``runconsumer`` does (handler threads: a task consumer has per-task
    timeouts) until ``bench_done`` has ``target`` rows; the watcher's thread is not counted."""
    from benchlib.common import connect
    from django.db import connections

    from django_sqlqueue.tasks.discovery import task_consumer_specs

    try:
        from django_sqlqueue.worker.loop import Worker
    except ImportError:  # before issue 27
        from django_sqlqueue.worker import Worker  # type: ignore[attr-defined,no-redef]

    worker = Worker(task_consumer_specs(), name=f"cost-{os.getpid()}")

    def watch() -> None:
        db = connect(os.environ["BENCH_DB"])
        cursor = db.cursor()
        while not worker.stop_event.is_set():
            cursor.execute("SELECT COUNT(*) FROM bench_done")
            if cursor.fetchone()[0] >= target:
                worker.stop_event.set()
                getattr(worker, "wakeup", worker.stop_event).set()
            time.sleep(0.02)
        db.close()

    hook = sys.getprofile()  # not the watcher: started before the count resumes
    threading.setprofile(None)  # type: ignore[arg-type]
    sys.setprofile(None)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    threading.setprofile(hook)  # type: ignore[arg-type]
    sys.setprofile(hook)
    worker.run()
    connections.close_all()


def _paths(root: Path) -> None:
    peer_bench = Path(os.environ.get("PEER_BENCH", HERE.parent.parent / "shared" / "peer-bench"))
    if not peer_bench.is_dir():
        peer_bench = Path("/work/shared/peer-bench")
    adapter = root / "bench" / "peers" / "sqlqueuetasks"
    if not adapter.is_dir():  # an old tree without the adapter: this checkout's
        adapter = HERE / "peers" / "sqlqueuetasks"
    sys.path[:0] = [str(root), str(adapter), str(peer_bench)]
    os.environ["SQLQUEUE_SRC"] = str(root)
    os.environ["DJANGO_SETTINGS_MODULE"] = "settings"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=HERE.parent)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--db", default="bench_hdrn_cost")
    parser.add_argument("--top", type=int, default=0, help="print the functions with the most calls per task")
    parser.add_argument("--json", default=None, help="write the counts to this file")
    parser.add_argument(
        "--worker", action="store_true", help="count a Worker.run() as runconsumer's (handler threads) instead"
    )
    parser.add_argument("--cprofile", type=int, default=0, help="print this many functions by cumulative time")
    args = parser.parse_args()
    root = args.root.resolve()
    os.environ["BENCH_DB"] = args.db
    _paths(root)

    from benchlib.common import connect
    from benchlib.job import ddl_statements

    admin = connect(None)
    admin.cursor().execute(f"CREATE DATABASE IF NOT EXISTS {args.db}")
    admin.close()

    import django

    django.setup()
    import django_sqlqueue

    assert Path(django_sqlqueue.__file__).resolve().is_relative_to(root), django_sqlqueue.__file__
    from benchtasks.tasks import record
    from django.core.management import call_command
    from django.db import connection, transaction

    from django_sqlqueue.testing.tasks import drain_tasks

    call_command("migrate", verbosity=0)
    drain_tasks()  # what an interrupted run left
    with connection.cursor() as cursor:
        for ddl in ddl_statements():
            cursor.execute(ddl)
        cursor.execute("DELETE FROM bench_done")

    def enqueue(n: int) -> None:
        with transaction.atomic():
            for i in range(n):
                record.enqueue(i, "cost", time.time())

    # Warm up: imports, the task's resolution, the connections, the topic's rows.
    enqueue(50)
    drain_tasks()

    statements: Counter[str] = Counter()

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        verb = sql.lstrip(" (").split()[0].upper()
        statements[verb] += 1
        return execute(sql, params, many, context)

    calls: Counter[str] = Counter()
    total = [0]

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            total[0] += 1
            if args.top:
                code = frame.f_code
                calls[f"{code.co_filename.rsplit('/', 2)[-2:]!s}:{code.co_name}"] += 1

    enqueue(args.tasks)
    with connection.execute_wrapper(spy):
        started = time.perf_counter()
        drain_tasks()
        plain_seconds = time.perf_counter() - started
    worker_statements: Counter[str] = Counter()
    cpu = 0.0
    if args.worker:  # the worker's statements on every thread's connection, not profiled
        from django.db.backends.signals import connection_created

        def worker_spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            worker_statements[sql.lstrip(" (").split()[0].upper()] += 1
            return execute(sql, params, many, context)

        def wrap(sender: Any, connection: Any, **kwargs: Any) -> None:
            connection.execute_wrappers.append(worker_spy)

        enqueue(args.tasks)
        connection_created.connect(wrap)
        connection.execute_wrappers.append(worker_spy)
        cpu = time.process_time()
        try:
            run_worker(2 * args.tasks + 50)
            cpu = time.process_time() - cpu  # this process's CPU, every thread
        finally:
            connection_created.disconnect(wrap)
            connection.execute_wrappers.remove(worker_spy)
    enqueue(args.tasks)
    ran = (3 if args.worker else 2) * args.tasks + 50
    run = partial(run_worker, ran) if args.worker else drain_tasks
    threading.setprofile(count)
    sys.setprofile(count)
    try:
        run()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM bench_done WHERE phase = 'cost'")
        done = cursor.fetchone()[0]
    assert done == ran, done  # every task ran once
    n = args.tasks
    result = {
        "root": str(root),
        "statements_per_task": sum(statements.values()) / n,
        "statements_by_verb": {k: v / n for k, v in sorted(statements.items())},
        "worker_statements_per_task": sum(worker_statements.values()) / n,
        "worker_statements_by_verb": {k: v / n for k, v in sorted(worker_statements.items())},
        "worker_cpu_us_per_task": cpu / n * 1e6,
        "calls_per_task": total[0] / n,
        "counted": "Worker.run() (runconsumer's worker)" if args.worker else "drain_tasks()",
        "drain_tasks_per_s_unprofiled": n / plain_seconds,
    }
    print(json.dumps(result, indent=1))
    if args.cprofile:
        import cProfile
        import pstats

        enqueue(args.tasks)
        profile = cProfile.Profile()
        profile.runcall(drain_tasks)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(args.cprofile)
    if args.top:
        for name, value in calls.most_common(args.top):
            print(f"{value / n:8.2f}  {name}")
    if args.json:
        Path(args.json).write_text(json.dumps({**result, "calls": {k: v / n for k, v in calls.items()}}))


if __name__ == "__main__":
    main()
