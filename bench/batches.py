"""Batches under kill -9 (issue 30's aim): 1,000 members, 10 ``kill -9`` of workers; the
callback must be enqueued and run exactly once, with 1,000 counted.

Run: ``.venv/bin/python bench/batches.py [--members 1000] [--kills 10] [--workers 4] [--json FILE]``
(``BENCH_DATABASE_URL``: default ``sqlqueue_bench_t`` on the local MariaDB, recreated).

Real ``runconsumer`` processes (the task test app's settings: ``tests/support/taskapp``,
visibility timeout 2 s so a killed worker's tasks come back quickly). The members sleep
5 ms each. Every 0.5-1.5 s one worker, chosen at random, gets SIGKILL and a fresh one is
started, until ``--kills`` kills. Reported: kills, callbacks enqueued (result rows of the callback's one id), callback
runs, members counted (succeeded + failed), member runs (> members: the kills' victims ran
again), and the seconds from the batch's commit to the callback's run.

Also reported, for "a plain task pays nothing": the cost of the only per-message work a
plain task meets (``BatchSettlement.key_of`` on a payload without a batch: one dict
look-up, in ns); a plain task's ack runs no extra statement.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("BENCH_DATABASE_URL", "mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue_bench_t")
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.support.taskapp.process_settings"
os.environ["DATABASE_URL"] = os.environ["BENCH_DATABASE_URL"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--json")
    opts = parser.parse_args()

    from bench.common import recreate_database

    recreate_database(os.environ["DATABASE_URL"])
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)

    from django_sqlqueue.task_models import TaskBatch, TaskResultRecord
    from django_sqlqueue.tasks import batch
    from django_sqlqueue.tasks.batches import BatchSettlement, callback_id
    from tests.support.processes import ConsumerProcess
    from tests.support.taskapp import batch_tasks as bt
    from tests.support.taskapp.models import Run

    env = {"TSK_VISIBILITY_TIMEOUT": "2"}
    with batch(on_finish=bt.done) as b:
        for i in range(opts.members):
            bt.member.enqueue("member", seq=i, seconds=0.005)
    committed = time.monotonic()
    names = (f"bb{i}" for i in itertools.count())

    def start() -> ConsumerProcess:
        return ConsumerProcess(next(names), "--group", "tasks", settings=os.environ["DJANGO_SETTINGS_MODULE"], env=env)

    workers = [start() for _ in range(opts.workers)]
    every = list(workers)
    rng = random.Random(30)
    kills = 0
    try:
        while kills < opts.kills and not Run.objects.filter(key=b.id).exists():
            time.sleep(rng.uniform(0.5, 1.5))
            victim = workers.pop(rng.randrange(len(workers)))
            victim.kill9()
            kills += 1
            fresh = start()
            workers.append(fresh)
            every.append(fresh)
        deadline = time.monotonic() + 300
        while not Run.objects.filter(key=b.id).exists():
            if time.monotonic() > deadline:
                raise SystemExit("the callback did not run within 300 s")
            time.sleep(0.05)
        elapsed = time.monotonic() - committed
        time.sleep(3)  # a second callback run, if there were one, would show now
    finally:
        for worker in workers:
            worker.terminate()
        for worker in every:
            worker.cleanup()
    row = TaskBatch.objects.get(id=b.id)

    class Plain:
        payload = {"task": "x.y", "args": [], "kwargs": {}, "backend": "default", "queue_name": "default"}
        id = "m"

    settlement, plain = BatchSettlement(), Plain()
    key_of_ns = min(timeit.repeat(lambda: settlement.key_of(plain), number=100_000, repeat=5)) / 100_000 * 1e9  # type: ignore[arg-type]
    figures = {
        "members": opts.members,
        "kills": kills,
        # The callback's message is garbage-collected once run: its result row stays (one id).
        "callbacks_enqueued": TaskResultRecord.objects.filter(id=callback_id(b.id)).count(),
        "callback_id_recorded": row.callback_id == callback_id(b.id),
        "callback_runs": Run.objects.filter(key=b.id).count(),
        "counted": row.succeeded + row.failed,
        "succeeded": row.succeeded,
        "failed": row.failed,
        "member_runs": Run.objects.filter(label="member").count(),
        "members_run": Run.objects.filter(label="member").values("seq").distinct().count(),
        "seconds_to_callback": round(elapsed, 2),
        "plain_task_key_of_ns": round(key_of_ns, 1),
    }
    print(json.dumps(figures, indent=2))
    if opts.json:
        Path(opts.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
