"""What one scrape of the queue gauges costs on a big log (issue 15's aim: <= 100 ms, constant statements).

Run: ``.venv/bin/python bench/scrape.py [--messages 1000000] [--small 10000] [--scrapes 20]``
(MariaDB; ``BENCH_DATABASE_URL`` names the big database, default ``sqlqueue_bench7``; the small
one is the same name with ``_small``; both are dropped and rebuilt).

Two databases of the same shape, built with bulk ``INSERT ... SELECT`` from MariaDB's
``seq_0_to_N`` sequence tables (a million rows in seconds, not the publish path): one topic
``orders`` with 64 partitions whose messages are all sequenced but for 1,000 waiting for the
sequencer, and four consumer groups with 64 watermarks each:

- ``caught-up``: at the head, 2 live subscribers, all 64 partitions leased;
- ``behind``: 1,000 messages behind per partition, 3,000 dead letters, in-flight and retrying
  deliveries, 2 live subscribers, half the leases;
- ``halfway``: half the log behind, 500 dead letters, 1 subscriber whose heartbeat is stale;
- ``paused``: at offset 0 (the whole log behind) and paused.

Then it times :func:`django_sqlqueue.metrics.gauges.read_snapshot` plus
:func:`~django_sqlqueue.metrics.gauges.render` (what the view does on a cache miss: the
view's cache is not involved) ``--scrapes`` times on each database, alternating small and
big so both see the same machine, and counts the statements of one scrape with Django's
``CaptureQueriesContext``. ``--scan`` also times, in the same alternation, the statements
before issue 15's fix (``MySQLDialect.unsequenced_via_heads = False``: the unsequenced rows
found by ``offset IS NULL`` alone, which reads the topic's whole index range). With
``--explain`` it prints the EXPLAIN of each statement and the time of each one on the big
database.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

from bench.common import BENCH_URL  # noqa: E402

PARTITIONS = 64
TOPIC = "orders"
UNSEQUENCED = 1_000
GROUPS = ("behind", "caught-up", "halfway", "paused")


def _recreate(url: str) -> dict:
    import environ
    import MySQLdb

    cfg = environ.Env.db_url_config(url)
    server = MySQLdb.connect(
        host=cfg["HOST"], port=int(cfg["PORT"] or 3306), user=cfg["USER"], password=cfg["PASSWORD"]
    )
    server.cursor().execute(f"DROP DATABASE IF EXISTS `{cfg['NAME']}`")
    server.cursor().execute(f"CREATE DATABASE `{cfg['NAME']}` CHARACTER SET utf8mb4")
    server.close()
    return cfg


def setup(small_url: str) -> None:
    """Two fresh, migrated databases: ``default`` (big) and ``small``."""
    os.environ["DATABASE_URL"] = BENCH_URL
    _recreate(BENCH_URL)
    _recreate(small_url)
    from django.conf import settings

    import bench.settings as bench_settings

    bench_settings.DATABASES["small"] = bench_settings.database_config(small_url)
    import django

    django.setup()
    assert "small" in settings.DATABASES
    from django.core.management import call_command

    for alias in ("default", "small"):
        call_command("migrate", verbosity=0, database=alias)


def build(alias: str, messages: int) -> float:
    """Fill database ``alias`` with ``messages`` messages of the shape above; return the seconds it took."""
    from django.db import connections

    start = time.perf_counter()
    sequenced = messages - UNSEQUENCED
    per_partition = sequenced // PARTITIONS
    sequenced = per_partition * PARTITIONS
    # Spread the publication times over the last ~3 hours (the lag in seconds has something to show).
    spread = 10_000
    with connections[alias].cursor() as c:
        c.execute(
            "INSERT INTO queue_topics (topic, partitions, created_at, updated_at) VALUES (%s, %s, NOW(6), NOW(6))",
            [TOPIC, PARTITIONS],
        )
        c.execute(
            "INSERT INTO queue_partitions (topic, `partition`, head_offset, created_at) "
            f"SELECT %s, seq, %s, NOW(6) FROM seq_0_to_{PARTITIONS - 1}",
            [TOPIC, per_partition],
        )
        columns = (
            "topic, `partition`, `key`, `offset`, id, payload, metadata, deliver_at, failed_at, failure_count, "
            "last_error, original_topic, created_at, published_at"
        )
        part_key = f"MOD(seq, {PARTITIONS}), CONCAT('k', MOD(seq, {PARTITIONS}))"
        at = f"NOW(6) - INTERVAL ({spread} - seq * {spread} DIV {messages}) SECOND"
        # In chunks of 200,000 rows: one huge transaction is slower (undo log) than a few.
        chunk = 200_000
        for lo in range(0, sequenced, chunk):
            hi = min(sequenced, lo + chunk) - 1
            c.execute(
                f"INSERT INTO queue_messages ({columns}) SELECT %s, {part_key}, "
                f"seq DIV {PARTITIONS} + 1, CONCAT('m', seq), '{{\"n\": 1}}', '{{}}', {at}, NULL, 0, '', '', "
                f"{at}, {at} "
                f"FROM seq_{lo}_to_{hi}",
                [TOPIC],
            )
        # The sequencer's backlog: committed, no offset yet (the newest messages).
        c.execute(
            f"INSERT INTO queue_messages ({columns}) SELECT %s, {part_key}, "
            f"NULL, CONCAT('m', seq), '{{}}', '{{}}', NOW(6), NULL, 0, '', '', NOW(6), NOW(6) "
            f"FROM seq_{sequenced}_to_{sequenced + UNSEQUENCED - 1}",
            [TOPIC],
        )
        marks = {
            "caught-up": per_partition,
            "behind": max(0, per_partition - 1_000 // (1 if messages >= 100_000 else 100)),
            "halfway": per_partition // 2,
            "paused": 0,
        }
        for group, mark in marks.items():
            c.execute(
                "INSERT INTO queue_offsets (consumer_group, topic, `partition`, offset_acked, updated_at) "
                f"SELECT %s, %s, seq, %s, NOW(6) FROM seq_0_to_{PARTITIONS - 1}",
                [group, TOPIC, mark],
            )
        dead = {"behind": 3_000, "halfway": 500}
        if messages < 100_000:
            dead = {g: n // 100 for g, n in dead.items()}
        for i, (group, n) in enumerate(dead.items()):
            c.execute(
                f"INSERT INTO queue_messages ({columns}) SELECT %s, MOD(seq, {PARTITIONS}), '', seq + 1 + {i * 10**7}, "
                f"CONCAT(%s, ':m', seq), '{{}}', '{{}}', NOW(6), NOW(6), 3, 'boom', %s, NOW(6), NOW(6) "
                f"FROM seq_0_to_{n - 1}",
                [TOPIC + "_dlq", group, TOPIC],
            )
        # Deliveries of "behind": 10 in flight and 5 retrying per partition, right after its watermark.
        c.execute(
            "INSERT INTO queue_delivery_state (consumer_group, topic, `partition`, message_offset, acked, "
            "invisible_until, retry_count, status, last_error) "
            f"SELECT 'behind', %s, p.seq, %s + o.seq + 1, 0, NOW(6) + INTERVAL 30 SECOND, "
            "IF(o.seq < 10, 0, 2), IF(o.seq < 10, 1, 2), IF(o.seq < 10, NULL, 'boom') "
            f"FROM seq_0_to_{PARTITIONS - 1} p, seq_0_to_14 o",
            [TOPIC, marks["behind"]],
        )
        beats = [("caught-up", "w1", 0), ("caught-up", "w2", 0), ("behind", "w3", 0), ("behind", "w4", 0)]
        beats.append(("halfway", "w5", 3600))  # stale
        for group, name, age in beats:
            c.execute(
                "INSERT INTO queue_subscriber_heartbeats (consumer_group, topic, subscriber_name, heartbeat_at, "
                "deregistered_at) VALUES (%s, %s, %s, NOW(6) - INTERVAL %s SECOND, NULL)",
                [group, TOPIC, name, age],
            )
        for group, name, count in (("caught-up", "w1", PARTITIONS), ("behind", "w3", PARTITIONS // 2)):
            c.execute(
                "INSERT INTO queue_partition_leases (consumer_group, topic, `partition`, leased_by, leased_at, "
                f"lease_renewed_at) SELECT %s, %s, seq, %s, NOW(6), NOW(6) FROM seq_0_to_{count - 1}",
                [group, TOPIC, name],
            )
        c.execute(
            "INSERT INTO queue_paused_topics (consumer_group, topic, paused_at, paused_by, reason) "
            "VALUES ('paused', %s, NOW(6), 'bench', 'bench')",
            [TOPIC],
        )
        c.execute("ANALYZE TABLE queue_messages, queue_offsets, queue_partitions, queue_delivery_state")
        c.fetchall()
    return time.perf_counter() - start


def scrape(alias: str) -> tuple[float, int, bytes]:
    """One uncached scrape of ``alias``: (seconds, statements, exposition)."""
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    from django_sqlqueue.metrics.gauges import read_snapshot, render

    with CaptureQueriesContext(connections[alias]) as queries:
        start = time.perf_counter()
        body, _ = render(read_snapshot(alias))
        elapsed = time.perf_counter() - start
    return elapsed, len(queries), body


def explain(alias: str) -> None:
    """Print each statement of one scrape with its time and its EXPLAIN."""
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    from django_sqlqueue.metrics.gauges import read_snapshot

    with CaptureQueriesContext(connections[alias]) as queries:
        read_snapshot(alias)
    for q in queries.captured_queries:
        print(f"\n{float(q['time']) * 1000:8.2f} ms  {q['sql'][:300]}")
        if q["sql"].lstrip().upper().startswith("SELECT") and "NOW(6)" not in q["sql"][:20]:
            with connections[alias].cursor() as c:
                c.execute("EXPLAIN " + q["sql"])
                for row in c.fetchall():
                    print("          ", row)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--scan", action="store_true", help="also time the statements before the fix")
    parser.add_argument("--explain", action="store_true", help="EXPLAIN and time each statement (big database)")
    args = parser.parse_args()
    setup(BENCH_URL + "_small")
    sizes = {"small": args.small, "default": args.messages}
    for alias, n in sizes.items():
        print(f"built {n:,} messages in {alias}: {build(alias, n):.1f} s", flush=True)

    from django.db import connections

    from django_sqlqueue.db.dialects.mysql import MySQLDialect
    from django_sqlqueue.metrics.gauges import DEAD_LETTER_CAP

    assert DEAD_LETTER_CAP >= 3_000
    runs = [(alias, True) for alias in sizes] + ([(alias, False) for alias in sizes] if args.scan else [])
    times: dict[tuple[str, bool], list[float]] = {run: [] for run in runs}
    statements: dict[tuple[str, bool], set[int]] = {run: set() for run in runs}
    bodies: dict[tuple[str, bool], bytes] = {}
    for _ in range(args.scrapes + 1):  # the first round warms the connections and the buffer pool, untimed
        for alias, via_heads in runs:
            MySQLDialect.unsequenced_via_heads = via_heads
            elapsed, n, body = scrape(alias)
            if _:
                times[(alias, via_heads)].append(elapsed)
            statements[(alias, via_heads)].add(n)
            bodies[(alias, via_heads)] = body
    MySQLDialect.unsequenced_via_heads = True
    for alias in sizes:
        connections[alias].close()
    if args.scan:
        for alias in sizes:
            same = _values(bodies[(alias, True)]) == _values(bodies[(alias, False)])
            print(f"{alias}: the same gauges with and without the fix: {same}")
    lag = sum(v for (name, _), v in _values(bodies[("default", True)]).items() if name == "sqlqueue_consumergroup_lag")
    base = statistics.median(times[("small", True)])
    print(f"\nuncached scrapes (read_snapshot + render), {args.scrapes} each, alternating; total lag {lag:,.0f}")
    print(
        f"{'messages':>12} {'queries':>10} {'median ms':>10} {'p95 ms':>8} {'statements':>11} "
        f"{'vs 100 ms aim':>14} {'vs 10k':>7}"
    )
    for alias, via_heads in runs:
        t = times[(alias, via_heads)]
        med = statistics.median(t)
        print(
            f"{sizes[alias]:>12,} {'issue 15' if via_heads else 'before':>10} {med * 1000:>10.1f} "
            f"{pct(t, 0.95) * 1000:>8.1f} {','.join(map(str, sorted(statements[(alias, via_heads)]))):>11} "
            f"{med / 0.1:>13.2f}x {med / base:>6.2f}x"
        )
    if args.explain:
        explain("default")


def _values(body: bytes) -> dict[tuple[str, str], float]:
    """``{(metric, labels): value}`` of an exposition, without the lag-seconds (the clock moves)."""
    out = {}
    for line in body.decode().splitlines():
        if line.startswith(("#", "sqlqueue_consumergroup_lag_seconds")):
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        out[(name, labels)] = float(value)
    return out


if __name__ == "__main__":
    main()
