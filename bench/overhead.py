"""Overhead of monitoring: publish and drain with metrics and tracing on, next to both off.

Run: ``.venv/bin/python bench/overhead.py [--single 3000] [--batched 20000] [--messages 30000]
[--workers 2] [--repeat 3] [--json FILE]`` (needs the ``prometheus`` and ``otel`` extras and
``opentelemetry-sdk``).

Issue 15's aim: publish and drain with metrics and tracing enabled >= 0.95x disabled, run side
by side in one run.

- **publish** (this process, interleaved in blocks as ``bench/publish.py`` does): ``publish()``
  one message per transaction, and ``publish_many()`` of 1,000, each *plain* (no span active:
  what a project without tracing gets) and *traced* (an OpenTelemetry SDK tracer provider
  with a ``BatchSpanProcessor``, each call inside an active span, as in a traced view: the
  trace context is injected into every message and a ``send`` span recorded). The traced side
  also pays for its own enclosing span, so the ratio overstates the queue's share.
- **drain** (``bench/consume.py``'s warm drain, K real ``runconsumer`` processes): *plain*
  workers, and *instrumented* ones started with ``--metrics-port`` and ``BENCH_OTEL=1``
  (``bench/settings.py`` installs the same SDK provider, so every handler call runs in a
  ``process`` span linked to its producer's context, which the messages carry because they
  were published inside a span). Rounds alternate the order.

Spans go to an exporter that counts and drops them (``bench/otel_setup.py``): the cost
measured is the instrumentation's, not a collector's network.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

from bench import consume  # noqa: E402
from bench.common import setup_django, truncate_queue  # noqa: E402

TOPIC = "bench"
PAYLOAD = {"order_id": 12345, "customer": "alice", "total": "19.90", "lines": [{"sku": "A-1", "qty": 2}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class InstrumentedProcs(consume.Procs):
    """Workers started with ``--metrics-port`` and ``BENCH_OTEL=1`` when ``instrumented``."""

    instrumented = False

    def worker(self, name: str, topic: str, **extra_env: str) -> consume.Proc:
        if not self.instrumented:
            return super().worker(name, topic, **extra_env)
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "DATABASE_URL": consume.BENCH_URL,
            "PYTHONUNBUFFERED": "1",
            "BENCH_OTEL": "1",
            **extra_env,
        }
        argv = [
            consume.PYTHON, "manage.py", "runconsumer", "--group", consume.GROUP, "--topic", topic, "--name", name,
            "--metrics-port", str(free_port()), "--metrics-addr", "127.0.0.1",
        ]  # fmt: skip
        return self._spawn(name, argv, env)


def publish_side(args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved blocks of plain and traced publishes; msgs/s per repetition."""
    from opentelemetry import trace

    from bench.otel_setup import install
    from django_sqlqueue import publish, publish_many

    exporter = install()
    tracer = trace.get_tracer("bench.overhead")

    def single(n: int, traced: bool) -> None:
        for _ in range(n):
            if traced:
                with tracer.start_as_current_span("view"):
                    publish(TOPIC, PAYLOAD)
            else:
                publish(TOPIC, PAYLOAD)

    def batched(n: int, traced: bool) -> None:
        for _ in range(0, n, 1000):
            rows = [{"payload": PAYLOAD} for _ in range(1000)]
            if traced:
                with tracer.start_as_current_span("view"):
                    publish_many(TOPIC, rows)
            else:
                publish_many(TOPIC, rows)

    publish(TOPIC, PAYLOAD)  # warm-up
    truncate_queue()
    runs: dict[str, list[float]] = {}
    for _rep in range(args.repeat):
        for shape, fn, total, block in (
            ("publish()", single, args.single, 100),
            ("publish_many() of 1,000", batched, args.batched, 1000),
        ):
            spent = {False: 0.0, True: 0.0}
            done = 0
            while done < total:
                step = min(block, total - done)
                order = (False, True) if (done // block) % 2 == 0 else (True, False)
                for traced in order:
                    start = time.perf_counter()
                    fn(step, traced)
                    spent[traced] += time.perf_counter() - start
                done += step
            runs.setdefault(f"{shape} plain", []).append(total / spent[False])
            runs.setdefault(f"{shape} traced", []).append(total / spent[True])
            truncate_queue()
    exporter.flush()
    return {"runs": runs, "spans_exported": exporter.count}


def drain_side(args: argparse.Namespace) -> dict[str, list[float]]:
    """Warm drains of plain and instrumented workers, alternating; msgs/s per round."""
    from opentelemetry import trace

    procs = InstrumentedProcs()
    ns = argparse.Namespace(messages=args.messages, partitions=8, batch_size=100, worker_env={})
    runs: dict[str, list[float]] = {"plain": [], "instrumented": []}
    tracer = trace.get_tracer("bench.overhead")
    original = consume.publish_drain

    def publish_in_a_span(*a: Any, **kw: Any) -> float:
        # The drained messages carry a trace context, as messages published by traced views do.
        with tracer.start_as_current_span("publisher"):
            return original(*a, **kw)

    consume.publish_drain = publish_in_a_span
    try:
        for rep in range(1, args.repeat + 1):
            for instrumented in (False, True) if rep % 2 else (True, False):
                procs.instrumented = instrumented
                result = consume.drain_run("queue", args.workers, "warm", rep, ns, procs)
                runs["instrumented" if instrumented else "plain"].append(result["msgs_per_s"])
    finally:
        consume.publish_drain = original
        procs.stop_all()
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--single", type=int, default=3000, help="publish() calls per repetition and side")
    parser.add_argument("--batched", type=int, default=20000, help="messages published with publish_many()")
    parser.add_argument("--messages", type=int, default=30000, help="messages per drain run")
    parser.add_argument("--workers", type=int, default=2, help="runconsumer processes per drain run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-drain", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ["BENCH_PARTITIONS"] = "8"
    setup_django()
    pub = publish_side(args)
    drains = {} if args.skip_drain else drain_side(args)
    rows: list[tuple[str, list[float], list[float]]] = []
    for shape in ("publish()", "publish_many() of 1,000"):
        rows.append((shape, pub["runs"][f"{shape} plain"], pub["runs"][f"{shape} traced"]))
    if drains:
        rows.append(
            (f"drain, {args.workers} workers (warm, {args.messages:,} msgs)", drains["plain"], drains["instrumented"])
        )
    print(f"\nspans exported by the publishing process: {pub['spans_exported']:,}")
    print(f"| what | off msgs/s (median of {args.repeat}) | on msgs/s | on / off (paired range) | aim |")
    print("|---|---:|---:|---:|---|")
    table = []
    for what, off, on in rows:
        ratio = statistics.median(on) / statistics.median(off)
        pairs = [b / a for a, b in zip(off, on, strict=True)]
        met = "met" if ratio >= 0.95 else "missed"
        print(
            f"| {what} | {statistics.median(off):,.0f} | {statistics.median(on):,.0f} | {ratio:.2f} "
            f"({min(pairs):.2f}–{max(pairs):.2f}) | >= 0.95: {met} |"
        )
        table.append({"what": what, "off": off, "on": on, "ratio": ratio})
    if args.json:
        args.json.write_text(json.dumps({"rows": table, "spans_exported": pub["spans_exported"]}, indent=2))


if __name__ == "__main__":
    main()
