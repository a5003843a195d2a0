"""Where a worker's poll spends its time: one in-process Worker, each step timed.

Run: ``.venv/bin/python bench/profile_poll.py [--conn-max-age none] [--count-calls] [--root DIR]``.

``--count-calls`` also counts the Python function calls made inside ``poll()`` (a
``sys.setprofile`` hook; the times are then inflated, the counts are exact and do not
depend on the machine's load): the Python work per message, comparable between two
checkouts. ``--root DIR`` runs another checkout's engine (e.g. ``git archive`` of an older
commit) with this script.

Drives ``Worker.poll()`` directly (no sleeps, no subprocess) against the bench database and
times every store call, the sequencer (messages are published without offsets), the handlers
and the worker's connection check (``tidy_connections()``, ``close_old_connections()`` before
aa0e32f: called once per loop and after every handler), and counts new database connections. Two shapes:

- ``drain``: 20,000 messages already published over 8 partitions, batch size 100: polls of
  800 messages;
- ``trickle``: before every poll, publish 4 messages to 4 of the 8 partitions (what a worker
  sees at ~1,000 msgs/s with 2 workers polling every 10 ms, roughly).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if "--root" in sys.argv:  # another checkout's engine (and its bench.common and settings)
    ROOT = Path(sys.argv[sys.argv.index("--root") + 1]).resolve()
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
from bench.common import partition_keys, setup_django, truncate_queue  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conn-max-age", default="", help="'none' for persistent connections (default Django's 0)")
    parser.add_argument("--polls", type=int, default=300, help="trickle polls")
    parser.add_argument("--count-calls", action="store_true", help="count Python calls inside poll()")
    parser.add_argument("--root", type=Path, help="run the engine of another checkout")
    args = parser.parse_args()
    if args.conn_max_age:
        os.environ["BENCH_CONN_MAX_AGE"] = args.conn_max_age
    setup_django()

    from django.db.backends.signals import connection_created

    import django_sqlqueue.worker.loop as worker_module
    from django_sqlqueue import publish_many
    from django_sqlqueue.consumers import load_consumers
    from django_sqlqueue.worker.loop import Worker

    times: dict[str, list[float]] = defaultdict(list)
    calls = [0]

    def count(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call":
            calls[0] += 1

    def poll(worker, sub):  # type: ignore[no-untyped-def]
        if not args.count_calls:
            return worker.poll(sub)
        sys.setprofile(count)
        try:
            return worker.poll(sub)
        finally:
            sys.setprofile(None)

    connects = [0]
    connection_created.connect(lambda **kw: connects.__setitem__(0, connects[0] + 1), weak=False)

    def timed(name, fn):  # type: ignore[no-untyped-def]
        def wrapper(*a, **kw):  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                times[name].append(time.perf_counter() - t)

        return wrapper

    # The worker's connection tidying (close_old_connections() in early versions,
    # tidy_connections() later): the loop's own call, outside poll(), is not timed.
    tidy_name = "tidy_connections" if hasattr(worker_module, "tidy_connections") else "close_old_connections"
    loop_close = getattr(worker_module, tidy_name)
    setattr(worker_module, tidy_name, timed(tidy_name, loop_close))

    keys = partition_keys(8)
    specs = [s for s in load_consumers() if s.group == "bench" and s.topic == "bench.drain"]
    for label in ("drain", "trickle"):
        truncate_queue()
        times.clear()
        publish_many("bench.drain", [{"payload": {"warm": 1}, "key": key} for key in keys])
        worker = Worker(specs, name=f"profile-{label}")
        store = worker.store
        for name in ("poll_state", "fetch", "mark_delivered", "ack_contiguous", "ack", "ensure_offsets"):
            setattr(store, name, timed(name, getattr(store, name)))
        worker.sequencer.sequence = timed("sequence", worker.sequencer.sequence)  # type: ignore[method-assign]
        sub = worker.subscriptions[0]
        spec = sub.spec
        sub.spec = dataclasses.replace(spec, handler=timed("handler", spec.handler))
        worker.register_topics()  # queue_topics + head rows, as run() does
        worker.keeper.tick()  # take the leases, no thread
        while worker.poll(sub)[0] or not times["ack_contiguous"]:
            pass
        times.clear()
        connects[0] = 0
        calls[0] = 0
        polls: list[tuple[float, int]] = []
        if label == "drain":
            for base in range(0, 20000, 1000):
                publish_many(
                    "bench.drain",
                    [{"payload": {"i": i}, "key": keys[i % 8]} for i in range(base, base + 1000)],
                )
            while True:
                loop_close()  # as the loop does
                t = time.perf_counter()
                handled, _ = poll(worker, sub)
                if not handled:
                    break
                polls.append((time.perf_counter() - t, handled))
        else:
            for n in range(args.polls):
                publish_many("bench.drain", [{"payload": {"n": n}, "key": keys[(n + j * 2) % 8]} for j in range(4)])
                loop_close()
                t = time.perf_counter()
                handled, _ = poll(worker, sub)
                polls.append((time.perf_counter() - t, handled))
        worker.keeper.release_all()
        total = sum(p[0] for p in polls)
        msgs = sum(p[1] for p in polls)
        print(
            f"\n{label}: {len(polls)} polls, {msgs} messages, {total * 1000 / len(polls):.2f} ms per poll "
            f"(median {statistics.median(p[0] for p in polls) * 1000:.2f}), {msgs / total:,.0f} msgs/s in poll(), "
            f"{connects[0]} new connections ({connects[0] / len(polls):.2f} per poll)"
            + (f", {calls[0] / msgs:.1f} Python calls per message in poll()" if args.count_calls else "")
        )
        print("| step | calls | ms per call (mean) | ms per poll | share of poll time |")
        print("|---|---:|---:|---:|---:|")
        accounted = 0.0
        for name, values in sorted(times.items(), key=lambda kv: -sum(kv[1])):
            s = sum(values)
            accounted += s
            print(
                f"| {name} | {len(values)} | {s * 1000 / len(values):.3f} | {s * 1000 / len(polls):.2f} | "
                f"{s / total:.0%} |"
            )
        print(
            f"| (rest of poll(): Python in the worker) | | | {(total - accounted) * 1000 / len(polls):.2f} | "
            f"{(total - accounted) / total:.0%} |"
        )
    truncate_queue()


if __name__ == "__main__":
    main()
