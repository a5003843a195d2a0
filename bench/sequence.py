"""Sequencing at backfill scale (issue 18 item 8): ``sequence()`` over a large backlog.

Run: ``.venv/bin/python bench/sequence.py [--db mysql|postgres ...] [--sizes 100000 1000000]
[--partitions 8] [--repeat 1] [--baseline REV] [--only baseline|new] [--json FILE]``.

For each database, backlog size and implementation, in one interleaved run:

1. the database (``sqlqueue_seq`` on the local MariaDB / PostgreSQL, or ``SEQ_BENCH_MYSQL_URL`` /
   ``SEQ_BENCH_POSTGRES_URL``) is dropped, created and migrated by the implementation under
   test, so a schema change of either side is honoured;
2. N committed, unsequenced messages (~120-byte payloads) are bulk inserted round-robin
   into the partitions of topic ``bench.seq`` with one ``INSERT ... SELECT`` over a number
   generator -- the shape of a Spark or ``publish_many`` backfill, minus the client cost;
3. the table is analysed, then ``sequence("bench.seq")`` is timed until nothing is left
   unnumbered, and the offsets are checked dense (1..n per partition). ``fill`` + the
   sequencing time is "backfill to visible": a stream (``offset > watermark``) sees the
   last message when ``sequence()`` returns.

The baseline is the package as of ``--baseline`` (default ``fdfe630``, the commit before
issue 18 item 8's read-ahead), extracted with ``git archive`` into a temporary directory;
"new" is the working tree. Each measurement runs in a fresh subprocess with the chosen
tree first on ``sys.path``. The report gives msgs/s per run and new/baseline ratios of
the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "bench.seq"
URLS = {
    "mysql": os.environ.get("SEQ_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/sqlqueue_seq"),
    "postgres": os.environ.get("SEQ_BENCH_POSTGRES_URL", "postgres://sqlqueue:sqlqueue@127.0.0.1:5432/sqlqueue_seq"),
}
PAYLOAD = json.dumps({"order": "0" * 40, "customer": "c" * 30, "amount": 1234, "currency": "EUR"})


def fill(n: int, partitions: int) -> None:
    """Insert ``n`` committed, unsequenced messages round-robin over ``partitions``."""
    from django.db import connection

    qn = connection.ops.quote_name
    columns = ", ".join(
        qn(c)
        for c in (
            "topic",
            "partition",
            "key",
            "id",
            "payload",
            "metadata",
            "deliver_at",
            "failure_count",
            "last_error",
            "original_topic",
            "created_at",
            "published_at",
        )
    )
    step = 100_000  # one statement per 100k rows: bounded undo/WAL per transaction
    with connection.cursor() as cursor:
        for start in range(0, n, step):
            count = min(step, n - start)
            if connection.vendor == "mysql":
                source = f"SELECT seq + {start} AS i FROM seq_1_to_{count}"
                now, idexpr, keyexpr = "UTC_TIMESTAMP(6)", "CONCAT('m', i)", f"CONCAT('k', i %% {partitions})"
            else:
                source = f"SELECT generate_series({start + 1}, {start + count}) AS i"
                now, idexpr, keyexpr = "now()", "'m' || i", f"'k' || (i %% {partitions})"
            cursor.execute(
                f"INSERT INTO queue_messages ({columns}) SELECT %s, i %% {partitions}, {keyexpr}, {idexpr}, %s, %s, "
                f"{now}, 0, '', '', {now}, {now} FROM ({source}) g ORDER BY i",
                [TOPIC, PAYLOAD, "{}"],
            )
        cursor.execute("ANALYZE TABLE queue_messages" if connection.vendor == "mysql" else "ANALYZE queue_messages")
        if connection.vendor == "mysql":
            cursor.fetchall()


def check_dense(partitions: int, n: int) -> None:
    from django.db import connection

    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {qn('partition')}, COUNT(*), MIN({qn('offset')}), MAX({qn('offset')}), "
            f"COUNT(DISTINCT {qn('offset')}) FROM queue_messages WHERE topic = %s GROUP BY {qn('partition')}",
            [TOPIC],
        )
        rows = cursor.fetchall()
    total = 0
    for partition, count, low, high, distinct in rows:
        assert (low, high, distinct) == (1, count, count), (partition, count, low, high, distinct)
        total += count
    assert total == n, (total, n)


def worker(args: argparse.Namespace) -> None:
    """One measurement, in a fresh process with the tree under test first on sys.path."""
    sys.path.insert(0, str(ROOT))  # testproject
    sys.path.insert(0, args.src)  # django_sqlqueue under test
    os.environ["DATABASE_URL"] = args.url
    os.environ["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    os.environ.setdefault("SQLQUEUE_LOG_LEVEL", "WARNING")
    from bench.common import recreate_database

    recreate_database(args.url)
    import django

    django.setup()
    import django_sqlqueue

    assert str(Path(django_sqlqueue.__file__).resolve()).startswith(str(Path(args.src).resolve())), (
        django_sqlqueue.__file__
    )
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django_sqlqueue.db.sequencer import sequence
    from django_sqlqueue.db.store.topics import TopicStore

    TopicStore("default").create_partitions(TOPIC, list(range(args.partitions)))
    t0 = time.perf_counter()
    fill(args.n, args.partitions)
    fill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    heads = sequence(TOPIC)
    seconds = time.perf_counter() - t0
    assert sum(heads.values()) == args.n, heads
    check_dense(args.partitions, args.n)
    print(json.dumps({"seconds": seconds, "rate": args.n / seconds, "fill_s": fill_s}))


def extract(rev: str, into: Path) -> None:
    data = subprocess.run(["git", "archive", rev, "django_sqlqueue"], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", nargs="+", default=["mysql", "postgres"], choices=sorted(URLS))
    parser.add_argument("--sizes", nargs="+", type=int, default=[100_000, 1_000_000])
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--baseline", default="fdfe630", help="git revision of the baseline package")
    parser.add_argument("--only", choices=["baseline", "new"], help="run one side only")
    parser.add_argument("--json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="seq-baseline-") as tmp:
        extract(args.baseline, Path(tmp))
        trees = {"baseline": tmp, "new": str(ROOT)}
        sides = [args.only] if args.only else ["baseline", "new"]
        for db in args.db:
            for n in args.sizes:
                for _ in range(args.repeat):
                    for side in sides:  # interleaved: same load conditions for both
                        out = subprocess.run(
                            [
                                sys.executable,
                                __file__,
                                "--worker",
                                "--src",
                                trees[side],
                                "--url",
                                URLS[db],
                                "--n",
                                str(n),
                                "--partitions",
                                str(args.partitions),
                            ],
                            check=True,
                            capture_output=True,
                            text=True,
                        ).stdout
                        row = {"db": db, "n": n, "side": side, **json.loads(out.strip().splitlines()[-1])}
                        results.append(row)
                        print(
                            f"{db:8} n={n:>9,} {side:8} {row['rate']:>9,.0f} msgs/s  ({row['seconds']:.1f} s; "
                            f"fill {row['fill_s']:.1f} s)",
                            flush=True,
                        )
    print("\nmedians (msgs/s) and new/baseline:")
    for db in args.db:
        for n in args.sizes:
            med = {
                side: statistics.median(r["rate"] for r in results if (r["db"], r["n"], r["side"]) == (db, n, side))
                for side in sides
            }
            ratio = f"  x{med['new'] / med['baseline']:.2f}" if len(med) == 2 else ""
            print(f"{db:8} n={n:>9,} " + "  ".join(f"{s} {v:,.0f}" for s, v in med.items()) + ratio)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
