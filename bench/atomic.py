"""Throughput of atomic consumers (issue 16): warm drains, side by side in one run.

Run: ``.venv/bin/python bench/atomic.py [--messages 10000] [--workers 2] [--batch-size 100]
[--repeat 3] [--json FILE]`` (``BENCH_DATABASE_URL`` picks the MariaDB database).

``bench/consume.py``'s warm drain (K real ``runconsumer`` processes, balanced leases, N
messages published in one transaction, timed from its commit until every watermark reached
its head), with a handler that does the same small write in each mode: it inserts one row
into ``bench_effects`` on the queue's database (``bench/benchapp/consumers.py``,
``BENCH_DRAIN_WRITE=1``). The modes:

- *non-atomic*: the insert autocommits on its own, the batch is acked afterwards
  (at-least-once: a crash in between handles the message again);
- *atomic=True*: each message's insert, ack and watermark move commit in one transaction,
  fenced by the lease (one commit per message);
- *atomic="batch"*: a partition's fetched batch (``--batch-size``) runs in one
  transaction, one commit per batch.

Rounds alternate the order of the modes (round 1 non-atomic first, round 2 reversed...);
the table gives each mode's median and its ratio to the non-atomic median. Issue 16's aims:
per-message atomic >= 0.5x non-atomic, batch-atomic >= 0.9x. ``--statements`` also reads
MariaDB's global ``Com_*`` counters around one extra drain per mode: statements per message
(every client of the server counts, so run it on a quiet server).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

from bench import consume  # noqa: E402
from bench.common import raw_connection, setup_django  # noqa: E402

#: (label, BENCH_ATOMIC, the aim as a fraction of the non-atomic median)
MODES = (("non-atomic", "", None), ("atomic=True", "true", 0.5), ('atomic="batch"', "batch", 0.9))
COUNTERS = (
    "Com_insert", "Com_update", "Com_select", "Com_delete", "Com_commit", "Com_rollback", "Com_set_option", "Questions",
)  # fmt: skip


def create_effects_table() -> None:
    conn = raw_connection()
    try:
        cur = conn.cursor()
        cur.execute(
            "CREATE TABLE IF NOT EXISTS bench_effects ("
            "id BIGINT AUTO_INCREMENT PRIMARY KEY, message_id VARCHAR(100) NOT NULL)"
        )
        cur.execute("TRUNCATE bench_effects")
    finally:
        conn.close()


def effects() -> int:
    conn = raw_connection()
    try:
        cur = conn.cursor()
        cur.execute("SELECT COUNT(*) FROM bench_effects")
        return int(cur.fetchone()[0])
    finally:
        conn.close()


def status() -> dict[str, int]:
    conn = raw_connection()
    try:
        cur = conn.cursor()
        cur.execute(f"SHOW GLOBAL STATUS WHERE Variable_name IN ({', '.join(['%s'] * len(COUNTERS))})", COUNTERS)
        return {name: int(value) for name, value in cur.fetchall()}
    finally:
        conn.close()


def drain(mode: str, rep: int, args: argparse.Namespace, procs: consume.Procs) -> dict[str, Any]:
    create_effects_table()
    ns = argparse.Namespace(
        messages=args.messages,
        partitions=args.partitions,
        batch_size=args.batch_size,
        worker_env={"BENCH_DRAIN_WRITE": "1", "BENCH_ATOMIC": mode},
    )
    result = consume.drain_run("queue", args.workers, "warm", rep, ns, procs)
    written = effects()
    # The warm-up message of each partition is handled too; a crash-free run writes each once.
    expected = args.messages + args.partitions
    if written != expected:
        raise consume.BenchError(f"{mode or 'non-atomic'}: {written} effect rows, expected {expected}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=10000, help="messages per drain")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="runconsumer processes per drain")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--statements", action="store_true", help="also count statements per message per mode")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ["BENCH_PARTITIONS"] = str(args.partitions)
    setup_django()
    print(f"engine {consume.engine_fingerprint()}", flush=True)
    procs = consume.Procs()
    runs: dict[str, list[float]] = {label: [] for label, _, _ in MODES}
    statements: dict[str, dict[str, float]] = {}
    try:
        for rep in range(1, args.repeat + 1):
            order = MODES if rep % 2 else MODES[::-1]
            for label, mode, _aim in order:
                runs[label].append(drain(mode, rep, args, procs)["msgs_per_s"])
        if args.statements:
            for label, mode, _aim in MODES:
                before = status()
                drain(mode, 0, args, procs)
                after = status()
                n = args.messages + args.partitions
                statements[label] = {k: round((after[k] - before[k]) / n, 2) for k in COUNTERS}
    finally:
        procs.stop_all()
    base = statistics.median(runs["non-atomic"])
    print(
        f"\n| warm drain, {args.workers} workers, {args.messages:,} msgs, batch {args.batch_size}, "
        f"one INSERT per message | msgs/s (median of {args.repeat}) | rounds | / non-atomic | aim |"
    )
    print("|---|---:|---|---:|---|")
    table = []
    for label, _mode, aim in MODES:
        median = statistics.median(runs[label])
        ratio = median / base
        verdict = "-" if aim is None else f">= {aim}: {'met' if ratio >= aim else 'missed'}"
        rounds = ", ".join(f"{r:,.0f}" for r in runs[label])
        print(f"| {label} | {median:,.0f} | {rounds} | {ratio:.2f} | {verdict} |")
        table.append({"mode": label, "runs": runs[label], "median": median, "ratio": ratio, "aim": aim})
    if statements:
        print("\nstatements per message (MariaDB global counters, every client):")
        for label, counts in statements.items():
            print(f"  {label}: {counts}")
    if args.json:
        args.json.write_text(json.dumps({"rows": table, "statements": statements}, indent=2))


if __name__ == "__main__":
    main()
