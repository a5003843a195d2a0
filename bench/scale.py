"""Scale benchmark (issue 14): many ``runconsumer`` workers on one topic with many partitions.

Run (one command each; a private MariaDB server is started and removed by the script)::

    .venv/bin/python bench/scale.py --private-mariadb                         # 100 workers x 4,096
    .venv/bin/python bench/scale.py --private-mariadb --quick                 # 20 workers x 512
    .venv/bin/python bench/scale.py --private-mariadb --max-connections 151   # the connection budget

or against a server of yours (nothing of its configuration is changed; the database is
dropped and created again): ``--database-url mysql://user:pw@host:3306/sqlqueue_scale``.

N real ``manage.py runconsumer --group scale --topic bench.scale`` processes
(``DJANGO_SETTINGS_MODULE=bench.scale_settings``: ``SQLQUEUE``'s default lease and poll
timings unless ``--lease-duration`` etc. are given) are spawned at once on an empty topic
of P partitions. This process watches ``queue_partition_leases`` and
``queue_subscriber_heartbeats`` every ``--sample`` seconds over its own connection and
reports, from the first spawn:

1. *spawn*: seconds to start the N processes (``Popen``), and until all N heartbeat;
2. *all leased*: every partition has an unexpired lease held by a live worker;
   *fair share*: besides, every live worker holds floor(P/N) to ceil(P/N) partitions;
3. *idle*: once fair, the server's statement counters (``SHOW GLOBAL STATUS``: Questions,
   Com_*) over ``--idle-seconds`` with no messages, per worker and second; the statements
   that make them (``performance_schema`` digests, private server only); the connections
   each worker holds (``ss``, by process) and the process list by user; RSS and CPU per
   worker and the server's CPU;
4. *kill -9*: SIGKILL of ``--kill-fraction`` of the workers (a seeded random choice), then
   seconds until every partition is leased again by a survivor, and until fair share among
   the survivors. No survivor may take a dead worker's partition before its lease
   expires: ``LEASE_DURATION`` after the dead worker's last renewal, which was at most
   ``LEASE_RENEW_INTERVAL`` before the kill. So the figure cannot be below
   ``LEASE_DURATION - LEASE_RENEW_INTERVAL`` and is about ``LEASE_DURATION`` for a quarter.

**Connection budget.** With ``--max-connections`` below the documented budget (N x the
per-worker budget of ``django_sqlqueue/worker/budget.py``, plus ``HEADROOM``), the run first
watches for ``--crowded-seconds`` what happens with too few connections (workers in,
partitions leased), then raises ``max_connections`` to the budget (``SET GLOBAL``, private
server only) and measures the way to fair share from there. The workers' logs are counted
at both points: WARNING/ERROR lines, tracebacks, ``Too many connections``, the startup
warning about room, the outage lines (``django_sqlqueue/worker/outage.py``).

Results: a summary on stdout, ``--json`` (default ``bench/results/scale-<stamp>.json``), the
workers' logs under ``bench/results/scale-logs/``. Every process and server started here is
stopped at exit, also on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from django_sqlqueue.worker.budget import connection_budget  # noqa: E402 - a leaf: imports nothing of Django

PYTHON = sys.executable
RESULTS = ROOT / "bench" / "results"
GROUP = "scale"
TOPIC = "bench.scale"
DB_NAME = "sqlqueue_scale"
DB_USER = "sqlqueue_scale"
DB_PASSWORD = "sqlqueue_scale"
#: Connections beyond the workers' budget: this process's probe and room for a ``mariadb`` client.
HEADROOM = 10
STOP_TIMEOUT = 60.0
LOG_PATTERNS = {
    "warning_lines": re.compile(r"^\S+ \S+ WARNING ", re.M),
    "error_lines": re.compile(r"^\S+ \S+ (?:ERROR|CRITICAL) ", re.M),
    "tracebacks": re.compile(r"^Traceback \(most recent call last\)", re.M),
    "too_many_connections": re.compile(r"Too many connections"),
    "room_warnings": re.compile(r"has room for \d+ more connection"),
    "outage_started": re.compile(r"database unreachable, retrying"),
    "outage_summaries": re.compile(r"database still unreachable after"),
    "outage_ended": re.compile(r"database reachable again after"),
    "lost_leases": re.compile(r"lost leases"),
}


class BenchError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- the database server ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PrivateMariaDB:
    """A throwaway ``mariadbd`` on its own data directory, port and socket."""

    max_connections: int
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sqlqueue-scale-")))
    port: int = field(default_factory=free_port)
    popen: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.directory / "mysqld.sock"

    def start(self) -> None:
        data = self.directory / "data"
        subprocess.run(
            ["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
             "--auth-root-authentication-method=socket", "--skip-test-db"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        argv = [
            "/usr/sbin/mariadbd", "--no-defaults", f"--datadir={data}", f"--port={self.port}",
            "--bind-address=127.0.0.1", f"--socket={self.socket}", f"--pid-file={self.directory / 'mysqld.pid'}",
            "--user=root", f"--max-connections={self.max_connections}", "--skip-log-bin",
            # Statement digests for the idle breakdown; ~100 MB of memory, no effect on the counters.
            "--performance-schema=ON", f"--log-error={self.directory / 'error.log'}",
        ]  # fmt: skip
        self.popen = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = self.root()
                break
            except Exception as exc:  # not up yet
                if self.popen.poll() is not None or time.monotonic() > deadline:
                    raise BenchError(f"private mariadbd did not start: {exc}; see {self.directory}/error.log") from exc
                time.sleep(0.2)
        cur = conn.cursor()
        cur.execute(f"CREATE DATABASE {DB_NAME} CHARACTER SET utf8mb4")
        # An ordinary account (no SUPER/CONNECTION ADMIN: no extra connection beyond the limit).
        cur.execute(f"CREATE USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}'")
        cur.execute(f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1'")
        conn.close()

    def root(self) -> Any:
        import MySQLdb

        return MySQLdb.connect(unix_socket=str(self.socket), user="root", autocommit=True)

    @property
    def url(self) -> str:
        return f"mysql://{DB_USER}:{quote(DB_PASSWORD)}@127.0.0.1:{self.port}/{DB_NAME}"

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        shutil.rmtree(self.directory, ignore_errors=True)


def url_config(url: str) -> dict[str, Any]:
    import environ

    return dict(environ.Env.db_url_config(url))


def reset_database(url: str) -> None:
    """Drop and create the bench database of a server given by URL (its configuration untouched)."""
    import MySQLdb

    cfg = url_config(url)
    conn = MySQLdb.connect(host=cfg["HOST"], port=int(cfg["PORT"] or 3306), user=cfg["USER"], password=cfg["PASSWORD"])
    cur = conn.cursor()
    cur.execute(f"DROP DATABASE IF EXISTS `{cfg['NAME']}`")
    cur.execute(f"CREATE DATABASE `{cfg['NAME']}` CHARACTER SET utf8mb4")
    conn.close()


class Probe:
    """This process's autocommit connection: the lease table, status counters, process list."""

    def __init__(self, url: str, server: PrivateMariaDB | None, lease_duration: float) -> None:
        import MySQLdb

        self.server = server
        self.lease_duration = lease_duration
        if server is not None:  # root over the socket: sees every thread, may SET GLOBAL
            self.conn = server.root()
            self.conn.cursor().execute(f"USE {DB_NAME}")
        else:
            cfg = url_config(url)
            self.conn = MySQLdb.connect(
                host=cfg["HOST"], port=int(cfg["PORT"] or 3306), user=cfg["USER"], password=cfg["PASSWORD"],
                database=cfg["NAME"], autocommit=True,
            )  # fmt: skip

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        cur = self.conn.cursor()
        cur.execute(sql, params)
        return list(cur.fetchall())

    def leases(self) -> dict[str, int]:
        """Unexpired leases of the topic per holder."""
        rows = self.query(
            "SELECT leased_by, COUNT(*) FROM queue_partition_leases WHERE consumer_group = %s AND topic = %s "
            "AND lease_renewed_at > UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND GROUP BY leased_by",
            (GROUP, TOPIC, int(self.lease_duration * 1e6)),
        )
        return {name: int(n) for name, n in rows}

    def live_subscribers(self) -> set[str]:
        rows = self.query(
            "SELECT subscriber_name FROM queue_subscriber_heartbeats WHERE consumer_group = %s AND topic = %s "
            "AND deregistered_at IS NULL AND heartbeat_at > UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND",
            (GROUP, TOPIC, int(self.lease_duration * 1e6)),
        )
        return {name for (name,) in rows}

    def registered_partitions(self) -> int:
        return int(self.query("SELECT COUNT(*) FROM queue_partitions WHERE topic = %s", (TOPIC,))[0][0])

    def status(self) -> dict[str, int]:
        rows = self.query("SHOW GLOBAL STATUS")
        out = {}
        for name, value in rows:
            if name in ("Questions", "Queries", "Connections", "Threads_connected", "Aborted_connects") or (
                name.startswith(("Com_", "Connection_errors_"))
            ):
                try:
                    out[name] = int(value)
                except ValueError:
                    pass
        return out

    def variable(self, name: str) -> str:
        return str(self.query(f"SELECT @@{name}")[0][0])

    def processlist(self) -> dict[str, int]:
        rows = self.query("SELECT USER, COMMAND, COUNT(*) FROM information_schema.PROCESSLIST GROUP BY USER, COMMAND")
        return {f"{user} {command}": int(n) for user, command, n in rows}

    def digests_reset(self) -> bool:
        if self.server is None:
            return False
        self.query("TRUNCATE TABLE performance_schema.events_statements_summary_by_digest")
        return True

    def digests(self, top: int = 15) -> list[dict[str, Any]]:
        rows = self.query(
            "SELECT COUNT_STAR, ROUND(SUM_TIMER_WAIT / 1e9, 1), SUM_ROWS_EXAMINED, LEFT(DIGEST_TEXT, 160) "
            "FROM performance_schema.events_statements_summary_by_digest WHERE SCHEMA_NAME = %s "
            "ORDER BY COUNT_STAR DESC LIMIT %s",
            (DB_NAME, top),
        )
        return [{"count": int(c), "ms": float(ms), "rows_examined": int(r), "sql": sql} for c, ms, r, sql in rows]

    def set_max_connections(self, n: int) -> None:
        self.query(f"SET GLOBAL max_connections = {int(n)}")

    def close(self) -> None:
        self.conn.close()


# -- the workers -------------------------------------------------------------------------------


@dataclass
class Worker:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    killed: bool = False


@dataclass
class Workers:
    logs: Path
    env: dict[str, str]
    running: list[Worker] = field(default_factory=list)

    def spawn(self, n: int) -> float:
        """Start ``n`` workers at once; return the seconds the spawning took."""
        if self.logs.exists():
            shutil.rmtree(self.logs)
        self.logs.mkdir(parents=True)
        start = time.monotonic()
        for i in range(n):
            name = f"w{i:03d}"
            path = self.logs / f"{name}.log"
            with open(path, "wb") as out:
                popen = subprocess.Popen(
                    [PYTHON, "manage.py", "runconsumer", "--group", GROUP, "--topic", TOPIC, "--name", name],
                    cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                )  # fmt: skip
            self.running.append(Worker(name, popen, path))
        return time.monotonic() - start

    @property
    def live(self) -> list[Worker]:
        return [w for w in self.running if not w.killed]

    def check_alive(self) -> None:
        for w in self.live:
            code = w.popen.poll()
            if code is not None:
                tail = w.log.read_text(errors="replace")[-2000:]
                raise BenchError(f"worker {w.name} exited with status {code}; log tail:\n{tail}")

    def kill9(self, victims: list[Worker]) -> None:
        for w in victims:
            w.popen.send_signal(signal.SIGKILL)
            w.killed = True
        for w in victims:
            w.popen.wait(timeout=30)

    def stop_all(self) -> None:
        """SIGTERM every live worker (graceful: leases released), SIGKILL after ``STOP_TIMEOUT``."""
        for w in self.running:
            if w.popen.poll() is None:
                w.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for w in self.running:
            try:
                w.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log(f"! {w.name} (pid {w.popen.pid}) ignored SIGTERM: SIGKILL")
                w.popen.kill()
                w.popen.wait(timeout=10)

    def log_counts(self) -> dict[str, Any]:
        """Totals over every worker's log, and how many workers had at least one of each."""
        totals: Counter[str] = Counter()
        workers_with: Counter[str] = Counter()
        most: Counter[str] = Counter()
        for w in self.running:
            text = w.log.read_text(errors="replace")
            for key, pattern in LOG_PATTERNS.items():
                n = len(pattern.findall(text))
                totals[key] += n
                workers_with[key] += n > 0
                most[key] = max(most[key], n)
        return {
            key: {"total": totals[key], "workers": workers_with[key], "max_per_worker": most[key]}
            for key in LOG_PATTERNS
        }

    def connections_by_pid(self, port: int) -> dict[str, int]:
        """Established TCP connections to the server's port, per worker (``ss -p``)."""
        out = subprocess.run(
            ["ss", "-Htnp", "state", "established", f"( dport = :{port} )"],
            check=False, capture_output=True, text=True, timeout=30,
        ).stdout  # fmt: skip
        by_pid = Counter(int(pid) for pid in re.findall(r"pid=(\d+)", out))
        return {w.name: by_pid.get(w.popen.pid, 0) for w in self.live}


def proc_cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def proc_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return None


def server_pid(server: PrivateMariaDB | None) -> int | None:
    if server is not None and server.popen is not None:
        return server.popen.pid
    return None


# -- watching the leases -----------------------------------------------------------------------


@dataclass
class Watch:
    """Time to milestones of one phase, from ``start`` (monotonic), sampled from the probe."""

    probe: Probe
    workers: Workers
    partitions: int
    start: float
    sample: float
    timeline: list[dict[str, Any]] = field(default_factory=list)

    def snapshot(self) -> dict[str, Any]:
        live = {w.name for w in self.workers.live}
        held = self.probe.leases()
        by_live = {name: held.get(name, 0) for name in live}
        n = len(live)
        floor_, ceil_ = self.partitions // n, math.ceil(self.partitions / n)
        leased_by_live = sum(by_live.values())
        heartbeats = self.probe.live_subscribers()
        beating = heartbeats & live
        snap = {
            "t": round(time.monotonic() - self.start, 2),
            "heartbeating": len(beating),
            # Killed workers whose heartbeat has not expired yet: still counted in everyone's share.
            "ghosts": len(heartbeats - live),
            "leased": sum(held.values()),
            "leased_by_live": leased_by_live,
            "holders": sum(1 for v in by_live.values() if v),
            "min": min(by_live.values()),
            "max": max(by_live.values()),
            "all_leased": leased_by_live == self.partitions,
            "fair": leased_by_live == self.partitions and all(floor_ <= v <= ceil_ for v in by_live.values()),
        }
        self.timeline.append(snap)
        return snap

    def until(self, what: str, timeout: float, *, check_alive: bool = True) -> float | None:
        """Seconds from ``start`` until a snapshot has ``what`` true (None on timeout)."""
        deadline = self.start + timeout
        last_print = 0.0
        while True:
            snap = self.snapshot()
            if snap[what]:
                return float(snap["t"])
            now = time.monotonic()
            if now - last_print >= 10:
                last_print = now
                log(
                    f"  t={snap['t']:.0f}s heartbeating {snap['heartbeating']}, leased {snap['leased_by_live']}"
                    f"/{self.partitions} by {snap['holders']} live workers (min {snap['min']}, max {snap['max']})"
                )
            if now > deadline:
                return None
            if check_alive:
                self.workers.check_alive()
            time.sleep(self.sample)


def wait_milestones(watch: Watch, timeout: float) -> dict[str, Any]:
    """All heartbeating, all leased, fair: seconds from the watch's start (None: not within timeout)."""
    n = len(watch.workers.live)
    out: dict[str, Any] = {}
    fair = watch.until("fair", timeout)
    out["all_heartbeating_s"] = next((s["t"] for s in watch.timeline if s["heartbeating"] >= n), None)
    out["all_leased_s"] = next((s["t"] for s in watch.timeline if s["all_leased"]), None)
    out["fair_s"] = fair
    out["no_ghosts_s"] = next((s["t"] for s in watch.timeline if not s["ghosts"]), None)
    if fair is not None and out["all_heartbeating_s"] is not None:
        out["fair_after_all_heartbeating_s"] = round(fair - out["all_heartbeating_s"], 2)
    last = watch.timeline[-1]
    out["at_end"] = {k: last[k] for k in ("heartbeating", "leased_by_live", "holders", "min", "max")}
    if fair is None:
        held = watch.probe.leases()
        out["holdings_at_timeout"] = dict(sorted(Counter(held.get(w.name, 0) for w in watch.workers.live).items()))
    return out


# -- the phases ----------------------------------------------------------------------------------


def idle_phase(probe: Probe, workers: Workers, server: PrivateMariaDB | None, port: int, seconds: float) -> dict:
    """Statement counters, CPU, RSS and connections over a quiet interval."""
    n = len(workers.live)
    conns = workers.connections_by_pid(port)
    plist = probe.processlist()
    digests = probe.digests_reset()
    spid = server_pid(server)
    cpu0 = {w.name: proc_cpu(w.popen.pid) for w in workers.live}
    scpu0 = proc_cpu(spid) if spid else None
    s0, t0 = probe.status(), time.monotonic()
    time.sleep(seconds)
    s1, t1 = probe.status(), time.monotonic()
    cpu1 = {w.name: proc_cpu(w.popen.pid) for w in workers.live}
    scpu1 = proc_cpu(spid) if spid else None
    dt = t1 - t0
    delta = {k: s1[k] - s0.get(k, 0) for k in s1 if isinstance(s1[k], int)}
    # This process sent one SHOW GLOBAL STATUS inside the window (the second).
    questions = delta.get("Questions", 0) - 1
    com = {k[4:]: v for k, v in delta.items() if k.startswith("Com_") and v > 0}
    com["show_status"] = com.get("show_status", 0) - 1
    cpu = [cpu1[k] - cpu0[k] for k in cpu0 if cpu0[k] is not None and cpu1.get(k) is not None]  # type: ignore[operator]
    rss = [r for r in (proc_rss_mib(w.popen.pid) for w in workers.live) if r is not None]
    conn_counts = Counter(conns.values())
    out: dict[str, Any] = {
        "seconds": round(dt, 1),
        "workers": n,
        "statements_per_s": round(questions / dt, 1),
        "statements_per_s_per_worker": round(questions / dt / n, 2),
        "by_command_per_s_per_worker": {
            k: round(v / dt / n, 3) for k, v in sorted(com.items(), key=lambda kv: -kv[1]) if v > 0
        },
        "worker_cpu_percent_mean": round(100 * sum(cpu) / len(cpu) / dt, 2) if cpu else None,
        "worker_cpu_percent_total": round(100 * sum(cpu) / dt, 1) if cpu else None,
        "server_cpu_percent": round(100 * (scpu1 - scpu0) / dt, 1) if scpu0 is not None and scpu1 is not None else None,
        "rss_mib_mean": round(sum(rss) / len(rss), 1) if rss else None,
        "rss_mib_max": round(max(rss), 1) if rss else None,
        "rss_mib_total": round(sum(rss)) if rss else None,
        "connections_per_worker": dict(sorted(conn_counts.items())),
        "processlist": plist,
    }
    if digests:
        out["top_statements"] = probe.digests()
    return out


def kill_phase(probe: Probe, workers: Workers, partitions: int, fraction: float, seed: int, args: Any) -> dict:
    victims = random.Random(seed).sample(workers.live, round(len(workers.live) * fraction))
    log(f"kill -9 of {len(victims)} workers: {', '.join(sorted(w.name for w in victims))}")
    start = time.monotonic()
    workers.kill9(victims)
    watch = Watch(probe, workers, partitions, start, args.sample)
    out = wait_milestones(watch, args.lease_duration * 3 + args.fair_timeout)
    out["killed"] = len(victims)
    out["survivors"] = len(workers.live)
    out["orphaned_partitions"] = next(
        (partitions - s["leased_by_live"] for s in watch.timeline), None
    )  # right after the kill
    out["timeline"] = watch.timeline
    return out


def run(args: argparse.Namespace, server: PrivateMariaDB | None, workers_holder: list[Workers]) -> dict[str, Any]:
    n, p = args.workers, args.partitions
    per_worker = connection_budget(concurrency=1, scheduler=False, async_handlers=False, handler_threads=True)
    budget = n * per_worker.total + HEADROOM
    url = server.url if server is not None else args.database_url
    if server is None:
        reset_database(url)
    port = int(url_config(url)["PORT"] or 3306)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.scale_settings",
        "DATABASE_URL": url,
        "PYTHONUNBUFFERED": "1",
        "SCALE_PARTITIONS": str(p),
        "SCALE_LEASE_DURATION": str(args.lease_duration),
        "SCALE_LEASE_RENEW_INTERVAL": str(args.renew_interval),
        "SCALE_POLL_INTERVAL": str(args.poll_interval),
        "SCALE_POLL_INTERVAL_MAX": str(args.poll_interval_max),
    }
    subprocess.run([PYTHON, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=600)
    probe = Probe(url, server, args.lease_duration)
    result: dict[str, Any] = {
        "workers": n,
        "partitions": p,
        "settings": {
            "LEASE_DURATION": args.lease_duration,
            "LEASE_RENEW_INTERVAL": args.renew_interval,
            "POLL_INTERVAL": args.poll_interval,
            "POLL_INTERVAL_MAX": args.poll_interval_max,
        },
        "server": {
            "version": probe.variable("version"),
            "max_connections": int(probe.variable("max_connections")),
            "private": server is not None,
        },
        "budget": {"per_worker": per_worker.describe(), "total_with_headroom": budget},
        "machine": {"cpus": os.cpu_count(), "load_at_start": os.getloadavg()},
    }
    workers = Workers(RESULTS / "scale-logs", env)
    workers_holder.append(workers)
    log(
        f"{n} workers x {p} partitions, server {result['server']['version']} max_connections "
        f"{result['server']['max_connections']} (budget {budget}: {n} x ({per_worker.describe()}) + {HEADROOM})"
    )
    spawn_start = time.monotonic()
    result["spawn_s"] = round(workers.spawn(n), 2)
    log(f"spawned {n} workers in {result['spawn_s']:.1f}s")
    watch = Watch(probe, workers, p, spawn_start, args.sample)
    crowded = result["server"]["max_connections"] < budget
    if crowded:
        log(f"too few connections: watching for {args.crowded_seconds:.0f}s")
        watch.until("fair", args.crowded_seconds)
        result["crowded"] = {
            "seconds": args.crowded_seconds,
            "at_end": {k: watch.timeline[-1][k] for k in ("heartbeating", "leased_by_live", "holders", "min", "max")},
            "connections_per_worker": dict(sorted(Counter(workers.connections_by_pid(port).values()).items())),
            "processlist": probe.processlist(),
            "status": {k: v for k, v in probe.status().items() if k.startswith("Connection_errors") and v},
            "logs": workers.log_counts(),
        }
        log(f"crowded: {json.dumps(result['crowded'])}")
        if server is None:
            raise BenchError("max_connections is below the budget and the server is not private: not raising it")
        probe.set_max_connections(budget)
        raised_at = time.monotonic()
        log(f"SET GLOBAL max_connections = {budget}")
        watch_after = Watch(probe, workers, p, raised_at, args.sample)
        result["after_raise"] = wait_milestones(watch_after, args.fair_timeout)
        result["after_raise"]["timeline"] = watch_after.timeline
        result["after_raise"]["logs"] = workers.log_counts()
        log(f"after raising max_connections: {summary_line(result['after_raise'])}")
    else:
        result["start"] = wait_milestones(watch, args.fair_timeout)
        log(f"from spawn: {summary_line(result['start'])}")
    result["start_timeline"] = watch.timeline
    fair = result["after_raise" if crowded else "start"]["fair_s"] is not None
    if not fair:
        log("! not fair within the timeout; measuring idle and kill -9 anyway")
    time.sleep(args.settle)
    log(f"idle for {args.idle_seconds:.0f}s")
    result["idle"] = idle_phase(probe, workers, server, port, args.idle_seconds)
    log(f"idle: {json.dumps({k: v for k, v in result['idle'].items() if k != 'top_statements'})}")
    result["fair_after_idle"] = Watch(probe, workers, p, time.monotonic(), args.sample).snapshot()
    if args.kill_fraction > 0:
        result["kill"] = kill_phase(probe, workers, p, args.kill_fraction, args.seed, args)
        log(f"after kill -9: {summary_line(result['kill'])}")
    result["logs"] = workers.log_counts()
    probe.close()
    return result


def summary_line(m: dict[str, Any]) -> str:
    def s(v: float | None) -> str:
        return "not reached" if v is None else f"{v:.1f}s"

    return (
        f"all heartbeating {s(m.get('all_heartbeating_s'))}, dead heartbeats expired {s(m.get('no_ghosts_s'))}, "
        f"all leased {s(m['all_leased_s'])}, fair {s(m['fair_s'])}; at end {m['at_end']}"
        + (f"; holdings (partitions: workers) {m['holdings_at_timeout']}" if "holdings_at_timeout" in m else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--private-mariadb", action="store_true", help="start a throwaway mariadbd for the run")
    where.add_argument("--database-url", help="mysql://... of an existing server (its database is recreated)")
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4096)
    parser.add_argument("--quick", action="store_true", help="20 workers x 512 partitions, 15 s idle")
    parser.add_argument(
        "--max-connections", type=int, help="private server's max_connections (default: the documented budget)"
    )
    parser.add_argument("--crowded-seconds", type=float, default=150.0, help="watch this long with too few connections")
    parser.add_argument("--lease-duration", type=float, default=30.0)
    parser.add_argument("--renew-interval", type=float, default=10.0)
    parser.add_argument("--poll-interval", type=float, default=0.1)
    parser.add_argument("--poll-interval-max", type=float, default=1.0)
    parser.add_argument("--fair-timeout", type=float, default=300.0, help="give up waiting for fair share after this")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between fair share and the idle window")
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--kill-fraction", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--sample", type=float, default=0.25, help="seconds between looks at the lease table")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.workers, args.partitions, args.idle_seconds = 20, 512, 15.0
    if args.private_mariadb and shutil.which("mariadb-install-db") is None:
        parser.error("--private-mariadb needs mariadb-install-db and /usr/sbin/mariadbd")

    def on_signal(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    per_worker = connection_budget(concurrency=1, scheduler=False, async_handlers=False, handler_threads=True).total
    server = None
    holder: list[Workers] = []
    started = time.time()
    result: dict[str, Any] = {}
    try:
        if args.private_mariadb:
            server = PrivateMariaDB(args.max_connections or args.workers * per_worker + HEADROOM)
            server.start()
            log(f"private mariadbd on 127.0.0.1:{server.port}, data in {server.directory}")
        result = run(args, server, holder)
    finally:
        for workers in holder:
            log("stopping the workers (SIGTERM)")
            workers.stop_all()
        if server is not None:
            log("stopping the private mariadbd")
            server.stop()
        out = args.json or RESULTS / f"scale-{time.strftime('%Y%m%d-%H%M%S', time.localtime(started))}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"started": started, "args": vars(args), **result}, indent=2, default=str))
        log(f"results: {out}")
    print(report(result))


def report(r: dict[str, Any]) -> str:
    if not r:
        return "no results"
    lines = [
        (
            f"{r['workers']} workers x {r['partitions']} partitions; {r['settings']}; server max_connections "
            f"{r['server']['max_connections']}, budget {r['budget']}"
        ),
        f"spawn: {r['spawn_s']}s",
    ]
    if "start" in r:
        lines.append(f"from spawn: {summary_line(r['start'])}")
    if "crowded" in r:
        c = r["crowded"]
        lines.append(f"crowded ({c['seconds']:.0f}s): {c['at_end']}; connections/worker {c['connections_per_worker']}")
        lines.append(f"  logs: {json.dumps(c['logs'])}")
        lines.append(f"after raising max_connections: {summary_line(r['after_raise'])}")
        lines.append(f"  logs: {json.dumps(r['after_raise']['logs'])}")
    if "idle" in r:
        i = r["idle"]
        lines.append(
            f"idle {i['seconds']}s: {i['statements_per_s']} statements/s = {i['statements_per_s_per_worker']} per "
            f"worker {i['by_command_per_s_per_worker']}; worker CPU {i['worker_cpu_percent_mean']}% each "
            f"({i['worker_cpu_percent_total']}% total), server CPU {i['server_cpu_percent']}%, RSS "
            f"{i['rss_mib_mean']} MiB mean / {i['rss_mib_max']} max; connections per worker (connections: workers) "
            f"{i['connections_per_worker']}; process list {i['processlist']}"
        )
        for d in i.get("top_statements", []):
            lines.append(f"  {d['count']:>7} {d['ms']:>9.1f} ms {d['rows_examined']:>10} rows  {d['sql']}")
    if "kill" in r:
        k = r["kill"]
        lines.append(f"kill -9 of {k['killed']} ({k['orphaned_partitions']} partitions orphaned): {summary_line(k)}")
    if "logs" in r:
        lines.append(f"logs: {json.dumps(r['logs'])}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
