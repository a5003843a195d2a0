"""Overhead of monitoring: publish and drain with metrics and tracing on, next to both off.

Run: ``.venv/bin/python bench/overhead.py [--single 3000] [--batched 20000] [--messages 30000]
[--workers 2] [--repeat 3] [--json FILE]`` (needs the ``prometheus`` and ``otel`` extras and
``opentelemetry-sdk``).

Issue 15's aim: publish and drain with metrics and tracing enabled >= 0.95x disabled, run side
by side in one run.

- **publish** (this process, interleaved in blocks as ``bench/publish.py`` does, the order
  rotating): ``publish()`` one message per transaction, and ``publish_many()`` of 1,000,
  *off* (no span active: what a project without tracing gets), *traced* (an OpenTelemetry SDK
  tracer provider with a ``BatchSpanProcessor``, each call inside an active request span, as
  in a traced view: the trace context is injected into every message and a ``send`` span
  recorded) and *traced, 10% sampled* (the request spans sampled 1 in 10, the send spans
  following them). The traced sides also pay for their own request span, so the ratio
  overstates the queue's share.
- **drain** (``bench/consume.py``'s warm drain, K real ``runconsumer`` processes, no-op
  handler, the order rotating per round): *off*; *metrics* (``--metrics-port``);
  *metrics + tracing* (also ``BENCH_OTEL=1``: ``bench/settings.py`` installs the same SDK
  provider, so every handler call runs in a ``process`` span linked to its producer's context,
  which the messages carry because they were published inside a span); and the same sampled
  ``ParentBased(TraceIdRatioBased(0.1))``.

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


#: publish variants: (name, sample ratio of the request span around each call, None: no span).
VARIANTS = (("off", None), ("traced", 1.0), ("traced, 10% sampled", 0.1))
#: drain variants: (name, --metrics-port, sample ratio of the worker's tracer provider or None).
DRAIN_VARIANTS = (
    ("off", False, None),
    ("metrics", True, None),
    ("metrics + tracing", True, 1.0),
    ("metrics + tracing, 10% sampled", True, 0.1),
)


class InstrumentedProcs(consume.Procs):
    """Workers with ``--metrics-port`` when ``metrics``, ``BENCH_OTEL=1`` when ``ratio`` is set."""

    metrics = False
    ratio: float | None = None

    def worker(self, name: str, topic: str, **extra_env: str) -> consume.Proc:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "DATABASE_URL": consume.BENCH_URL,
            "PYTHONUNBUFFERED": "1",
            **extra_env,
        }
        if self.ratio is not None:
            env.update(BENCH_OTEL="1", BENCH_OTEL_RATIO=str(self.ratio))
        argv = [consume.PYTHON, "manage.py", "runconsumer", "--group", consume.GROUP, "--topic", topic, "--name", name]
        if self.metrics:
            argv += ["--metrics-port", str(free_port()), "--metrics-addr", "127.0.0.1"]
        return self._spawn(name, argv, env)


def publish_side(args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved blocks of each variant's publishes; msgs/s per repetition."""
    from opentelemetry import trace

    from bench.otel_setup import install, sampled_tracer
    from django_sqlqueue import publish, publish_many

    exporter = install()
    # The request span a traced view runs in: always sampled, or sampled 1 time in 10.
    tracers = {1.0: trace.get_tracer("bench.overhead"), 0.1: sampled_tracer(0.1)}

    def single(n: int, ratio: float | None) -> None:
        for _ in range(n):
            if ratio is None:
                publish(TOPIC, PAYLOAD)
            else:
                with tracers[ratio].start_as_current_span("view"):
                    publish(TOPIC, PAYLOAD)

    def batched(n: int, ratio: float | None) -> None:
        for _ in range(0, n, 1000):
            rows = [{"payload": PAYLOAD} for _ in range(1000)]
            if ratio is None:
                publish_many(TOPIC, rows)
            else:
                with tracers[ratio].start_as_current_span("view"):
                    publish_many(TOPIC, rows)

    publish(TOPIC, PAYLOAD)  # warm-up
    truncate_queue()
    runs: dict[str, list[float]] = {}
    for _rep in range(args.repeat):
        for shape, fn, total, block in (
            ("publish()", single, args.single, 100),
            ("publish_many() of 1,000", batched, args.batched, 1000),
        ):
            spent = {name: 0.0 for name, _ in VARIANTS}
            done = 0
            while done < total:
                step = min(block, total - done)
                turn = (done // block) % len(VARIANTS)
                for name, ratio in VARIANTS[turn:] + VARIANTS[:turn]:  # rotate who goes first
                    start = time.perf_counter()
                    fn(step, ratio)
                    spent[name] += time.perf_counter() - start
                done += step
            for name, _ in VARIANTS:
                runs.setdefault(f"{shape} {name}", []).append(total / spent[name])
            truncate_queue()
    exporter.flush()
    return {"runs": runs, "spans_exported": exporter.count}


def drain_side(args: argparse.Namespace) -> dict[str, list[float]]:
    """Warm drains of plain and instrumented workers, rotating the order; msgs/s per round."""
    from opentelemetry import trace

    procs = InstrumentedProcs()
    ns = argparse.Namespace(messages=args.messages, partitions=8, batch_size=100, worker_env={})
    runs: dict[str, list[float]] = {name: [] for name, _, _ in DRAIN_VARIANTS}
    tracer = trace.get_tracer("bench.overhead")
    original = consume.publish_drain

    def publish_in_a_span(*a: Any, **kw: Any) -> float:
        # The drained messages carry a trace context, as messages published by traced views do.
        with tracer.start_as_current_span("publisher"):
            return original(*a, **kw)

    consume.publish_drain = publish_in_a_span
    try:
        for rep in range(1, args.repeat + 1):
            turn = rep % len(DRAIN_VARIANTS)
            for name, metrics, ratio in DRAIN_VARIANTS[turn:] + DRAIN_VARIANTS[:turn]:
                procs.metrics, procs.ratio = metrics, ratio
                result = consume.drain_run("queue", args.workers, "warm", rep, ns, procs)
                runs[name].append(result["msgs_per_s"])
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
    groups: list[tuple[str, dict[str, list[float]]]] = []
    for shape in ("publish()", "publish_many() of 1,000"):
        groups.append((shape, {name: pub["runs"][f"{shape} {name}"] for name, _ in VARIANTS}))
    if drains:
        groups.append((f"drain, {args.workers} workers (warm, {args.messages:,} msgs)", drains))
    print(f"\nspans exported by the publishing process: {pub['spans_exported']:,}")
    print(f"| what | variant | msgs/s (median of {args.repeat}) | / off (paired range) | aim >= 0.95 |")
    print("|---|---|---:|---:|---|")
    table = []
    for what, by_variant in groups:
        off = by_variant["off"]
        for name, on in by_variant.items():
            ratio = statistics.median(on) / statistics.median(off)
            pairs = [b / a for a, b in zip(off, on, strict=True)]
            met = "" if name == "off" else ("met" if ratio >= 0.95 else "missed")
            print(
                f"| {what} | {name} | {statistics.median(on):,.0f} | {ratio:.2f} "
                f"({min(pairs):.2f}–{max(pairs):.2f}) | {met} |"
            )
            table.append({"what": what, "variant": name, "runs": on, "ratio": ratio})
    if args.json:
        args.json.write_text(json.dumps({"rows": table, "spans_exported": pub["spans_exported"]}, indent=2))


if __name__ == "__main__":
    main()
