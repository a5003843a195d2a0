"""The sequencer's cost of counting messages per hour (queue_topic_hours), side by side.

Run: ``.venv/bin/python bench/topic_hours.py [--messages 20000] [--partitions 8]
[--repeat 3] [--json FILE]``; ``BENCH_DATABASE_URL`` picks the database (MariaDB/MySQL or
PostgreSQL; the database named there is dropped and created again).

Each round publishes the messages unsequenced (not timed), then times the sequencer
numbering them, with the counter upsert (the engine as shipped) and without it (the
round's ``count_sequenced`` replaced by a no-op), alternating which goes first. Scenarios:

- ``large``: one ``sequence()`` draining the backlog (rounds of up to 2000 per partition);
- ``small``: rounds of at most 10 messages per partition (a worker's steady state: each
  poll numbers what arrived since the last, so the per-round statement weighs most);
- ``threads``: four threads at once, each numbering its own two partitions in rounds of
  10: sequencers of different partitions of one topic, which upsert counter rows of the
  same hour (striped by ``partition % 16``).

Reports msgs/s (median of the repeats) per scenario and mode, with/without (of the medians,
and the median of each repeat's pair), and the share of the sequencing time spent in the
counter upsert (timed inside the runs with counters: robust to the machine's drift, which
on a shared machine moves whole runs by 2x).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH_URL = os.environ.get("BENCH_DATABASE_URL", "mysql://root@127.0.0.1:3306/sqlqueue_bench_hours")
TOPIC = "bench.hours"
#: scenario -> per run, the share of the sequencing time spent in the counter upsert (in
#: ``threads``: the four threads' upsert time over four times the wall-clock time).
SHARES: dict[str, list[float]] = {}


def reset() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for table in ("queue_messages", "queue_partitions", "queue_topic_hours"):
            cursor.execute(f"DELETE FROM {table}")


def publish_backlog(messages: int, partitions: int) -> None:
    from django_sqlqueue import publish_many
    from django_sqlqueue.db.store.topics import TopicStore

    reset()
    TopicStore("default").create_partitions(TOPIC, list(range(partitions)))
    for start in range(0, messages, 500):
        publish_many(TOPIC, [{"payload": {"i": i}, "key": f"k{i}"} for i in range(start, min(messages, start + 500))])


def drain(wanted: list[int], limit: int) -> None:
    from django_sqlqueue.db.sequencer import Sequencer

    sequencer = Sequencer("default")
    while sequencer.sequence(TOPIC, wanted, limit=limit):
        pass


def run_scenario(scenario: str, partitions: int) -> None:
    from django.db import connections

    everything = list(range(partitions))
    if scenario == "large":
        drain(everything, 2000)
    elif scenario == "small":
        drain(everything, 10)
    else:
        errors: list[BaseException] = []

        def part(wanted: list[int]) -> None:
            try:
                drain(wanted, 10)
            except BaseException as exc:  # noqa: BLE001 - reported after the join
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=part, args=(everything[i::4],)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]


def measure(scenario: str, counting: bool, messages: int, partitions: int) -> float:
    from django_sqlqueue.db import sequencer as sequencer_module
    from django_sqlqueue.models import Message, TopicHour

    shipped = sequencer_module.count_sequenced
    publish_backlog(messages, partitions)
    spent = [0.0]
    lock = threading.Lock()

    def timed(*args: Any) -> None:
        start = time.perf_counter()
        shipped(*args)
        with lock:
            spent[0] += time.perf_counter() - start

    sequencer_module.count_sequenced = timed if counting else (lambda *args: None)  # type: ignore[assignment]
    try:
        start = time.perf_counter()
        run_scenario(scenario, partitions)
        elapsed = time.perf_counter() - start
    finally:
        sequencer_module.count_sequenced = shipped
    if counting:
        threads = 4 if scenario == "threads" else 1
        SHARES.setdefault(scenario, []).append(spent[0] / (elapsed * threads))
    assert not Message.objects.filter(topic=TOPIC, offset__isnull=True).exists()
    counted = sum(TopicHour.objects.filter(topic=TOPIC).values_list("messages", flat=True))
    assert counted == (messages if counting else 0), counted
    return messages / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scenarios", default="large,small,threads")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench.common import setup_django

    setup_django(BENCH_URL)
    from django.db import connection

    results: dict[str, Any] = {"vendor": connection.vendor, "messages": args.messages, "scenarios": {}}
    for scenario in args.scenarios.split(","):
        runs: dict[str, list[float]] = {"with": [], "without": []}
        for r in range(args.repeat):
            order = [True, False] if r % 2 == 0 else [False, True]
            for counting in order:
                runs["with" if counting else "without"].append(
                    measure(scenario, counting, args.messages, args.partitions)
                )
        with_, without = statistics.median(runs["with"]), statistics.median(runs["without"])
        ratios = [w / wo for w, wo in zip(runs["with"], runs["without"], strict=True)]
        results["scenarios"][scenario] = {
            "with": with_,
            "without": without,
            "ratio": with_ / without,
            "paired_ratio_median": statistics.median(ratios),
            "upsert_share_median": statistics.median(SHARES[scenario]),
            "runs": runs,
            "upsert_shares": SHARES[scenario],
        }
        print(
            f"{connection.vendor} {scenario:8s} with counters {with_:9.0f} msgs/s  without {without:9.0f} msgs/s  "
            f"ratio {with_ / without:.3f} (paired median {statistics.median(ratios):.3f}); "
            f"upsert {100 * statistics.median(SHARES[scenario]):.1f}% of the sequencing time",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
