"""Publishing inside views: contention between concurrent request-like transactions.

Run: ``/work/main/.venv/bin/python bench/contention.py [--threads 8] [--seconds 8] [--work-ms 20]
[--repeat 3] [--pairs 100] [--old-root /tmp/bench7-old] [--json FILE]``.

Issue 7's view scenarios, each variant in its own child process (this script with
``--child``), interleaved within one run (the order of the variants rotates between
repetitions), median of the repetitions reported with the load average:

**(a) view, no key.** ``--threads`` threads, each looping for ``--seconds``: one transaction
(``transaction.atomic()``) that inserts a row into an application table (``bench_app_orders``),
publishes one message, does ``--work-ms`` more work (a sleep: the rest of the view, I/O bound),
commits. Reported: committed transactions per second and p50/p99 of the transaction's
duration (BEGIN to the end of COMMIT). Variants, in the same run:

- ``plain``: the same transaction with a plain ``INSERT`` into an outbox-shaped table
  (``CREATE TABLE ... LIKE queue_messages``) instead of ``publish()``: the reference;
- ``new``: ``publish(topic, payload)`` of this checkout's engine (append-only, default key "");
- ``old``: ``publish(topic, payload, partition_key="")`` of the engine in ``--old-root``
  (head-row locking publish, issue 7's "today"), run with that checkout's code and its own
  database.

**(b) view, one of 100 keys.** As (a), the message's key (old engine: ``partition_key``)
being ``customer-<n>`` with n random in 0..99.

**(c) two views, opposite order.** Two threads, ``--pairs`` rounds: in each round thread 1
publishes to A then B, thread 2 to B then A, each in one transaction, with a 5 ms pause
between its two publishes so the transactions overlap (a barrier starts both together).
A and B are keys hashing to two different partitions (new engine) or the partition keys
"A" and "B" (old engine); ``plain`` does the same with plain INSERTs. Reported: commits and
deadlocks (MySQL error 1213) / lock wait timeouts (1205) of each variant.

Databases: ``BENCH_DATABASE_URL`` (default ``sqlqueue_bench7``) for ``plain`` and ``new``,
``BENCH_OLD_DATABASE_URL`` (default ``sqlqueue_bench_old``) for ``old``; both are dropped,
recreated and migrated at the start (each with its engine's migrations).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
NEW_ROOT = HERE.parent
NEW_URL = os.environ.get("BENCH_DATABASE_URL", "mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue_bench7")
OLD_URL = os.environ.get("BENCH_OLD_DATABASE_URL", "mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue_bench_old")
TOPIC = "bench.views"
PAYLOAD = {"order_id": 12345, "customer": "alice", "total": "19.90", "lines": [{"sku": "A-1", "qty": 2}]}
APP_TABLE = (
    "CREATE TABLE IF NOT EXISTS bench_app_orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, customer VARCHAR(64) NOT NULL, "
    "total DECIMAL(10, 2) NOT NULL, created_at DATETIME(6) NOT NULL) DEFAULT CHARSET=utf8mb4"
)
OUTBOX_COLUMNS = (
    "topic, `partition`, `key`, id, payload, metadata, deliver_at, failed_at, failure_count, last_error, "
    "original_topic, created_at, published_at"
)
OUTBOX_INSERT = (
    f"INSERT INTO bench_outbox ({OUTBOX_COLUMNS}) VALUES (%s, %s, %s, %s, %s, '{{}}', UTC_TIMESTAMP(6), NULL, 0, '', "
    "'', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
)
DEADLOCK, LOCK_WAIT_TIMEOUT = 1213, 1205


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# -- child: runs inside one engine's checkout -------------------------------------------------


def child_django(root: Path, url: str, *, create: bool) -> None:
    """Import Django from the engine checkout at ``root`` against ``url`` (recreated if ``create``)."""
    sys.path.insert(0, str(root))
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    import environ
    import MySQLdb

    cfg = environ.Env.db_url_config(url)
    if create:
        server = MySQLdb.connect(
            host=cfg["HOST"], port=int(cfg["PORT"] or 3306), user=cfg["USER"], password=cfg["PASSWORD"]
        )
        server.cursor().execute(f"DROP DATABASE IF EXISTS `{cfg['NAME']}`")
        server.cursor().execute(f"CREATE DATABASE `{cfg['NAME']}` CHARACTER SET utf8mb4")
        server.close()
    import django

    django.setup()
    if create:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)


def child_reset() -> None:
    from django.apps import apps
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(APP_TABLE)
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_outbox LIKE queue_messages")
        for table in ["bench_app_orders", "bench_outbox"] + [
            m._meta.db_table for m in apps.get_app_config("django_sqlqueue").get_models() if m._meta.managed
        ]:
            cursor.execute(f"TRUNCATE TABLE {table}")


def make_publisher(variant: str, engine: str) -> Any:
    """Return ``send(cursor, key)``: what the view does to emit its message."""
    if variant == "plain":
        counter = [random.randrange(1 << 20)]
        body = json.dumps(PAYLOAD, separators=(",", ":"))

        def plain(cursor: Any, key: str) -> None:
            counter[0] += 1
            part = zlib.crc32(key.encode()) % 8 if key else counter[0] % 8
            cursor.execute(OUTBOX_INSERT, (TOPIC, part, key, os.urandom(16).hex(), body))

        return plain
    from django_sqlqueue import publish

    if engine == "old":
        return lambda cursor, key: publish(TOPIC, PAYLOAD, partition_key=key)
    return lambda cursor, key: publish(TOPIC, PAYLOAD, key=key)


def child_views(args: argparse.Namespace) -> dict[str, Any]:
    from django.db import connections, transaction

    send = make_publisher(args.variant, args.engine)
    durations: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(args.threads)
    work = args.work_ms / 1000

    def view(n: int) -> None:
        rng = random.Random(n)
        mine: list[float] = []
        try:
            barrier.wait()
            end = time.perf_counter() + args.seconds
            while time.perf_counter() < end:
                key = f"customer-{rng.randrange(100)}" if args.keys else ""
                t = time.perf_counter()
                with transaction.atomic(), connections["default"].cursor() as cursor:
                    cursor.execute(
                        "INSERT INTO bench_app_orders (customer, total, created_at) VALUES (%s, %s, UTC_TIMESTAMP(6))",
                        (key or "anonymous", "19.90"),
                    )
                    send(cursor, key)
                    time.sleep(work)
                mine.append(time.perf_counter() - t)
        except Exception as exc:  # noqa: BLE001 - reported
            with lock:
                errors.append(repr(exc))
        finally:
            connections.close_all()
            with lock:
                durations.extend(mine)

    threads = [threading.Thread(target=view, args=(i,)) for i in range(args.threads)]
    start = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - start
    return {
        "commits": len(durations),
        "tx_per_s": len(durations) / elapsed,
        "p50_ms": percentile(durations, 0.5) * 1000,
        "p99_ms": percentile(durations, 0.99) * 1000,
        "errors": errors[:5],
        "error_count": len(errors),
    }


def child_cross(args: argparse.Namespace) -> dict[str, Any]:
    from django.db import OperationalError, connections, transaction

    send = make_publisher(args.variant, args.engine)
    if args.engine == "new":
        from django_sqlqueue.conf import get_settings

        n = get_settings().partitions_for(TOPIC) or 8
        key_a = "A"
        key_b = next(f"B{i}" for i in range(1000) if zlib.crc32(f"B{i}".encode()) % n != zlib.crc32(b"A") % n)
    else:
        key_a, key_b = "A", "B"
    barrier = threading.Barrier(2)
    outcome: dict[str, int] = {"commits": 0, "deadlocks": 0, "lock_wait_timeouts": 0, "other_errors": 0}
    other: list[str] = []
    lock = threading.Lock()

    def view(order: tuple[str, str]) -> None:
        try:
            for _ in range(args.pairs):
                barrier.wait()
                try:
                    with transaction.atomic(), connections["default"].cursor() as cursor:
                        send(cursor, order[0])
                        time.sleep(0.005)
                        send(cursor, order[1])
                    result = "commits"
                except OperationalError as exc:
                    code = exc.args[0] if exc.args else None
                    result = {DEADLOCK: "deadlocks", LOCK_WAIT_TIMEOUT: "lock_wait_timeouts"}.get(code, "other_errors")
                    if result == "other_errors":
                        other.append(repr(exc))
                with lock:
                    outcome[result] += 1
        finally:
            connections.close_all()

    threads = [threading.Thread(target=view, args=(o,)) for o in ((key_a, key_b), (key_b, key_a))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return {**outcome, "transactions": 2 * args.pairs, "keys": [key_a, key_b], "other": other[:3]}


def child_main(args: argparse.Namespace) -> None:
    root = Path(args.root)
    child_django(root, args.url, create=args.scenario == "setup")
    child_reset()
    if args.scenario == "setup":
        result: dict[str, Any] = {}
    elif args.scenario == "cross":
        result = child_cross(args)
    else:
        result = child_views(args)
    if args.scenario != "setup":
        from django.db import connection

        with connection.cursor() as cursor:
            table = "bench_outbox" if args.variant == "plain" else "queue_messages"
            cursor.execute(f"SELECT COUNT(*) FROM {table}")
            result["messages_stored"] = cursor.fetchone()[0]
    print("RESULT " + json.dumps(result))


# -- driver -------------------------------------------------------------------------------------


def run_child(variant: str, scenario: str, args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    engine = "old" if variant == "old" else "new"
    root = args.old_root if engine == "old" else NEW_ROOT
    url = OLD_URL if engine == "old" else NEW_URL
    argv = [
        sys.executable, str(Path(__file__).resolve()), "--child", "--variant", variant, "--engine", engine,
        "--scenario", scenario, "--root", str(root), "--url", url, "--threads", str(args.threads),
        "--seconds", str(args.seconds), "--work-ms", str(args.work_ms), "--pairs", str(args.pairs),
    ]  # fmt: skip
    if extra.get("keys"):
        argv.append("--keys")
    load = load_average()
    proc = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=600, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(
            f"{variant} {scenario} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        )
    result = json.loads(lines[-1][len("RESULT ") :])
    result.update(variant=variant, scenario=scenario, load_before=load, load_after=load_average())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per view run (default 8)")
    parser.add_argument("--work-ms", type=float, default=20.0, help="work after publish, ms (default 20)")
    parser.add_argument("--pairs", type=int, default=100, help="rounds of the opposite-order case (default 100)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--old-root",
        type=Path,
        default=Path("/tmp/bench7-old"),
        help="the engine before issue 7 (git archive 5e0402c)",
    )
    parser.add_argument("--variants", default="plain,new,old", help="subset of plain,new,old")
    parser.add_argument("--scenarios", default="nokey,keys,cross", help="subset of nokey,keys,cross")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--report", type=Path, help="only print the tables of an earlier --json file")
    # child options
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--scenario", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--keys", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args)
        return
    if args.report:
        data = json.loads(args.report.read_text())
        for key in ("threads", "seconds", "work_ms", "pairs", "repeat"):
            setattr(args, key, type(getattr(args, key))(data["args"][key]))
        print(report(data["rows"], args, *data["load"]))
        return

    variants = [v for v in args.variants.split(",") if v]
    scenarios = [s for s in args.scenarios.split(",") if s]
    if "old" in variants:
        run_child("old", "setup", args)
    if {"plain", "new"} & set(variants):
        run_child("new", "setup", args)
    rows: list[dict[str, Any]] = []
    load_start = load_average()
    for rep in range(args.repeat):
        order = variants[rep % len(variants) :] + variants[: rep % len(variants)]
        for scenario in scenarios:
            for variant in order:
                if scenario == "cross":
                    r = run_child(variant, "cross", args)
                    print(
                        f"  rep {rep + 1} cross {variant:5}: {r['commits']}/{r['transactions']} committed, "
                        f"{r['deadlocks']} deadlocks, {r['lock_wait_timeouts']} lock wait timeouts "
                        f"(load {r['load_before'][0]})",
                        flush=True,
                    )
                else:
                    r = run_child(variant, "views", args, keys=scenario == "keys")
                    r["scenario"] = scenario
                    print(
                        f"  rep {rep + 1} {scenario:5} {variant:5}: {r['tx_per_s']:7.1f} tx/s p50 {r['p50_ms']:.1f} "
                        f"p99 {r['p99_ms']:.1f} ms, {r['error_count']} errors, stored {r['messages_stored']} "
                        f"(load {r['load_before'][0]})",
                        flush=True,
                    )
                r["rep"] = rep + 1
                rows.append(r)
    load_end = load_average()
    print()
    print(report(rows, args, load_start, load_end))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "load": [load_start, load_end]},
                indent=2,
            )
        )


def report(rows: list[dict[str, Any]], args: argparse.Namespace, load_start: list[float], load_end: list[float]) -> str:
    out = [
        (
            f"{args.threads} threads, {args.work_ms:g} ms of work after the publish, {args.seconds:g} s per run, "
            f"median of {args.repeat} runs (min–max); load average (1/5/15 min) {load_start} at start, "
            f"{load_end} at end\n"
        ),
        "| scenario | variant | tx/s | ratio to plain INSERT (paired min–max) | p50 ms | p99 ms | errors |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    names = {"plain": "plain outbox INSERT", "new": "publish(), new engine", "old": "publish(), old engine (today)"}
    titles = {"nokey": "(a) view, no key", "keys": "(b) view, 1 of 100 keys"}
    for scenario in ("nokey", "keys"):
        base = [r["tx_per_s"] for r in rows if r["scenario"] == scenario and r["variant"] == "plain"]
        for variant in ("plain", "new", "old"):
            mine = [r for r in rows if r["scenario"] == scenario and r["variant"] == variant]
            if not mine:
                continue
            tps = [r["tx_per_s"] for r in mine]
            ratio = f"{statistics.median(tps) / statistics.median(base):.2f}" if base else "–"
            by_rep = {r["rep"]: r["tx_per_s"] for r in rows if r["scenario"] == scenario and r["variant"] == "plain"}
            pairs = [r["tx_per_s"] / by_rep[r["rep"]] for r in mine if r["rep"] in by_rep]
            if variant != "plain" and len(pairs) > 1:
                ratio += f" ({min(pairs):.2f}–{max(pairs):.2f})"
            out.append(
                f"| {titles[scenario]} | {names[variant]} | {statistics.median(tps):,.1f} "
                f"({min(tps):,.1f}–{max(tps):,.1f}) "
                f"| {ratio} | {statistics.median(r['p50_ms'] for r in mine):.1f} | "
                f"{statistics.median(r['p99_ms'] for r in mine):.1f} | {sum(r['error_count'] for r in mine)} |"
            )
    cross = [r for r in rows if r["scenario"] == "cross"]
    if cross:
        out += [
            "",
            f"(c) two views publishing A then B and B then A, {args.pairs} rounds per run, {args.repeat} runs:\n",
            "| variant | transactions | committed | deadlocks (1213) | lock wait timeouts (1205) | other errors |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for variant in ("plain", "new", "old"):
            mine = [r for r in cross if r["variant"] == variant]
            if mine:
                out.append(
                    f"| {names[variant]} | {sum(r['transactions'] for r in mine)} | "
                    f"{sum(r['commits'] for r in mine)} | "
                    f"{sum(r['deadlocks'] for r in mine)} | {sum(r['lock_wait_timeouts'] for r in mine)} | "
                    f"{sum(r['other_errors'] for r in mine)} |"
                )
    return "\n".join(out)


if __name__ == "__main__":
    main()
