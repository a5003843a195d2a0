"""Wake-up latency and the statements it costs (issue 17), on MariaDB or PostgreSQL.

Run: ``.venv/bin/python bench/wakeup.py --db mysql|postgres [--rates 200,1000] [--seconds 10]
[--repeat 2] [--variants polling,notify,before] [--baseline-src DIR] [--idle 20] [--json FILE]``.

Two ``manage.py runconsumer`` workers (``bench.settings``, topic ``bench.latency``, 8 partitions,
``SQLQUEUE`` defaults for the cadence: ``POLL_INTERVAL`` 0.1 s, ``POLL_INTERVAL_MAX`` 1 s)
consume while this process publishes ``rate`` messages/s with ``publish()`` (one message and
one commit per call, on a monotonic schedule); the handler records ``time.time()`` minus the
publisher's timestamp. Variants, run interleaved per repetition so that machine load hits
them alike:

- ``polling``: this checkout with ``SQLQUEUE["NOTIFY"] = False`` (the cadence and the probe);
- ``notify``: this checkout with notifications (PostgreSQL only);
- ``before-notify``: the same workers with notifications (PostgreSQL only; issue 33's baseline);
- ``before``: the workers of another checkout (``--baseline-src``, e.g. a worktree of the
  commit before issue 17: ``git worktree add /tmp/before 87fadea``), for a side-by-side
  baseline; the publisher is this checkout's either way.

Cost: on MariaDB the statements of the workers' connections, read from the general log
(``mysql.general_log``, switched on for the run and off after it; only connections to the
bench database count), per message and, with ``--idle S``, per worker and second with
nothing to do. On PostgreSQL ``pg_stat_database.xact_commit`` of the bench database:
transactions (the server has no per-statement counter without ``pg_stat_statements``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
URLS = {
    "mysql": "mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue_bench_wakeup",
    "postgres": "postgres://sqlqueue:sqlqueue@127.0.0.1:5432/sqlqueue_bench_wakeup",
}
TOPIC = "bench.latency"
PARTITIONS = 8
RESULTS = ROOT / "bench" / "results"


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.url = os.environ.get("BENCH_DATABASE_URL") or URLS[args.db]
        os.environ["DATABASE_URL"] = self.url
        os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
        os.environ["BENCH_PARTITIONS"] = str(PARTITIONS)
        sys.path.insert(0, str(ROOT))
        self._create_database()
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        self.workers: list[subprocess.Popen[bytes]] = []

    # -- database ---------------------------------------------------------------------

    def _create_database(self) -> None:
        import environ

        cfg = environ.Env.db_url_config(self.url)
        self.db_name = cfg["NAME"]
        if self.args.db == "mysql":
            import MySQLdb

            root = MySQLdb.connect(host=cfg["HOST"], port=int(cfg["PORT"] or 3306), user="root", autocommit=True)
            c = root.cursor()
            c.execute(f"DROP DATABASE IF EXISTS `{self.db_name}`")
            c.execute(f"CREATE DATABASE `{self.db_name}` CHARACTER SET utf8mb4")
            root.close()
        else:
            import psycopg

            admin = psycopg.connect(
                host=cfg["HOST"], port=cfg["PORT"] or 5432, user=cfg["USER"], password=cfg["PASSWORD"],
                dbname="postgres", autocommit=True,
            )  # fmt: skip
            admin.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{self.db_name}"')
            admin.close()

    def truncate(self) -> None:
        from django.apps import apps
        from django.db import connection

        with connection.cursor() as cursor:
            for model in apps.get_app_config("django_sqlqueue").get_models():
                if model._meta.managed:
                    cursor.execute(f"DELETE FROM {model._meta.db_table}")

    def progress(self) -> tuple[int, int]:
        """(sum of heads, sum of the group's watermarks) of the topic."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT COALESCE(SUM(head_offset), 0) FROM queue_partitions WHERE topic = %s", [TOPIC])
            heads = int(cursor.fetchone()[0])
            cursor.execute(
                "SELECT COALESCE(SUM(offset_acked), 0) FROM queue_offsets "
                "WHERE topic = %s AND consumer_group = 'bench'",
                [TOPIC],
            )
            return heads, int(cursor.fetchone()[0])

    def wait_consumed(self, n: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            heads, acked = self.progress()
            if heads >= n and acked >= n:
                return
            self.check_workers()
            time.sleep(0.05)
        raise RuntimeError(f"not consumed after {timeout}s: {self.progress()} of {n}")

    def wait_balanced(self, timeout: float = 60) -> None:
        from django.db import connection

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT leased_by, COUNT(*) FROM queue_partition_leases WHERE topic = %s GROUP BY leased_by",
                    [TOPIC],
                )
                counts = sorted(n for _, n in cursor.fetchall())
            if counts == [PARTITIONS // 2, PARTITIONS // 2]:
                return
            time.sleep(0.1)
        raise RuntimeError("leases not balanced")

    # -- cost counters ----------------------------------------------------------------

    def counter_start(self) -> Any:
        from django.db import connection

        with connection.cursor() as cursor:
            if self.args.db == "postgres":
                cursor.execute("SELECT pg_stat_clear_snapshot()")
                cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [self.db_name])
                return int(cursor.fetchone()[0])
        self._root().cursor().execute("TRUNCATE mysql.general_log")
        c = self._root().cursor()
        c.execute("SET GLOBAL log_output = 'TABLE'")
        c.execute("SET GLOBAL general_log = 1")
        return None

    def counter_stop(self, start: Any) -> int:
        """Statements (MariaDB, the workers' connections) or transactions (PostgreSQL) since ``start``."""
        from django.db import connection

        if self.args.db == "postgres":
            time.sleep(0.6)  # the statistics collector's reporting delay (PG 15 and older)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_stat_clear_snapshot()")
                cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [self.db_name])
                return int(cursor.fetchone()[0]) - start
        c = self._root().cursor()
        # The workers' connections: every connection to the bench database but this
        # process's (the publisher's) own, listed while they are still open.
        c.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s", [self.db_name])
        threads = {int(row[0]) for row in c.fetchall()}
        c.execute("SET GLOBAL general_log = 0")
        from django.db import connection as dj

        own = dj.connection.thread_id() if dj.connection is not None else None
        threads.discard(own)
        if not threads:
            return 0
        c.execute(
            "SELECT COUNT(*) FROM mysql.general_log WHERE command_type = 'Query' "
            f"AND thread_id IN ({','.join(map(str, threads))})"
        )
        return int(c.fetchone()[0])

    def _root(self) -> Any:
        if not hasattr(self, "_root_conn"):
            import MySQLdb

            self._root_conn = MySQLdb.connect(host="127.0.0.1", user="root", autocommit=True)
        return self._root_conn

    # -- workers ----------------------------------------------------------------------

    def start_workers(self, variant: str, lat_dir: Path, *, default_leases: bool = False) -> None:
        src = Path(self.args.baseline_src) if variant.startswith("before") else ROOT
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "DATABASE_URL": self.url,
            "BENCH_PARTITIONS": str(PARTITIONS),
            "BENCH_LATENCY_DIR": str(lat_dir),
            "SQLQUEUE_POLL_INTERVAL": str(self.args.poll_interval),
            "SQLQUEUE_POLL_INTERVAL_MAX": str(self.args.poll_interval_max),
            "SQLQUEUE_NOTIFY": "1" if variant in ("notify", "before-notify") else "0",
            "BENCH_CONN_MAX_AGE": "none",
            # The idle phase runs with SQLQUEUE's default lease clock (30 s leases renewed every
            # 10 s), as the idle figure is "at the default settings".
            "BENCH_DEFAULT_LEASES": "1" if default_leases else "0",
            "PYTHONUNBUFFERED": "1",
        }
        log_dir = RESULTS / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        for i in range(2):
            log = open(log_dir / f"wakeup-{variant}-w{i}.log", "w")  # noqa: SIM115 - the child owns it
            argv = [sys.executable, "manage.py", "runconsumer", "--group", "bench", "--topic", TOPIC, "--name", f"w{i}"]
            self.workers.append(subprocess.Popen(argv, cwd=src, env=env, stdout=log, stderr=subprocess.STDOUT))

    def check_workers(self) -> None:
        for w in self.workers:
            if w.poll() is not None:
                raise RuntimeError(f"worker {w.pid} exited with {w.returncode}")

    def stop_workers(self) -> None:
        for w in self.workers:
            w.send_signal(signal.SIGTERM)
        for w in self.workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
        self.workers = []

    # -- one run ----------------------------------------------------------------------

    def publish_at(self, rate: float, seconds: float, label: str, keys: list[str]) -> int:
        """Publish ``rate`` messages/s for ``seconds`` on a monotonic schedule; return how many
        went out more than 5 ms late."""
        from django_sqlqueue import publish

        begin = time.perf_counter()
        behind = 0
        for i in range(int(rate * seconds)):
            delay = begin + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            elif delay < -0.005:
                behind += 1
            publish(TOPIC, {"t": time.time(), "run": label}, key=keys[i % PARTITIONS])
        return behind

    def idle(self, variant: str) -> dict[str, Any]:
        """Statements (MariaDB) or transactions (PostgreSQL) per worker and second with nothing
        to do, at the default lease settings, after the workers settled."""
        from django.db import connections

        self.truncate()
        self.start_workers(variant, RESULTS / "latency" / "idle", default_leases=True)
        try:
            deadline = time.monotonic() + 60
            while self.progress()[0] == 0 and time.monotonic() < deadline:  # topic registered
                time.sleep(0.2)
            time.sleep(12)  # leases taken, the first renewals done, polls at POLL_INTERVAL_MAX
            start = self.counter_start()
            time.sleep(self.args.idle)
            cost = self.counter_stop(start)
        finally:
            self.stop_workers()
            connections.close_all()
        result = {"db": self.args.db, "variant": variant, "idle_seconds": self.args.idle,
                  "idle_per_worker_per_s": round(cost / 2 / self.args.idle, 2)}  # fmt: skip
        print(json.dumps(result), flush=True)
        return result

    def run(self, variant: str, rate: float, rep: int) -> dict[str, Any]:
        from django.db import connections

        from django_sqlqueue import publish

        label = f"{self.args.db}-{variant}-r{rate:g}-{rep}"
        lat_dir = RESULTS / "latency" / f"wakeup-{label}"
        shutil.rmtree(lat_dir, ignore_errors=True)
        lat_dir.mkdir(parents=True)
        self.truncate()
        self.start_workers(variant, lat_dir)
        from bench.common import key_for_partition

        keys = [key_for_partition(p, PARTITIONS) for p in range(PARTITIONS)]
        try:
            for p in range(PARTITIONS):
                publish(TOPIC, {"t": time.time(), "run": "warmup"}, key=keys[p])
            self.wait_consumed(PARTITIONS)
            self.wait_balanced()
            # Published at the rate before the measured window: the workers are busy, as in a
            # steady state, not waking from an idle poll interval.
            self.publish_at(rate, self.args.warm, "warm", keys)
            n = int(rate * self.args.seconds)
            start_count = self.counter_start()
            begin = time.perf_counter()
            behind = self.publish_at(rate, self.args.seconds, label, keys)
            elapsed = time.perf_counter() - begin
            self.wait_consumed(PARTITIONS + int(rate * self.args.warm) + n)
            cost = self.counter_stop(start_count)
        finally:
            self.stop_workers()
            connections.close_all()
        samples = sorted(
            float(value) * 1000
            for path in lat_dir.glob("latency-*.txt")
            for line in path.read_text().splitlines()
            for run, _, value in [line.partition(" ")]
            if run == label
        )
        result = {
            "db": self.args.db,
            "variant": variant,
            "rate": rate,
            "rep": rep,
            "published": n,
            "received": len(samples),
            "achieved_rate": round(n / elapsed, 1),
            "behind_5ms": behind,
            "p50_ms": round(percentile(samples, 0.50), 2),
            "p90_ms": round(percentile(samples, 0.90), 2),
            "p99_ms": round(percentile(samples, 0.99), 2),
            "max_ms": round(samples[-1], 2) if samples else None,
            ("statements" if self.args.db == "mysql" else "transactions") + "_per_message": round(cost / n, 2),
        }
        print(json.dumps(result), flush=True)
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=sorted(URLS), default="mysql")
    parser.add_argument("--rates", default="200,1000")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--variants", default="polling,notify")
    parser.add_argument("--baseline-src", default="")
    parser.add_argument("--poll-interval", type=float, default=0.1)
    parser.add_argument("--poll-interval-max", type=float, default=1.0)
    parser.add_argument("--warm", type=float, default=1.0, help="seconds published at the rate before measuring")
    parser.add_argument("--idle", type=float, default=0, help="seconds of an idle-cost phase per variant (0: none)")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if args.db != "postgres":
        variants = [v for v in variants if v not in ("notify", "before-notify")]
    if any(v.startswith("before") for v in variants) and not args.baseline_src:
        parser.error("--variants before needs --baseline-src")
    bench = Bench(args)
    rows: list[dict[str, Any]] = []
    idles: list[dict[str, Any]] = []
    for rep in range(args.repeat):
        if args.idle:
            for variant in variants:
                idles.append(bench.idle(variant))
        for rate in [float(r) for r in args.rates.split(",")]:
            for variant in variants:
                rows.append(bench.run(variant, rate, rep))
    print("\nmedians:")
    keyname = "statements_per_message" if args.db == "mysql" else "transactions_per_message"
    for rate in sorted({r["rate"] for r in rows}):
        for variant in variants:
            sel = [r for r in rows if r["rate"] == rate and r["variant"] == variant]
            med = {k: statistics.median(r[k] for r in sel) for k in ("p50_ms", "p99_ms", keyname)}
            print(
                f"  {args.db} {rate:>6g}/s {variant:8} p50 {med['p50_ms']:7.2f} ms  p99 {med['p99_ms']:7.2f} ms  "
                f"{keyname} {med[keyname]:.2f}"
            )
    for variant in variants:
        sel = [r["idle_per_worker_per_s"] for r in idles if r["variant"] == variant]
        if sel:
            what = "statements" if args.db == "mysql" else "transactions"
            print(f"  {args.db} idle {variant:8} {what} per worker per second {statistics.median(sel):.2f}")
    rows += idles
    if args.json:
        Path(args.json).write_text("\n".join(json.dumps(r) for r in rows) + "\n")


if __name__ == "__main__":
    main()
