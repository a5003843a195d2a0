"""A partition's first message at or after a time (seek, a new group, Spark's start by time),
on a log of N retained messages, side by side with the read it replaced (issue 32).

Run: ``.venv/bin/python bench/seek_time.py [--sizes 1000000,10000000] [--database-url URL]
[--calls 3] [--json FILE]`` (``BENCH_DATABASE_URL`` if no URL; MariaDB or PostgreSQL; the
database is dropped and created again for every size, and dropped at the end).

For each size, on a freshly migrated database filled by ``bench/growth_fill.py`` (one topic,
8 partitions, published over a day that ended an hour ago, no ``ANALYZE``), three times are
asked for: the day's start (the partition's first message), its middle, and an hour ago (past
the last message: none qualifies). Each is timed twice, per partition, first call and then the
best of ``--calls`` (a call over a second is not repeated):

- **probes** -- ``SeekReads.first_offset`` (``db/store/seek_reads.py``): probes of the offset
  index, then a read forward over about an hour of the partition;
- **walk (before)** -- the statement of b5f3c3f and earlier, run on the same log: the offset
  index in order, each row read for its ``published_at``, up to the first that qualifies
  (``published_at`` has no index).

Both must give the same offset (checked). Then ``ops.plan_seek(time=...)`` (every partition,
plus the counts of what it would move), first call and best, with the probes only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

WHEN = ("the day's start", "the middle", "an hour ago")


def _configure() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="1000000,10000000", help="retained messages, comma-separated")
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", ""))
    parser.add_argument("--calls", type=int, default=3, help="calls after the first")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.database_url = args.database_url or "mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue_growth"
    return args


def walk(topic: str, partition: int, since: dt.datetime) -> int | None:
    """The read of b5f3c3f: the partition in offset order up to the first message at ``since``."""
    from django_sqlqueue.db.store import QueueStore

    s = QueueStore("default")
    rows = s._fetchall(
        f"SELECT {s.OFF} FROM queue_messages {s.dialect.use_index('queue_msg_offset')} "
        f"WHERE topic = %s AND {s.P} = %s AND {s.OFF} IS NOT NULL AND published_at >= %s ORDER BY {s.OFF} LIMIT 1",
        [topic, partition, s.dialect.adapt_datetime(since)],
    )
    return int(rows[0][0]) if rows else None


def ms(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return (time.perf_counter() - start) * 1000, out


def run_size(url: str, n: int, calls: int, first: bool) -> dict[str, Any]:
    from bench.common import recreate_database, setup_django

    if first:
        setup_django(url)
    else:
        from django.core.management import call_command
        from django.db import connections

        connections.close_all()
        recreate_database(url)
        call_command("migrate", verbosity=0)
    from bench.growth_fill import PARTITIONS, SPAN_SECONDS, TOPIC, fill
    from django_sqlqueue import ops
    from django_sqlqueue.db.store import QueueStore

    print(f"\n== {n:,} retained messages", flush=True)
    print(f"  filled in {fill(n)['seconds']} s", flush=True)
    now = dt.datetime.now(dt.UTC)
    start = now - dt.timedelta(seconds=SPAN_SECONDS + 3600)
    middle, hour_ago = start + dt.timedelta(seconds=SPAN_SECONDS / 2), now - dt.timedelta(hours=1)
    times = dict(zip(WHEN, (start, middle, hour_ago), strict=True))
    store = QueueStore("default")
    result: dict[str, Any] = {"size": n, "first_offset": {}, "plan_seek": {}}
    for label, since in times.items():
        for name, fn in (("probes", store.first_offset), ("walk", walk)):
            firsts, bests, answers = [], [], []
            for p in range(PARTITIONS):
                first_ms, answer = ms(lambda: fn(TOPIC, p, since))  # noqa: B023 - called at once
                # A call over a second is not repeated (the walk at 10M: minutes per time).
                rest = [ms(lambda: fn(TOPIC, p, since))[0] for _ in range(calls if first_ms < 1000 else 0)]  # noqa: B023
                rest = rest or [first_ms]
                firsts.append(first_ms)
                bests.append(min(rest))
                answers.append(answer)
            result["first_offset"].setdefault(label, {})[name] = {
                "first_ms_max": round(max(firsts), 1),
                "best_ms_max": round(max(bests), 1),
                "answers": answers,
            }
            print(f"  {label:16} {name:6} slowest partition: first {max(firsts):8.1f} ms, best {max(bests):8.1f} ms")
        both = result["first_offset"][label]
        assert both["probes"]["answers"] == both["walk"]["answers"], (label, both)
        first_ms, _ = ms(lambda: ops.plan_seek("bench", TOPIC, time=since))  # noqa: B023
        best = min(ms(lambda: ops.plan_seek("bench", TOPIC, time=since))[0] for _ in range(calls))  # noqa: B023
        result["plan_seek"][label] = {"first_ms": round(first_ms, 1), "best_ms": round(best, 1)}
        print(f"  {label:16} plan_seek (8 partitions): first {first_ms:8.1f} ms, best {best:8.1f} ms", flush=True)
    return result


def main() -> None:
    args = _configure()
    runs = [run_size(args.database_url, n, args.calls, first=i == 0) for i, n in enumerate(args.sizes)]
    from django.db import connection, connections

    from bench.common import recreate_database
    from bench.consume import RESULTS, engine_fingerprint

    meta = {"engine": engine_fingerprint(), "vendor": connection.vendor, "sizes": args.sizes, "calls": args.calls}
    connections.close_all()
    recreate_database(args.database_url, create=False)
    out = args.json or RESULTS / f"seek-time-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "runs": runs}, indent=2, default=str))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
