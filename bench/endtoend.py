"""End to end, new engine next to today's: publish one message per transaction, then drain.

Run: ``/work/main/.venv/bin/python bench/endtoend.py [--messages 50000] [--workers 2] [--repeat 3]
[--old-root /tmp/bench7-old] [--latency] [--json FILE]``.

Issue 7 moves work from the publisher (no head-row lock, no offset) to the consumer side
(the workers' polls sequence what committed), so it is judged end to end. For each engine,
interleaved within one run (the order alternates between repetitions), in a child process
running that engine's checkout (``--old-root`` for today's engine, e.g. an archive of commit
5e0402c: ``git archive 5e0402c | tar -x -C /tmp/bench7-old``):

1. **publish**: N messages to ``bench.drain``, one ``publish()`` per transaction (Django
   autocommit), keys round-robin over 8 partitions (new engine: keys hashing to partitions
   0..7; old engine: partition keys ``p0``..``p7``), no worker running;
2. **drain**: start K ``manage.py runconsumer --group bench --topic bench.drain`` workers of that
   checkout (``DJANGO_SETTINGS_MODULE=bench.settings``: batch size 100, poll 10 ms, the no-op
   consumer of ``bench/benchapp``) and poll every 20 ms until done: every message acked
   (the sum of the watermarks equals N; new engine: and no message is left without an
   offset, i.e. the drain includes sequencing). ``drain wall`` counts from the spawn of the
   workers (Python + Django start-up, the first lease round), ``from first ack`` from the
   first poll that saw an ack.

Reported: publish seconds, drain seconds, total, and the new/old ratios (for throughput:
old time / new time, so > 1 means the new engine is faster).

With ``--latency``, also the end-to-end latency at 1,000 msgs/s with a 10 ms poll: each
checkout's own ``bench/consume.py --skip-drain --skip-baseline --rate 1000 --repeat 1``,
``--publishers 2`` (one thread cannot sustain 1,000 publish()/s on a loaded host), alternated,
``--repeat`` times each, p50/p99 medians.

Databases: ``BENCH_DATABASE_URL`` (default ``sqlqueue_bench7``) for the new engine,
``BENCH_OLD_DATABASE_URL`` (default ``sqlqueue_bench_old``) for the old one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
NEW_ROOT = HERE.parent
NEW_URL = os.environ.get("BENCH_DATABASE_URL", "mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue_bench7")
OLD_URL = os.environ.get("BENCH_OLD_DATABASE_URL", "mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue_bench_old")
TOPIC = "bench.drain"
GROUP = "bench"
PARTITIONS = 8
PAYLOAD = {"customer": "alice", "total": "19.90", "lines": [{"sku": "A-1", "qty": 2}]}
STOPPED_RE = re.compile(r"worker stopped subscriber=(\S+) delivered=(\d+) acked=(\d+)")
LOGS = NEW_ROOT / "bench" / "results" / "logs"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# -- child: one engine's checkout -------------------------------------------------------------


def child_setup(root: Path, url: str, create: bool) -> None:
    sys.path.insert(0, str(root))
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ["BENCH_PARTITIONS"] = str(PARTITIONS)
    import environ
    import MySQLdb

    if create:
        cfg = environ.Env.db_url_config(url)
        server = MySQLdb.connect(
            host=cfg["HOST"], port=int(cfg["PORT"] or 3306), user=cfg["USER"], password=cfg["PASSWORD"]
        )
        server.cursor().execute(f"DROP DATABASE IF EXISTS `{cfg['NAME']}`")
        server.cursor().execute(f"CREATE DATABASE `{cfg['NAME']}` CHARACTER SET utf8mb4")
        server.close()
    import django

    django.setup()
    from django.apps import apps
    from django.db import connection

    if create:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        for model in apps.get_app_config("django_sqlqueue").get_models():
            if model._meta.managed:  # the console's placeholder has no table
                cursor.execute(f"TRUNCATE TABLE {model._meta.db_table}")


def has_sequencer(root: Path) -> bool:
    """Whether the checkout at ``root`` is the engine with a sequencer (``publish(key=...)``).

    The "old" side (``--old-root``) may be either engine: before issue 7, or an earlier
    commit of this one for a before/after comparison.
    """
    return (root / "django_sqlqueue" / "sequencer.py").exists()


def progress(engine: str) -> tuple[int, int, int]:
    """(sum of heads, sum of the group's watermarks, messages without an offset)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT COALESCE(SUM(head_offset), 0) FROM queue_partitions WHERE topic = %s", [TOPIC])
        heads = int(cursor.fetchone()[0])
        cursor.execute(
            "SELECT COALESCE(SUM(offset_acked), 0) FROM queue_offsets WHERE consumer_group = %s AND topic = %s",
            [GROUP, TOPIC],
        )
        acked = int(cursor.fetchone()[0])
        waiting = 0
        if engine == "sequenced":
            # NULL offsets sort first in the (topic, partition, offset) index: one short range per partition.
            cursor.execute(
                "SELECT COUNT(*) FROM queue_messages WHERE topic = %s AND `partition` IN "
                f"({', '.join(map(str, range(PARTITIONS)))}) AND `offset` IS NULL",
                [TOPIC],
            )
            waiting = int(cursor.fetchone()[0])
    return heads, acked, waiting


def child_run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(args.root)
    child_setup(root, args.url, args.create)

    from django_sqlqueue import publish

    if has_sequencer(root):
        import zlib

        keys = []
        for p in range(PARTITIONS):
            i = 0
            while zlib.crc32(f"k{i}".encode()) % PARTITIONS != p:
                i += 1
            keys.append(f"k{i}")

        def send(i: int) -> None:
            publish(TOPIC, {**PAYLOAD, "i": i}, key=keys[i % PARTITIONS])

    else:

        def send(i: int) -> None:
            publish(TOPIC, {**PAYLOAD, "i": i}, partition_key=f"p{i % PARTITIONS}")

    n = args.messages
    load0 = load_average()
    t0 = time.perf_counter()
    for i in range(n):
        send(i)
    publish_s = time.perf_counter() - t0

    LOGS.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "DATABASE_URL": args.url,
        "PYTHONUNBUFFERED": "1",
        "BENCH_PARTITIONS": str(PARTITIONS),
    }
    procs = []
    t_spawn = time.perf_counter()
    for w in range(args.workers):
        log = LOGS / f"e2e-{args.engine}-r{args.rep}-w{w}.log"
        with open(log, "w") as out:
            argv = [
                sys.executable, "manage.py", "runconsumer", "--group", GROUP, "--topic", TOPIC,
                "--name", f"e2e-{args.engine}-r{args.rep}-w{w}",
            ]  # fmt: skip
            procs.append((subprocess.Popen(argv, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT), log))
    t_first = None
    acked_first = 0
    try:
        deadline = time.monotonic() + 600
        while True:
            heads, acked, waiting = progress("sequenced" if has_sequencer(root) else "plain")
            now = time.perf_counter()
            if t_first is None and acked > 0:
                t_first, acked_first = now, acked
            if acked == n and heads == n and waiting == 0:
                t_done = now
                break
            for p, log in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"worker exited {p.returncode}: {log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"not drained: heads {heads} acked {acked} waiting {waiting}")
            time.sleep(0.02)
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p, _ in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    counts = []
    for _, log in procs:
        m = STOPPED_RE.search(log.read_text(errors="replace"))
        counts.append(int(m.group(3)) if m else None)
    assert t_first is not None
    drain_s = t_done - t_spawn
    return {
        "engine": args.engine,
        "rep": args.rep,
        "messages": n,
        "publish_s": publish_s,
        "publish_per_s": n / publish_s,
        "drain_s": drain_s,
        "drain_per_s": n / drain_s,
        "first_ack_after_s": t_first - t_spawn,
        "drain_from_first_ack_per_s": (n - acked_first) / (t_done - t_first) if t_done > t_first else None,
        "total_s": publish_s + drain_s,
        "per_worker_acked": counts,
        "load_before": load0,
        "load_after": load_average(),
    }


# -- driver -------------------------------------------------------------------------------------


def run_child(engine: str, rep: int, create: bool, args: argparse.Namespace) -> dict[str, Any]:
    root = args.old_root if engine == "old" else NEW_ROOT
    url = OLD_URL if engine == "old" else NEW_URL
    argv = [
        sys.executable, str(Path(__file__).resolve()), "--child", "--engine", engine, "--root", str(root),
        "--url", url, "--messages", str(args.messages), "--workers", str(args.workers), "--rep", str(rep),
    ]  # fmt: skip
    if create:
        argv.append("--create")
    proc = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=1800, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(
            f"{engine} rep {rep} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        )
    return json.loads(lines[-1][len("RESULT ") :])


def run_latency(engine: str, rep: int, args: argparse.Namespace) -> dict[str, Any]:
    """One run of the checkout's own bench/consume.py latency benchmark (1,000 msgs/s, 10 ms poll)."""
    root = args.old_root if engine == "old" else NEW_ROOT
    url = OLD_URL if engine == "old" else NEW_URL
    out = NEW_ROOT / "bench" / "results" / f"e2e-latency-{engine}-{rep}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable, "bench/consume.py", "--skip-drain", "--skip-baseline", "--rate", "1000",
        "--seconds", str(args.latency_seconds), "--poll-interval", "0.01", "--repeat", "1", "--json", str(out),
        "--publishers", str(args.latency_publishers),
    ]  # fmt: skip
    load = load_average()
    proc = subprocess.run(
        argv,
        cwd=root,
        env={**os.environ, "BENCH_DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode:
        raise RuntimeError(f"latency {engine} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    row = json.loads(out.read_text())["latency"][0]
    row.update(engine=engine, rep=rep, load_before=load)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=50000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--old-root", type=Path, default=Path("/tmp/bench7-old"))
    parser.add_argument("--engines", default="new,old")
    parser.add_argument("--skip-drain", action="store_true")
    parser.add_argument("--latency", action="store_true", help="also run the 1,000 msgs/s latency benchmark")
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument(
        "--latency-publishers", type=int, default=2, help="publisher threads (one cannot reach 1,000/s on a busy host)"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--rep", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--create", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child_run(args)))
        return

    engines = [e for e in args.engines.split(",") if e]
    rows: list[dict[str, Any]] = []
    lat: list[dict[str, Any]] = []
    load_start = load_average()
    if not args.skip_drain:
        for rep in range(1, args.repeat + 1):
            for engine in engines if rep % 2 else engines[::-1]:
                r = run_child(engine, rep, rep == 1, args)
                rows.append(r)
                print(
                    f"  rep {rep} {engine}: publish {r['publish_s']:.1f}s ({r['publish_per_s']:,.0f}/s), drain "
                    f"{r['drain_s']:.1f}s ({r['drain_per_s']:,.0f}/s wall, "
                    f"{r['drain_from_first_ack_per_s'] or 0:,.0f}/s "
                    f"from first ack at +{r['first_ack_after_s']:.2f}s), total {r['total_s']:.1f}s; per worker "
                    f"{r['per_worker_acked']}; load {r['load_before'][0]}",
                    flush=True,
                )
    if args.latency:
        for rep in range(1, args.repeat + 1):
            for engine in engines if rep % 2 else engines[::-1]:
                r = run_latency(engine, rep, args)
                lat.append(r)
                print(
                    f"  latency rep {rep} {engine}: p50 {r['p50_ms']} p99 {r['p99_ms']} max {r['max_ms']} ms, "
                    f"received {r['received']}/{r['published']}, achieved {r['achieved_rate']}/s; "
                    f"load {r['load_before'][0]}",
                    flush=True,
                )
    load_end = load_average()
    print()
    print(report(rows, lat, args, load_start, load_end))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"drain": rows, "latency": lat, "load": [load_start, load_end]}, indent=2))


def report(
    rows: list[dict[str, Any]], lat: list[dict[str, Any]], args: argparse.Namespace, load_start: Any, load_end: Any
) -> str:
    def med(engine: str, key: str, source: list[dict[str, Any]]) -> float:
        values = [r[key] for r in source if r["engine"] == engine and r.get(key) is not None]
        return statistics.median(values) if values else float("nan")

    def rng(engine: str, key: str, source: list[dict[str, Any]], fmt: str) -> str:
        values = [r[key] for r in source if r["engine"] == engine and r.get(key) is not None]
        return f" ({min(values):{fmt}}–{max(values):{fmt}})" if len(values) > 1 else ""

    out = [f"load average (1/5/15 min): {load_start} at start, {load_end} at end"]
    if rows:
        out += [
            (
                f"\n{args.messages:,} messages published one per transaction, then drained by {args.workers} "
                f"workers; median of {args.repeat} runs per engine (min–max)\n"
            ),
            "| measure | new engine | old engine (today) | new vs old | aim |",
            "|---|---:|---:|---:|---|",
        ]
        for key, title, _better, aim in (
            ("publish_s", "publish, seconds", "lower", None),
            ("drain_s", "drain incl. worker start-up, seconds", "lower", None),
            ("total_s", "publish + drain, seconds", "lower", "less total time than old"),
        ):
            new, old = med("new", key, rows), med("old", key, rows)
            verdict = ""
            if aim:
                verdict = f"{aim}: {'met' if new < old else 'missed'}"
            out.append(
                f"| {title} | {new:.1f}{rng('new', key, rows, '.1f')} | {old:.1f}{rng('old', key, rows, '.1f')} | "
                f"{old / new:.2f}x faster | {verdict} |"
            )
        for key, title, aim in (
            ("publish_per_s", "publish, msgs/s", None),
            ("drain_per_s", "drain msgs/s, wall from worker spawn (sequencing included)", 0.8),
            ("drain_from_first_ack_per_s", "drain msgs/s, from the first ack (sequencing included)", 0.8),
        ):
            new, old = med("new", key, rows), med("old", key, rows)
            verdict = f">= {aim}x old: {'met' if new / old >= aim else 'missed'}" if aim else ""
            out.append(
                f"| {title} | {new:,.0f}{rng('new', key, rows, ',.0f')} | {old:,.0f}{rng('old', key, rows, ',.0f')} | "
                f"{new / old:.2f}x | {verdict} |"
            )
    if lat:
        out += [
            (
                f"\nPublish -> handler latency at 1,000 msgs/s for {args.latency_seconds:g} s, 10 ms poll, 2 workers: "
                f"median of {args.repeat} runs per engine (min–max)\n"
            ),
            "| engine | achieved rate | received/published | p50 ms | p99 ms | max ms | aim p99 <= 50 ms |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for engine, title in (("new", "new engine"), ("old", "old engine (today)")):
            mine = [r for r in lat if r["engine"] == engine]
            if not mine:
                continue
            p99 = med(engine, "p99_ms", lat)
            out.append(
                f"| {title} | {med(engine, 'achieved_rate', lat):,.0f}/s | {sum(r['received'] for r in mine):,}/"
                f"{sum(r['published'] for r in mine):,} | {med(engine, 'p50_ms', lat):.1f} | {p99:.1f}"
                f"{rng(engine, 'p99_ms', lat, '.1f')} | {med(engine, 'max_ms', lat):.1f} | "
                f"{('met' if p99 <= 50 else 'missed') if engine == 'new' else '(reference)'} |"
            )
    return "\n".join(out)


if __name__ == "__main__":
    main()
