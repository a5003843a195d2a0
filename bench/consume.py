"""Consumption benchmarks: drain throughput and end-to-end latency of ``runconsumer`` workers.

Run: ``.venv/bin/python bench/consume.py [--messages N] [--partitions P] [--workers 1,2,4]
[--rate 1000,200] [--seconds 10] [--repeat 3] [--json FILE]``.

Everything runs against a dedicated, freshly migrated database (``sqlqueue_bench``, see
``bench/common.py``); the queue tables are truncated before every run. Workers are real
``manage.py runconsumer`` subprocesses with ``DJANGO_SETTINGS_MODULE=bench.settings``
(consumers in ``bench/benchapp/consumers.py``), stopped with SIGTERM (graceful drain).

**Drain.** N messages over P partitions (integers 0..P-1, ``SQLQUEUE["TOPICS"]`` in
``bench/settings.py``, ``BENCH_PARTITIONS``) of topic ``bench.drain``: message i has the key
``keys[i % P]``, one key per partition chosen so that it hashes (CRC-32) to that partition, so
every partition gets N/P messages. K workers of group ``bench`` consume them with a no-op
handler, batch size 100. Messages are published without offsets; the workers' polls sequence
them. Done means no message of the topic waits for an offset (``offset IS NULL``), the heads
sum to N (plus warm-up) and every partition's watermark (``queue_offsets.offset_acked``)
equals its head (``queue_partitions.head_offset``), polled every 20 ms from this process.
Two modes:

- *cold*: publish N (``publish_many``, 1,000 per call), then start the K workers. Reported
  twice: ``wall`` = N / (done - spawn), which includes Python + Django start-up, the first
  lease round and fair-share rebalancing; ``from 1st ack`` = messages acked after the first
  poll that saw any ack / time from that poll to done.
- *warm*: start the K workers, publish one warm-up message per partition, wait until it is
  consumed and (for the queue) the leases are balanced, then publish N messages in **one**
  transaction (so they appear at once) and time from its commit to done. This is the steady
  state of a running system and the figure compared with the targets.

The baseline, run interleaved with the queue in the same modes against the same tables, is
``bench/baseline_consumer.py``: K raw-mysqlclient processes with a static partition split and no
leases, doing per partition (after a hand-written sequencing transaction when unsequenced
messages exist) SELECT 100 -> upsert delivery rows + COMMIT -> no-op -> DELETE rows + UPDATE
watermark + COMMIT. It is "the limit" for that shape of work; the tables show
queue / baseline.

**Latency.** Two workers on ``bench.latency``; after a warm-up (partitions exist, leases
balanced) this process publishes ``rate`` messages/s for ``seconds`` with ``publish()`` (one
message and one commit per call, paced on a monotonic-clock schedule, keys round-robin over
the P per-partition keys), payload ``{"t": time.time()}``. Handlers write ``time.time() - t`` to per-process
files; after the drain and SIGTERM they are read back and summarised (p50/p95/p99/max).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
from bench.common import BENCH_URL, partition_keys, raw_connection, setup_django, truncate_queue  # noqa: E402

GROUP = "bench"
DRAIN_TOPIC = "bench.drain"
LATENCY_TOPIC = "bench.latency"
RESULTS = ROOT / "bench" / "results"
PYTHON = sys.executable
POLL = 0.02
STOP_TIMEOUT = 30.0
PAYLOAD = {"customer": "alice", "total": "19.90", "lines": [{"sku": "A-1", "qty": 2}]}
STOPPED_RE = re.compile(r"worker stopped subscriber=(\S+) delivered=(\d+) acked=(\d+)")


class BenchError(RuntimeError):
    pass


def engine_fingerprint() -> str:
    """Git HEAD plus a hash of django_sqlqueue/*.py as on disk (the tree may be uncommitted)."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted((ROOT / "django_sqlqueue").rglob("*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=False, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "django_sqlqueue"],
            cwd=ROOT,
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head, dirty = "?", ""
    return f"{head}{'+dirty' if dirty else ''} engine-sha256:{digest.hexdigest()[:12]}"


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a live process, from /proc (None if unavailable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def mariadb_pid() -> int | None:
    try:
        out = subprocess.run(
            ["pgrep", "-x", "mariadbd"], check=False, capture_output=True, text=True, timeout=5
        ).stdout.split()
        if not out:
            out = subprocess.run(
                ["pgrep", "-x", "mysqld"], check=False, capture_output=True, text=True, timeout=5
            ).stdout.split()
        return int(out[0]) if out else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


MARIADB_PID = mariadb_pid()


def server_cpu() -> float | None:
    """CPU seconds used so far by the database server (all its clients, not only ours)."""
    return cpu_seconds(MARIADB_PID) if MARIADB_PID else None


# -- processes ----------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    #: CPU seconds the process had used when it was asked to stop.
    cpu: float | None = None


@dataclass
class Procs:
    """Every subprocess this benchmark started; :meth:`stop_all` ends them by pid."""

    running: list[Proc] = field(default_factory=list)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        log = RESULTS / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        out = open(log, "w")  # noqa: SIM115 - closed by the child's exit / GC
        popen = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        proc = Proc(name, popen, log)
        self.running.append(proc)
        return proc

    def worker(self, name: str, topic: str, **extra_env: str) -> Proc:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "DATABASE_URL": BENCH_URL,
            "PYTHONUNBUFFERED": "1",
            **extra_env,
        }
        argv = [PYTHON, "manage.py", "runconsumer", "--group", GROUP, "--topic", topic, "--name", name]
        return self._spawn(name, argv, env)

    def baseline(self, name: str, parts: list[int], batch_size: int, topic: str = DRAIN_TOPIC, *extra: str) -> Proc:
        import environ

        cfg = environ.Env.db_url_config(BENCH_URL)
        argv = [
            PYTHON,
            str(ROOT / "bench" / "baseline_consumer.py"),
            "--host", cfg["HOST"], "--port", str(cfg["PORT"] or 3306),
            "--user", cfg["USER"], "--password", cfg["PASSWORD"], "--database", cfg["NAME"],
            "--topic", topic, "--group", GROUP,
            "--partitions", ",".join(map(str, parts)), "--batch-size", str(batch_size), *extra,
        ]  # fmt: skip
        return self._spawn(name, argv, {**os.environ, "PYTHONUNBUFFERED": "1"})

    def stop_all(self, timeout: float = STOP_TIMEOUT) -> list[Proc]:
        """SIGTERM every running child, wait for them (SIGKILL after ``timeout``)."""
        procs, self.running = self.running, []
        for p in procs:
            if p.popen.poll() is None:
                p.cpu = cpu_seconds(p.popen.pid)
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"  ! {p.name} (pid {p.popen.pid}) ignored SIGTERM for {timeout:.0f}s: SIGKILL", file=sys.stderr)
                p.popen.kill()
                p.popen.wait(timeout=10)
        return procs

    def cpu(self) -> float:
        """CPU seconds used so far by the running children."""
        return sum(cpu_seconds(p.popen.pid) or 0.0 for p in self.running)

    def check_alive(self) -> None:
        for p in self.running:
            code = p.popen.poll()
            if code is not None:
                tail = p.log.read_text(errors="replace")[-2000:]
                raise BenchError(f"{p.name} exited with status {code}; log tail:\n{tail}")


def worker_counts(procs: list[Proc]) -> dict[str, int]:
    """Messages each process handled: from runconsumer's last log line or the baseline's JSON."""
    counts: dict[str, int] = {}
    for p in procs:
        text = p.log.read_text(errors="replace")
        m = STOPPED_RE.search(text)
        if m:
            counts[p.name] = int(m.group(3))
            continue
        for line in reversed(text.splitlines()):
            if line.startswith("{"):
                counts[p.name] = json.loads(line)["handled"]
                break
    return counts


# -- database probes ------------------------------------------------------------------------


class Probe:
    """A separate autocommit connection that watches the queue tables."""

    def __init__(self) -> None:
        self.conn = raw_connection()
        self.conn.autocommit(True)

    def progress(self, topic: str, partitions: int) -> tuple[int, int, int, int]:
        """(sum of heads, sum of watermarks, partitions, partitions drained) of ``topic``.

        A partition counts as drained when its watermark equals its head and none of its
        messages waits for an offset. The unsequenced look-up is a range read of the
        (topic, partition, offset) index per partition: NULL offsets sort first.
        """
        cur = self.conn.cursor()
        cur.execute(
            "SELECT COALESCE(SUM(p.head_offset), 0), COALESCE(SUM(COALESCE(o.offset_acked, 0)), 0), COUNT(*), "
            "COALESCE(SUM(COALESCE(o.offset_acked, 0) >= p.head_offset AND NOT EXISTS (SELECT 1 FROM queue_messages m "
            "WHERE m.topic = p.topic AND m.`partition` = p.`partition` AND m.`offset` IS NULL)), 0) "
            "FROM queue_partitions p LEFT JOIN queue_offsets o ON o.consumer_group = %s AND o.topic = p.topic "
            "AND o.`partition` = p.`partition` WHERE p.topic = %s AND p.`partition` < %s",
            (GROUP, topic, partitions),
        )
        head, acked, parts, done = cur.fetchone()
        return int(head), int(acked), int(parts), int(done)

    def leases(self, topic: str) -> dict[str, int]:
        cur = self.conn.cursor()
        cur.execute(
            "SELECT leased_by, COUNT(*) FROM queue_partition_leases WHERE consumer_group = %s AND topic = %s "
            "GROUP BY leased_by",
            (GROUP, topic),
        )
        return {name: int(n) for name, n in cur.fetchall()}

    def wait_drained(self, topic: str, partitions: int, expected_head: int, timeout: float, procs: Procs) -> None:
        deadline = time.monotonic() + timeout
        while True:
            head, acked, parts, done = self.progress(topic, partitions)
            if head == expected_head and parts == partitions and done == parts:
                return
            if time.monotonic() > deadline:
                raise BenchError(f"{topic}: not drained after {timeout:.0f}s (head {head}, acked {acked})")
            procs.check_alive()
            time.sleep(POLL)

    def wait_balanced(self, topic: str, workers: int, partitions: int, timeout: float, procs: Procs) -> None:
        """Wait until ``workers`` subscribers hold every partition, at most their fair share each."""
        cap = math.ceil(partitions / workers)
        deadline = time.monotonic() + timeout
        while True:
            held = self.leases(topic)
            if len(held) == workers and sum(held.values()) == partitions and max(held.values()) <= cap:
                return
            if time.monotonic() > deadline:
                raise BenchError(f"{topic}: leases not balanced after {timeout:.0f}s: {held}")
            procs.check_alive()
            time.sleep(0.05)

    def commit_latency(self, n: int = 100) -> dict[str, float]:
        """The server's commit latency right now: ``n`` one-row UPDATE + COMMIT, in ms.

        Other clients of the same server share its redo-log flushes; this shows how busy
        it was around a measurement.
        """
        cur = self.conn.cursor()
        cur.execute("CREATE TABLE IF NOT EXISTS bench_commit_probe (id INT PRIMARY KEY, n BIGINT NOT NULL)")
        cur.execute("INSERT IGNORE INTO bench_commit_probe VALUES (1, 0)")
        self.conn.autocommit(False)
        times = []
        try:
            for _ in range(n):
                t = time.perf_counter()
                cur.execute("UPDATE bench_commit_probe SET n = n + 1 WHERE id = 1")
                self.conn.commit()
                times.append((time.perf_counter() - t) * 1000)
        finally:
            self.conn.autocommit(True)
        times.sort()
        return {"p50_ms": round(percentile(times, 0.5), 3), "p95_ms": round(percentile(times, 0.95), 3)}

    def close(self) -> None:
        self.conn.close()


# -- publishing -----------------------------------------------------------------------------


def publish_drain(n: int, partitions: int, *, one_transaction: bool, chunk: int = 1000) -> float:
    """Publish ``n`` drain messages round-robin over the partitions; return seconds taken."""
    from django.db import transaction

    from django_sqlqueue import publish_many

    keys = partition_keys(partitions)
    start = time.perf_counter()

    def write() -> None:
        for base in range(0, n, chunk):
            publish_many(
                DRAIN_TOPIC,
                [
                    {"payload": {**PAYLOAD, "i": i}, "key": keys[i % partitions]}
                    for i in range(base, min(n, base + chunk))
                ],
            )

    if one_transaction:
        with transaction.atomic():
            write()
    else:
        write()
    return time.perf_counter() - start


def publish_warmup(topic: str, partitions: int, payload: dict[str, Any]) -> None:
    from django_sqlqueue import publish_many

    publish_many(topic, [{"payload": payload, "key": key} for key in partition_keys(partitions)])


# -- drain ----------------------------------------------------------------------------------


def drain_run(impl: str, workers: int, mode: str, rep: int, args: argparse.Namespace, procs: Procs) -> dict[str, Any]:
    """One drain measurement; see the module docstring."""
    n, parts = args.messages, args.partitions
    keys = list(range(parts))
    probe = Probe()
    try:
        procs.stop_all()
        truncate_queue()

        def spawn() -> None:
            for i in range(workers):
                name = f"{impl}-{mode}-k{workers}-r{rep}-w{i}"
                if impl == "queue":
                    procs.worker(name, DRAIN_TOPIC, BENCH_BATCH_SIZE=str(args.batch_size), **args.worker_env)
                else:
                    procs.baseline(name, keys[i::workers], args.batch_size)

        base = 0
        publish_seconds = None
        if mode == "cold":
            publish_seconds = publish_drain(n, parts, one_transaction=False)
            cpu0, server0 = 0.0, server_cpu()
            t_start = time.perf_counter()
            spawn()
        else:
            spawn()
            publish_warmup(DRAIN_TOPIC, parts, {"warmup": True})
            probe.wait_drained(DRAIN_TOPIC, parts, parts, 120, procs)
            if impl == "queue":
                probe.wait_balanced(DRAIN_TOPIC, workers, parts, 60, procs)
            base = parts
            publish_seconds = publish_drain(n, parts, one_transaction=True)
            t_start = time.perf_counter()
            cpu0, server0 = procs.cpu(), server_cpu()
        expected = base + n
        t_first = acked_first = None
        deadline = time.monotonic() + max(120.0, n / 200)
        while True:
            head, acked, p_total, p_done = probe.progress(DRAIN_TOPIC, parts)
            now = time.perf_counter()
            if t_first is None and acked > base:
                t_first, acked_first = now, acked
            if head == expected and p_total == parts and p_done == parts:
                t_done = now
                cpu1, server1 = procs.cpu(), server_cpu()
                break
            if time.monotonic() > deadline:
                raise BenchError(f"drain {impl} k={workers} {mode}: timeout (acked {acked - base} of {n})")
            procs.check_alive()
            time.sleep(POLL)
        stopped = procs.stop_all()
        counts = worker_counts(stopped)
    finally:
        probe.close()
    assert t_first is not None and acked_first is not None
    wall = t_done - t_start
    result = {
        "impl": impl,
        "workers": workers,
        "mode": mode,
        "rep": rep,
        "messages": n,
        "publish_seconds": round(publish_seconds, 3),
        "seconds": round(wall, 3),
        "msgs_per_s": round(n / wall),
        "first_ack_after": round(t_first - t_start, 3),
        "msgs_per_s_from_first_ack": round((expected - acked_first) / (t_done - t_first)) if t_done > t_first else None,
        "per_worker": counts,
        # cold: includes Python/Django start-up; server: every client of the server, not only ours
        "workers_cpu_s": round(cpu1 - cpu0, 2),
        "server_cpu_s": round(server1 - server0, 2) if server0 is not None and server1 is not None else None,
    }
    print(
        f"  {impl:8} {mode} k={workers} rep {rep}: {result['msgs_per_s']:>7,}/s wall ({wall:.2f}s), "
        f"{result['msgs_per_s_from_first_ack'] or 0:>7,}/s from first ack (+{result['first_ack_after']:.2f}s); "
        f"per worker {sorted(counts.values(), reverse=True)}; cpu workers {result['workers_cpu_s']}s "
        f"server {result['server_cpu_s']}s",
        flush=True,
    )
    return result


# -- latency --------------------------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def latency_run(
    impl: str, rate: float, publishers: int, rep: int, args: argparse.Namespace, procs: Procs
) -> dict[str, Any]:
    import threading

    from django.db import connections

    from django_sqlqueue import publish

    parts, seconds = args.partitions, args.seconds
    label = f"{impl}-r{rate:g}-p{publishers}-{rep}"
    lat_dir = RESULTS / "latency" / label
    shutil.rmtree(lat_dir, ignore_errors=True)
    lat_dir.mkdir(parents=True)
    n = int(rate * seconds)
    behind = [0] * publishers
    call_seconds = [0.0] * publishers
    errors: list[BaseException] = []
    probe = Probe()
    try:
        procs.stop_all()
        truncate_queue()
        commit_before = probe.commit_latency()
        keys = partition_keys(parts)
        env = {"BENCH_LATENCY_DIR": str(lat_dir), "SQLQUEUE_POLL_INTERVAL": str(args.poll_interval), **args.worker_env}
        for i in range(2):
            if impl == "queue":
                procs.worker(f"latency-{label}-w{i}", LATENCY_TOPIC, **env)
            else:
                procs.baseline(
                    f"latency-{label}-w{i}",
                    list(range(parts))[i::2],
                    args.batch_size,
                    LATENCY_TOPIC,
                    "--latency-dir",
                    str(lat_dir),
                    "--poll-interval",
                    str(args.poll_interval),
                )
        publish_warmup(LATENCY_TOPIC, parts, {"t": time.time(), "run": "warmup"})
        probe.wait_drained(LATENCY_TOPIC, parts, parts, 120, procs)
        if impl == "queue":
            probe.wait_balanced(LATENCY_TOPIC, 2, parts, 60, procs)

        def publisher(j: int, start: float) -> None:
            # Publisher j sends messages j, j + publishers, ...: together one schedule of `rate`/s.
            try:
                for i in range(j, n, publishers):
                    delay = start + i / rate - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                    elif delay < -0.005:
                        behind[j] += 1
                    t = time.perf_counter()
                    publish(LATENCY_TOPIC, {"t": time.time(), "run": label}, key=keys[i % parts])
                    call_seconds[j] += time.perf_counter() - t
            except BaseException as exc:  # noqa: BLE001 - reported by the caller
                errors.append(exc)
            finally:
                if publishers > 1:
                    connections.close_all()

        cpu0, server0, own0 = procs.cpu(), server_cpu(), time.process_time()
        start = time.perf_counter()
        if publishers == 1:
            publisher(0, start)
        else:
            threads = [threading.Thread(target=publisher, args=(j, start), daemon=True) for j in range(publishers)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(timeout=seconds * 10 + 60)
            if any(th.is_alive() for th in threads):
                raise BenchError("a publisher thread did not finish")
        elapsed = time.perf_counter() - start
        cpu1, server1, own1 = procs.cpu(), server_cpu(), time.process_time()
        if errors:
            raise BenchError(f"publisher failed: {errors[0]!r}") from errors[0]
        probe.wait_drained(LATENCY_TOPIC, parts, parts + n, 120, procs)
        procs.stop_all()
        commit_after = probe.commit_latency()
    finally:
        probe.close()
    samples: list[float] = []
    for path in lat_dir.glob("latency-*.txt"):
        for line in path.read_text().splitlines():
            run, _, value = line.partition(" ")
            if run == label:
                samples.append(float(value) * 1000)
    samples.sort()
    result = {
        "impl": impl,
        "rate": rate,
        "publishers": publishers,
        "rep": rep,
        "published": n,
        "received": len(samples),
        "achieved_rate": round(n / elapsed, 1),
        "publishes_behind_schedule_5ms": sum(behind),
        "publish_call_ms": round(sum(call_seconds) / n * 1000, 3),
        "p50_ms": round(percentile(samples, 0.50), 2),
        "p95_ms": round(percentile(samples, 0.95), 2),
        "p99_ms": round(percentile(samples, 0.99), 2),
        "max_ms": round(samples[-1], 2) if samples else None,
        "mean_ms": round(statistics.fmean(samples), 2) if samples else None,
        # CPU over the publishing window, as a share of one core
        "workers_cpu": round((cpu1 - cpu0) / elapsed, 2),
        "publisher_cpu": round((own1 - own0) / elapsed, 2),
        "server_cpu": round((server1 - server0) / elapsed, 2) if server0 is not None and server1 is not None else None,
        "commit_probe_before": commit_before,
        "commit_probe_after": commit_after,
    }
    print(
        f"  latency {impl:8} {rate:g}/s x{publishers} rep {rep}: achieved {result['achieved_rate']:,}/s "
        f"(publish() {result['publish_call_ms']} ms), received {len(samples)}/{n}, "
        f"p50 {result['p50_ms']} p95 {result['p95_ms']} p99 {result['p99_ms']} max {result['max_ms']} ms; "
        f"cpu workers {result['workers_cpu']} publisher {result['publisher_cpu']} server {result['server_cpu']}; "
        f"commit probe p50 {commit_before['p50_ms']}/{commit_after['p50_ms']} ms",
        flush=True,
    )
    return result


# -- report ---------------------------------------------------------------------------------


def median_of(rows: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def spread(rows: list[dict[str, Any]], key: str, fmt: str = ",.0f") -> str:
    values = [r[key] for r in rows if r.get(key) is not None]
    if len(values) < 2:
        return ""
    return f" ({min(values):{fmt}}–{max(values):{fmt}})"


def paired_ratios(q: list[dict[str, Any]], b: list[dict[str, Any]], key: str) -> list[float]:
    """queue / baseline of the runs made back to back (same repetition)."""
    by_rep = {r["rep"]: r for r in b if r.get(key)}
    return [r[key] / by_rep[r["rep"]][key] for r in q if r.get(key) and r["rep"] in by_rep]


def runs_per_cell(rows: list[dict[str, Any]], *keys: str) -> str:
    """How many runs each table cell is the median of ("3", or "3-6" when it varies)."""
    from collections import Counter

    counts = Counter(tuple(r.get(k) for k in keys) for r in rows)
    low, high = min(counts.values()), max(counts.values())
    return str(low) if low == high else f"{low}-{high}"


def report(drains: list[dict[str, Any]], latencies: list[dict[str, Any]], args: argparse.Namespace) -> str:
    out: list[str] = []
    if drains:
        out.append(
            f"Drain of {args.messages:,} messages over {args.partitions} partitions, batch size {args.batch_size}, "
            f"no-op handler: median of {runs_per_cell(drains, 'impl', 'workers', 'mode')} runs (min–max); "
            "ratio = median django-sqlqueue / median "
            "hand-written SQL baseline (range of the ratios of runs made back to back)\n"
        )
        out.append("| workers | measure | django-sqlqueue msgs/s | baseline msgs/s | ratio |")
        out.append("|---:|---|---:|---:|---:|")
        measures = [
            ("warm", "msgs_per_s", "warm: workers running, N committed at once"),
            ("cold", "msgs_per_s_from_first_ack", "cold, from the first ack"),
            ("cold", "msgs_per_s", "cold, wall incl. start-up"),
        ]
        for k in args.workers:
            for mode, key, title in measures:
                if mode not in args.modes:
                    continue
                q = [r for r in drains if r["impl"] == "queue" and r["workers"] == k and r["mode"] == mode]
                b = [r for r in drains if r["impl"] == "baseline" and r["workers"] == k and r["mode"] == mode]
                if not q:
                    continue
                if not b:
                    out.append(f"| {k} | {title} | {median_of(q, key):,.0f}{spread(q, key)} | – | – |")
                    continue
                mq, mb = median_of(q, key), median_of(b, key)
                pairs = paired_ratios(q, b, key)
                pair_text = f" ({min(pairs):.2f}–{max(pairs):.2f})" if len(pairs) > 1 else ""
                out.append(
                    f"| {k} | {title} | {mq:,.0f}{spread(q, key)} | {mb:,.0f}{spread(b, key)} | "
                    f"{mq / mb:.2f}{pair_text} |"
                )
        out.append("")
    if latencies:
        out.append(
            f"End-to-end latency (publisher's time.time() before publish() to the handler), 2 consumer processes, "
            f"poll interval {args.poll_interval:g} s, {args.seconds:g} s of publish() over {args.partitions} "
            f"partitions: median of {runs_per_cell(latencies, 'impl', 'rate', 'publishers')} runs per statistic\n"
        )
        out.append(
            "| target rate | publisher threads | consumer | achieved publish rate | received / published | "
            "p50 ms | p95 ms | p99 ms (min–max) | max ms | p50 / p99 vs baseline | server commit p50 ms |"
        )
        out.append("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for rate, pubs in [(r, p) for r in args.rate for p in args.publishers]:
            by_impl = {
                impl: [r for r in latencies if r["rate"] == rate and r["publishers"] == pubs and r["impl"] == impl]
                for impl in ("queue", "baseline")
            }
            for impl, rows in by_impl.items():
                if not rows:
                    continue
                received = sum(r["received"] for r in rows)
                published = sum(r["published"] for r in rows)
                versus = ""
                base = by_impl["baseline"]
                if impl == "queue" and base:
                    versus = (
                        f"{median_of(rows, 'p50_ms') / median_of(base, 'p50_ms'):.2f} / "
                        f"{median_of(rows, 'p99_ms') / median_of(base, 'p99_ms'):.2f}"
                    )
                probes = [
                    {"p50": r[k]["p50_ms"]}
                    for r in rows
                    for k in ("commit_probe_before", "commit_probe_after")
                    if k in r
                ]
                title = "django-sqlqueue" if impl == "queue" else "hand-written SQL"
                out.append(
                    f"| {rate:,.0f}/s | {pubs} | {title} | {median_of(rows, 'achieved_rate'):,.0f}/s | "
                    f"{received:,}/{published:,} | {median_of(rows, 'p50_ms'):.1f} | {median_of(rows, 'p95_ms'):.1f} | "
                    f"{median_of(rows, 'p99_ms'):.1f}{spread(rows, 'p99_ms', '.1f')} | "
                    f"{median_of(rows, 'max_ms'):.1f} | "
                    f"{versus} | {median_of(probes, 'p50'):.2f} |"
                )
        out.append("")
    return "\n".join(out)


def csv_list(kind: type):  # type: ignore[no-untyped-def]
    return lambda text: [kind(v) for v in text.split(",") if v]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=50000, help="messages per drain run (default 50,000)")
    parser.add_argument("--partitions", type=int, default=8, help="partitions (default 8)")
    parser.add_argument("--workers", type=csv_list(int), default=[1, 2, 4], help="worker counts (default 1,2,4)")
    parser.add_argument("--batch-size", type=int, default=100, help="drain consumer batch size (default 100)")
    parser.add_argument("--modes", type=csv_list(str), default=["warm", "cold"], help="drain modes (warm,cold)")
    parser.add_argument("--rate", type=csv_list(float), default=[1000.0, 200.0], help="latency rates (1000,200)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of publishing per latency run")
    parser.add_argument(
        "--publishers", type=csv_list(int), default=[1], help="latency: publisher threads, e.g. 1,2 (default 1)"
    )
    parser.add_argument("--poll-interval", type=float, default=0.01, help="POLL_INTERVAL of the latency workers")
    parser.add_argument("--repeat", type=int, default=3, help="runs of every measurement (median reported)")
    parser.add_argument("--skip-drain", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-baseline", action="store_true", help="run only django-sqlqueue")
    parser.add_argument(
        "--conn-max-age", default="", help="CONN_MAX_AGE for the workers ('none' = persistent; default Django's 0)"
    )
    parser.add_argument("--json", type=Path, help="write the raw results here")
    parser.add_argument(
        "--report", type=Path, nargs="+", metavar="JSON", help="only print the tables of earlier --json files (merged)"
    )
    args = parser.parse_args()
    if args.report:
        drains, latencies = [], []
        for i, path in enumerate(args.report):
            data = json.loads(path.read_text())
            for r in data["drain"] + data["latency"]:
                r["rep"] = f"{i}-{r['rep']}"
            drains += data["drain"]
            latencies += data["latency"]
            print(f"{path}: engine {data.get('engine')}", file=sys.stderr)
        saved = json.loads(args.report[0].read_text())["args"]
        for key in ("messages", "partitions", "workers", "batch_size", "modes", "rate", "seconds", "poll_interval"):
            setattr(args, key, saved[key])
        args.publishers = saved.get("publishers", [1])
        for r in latencies:
            r.setdefault("impl", "queue")
        print(report(drains, latencies, args))
        return
    args.worker_env = {"BENCH_CONN_MAX_AGE": args.conn_max_age} if args.conn_max_age else {}

    def on_signal(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    RESULTS.mkdir(parents=True, exist_ok=True)
    os.environ["BENCH_PARTITIONS"] = str(args.partitions)  # bench/settings.py: SQLQUEUE["TOPICS"], workers inherit it
    setup_django()
    procs = Procs()
    drains: list[dict[str, Any]] = []
    latencies: list[dict[str, Any]] = []
    started = time.time()
    fingerprint = engine_fingerprint()
    print(f"engine under test: {fingerprint}", flush=True)
    try:
        impls = ["queue"] if args.skip_baseline else ["queue", "baseline"]
        if not args.skip_drain:
            for mode in args.modes:
                print(f"drain, {mode}:", flush=True)
                for rep in range(1, args.repeat + 1):
                    for k in args.workers:
                        for impl in impls if rep % 2 else impls[::-1]:
                            drains.append(drain_run(impl, k, mode, rep, args, procs))
        if not args.skip_latency:
            print("latency:", flush=True)
            for rep in range(1, args.repeat + 1):
                for rate in args.rate:
                    for pubs in args.publishers:
                        for impl in impls if rep % 2 else impls[::-1]:
                            latencies.append(latency_run(impl, rate, pubs, rep, args, procs))
    finally:
        procs.stop_all()
        fingerprint_end = engine_fingerprint()
        if fingerprint_end != fingerprint:
            print(f"WARNING: the engine changed on disk during the run: {fingerprint} -> {fingerprint_end}")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(
                json.dumps(
                    {
                        "started": started,
                        "engine": fingerprint,
                        "engine_at_end": fingerprint_end,
                        "args": {k: v for k, v in vars(args).items() if k != "json"},
                        "drain": drains,
                        "latency": latencies,
                    },
                    indent=2,
                    default=str,
                )
            )
    print()
    print(report(drains, latencies, args))


if __name__ == "__main__":
    main()
