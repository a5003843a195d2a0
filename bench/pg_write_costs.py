"""What a message costs PostgreSQL to write, piece by piece (issue 33, aims 2 and 3).

Run: ``.venv/bin/python bench/pg_write_costs.py [--rows 1000000] [--repeat 5] [--only publish notify layout]``.

Three measurements on the local PostgreSQL (``COSTS_BENCH_POSTGRES_URL``, default database
``sqlqueue_costs``, dropped, created and migrated by this script), each interleaved and
reported as medians and ratios:

``publish``
    One-message autocommit writes on one connection, from the floor up: a 1-row INSERT into
    a narrow table (the harness's raw limit), the log's INSERT as ``publish()`` sends it
    without and with its ``pg_notify``, then ``publish()`` itself. The steps between them are
    the log's row and indexes, the notification, and the Python of ``publish()``.
``notify``
    The log's INSERT without and with ``pg_notify`` from 1, 4 and 8 connections at once:
    PostgreSQL serializes the commits of notifying transactions (a database-wide lock from
    the notification's queueing to the end of the commit), so concurrent publishers lose
    their group commit.
``layout``
    A design probe for the bulk sequencing aim, on raw copies of the log (not the package's
    code): numbering ``--rows`` unsequenced messages of one topic in 8 partitions by an
    ``UPDATE`` of the log's ``offset`` (today's layout: every row a new tuple and new index
    entries) against an ``INSERT`` of ``(topic, partition, offset, seq)`` into a narrow table
    (an insert-only log); and single-message publishes into the log with and without its
    two offset indexes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
URL = os.environ.get("COSTS_BENCH_POSTGRES_URL", "postgres://sqlqueue:sqlqueue@127.0.0.1:5432/sqlqueue_costs")
TOPIC = "bench.costs"
PAYLOAD = '{"job_id": 1, "phase": "x", "enq_ts": 1.0}'
COLUMNS = (
    'topic, "partition", key, id, payload, metadata, deliver_at, failed_at, failure_count, last_error, '
    "original_topic, created_at, published_at"
)
#: The log's INSERT as publish() sends it for one message without metadata.
LOG_INSERT = (
    f"INSERT INTO {{table}} ({COLUMNS}) VALUES (%s, %s, %s, %s, %s::jsonb, '{{{{}}}}'::jsonb, statement_timestamp(), "
    "NULL, 0, '', '', statement_timestamp(), statement_timestamp())"
)
NOTIFYING = 'WITH ins AS ({insert} RETURNING id, "partition") SELECT pg_notify(%s, ins."partition"::text) FROM ins'


def connect() -> Any:
    import psycopg

    return psycopg.connect(URL.replace("postgres://", "postgresql://", 1), autocommit=True)


def recreate_database() -> None:
    """Drop, create and migrate the benchmark's database (with the working tree's migrations)."""
    import psycopg

    admin = URL.rsplit("/", 1)[0] + "/postgres"
    name = URL.rsplit("/", 1)[1]
    with psycopg.connect(admin.replace("postgres://", "postgresql://", 1), autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name}")
        c.execute(f"CREATE DATABASE {name}")
    env = {**os.environ, "DATABASE_URL": URL, "DJANGO_SETTINGS_MODULE": "testproject.settings"}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)


def rate(n: int, fn: Callable[[int], object]) -> float:
    started = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - started)


def report(results: dict[str, list[float]], base: str, unit: str = "msgs/s") -> None:
    floor = statistics.median(results[base])
    for name, runs in results.items():
        median = statistics.median(runs)
        print(
            f"  {name:34} {median:9,.0f} {unit}  {1e6 / median:6.0f} us/msg  {median / floor:5.2f}x  "
            f"(runs {', '.join(f'{r:,.0f}' for r in runs)})",
            flush=True,
        )


def publish_steps(repeat: int, n: int = 1500) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.update(DATABASE_URL=URL, DJANGO_SETTINGS_MODULE="testproject.settings")
    import django

    django.setup()
    from django_sqlqueue import publish
    from django_sqlqueue.rules.notify_channels import channel_for
    from django_sqlqueue.rules.validation import new_message_id

    c = connect()
    c.execute("CREATE TABLE IF NOT EXISTS narrow (id bigserial PRIMARY KEY, payload text, ts double precision)")
    insert = LOG_INSERT.format(table="queue_messages")
    notifying = NOTIFYING.format(insert=insert)

    def row(i: int) -> list[Any]:
        return [TOPIC, i % 8, str(i % 64), new_message_id(), PAYLOAD]

    steps: dict[str, Callable[[int], object]] = {
        "raw 1-row INSERT, narrow table": lambda i: c.execute(
            "INSERT INTO narrow (payload, ts) VALUES (%s, %s)", (PAYLOAD, time.time())
        ),
        "the log's INSERT": lambda i: c.execute(insert, row(i)),
        "the log's INSERT + pg_notify": lambda i: c.execute(notifying, [*row(i), channel_for(TOPIC)]),
        "publish()": lambda i: publish(TOPIC, {"job_id": i, "phase": "x", "enq_ts": 1.0}, key=str(i % 64)),
    }
    results: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeat):
        for name, step in steps.items():
            results[name].append(rate(n, step))
    print("publish, one connection, autocommit, one message a transaction:")
    report(results, "raw 1-row INSERT, narrow table")


def notify_concurrency(repeat: int, n: int = 800) -> None:
    insert = LOG_INSERT.format(table="queue_messages")
    notifying = NOTIFYING.format(insert=insert)

    def run(sql: str, connections: int, notify: bool) -> float:
        def work(k: int) -> None:
            with connect() as c:
                for i in range(n):
                    params = [TOPIC, i % 8, "1", f"{k}-{i}-{time.time_ns()}", PAYLOAD]
                    c.execute(sql, [*params, "sqlqueue.bench.costs"] if notify else params)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(connections)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return connections * n / (time.perf_counter() - started)

    print("the notification under concurrent publishers (aggregate msgs/s):")
    for connections in (1, 4, 8):
        results: dict[str, list[float]] = {f"{connections} conn, INSERT": [], f"{connections} conn, + pg_notify": []}
        for _ in range(repeat):
            results[f"{connections} conn, INSERT"].append(run(insert, connections, False))
            results[f"{connections} conn, + pg_notify"].append(run(notifying, connections, True))
        report(results, f"{connections} conn, INSERT")


def layout(rows: int, repeat: int, batch: int = 40_000) -> None:
    c = connect()

    def make(table: str, offset_indexes: bool) -> None:
        c.execute(f"DROP TABLE IF EXISTS {table}")
        c.execute(f"CREATE TABLE {table} (LIKE queue_messages INCLUDING DEFAULTS)")
        c.execute(f"ALTER TABLE {table} ALTER seq ADD GENERATED BY DEFAULT AS IDENTITY, ADD PRIMARY KEY (seq)")
        c.execute(f"CREATE UNIQUE INDEX {table}_id ON {table} (topic, id)")
        c.execute(f"CREATE INDEX {table}_topic_seq ON {table} (topic, seq)")
        if offset_indexes:
            c.execute(f'CREATE UNIQUE INDEX {table}_offset ON {table} (topic, "partition", "offset")')
            c.execute(f'CREATE INDEX {table}_unsequenced ON {table} (topic, "partition", seq) WHERE "offset" IS NULL')
        c.execute(
            f"INSERT INTO {table} ({COLUMNS}) SELECT %s, g %% 8, (g %% 64)::text, lpad(to_hex(g), 32, '0'), "
            "%s::jsonb, '{}'::jsonb, now(), NULL, 0, '', '', now(), now() FROM generate_series(1, %s) g",
            [TOPIC, PAYLOAD, rows],
        )
        c.execute(f"VACUUM ANALYZE {table}")

    make("costs_wide", offset_indexes=True)
    started, done = time.perf_counter(), 0
    while True:
        cur = c.execute(
            f'WITH todo AS (SELECT seq, "partition" FROM costs_wide WHERE topic = %s AND "offset" IS NULL '
            f'ORDER BY seq LIMIT {batch}), numbered AS (SELECT seq, row_number() OVER (PARTITION BY "partition" '
            f"ORDER BY seq) + %s AS o FROM todo) "
            'UPDATE costs_wide SET "offset" = numbered.o FROM numbered WHERE costs_wide.seq = numbered.seq',
            [TOPIC, done // 8],
        )
        if not cur.rowcount:
            break
        done += cur.rowcount
    wide = done / (time.perf_counter() - started)

    make("costs_lean", offset_indexes=False)
    c.execute("DROP TABLE IF EXISTS costs_offsets")
    c.execute(
        'CREATE TABLE costs_offsets (topic varchar(160), "partition" bigint, "offset" bigint, seq bigint, '
        'PRIMARY KEY (topic, "partition", "offset"))'
    )
    started, done, last = time.perf_counter(), 0, 0
    while True:
        got = c.execute(
            'INSERT INTO costs_offsets SELECT %s, "partition", row_number() OVER (PARTITION BY "partition" '
            f'ORDER BY seq) + %s, seq FROM (SELECT seq, "partition" FROM costs_lean WHERE topic = %s AND seq > %s '
            f"ORDER BY seq LIMIT {batch}) s RETURNING seq",
            [TOPIC, done // 8, TOPIC, last],
        ).fetchall()
        if not got:
            break
        done, last = done + len(got), max(r[0] for r in got)
    narrow = done / (time.perf_counter() - started)
    print(f"numbering {rows:,} messages of one topic, {batch:,} a statement:")
    report({"UPDATE of the log's offset": [wide], "INSERT into a narrow table": [narrow]}, "UPDATE of the log's offset")

    def publish_into(table: str) -> Callable[[int], object]:
        sql = LOG_INSERT.format(table=table)
        return lambda i: c.execute(sql, [TOPIC, i % 8, str(i % 64), f"{table}-{time.time_ns()}-{i}", PAYLOAD])

    results: dict[str, list[float]] = {"into the log with its offset indexes": [], "into the log without them": []}
    for _ in range(repeat):
        results["into the log with its offset indexes"].append(rate(3000, publish_into("costs_wide")))
        results["into the log without them"].append(rate(3000, publish_into("costs_lean")))
    print("one-message publishes (the same INSERT), by layout:")
    report(results, "into the log with its offset indexes")
    for table in ("costs_wide", "costs_lean", "costs_offsets"):
        c.execute(f"DROP TABLE {table}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", nargs="+", choices=["publish", "notify", "layout"])
    args = parser.parse_args()
    parts = args.only or ["publish", "notify", "layout"]
    recreate_database()
    if "publish" in parts:
        publish_steps(args.repeat)
    if "notify" in parts:
        notify_concurrency(min(args.repeat, 3))
    if "layout" in parts:
        layout(args.rows, min(args.repeat, 3))


if __name__ == "__main__":
    main()
