"""``django_sqlqueue.testing.drain()`` against two ``runconsumer`` processes (issue 19's aim).

Run: ``.venv/bin/python bench/drain.py [--messages 10000] [--partitions 8] [--repeat 3] [--json FILE]``.

The aim: ``drain()`` of 10,000 messages in a test takes at most twice the time two
``runconsumer`` processes take to drain them. Same database (``BENCH_DATABASE_URL``,
default ``sqlqueue_bench_t`` on the local MariaDB; freshly created, see
``bench/common.py``), same topic (``bench.drain``, 8 partitions), same no-op handler
(``bench/benchapp/consumers.py``, batch size 100), same publish (``publish_many`` of 1,000
per call), interleaved runs:

- ``runconsumer x2 warm``: two workers already running with balanced leases; the N
  messages are published in one transaction; time from its commit to fully acked
  (``bench/consume.py``'s warm drain, reused here);
- ``runconsumer x2 cold``: N messages published, then the two processes started; time from
  spawn to fully acked (includes Python and Django start-up, the first lease round);
- ``drain() committed``: N messages published and committed, then ``drain("bench.drain")``
  in this process (a ``transactional_db`` test);
- ``drain() in a transaction``: N messages published and drained inside one ``atomic()``
  block that is rolled back afterwards (a ``db`` test, Django's ``TestCase``).

The ratio reported is ``drain() / runconsumer x2 warm`` (medians; the aim is <= 2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
os.environ.setdefault("BENCH_DATABASE_URL", "mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue_bench_t")
from bench.common import setup_django, truncate_queue  # noqa: E402
from bench.consume import DRAIN_TOPIC, GROUP, Procs, drain_run, publish_drain  # noqa: E402


class Rollback(Exception):
    pass


def drain_in_process(n: int, partitions: int, *, in_transaction: bool) -> float:
    """Publish ``n`` messages, then time ``drain()`` of them; return its seconds."""
    from django.db import transaction

    from django_sqlqueue.testing import drain

    truncate_queue()
    if not in_transaction:
        publish_drain(n, partitions, one_transaction=False)
        began = time.perf_counter()
        summary = drain(DRAIN_TOPIC, group=GROUP)
        seconds = time.perf_counter() - began
    else:
        try:
            with transaction.atomic():
                publish_drain(n, partitions, one_transaction=False)
                began = time.perf_counter()
                summary = drain(DRAIN_TOPIC, group=GROUP)
                seconds = time.perf_counter() - began
                raise Rollback
        except Rollback:
            pass
    if summary.handled != n:
        raise RuntimeError(f"drain() handled {summary.handled} of {n}: {summary}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.worker_env = {}
    os.environ["BENCH_PARTITIONS"] = str(args.partitions)
    os.environ["BENCH_BATCH_SIZE"] = str(args.batch_size)
    setup_django()
    procs = Procs()
    rows: dict[str, list[float]] = {
        "runconsumer x2 warm": [],
        "runconsumer x2 cold": [],
        "drain() committed": [],
        "drain() in a transaction": [],
    }
    n, parts = args.messages, args.partitions
    try:
        for rep in range(1, args.repeat + 1):
            for mode in ("warm", "cold"):
                rows[f"runconsumer x2 {mode}"].append(drain_run("queue", 2, mode, rep, args, procs)["seconds"])
            for label, in_tx in (("drain() committed", False), ("drain() in a transaction", True)):
                seconds = drain_in_process(n, parts, in_transaction=in_tx)
                rows[label].append(round(seconds, 3))
                print(f"  {label} rep {rep}: {seconds:.2f}s ({n / seconds:,.0f}/s)", flush=True)
    finally:
        procs.stop_all()
    medians = {label: statistics.median(values) for label, values in rows.items()}
    warm = medians["runconsumer x2 warm"]
    lines = [f"{n:,} messages, {parts} partitions, batch size {args.batch_size}, {args.repeat} run(s), medians:"]
    for label, median in medians.items():
        lines.append(f"  {label:26} {median:6.2f}s  {n / median:>8,.0f}/s  x{median / warm:.2f} of runconsumer x2 warm")
    print("\n".join(lines))
    if args.json:
        result: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "json"}, "runs": rows}
        args.json.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
