"""The issue-14 case, side by side: one handler that never returns must not stall the queue.

Two ``runconsumer`` workers, one topic of 8 partitions, one message whose handler hangs
forever (``{"hang": true}``: an HTTP call without a timeout) and 200 ordinary messages on
other keys; the consumer's visibility timeout 3 s, ``LEASE_DURATION`` 3 s
(``bench/hung_support/sqlqueue_hungbench``). Measured from the workers' spawn: seconds until
all 200 are handled (or how many were after ``--seconds``), and whether the hung message
reached the dead-letter topic.

    .venv/bin/python bench/hung.py --old /tmp/sqlqueue-4cc22b8 --rounds 3 [--seconds 60] [--json FILE]

``--old`` is another checkout (``git archive <commit> | tar -x -C DIR``): rounds alternate
this checkout's workers and the old one's, against a fresh database each time (the schema
of both must be the same: migrations are applied from this checkout). The workers are
killed (SIGKILL) after each run: a worker of an engine without handler timeouts cannot
drain a hung handler.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("BENCH_DATABASE_URL", "mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue_bench_hung")

from bench.common import BENCH_URL, ROOT, key_for_partition, setup_django, truncate_queue

SUPPORT = ROOT / "bench" / "hung_support"
OTHERS = 200


def run_once(root: Path, seconds: float) -> dict[str, object]:
    """One run with the workers of the checkout at ``root``; returns its figures."""
    from django_sqlqueue import publish, publish_many
    from django_sqlqueue.models import Message

    truncate_queue()
    Message.objects.filter(topic="bench.hung_dlq").delete()
    hung = publish("bench.hung", {"hang": True}, key=key_for_partition(0, 8))
    others = publish_many("bench.hung", [{"payload": {"i": i}, "key": f"key-{i}"} for i in range(OTHERS)])
    ids = {m.id for m in others}
    out = Path(tempfile.mkdtemp(prefix="bench-hung-"))
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "sqlqueue_hungbench.settings",
        "PYTHONPATH": f"{SUPPORT}{os.pathsep}{root}",
        "DATABASE_URL": BENCH_URL,
        "BENCH_HUNG_DIR": str(out),
    }
    command = [sys.executable, "manage.py", "runconsumer", "--group", "hung", "--topic", "bench.hung"]
    spawned = time.monotonic()
    workers = [
        subprocess.Popen(
            [*command, "--name", name], cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for name in ("hung-a", "hung-b")
    ]
    all_done: float | None = None
    handled = 0
    try:
        while time.monotonic() - spawned < seconds:
            seen: set[str] = set()
            for path in out.glob("hung-*.txt"):
                seen.update(path.read_text().split())
            handled = len(seen & ids)
            if handled == OTHERS and all_done is None:
                all_done = time.monotonic() - spawned
            dead = Message.objects.filter(topic="bench.hung_dlq", id=f"hung:{hung.id}").exists()
            if all_done is not None and dead:
                break
            time.sleep(0.1)
        dead_lettered = Message.objects.filter(topic="bench.hung_dlq", id=f"hung:{hung.id}").exists()
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
    return {
        "all_200_handled_s": None if all_done is None else round(all_done, 2),
        "handled": handled,
        "hung_dead_lettered": dead_lettered,
        "watched_s": round(time.monotonic() - spawned, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, help="another checkout to run side by side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to watch each run")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    setup_django()
    checkouts = {"new": ROOT} | ({"old": args.old.resolve()} if args.old else {})
    runs: dict[str, list[dict[str, object]]] = {name: [] for name in checkouts}
    for round_ in range(args.rounds):
        order = list(checkouts) if round_ % 2 == 0 else list(reversed(checkouts))
        for name in order:
            result = run_once(checkouts[name], args.seconds)
            runs[name].append(result)
            print(f"round {round_ + 1} {name}: {result}", flush=True)
    print("\ncheckout | all 200 handled (median s) | handled at the end (median) | hung one dead-lettered")
    for name, results in runs.items():
        times = [r["all_200_handled_s"] for r in results if r["all_200_handled_s"] is not None]
        median = f"{statistics.median(times):.1f}" if len(times) == len(results) else f"never in {args.seconds:g}s"
        handled = statistics.median(int(r["handled"]) for r in results)  # type: ignore[call-overload]
        dlq = sum(bool(r["hung_dead_lettered"]) for r in results)
        print(f"{name} ({checkouts[name]}) | {median} | {handled:g}/{OTHERS} | {dlq}/{len(results)}")
    if args.json:
        args.json.write_text(
            json.dumps({"checkouts": {k: str(v) for k, v in checkouts.items()}, "runs": runs}, indent=2)
        )


if __name__ == "__main__":
    main()
