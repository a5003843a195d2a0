"""Cost as the log grows (issue 32): the everyday operations on an empty log, 1M and 10M retained messages.

Run: ``.venv/bin/python bench/growth.py [--sizes 0,1000000,10000000] [--database-url URL] [--quick]
[--calls 5] [--json FILE] [--keep]`` (``BENCH_DATABASE_URL`` if no ``--database-url``; MariaDB or
PostgreSQL; the database is dropped and created again for every size, and dropped at the end
unless ``--keep``).

For each size N, on a freshly migrated database:

1. **Fill** (``bench/growth_fill.py``): N messages in topic ``bench.growth`` (8 partitions),
   sequenced, group ``bench`` at the head and group ``audit`` paused at the head (so the GC
   floor is the fill's head), a side topic ``orders`` (10,000 messages, 2 groups), 1,000 dead
   letters, a day of per-minute history per group and 1,000 action-log entries. Bulk
   ``INSERT ... SELECT``, no ``ANALYZE``. ``SQLQUEUE["RETENTION"]`` is 7 days, so nothing is
   collected before the GC phase.
2. **Reads**, each timed on its FIRST call after the fill, then ``--calls`` more (best, median,
   slowest): ``queue_status``, ``queue_health`` (the commands), the metrics view (its cache
   cleared before each call) and every console page (Django test client, a superuser, full
   rendering), including the big topic's messages, a next page and a key search. A statement
   is cut after ``--read-timeout`` seconds (the call then counts as that long, its error kept).
3. **Publish**: ``publish()`` of one message, each its own transaction (p50/p99), then
   ``publish_many`` of 1,000 (msgs/s, median of the batches), no worker running.
4. **Drain**: two ``runconsumer`` processes (``bench.growth_settings``) catch up with what 3
   published and share the leases; then N' messages are published in one transaction and
   timed from its commit until every partition's watermark is its head (sequencing included).
5. **Latency**: the same two workers while this process publishes at a steady ``--rate``
   (``publish()``, one message per transaction); the handler records publish-to-handler time.
6. **Sizes**: data and index bytes per table (before the GC phase; MariaDB: the table's file
   and InnoDB's own page counts per index, ``mysql.innodb_index_stats``, as its automatic
   statistics left them: no ``ANALYZE`` runs).
7. **GC**: the workers stop; a publisher thread publishes at ``--gc-rate`` msgs/s throughout;
   after ``--seconds`` of it alone, ``ops.collect_garbage`` runs with ``RETENTION`` 600 s (the
   filled messages are 1 to 25 h old): msgs/s removed, compared with step 3's ``publish_many``
   rate, every statement timed through a connection wrapper (each GC statement is its own
   autocommit transaction, so the longest statement is the longest GC transaction), and the
   publisher's p50/p99 before and during.

Figures are medians where repeated; the machine is shared, so they are noisy.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _configure() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="0,1000000,10000000", help="retained messages, comma-separated")
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", ""))
    parser.add_argument("--quick", action="store_true", help="a dev run: fewer calls and messages")
    parser.add_argument("--calls", type=int, default=None, help="calls after the first (default 5; quick 2)")
    parser.add_argument("--singles", type=int, default=None, help="publish() calls (default 500; quick 100)")
    parser.add_argument("--batches", type=int, default=None, help="publish_many of 1,000 (default 10; quick 3)")
    parser.add_argument("--drain", type=int, default=None, help="messages drained (default 20000; quick 4000)")
    parser.add_argument("--rate", type=float, default=200.0, help="latency: msgs/s published")
    parser.add_argument("--gc-rate", type=float, default=100.0, help="GC: msgs/s published throughout")
    parser.add_argument("--seconds", type=float, default=None, help="latency and pre-GC window (10; quick 4)")
    parser.add_argument("--read-timeout", type=float, default=120.0, help="seconds a read statement may take")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the database at the end")
    args = parser.parse_args()
    quick = args.quick
    for name, full, small in (("calls", 5, 2), ("singles", 500, 100), ("batches", 10, 3), ("drain", 20000, 4000)):
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    args.seconds = args.seconds or (4.0 if quick else 10.0)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.database_url = args.database_url or "mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue_growth"
    # Read by bench.common (BENCH_URL) and handed to the runconsumer processes.
    os.environ["BENCH_DATABASE_URL"] = args.database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.growth_settings"
    return args


def pct(values: list[float], q: float) -> float:
    from bench.consume import percentile

    return round(percentile(sorted(values), q), 2)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


# -- reads ----------------------------------------------------------------------------------


def read_ops(client: Any) -> list[tuple[str, Callable[[], object]]]:
    """Every read measured: the commands, the metrics view and the console's pages."""
    from django.core.management import call_command

    from bench.common import partition_keys
    from bench.growth_fill import TOPIC
    from django_sqlqueue.metrics.views import clear_cache

    base = "/admin/django_sqlqueue/queueconsole"
    cursor: dict[str, str] = {}

    def get(path: str, ok: tuple[int, ...] = (200,)) -> Callable[[], object]:
        def run() -> object:
            response = client.get(path)
            assert response.status_code in ok, (path, response.status_code)
            return response

        return run

    def messages() -> object:
        response = get(f"{base}/messages/?topic={TOPIC}")()
        cursor.setdefault("next", getattr(response.context["page"], "next_cursor", "") or "")  # type: ignore[attr-defined]
        return response

    def command(name: str) -> Callable[[], object]:
        def run() -> object:
            try:
                call_command(name, stdout=io.StringIO(), stderr=io.StringIO())
            except SystemExit:  # queue_health exits non-zero on a problem: still a full call
                pass
            return None

        return run

    def scrape() -> object:
        clear_cache()
        return get("/sqlqueue/metrics")()

    key = partition_keys(8)[3]
    return [
        ("queue_status", command("queue_status")),
        ("queue_health", command("queue_health")),
        ("metrics scrape", scrape),
        ("console: overview", get(f"{base}/")),
        ("console: overview JSON", get(f"{base}/?format=json")),
        ("console: groups", get(f"{base}/groups/")),
        ("console: group (big topic)", get(f"{base}/groups/bench/{TOPIC}/")),
        ("console: group 24 h", get(f"{base}/groups/bench/{TOPIC}/?window=24h")),
        ("console: topics", get(f"{base}/topics/")),
        ("console: messages (big topic)", messages),
        ("console: messages, next page", lambda: get(f"{base}/messages/?topic={TOPIC}&cursor={cursor['next']}")()),
        ("console: messages, by key", get(f"{base}/messages/?topic={TOPIC}&key={key}")),
        ("console: messages, all topics", get(f"{base}/messages/")),
        ("console: dead letters", get(f"{base}/deadletters/")),
        ("console: leases", get(f"{base}/leases/")),
        ("console: action log", get(f"{base}/actionlog/")),
        ("console: tasks", get(f"{base}/tasks/")),
    ]


def statement_timeout(seconds: float) -> None:
    """Cap every statement of this connection (0: no cap): a plan that reads the whole log is
    reported as a timeout instead of holding the run for an hour."""
    from django.db import connection

    with connection.cursor() as c:
        if connection.vendor == "mysql":
            c.execute(f"SET SESSION max_statement_time = {float(seconds)}")
        elif connection.vendor == "postgresql":
            c.execute(f"SET statement_timeout = {int(seconds * 1000)}")


def _timed(spent: list[float]) -> Callable[..., Any]:
    """A ``connection.execute_wrapper`` adding each statement's time to ``spent[0]`` (seconds)."""

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            spent[0] += time.perf_counter() - start

    return wrapper


def measure_reads(client: Any, calls: int, timeout: float) -> dict[str, dict[str, Any]]:
    """Each read's first call and ``calls`` more; a call that fails (the statement timeout)
    counts as ``timeout`` and is listed in ``errors``; two of them end that read's calls."""
    from django.db import connection

    out: dict[str, dict[str, Any]] = {}
    statement_timeout(timeout)
    try:
        for name, fn in read_ops(client):
            errors: list[str] = []

            db_times: list[float] = []

            def call(
                fn: Callable[[], object] = fn, errors: list[str] = errors, db_times: list[float] = db_times
            ) -> float:
                start = time.perf_counter()
                # The database's share of the call (each statement timed as it runs): a page of
                # 50 rows renders slower than an empty one, whatever the log's size.
                spent = [0.0]
                with connection.execute_wrapper(_timed(spent)):
                    try:
                        fn()
                    except Exception as exc:  # noqa: BLE001 - a timed-out or failed call is a result
                        errors.append(f"{type(exc).__name__}: {str(exc).strip()[:200]}")
                        return max(timeout * 1000, (time.perf_counter() - start) * 1000)
                db_times.append(spent[0] * 1000)
                return (time.perf_counter() - start) * 1000

            first = call()
            rest = []
            while len(rest) < calls and len(errors) < 2:
                rest.append(call())
            rest = rest or [first]
            out[name] = {
                "first_ms": round(first, 1),
                "best_ms": round(min(rest), 1),
                "median_ms": round(statistics.median(rest), 1),
                "slowest_ms": round(max(rest), 1),
                # The median call's statements, summed.
                "db_median_ms": round(statistics.median(db_times[1:] or db_times), 1) if db_times else None,
                "errors": errors,
            }
            flag = f"  ({len(errors)} failed: {errors[0]})" if errors else ""
            print(
                f"  {name:32} first {first:8.1f}  best {min(rest):7.1f}  slowest {max(rest):7.1f} ms{flag}", flush=True
            )
    finally:
        statement_timeout(0)
    return out


# -- publishing, drain, latency -------------------------------------------------------------


def measure_publish(args: argparse.Namespace) -> dict[str, Any]:
    from bench.common import best_rate, partition_keys
    from bench.consume import PAYLOAD
    from bench.growth_fill import TOPIC
    from django_sqlqueue import publish, publish_many

    keys = partition_keys(8)
    times = []
    for i in range(args.singles):
        start = time.perf_counter()
        publish(TOPIC, {**PAYLOAD, "i": i}, key=keys[i % 8])  # autocommit: one message, one commit
        times.append((time.perf_counter() - start) * 1000)

    def batch() -> int:
        publish_many(TOPIC, [{"payload": {**PAYLOAD, "i": i}, "key": keys[i % 8]} for i in range(1000)])
        return 1000

    rate, rates = best_rate(batch, repeat=args.batches)
    result = {
        "publish_p50_ms": pct(times, 0.5),
        "publish_p99_ms": pct(times, 0.99),
        "publish_many_msgs_per_s": round(rate),
        "published": args.singles + 1000 * args.batches,
    }
    batches = ", ".join(f"{r:,.0f}" for r in rates)
    print(f"  publish() p50 {result['publish_p50_ms']} p99 {result['publish_p99_ms']} ms; "
          f"publish_many {rate:,.0f} msgs/s (batches: {batches})", flush=True)  # fmt: skip
    return result


def progress() -> tuple[int, int, int]:
    """(sum of heads, sum of group bench's watermarks, partitions drained) of the big topic.

    Drained: the watermark is the head and no message of the partition waits for an offset
    (a range of the (topic, partition, offset) index: NULLs sort first)."""
    from django.db import connection

    from bench.growth_fill import TOPIC

    q = connection.ops.quote_name
    P, OFF = q("partition"), q("offset")
    with connection.cursor() as c:
        c.execute(
            "SELECT COALESCE(SUM(p.head_offset), 0), COALESCE(SUM(o.offset_acked), 0), COALESCE(SUM(CASE WHEN "
            f"o.offset_acked >= p.head_offset AND NOT EXISTS (SELECT 1 FROM queue_messages m WHERE m.topic = p.topic "
            f"AND m.{P} = p.{P} AND m.{OFF} IS NULL) THEN 1 ELSE 0 END), 0) FROM queue_partitions p "
            f"LEFT JOIN queue_offsets o ON o.consumer_group = 'bench' AND o.topic = p.topic AND o.{P} = p.{P} "
            "WHERE p.topic = %s",
            [TOPIC],
        )
        head, acked, done = c.fetchone()
    return int(head), int(acked), int(done)


def wait_drained(expected: int, procs: Any, timeout: float) -> float:
    """Poll every 20 ms until the big topic's head sum is ``expected``, all acked; return when."""
    from bench.consume import BenchError

    deadline = time.monotonic() + timeout
    while True:
        head, acked, done = progress()
        if head == expected and done == 8:
            return time.perf_counter()
        if time.monotonic() > deadline:
            raise BenchError(f"not drained after {timeout:.0f} s: head {head} (expected {expected}), acked {acked}")
        procs.check_alive()
        time.sleep(0.02)


def wait_balanced(procs: Any, timeout: float) -> None:
    from django.db import connection

    from bench.consume import BenchError
    from bench.growth_fill import TOPIC

    deadline = time.monotonic() + timeout
    while True:
        with connection.cursor() as c:
            c.execute(
                "SELECT leased_by, COUNT(*) FROM queue_partition_leases WHERE consumer_group = 'bench' AND topic = %s "
                "GROUP BY leased_by",
                [TOPIC],
            )
            held = sorted(n for _, n in c.fetchall())
        if held == [4, 4]:
            return
        if time.monotonic() > deadline:
            raise BenchError(f"leases not balanced after {timeout:.0f} s: {held}")
        procs.check_alive()
        time.sleep(0.05)


def measure_consume(args: argparse.Namespace, expected: int, label: str) -> dict[str, Any]:
    """Steps 4 and 5 with two runconsumer processes; ``expected``: the head sum before."""
    import shutil

    from django.db import transaction

    from bench.common import partition_keys
    from bench.consume import PAYLOAD, RESULTS, Procs
    from bench.growth_fill import TOPIC
    from django_sqlqueue import publish, publish_many

    lat_dir = RESULTS / "latency" / f"growth-{label}"
    shutil.rmtree(lat_dir, ignore_errors=True)
    env = {"DJANGO_SETTINGS_MODULE": "bench.growth_settings", "BENCH_LATENCY_DIR": str(lat_dir)}
    procs = Procs()
    keys = partition_keys(8)
    try:
        for i in range(2):
            procs.worker(f"growth-{label}-w{i}", TOPIC, **env)
        caught_up = time.perf_counter()
        wait_drained(expected, procs, 600)
        catch_up = time.perf_counter() - caught_up
        wait_balanced(procs, 120)
        with transaction.atomic():
            for base in range(0, args.drain, 1000):
                n = min(1000, args.drain - base)
                publish_many(TOPIC, [{"payload": {**PAYLOAD, "i": base + i}, "key": keys[i % 8]} for i in range(n)])
        start = time.perf_counter()
        expected += args.drain
        drain_s = wait_drained(expected, procs, 600) - start
        n = int(args.rate * args.seconds)
        run = f"growth-{label}"
        start = time.perf_counter()
        for i in range(n):
            delay = start + i / args.rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            publish(TOPIC, {"t": time.time(), "run": run}, key=keys[i % 8])
        achieved = n / (time.perf_counter() - start)
        expected += n
        wait_drained(expected, procs, 600)
    finally:
        procs.stop_all()
    samples = [
        float(v) * 1000
        for path in lat_dir.glob("latency-*.txt")
        for r, _, v in (line.partition(" ") for line in path.read_text().splitlines())
        if r == run
    ]
    result = {
        "catch_up_s": round(catch_up, 2),
        "drain_messages": args.drain,
        "drain_msgs_per_s": round(args.drain / drain_s),
        "latency_rate": round(achieved, 1),
        "latency_received": len(samples),
        "latency_p50_ms": pct(samples, 0.5),
        "latency_p99_ms": pct(samples, 0.99),
        "head": expected,
    }
    print(f"  drain {result['drain_msgs_per_s']:,} msgs/s (2 workers; catch-up {catch_up:.1f} s); latency at "
          f"{achieved:.0f}/s p50 {result['latency_p50_ms']} p99 {result['latency_p99_ms']} ms "
          f"({len(samples)}/{n})", flush=True)  # fmt: skip
    return result


# -- garbage collection ---------------------------------------------------------------------


def measure_gc(args: argparse.Namespace, publish_many_rate: float) -> dict[str, Any]:
    from django.conf import settings
    from django.db import connection, connections
    from django.test import override_settings

    from bench.common import partition_keys
    from bench.growth_fill import TOPIC
    from django_sqlqueue import publish
    from django_sqlqueue.ops.gc import collect_garbage

    keys = partition_keys(8)
    samples: list[tuple[float, float]] = []  # (start, ms) of each publish
    stop = threading.Event()
    errors: list[BaseException] = []

    def publisher() -> None:
        try:
            start, i = time.perf_counter(), 0
            while not stop.is_set():
                delay = start + i / args.gc_rate - time.perf_counter()
                if delay > 0:
                    stop.wait(delay)
                t = time.perf_counter()
                publish(TOPIC, {"gc": i}, key=keys[i % 8])
                samples.append((t, (time.perf_counter() - t) * 1000))
                i += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    statements: list[tuple[float, str]] = []

    def timer(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            statements.append(((time.perf_counter() - start) * 1000, sql.split(" ", 1)[0].upper()))

    thread = threading.Thread(target=publisher, daemon=True)
    thread.start()
    time.sleep(args.seconds)
    gc_start = time.perf_counter()
    with override_settings(SQLQUEUE={**settings.SQLQUEUE, "RETENTION": 600.0}), connection.execute_wrapper(timer):
        deleted = collect_garbage(topics=[TOPIC])[TOPIC]
    gc_end = time.perf_counter()
    time.sleep(1.0)
    stop.set()
    thread.join(timeout=60)
    if errors:
        raise RuntimeError(f"publisher failed: {errors[0]!r}") from errors[0]
    seconds = gc_end - gc_start
    before = [ms for t, ms in samples if t < gc_start]
    during = [ms for t, ms in samples if gc_start <= t < gc_end]
    deletes = [ms for ms, verb in statements if verb == "DELETE"]
    rate = deleted / seconds if seconds > 0 else 0.0
    result = {
        "deleted": deleted,
        "seconds": round(seconds, 2),
        "msgs_per_s": round(rate),
        "vs_publish_many": round(rate / publish_many_rate, 2) if publish_many_rate else None,
        "statements": len(statements),
        "longest_statement_ms": round(max((ms for ms, _ in statements), default=0.0), 1),
        "longest_delete_ms": round(max(deletes, default=0.0), 1),
        "publish_before_p50_ms": pct(before, 0.5),
        "publish_before_p99_ms": pct(before, 0.99),
        "publish_during_p50_ms": pct(during, 0.5) if during else None,
        "publish_during_p99_ms": pct(during, 0.99) if during else None,
        "publish_during_max_ms": round(max(during), 1) if during else None,
        "publishes_during": len(during),
    }
    print(f"  GC {deleted:,} in {seconds:.1f} s = {rate:,.0f} msgs/s ({result['vs_publish_many']}x publish_many); "
          f"{len(statements)} statements, longest {result['longest_statement_ms']} ms; publish() p99 "
          f"{result['publish_before_p99_ms']} -> {result['publish_during_p99_ms']} ms", flush=True)  # fmt: skip
    return result


# -- one size, and the run ------------------------------------------------------------------


def prepare(url: str, first: bool) -> None:
    """A freshly created, migrated database (Django set up on the first call)."""
    from bench.common import recreate_database, setup_django

    if first:
        setup_django(url)
        return
    from django.core.management import call_command
    from django.db import connections

    connections.close_all()
    recreate_database(url)
    call_command("migrate", verbosity=0)


def run_size(args: argparse.Namespace, n: int, first: bool) -> dict[str, Any]:
    prepare(args.database_url, first)  # sets Django up on the first call: imports after it
    from django.contrib.auth.models import User
    from django.test import Client

    from bench.growth_fill import fill, load_action_log
    from bench.growth_report import table_sizes

    if first:
        from django.test.utils import setup_test_environment

        setup_test_environment()  # the test client's response.context (the next page's cursor)
    print(f"\n== {n:,} retained messages", flush=True)
    filled = fill(n)
    print(f"  filled in {filled['seconds']} s", flush=True)
    user = User.objects.create_superuser("bench", "b@example.com", "pw")
    load_action_log(user.pk)
    client = Client()
    client.force_login(user)
    result: dict[str, Any] = {"size": n, "fill": filled, "reads": measure_reads(client, args.calls, args.read_timeout)}
    result["publish"] = measure_publish(args)
    result["consume"] = measure_consume(args, n + result["publish"]["published"], f"{n}")
    result["sizes"] = table_sizes()
    result["gc"] = measure_gc(args, result["publish"]["publish_many_msgs_per_s"])
    return result


def main() -> None:
    args = _configure()
    from bench.consume import RESULTS, engine_fingerprint
    from bench.growth_report import report

    runs = []
    for i, n in enumerate(args.sizes):
        runs.append(run_size(args, n, first=i == 0))
    if not args.keep:
        from django.db import connections

        from bench.common import recreate_database

        connections.close_all()
        recreate_database(args.database_url, create=False)
    from django.db import connection

    meta = {"engine": engine_fingerprint(), "vendor": connection.vendor, "args": {**vars(args), "json": None}}
    text = report(runs)
    print("\n" + text)
    out = args.json or RESULTS / f"growth-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "runs": runs, "markdown": text}, indent=2, default=str))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
