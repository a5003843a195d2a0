"""Publish throughput: publish()/publish_many() next to raw mysqlclient INSERTs of the same rows.

Run: ``.venv/bin/python bench/publish.py [--single N] [--batched N] [--batch-size B] [--repeat 3]
[--profile DIR]``.

Every variant runs in this one process against the same MariaDB (``BENCH_DATABASE_URL``,
default ``sqlqueue_bench7``), interleaved finely: a repetition alternates blocks of the raw
variant and of the queue variant (``--block`` messages for single publishes, one batch for
batched ones; the order flips every block), so that both see the same server and host load,
and sums each variant's time. The table shows the median of the repetitions and the ratio to
the raw baseline of the same shape, plus the range of the per-repetition ratios. (A single
commit costs 0.3-3 ms here depending on what else the server flushes; runs of whole variants
one after the other gave ratios from 0.5 to 1.2 for the same code.)

The raw table is ``CREATE TABLE bench_raw_messages LIKE queue_messages``: the same columns,
the same ``seq`` AUTO_INCREMENT primary key and the same indexes (unique (topic, id), unique
(topic, partition, offset), (topic, seq)). The raw rows are the rows publish() writes (same
topic, partition, key, 32-hex-digit random id, JSON payload, ``offset`` NULL, times from
``UTC_TIMESTAMP(6)``), written by plain mysqlclient without Django. The raw side serializes
each row's payload with ``json.dumps`` as a hand-written outbox has to (``--raw-encode once``
serializes it once for the whole run instead: a floor no application reaches).

- raw single: one ``INSERT`` of one row in autocommit mode (the INSERT is its own transaction:
  one round trip, one durable commit): the floor of "one message = one transaction".
- publish single: ``publish()`` outside any transaction (Django autocommit: it commits per
  message). Keys: none (spread round-robin).
- raw batched: one multi-row ``INSERT`` statement of B rows + ``COMMIT``.
- publish_many: ``publish_many()`` of B messages (one transaction, unkeyed).

Aims of issue 7: publish single >= 0.9x raw single; publish_many of 1,000 >= 0.8x raw batched.
With ``--profile DIR`` the two publish variants are also run once more under cProfile and the
stats are written to DIR (``publish_single.prof``, ``publish_many.prof``) with a text summary.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import raw_connection, setup_django, truncate_queue

TOPIC = "bench"
PARTITIONS = 8
RAW_COLUMNS = (
    "topic, `partition`, `key`, id, payload, metadata, deliver_at, failed_at, failure_count, last_error, "
    "original_topic, created_at, published_at"
)
RAW_ROW = "(%s, %s, %s, %s, %s, '{}', UTC_TIMESTAMP(6), NULL, 0, '', '', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
RAW_INSERT = f"INSERT INTO bench_raw_messages ({RAW_COLUMNS}) VALUES {RAW_ROW}"
PAYLOAD = {"order_id": 12345, "customer": "alice", "total": "19.90", "lines": [{"sku": "A-1", "qty": 2}]}


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--single", type=int, default=3000, help="messages per single-message run (default 3,000)")
    parser.add_argument("--batched", type=int, default=50000, help="messages per batched run (default 50,000)")
    parser.add_argument("--batch-size", type=int, default=1000, help="messages per publish_many (default 1,000)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--block", type=int, default=100, help="single publishes per interleaved block (100)")
    parser.add_argument(
        "--raw-encode", choices=("per-row", "once"), default="per-row", help="raw side: json.dumps per row or once"
    )
    parser.add_argument("--profile", type=Path, help="also profile the publish variants; write the stats here")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    setup_django()
    from django.db import connection

    from django_sqlqueue import publish, publish_many

    raw = raw_connection()
    cur = raw.cursor()
    cur.execute("DROP TABLE IF EXISTS bench_raw_messages")
    cur.execute("CREATE TABLE bench_raw_messages LIKE queue_messages")
    body = json.dumps(PAYLOAD, separators=(",", ":"))
    counter = [0]

    def raw_row() -> tuple[str, int, str, str, str]:
        # What publish() computes for an unkeyed message: a round-robin partition, a random id.
        counter[0] += 1
        payload = body if args.raw_encode == "once" else json.dumps(PAYLOAD, separators=(",", ":"))
        return (TOPIC, counter[0] % PARTITIONS, "", os.urandom(16).hex(), payload)

    def raw_single(n: int | None = None) -> int:
        n = args.single if n is None else n
        raw.autocommit(True)
        try:
            for _ in range(n):
                cur.execute(RAW_INSERT, raw_row())
        finally:
            raw.autocommit(False)
        return n

    def publish_single(n: int | None = None) -> int:
        n = args.single if n is None else n
        for _ in range(n):
            publish(TOPIC, PAYLOAD)
        return n

    def raw_batched(n: int | None = None) -> int:
        n = args.batched if n is None else n
        for _ in range(0, n, args.batch_size):
            # One statement of B rows (spelled out: executemany() does not fold rows whose
            # VALUES contain function calls).
            cur.execute(
                f"INSERT INTO bench_raw_messages ({RAW_COLUMNS}) VALUES {', '.join([RAW_ROW] * args.batch_size)}",
                [v for _ in range(args.batch_size) for v in raw_row()],
            )
            raw.commit()
        return n

    def publish_batched(n: int | None = None) -> int:
        n = args.batched if n is None else n
        for _ in range(0, n, args.batch_size):
            publish_many(TOPIC, [{"payload": PAYLOAD} for _ in range(args.batch_size)])
        return n

    def reset() -> None:
        cur.execute("TRUNCATE TABLE bench_raw_messages")
        raw.commit()
        truncate_queue()

    names = {
        "raw_single": "raw INSERT (autocommit), 1 row per transaction",
        "publish_single": "publish(), 1 message per transaction",
        "raw_batched": f"raw multi-row INSERT of {args.batch_size:,} rows + COMMIT",
        "publish_batched": f"publish_many() of {args.batch_size:,} messages",
    }
    fns = {
        "raw_single": raw_single,
        "publish_single": publish_single,
        "raw_batched": raw_batched,
        "publish_batched": publish_batched,
    }
    # Warm-up (connections, max_allowed_packet look-up, imports), not timed.
    publish(TOPIC, PAYLOAD)
    cur.execute(RAW_INSERT, raw_row())
    raw.commit()
    reset()

    runs: dict[str, list[float]] = {k: [] for k in fns}
    load_before = load_average()
    for _rep in range(args.repeat):
        for pair, total, block in (
            (("raw_single", "publish_single"), args.single, args.block),
            (("raw_batched", "publish_batched"), args.batched, args.batch_size),
        ):
            spent = dict.fromkeys(pair, 0.0)
            done = 0
            while done < total:
                step = min(block, total - done)
                for name in pair if (done // block) % 2 == 0 else pair[::-1]:
                    start = time.perf_counter()
                    fns[name](step)
                    spent[name] += time.perf_counter() - start
                done += step
            for name in pair:
                runs[name].append(total / spent[name])
            reset()
    load_after = load_average()

    med = {k: statistics.median(v) for k, v in runs.items()}
    print(
        f"load average before {load_before}, after {load_after}; database {connection.settings_dict['NAME']}; "
        f"raw payload encoding: {args.raw_encode}"
    )
    print(f"| variant | msgs/s (median of {args.repeat}; min–max) | ratio to raw (paired range) | aim |")
    print("|---|---:|---:|---|")
    results = {"load_before": load_before, "load_after": load_after, "variants": {}}
    for base, mine, aim in (("raw_single", "publish_single", 0.9), ("raw_batched", "publish_batched", 0.8)):
        pairs = [m / b for m, b in zip(runs[mine], runs[base], strict=True)]
        ratio = med[mine] / med[base]
        print(
            f"| {names[base]} | {med[base]:,.0f} ({min(runs[base]):,.0f}–{max(runs[base]):,.0f}) | 1.00 (baseline) | |"
        )
        print(
            f"| {names[mine]} | {med[mine]:,.0f} ({min(runs[mine]):,.0f}–{max(runs[mine]):,.0f}) | "
            f"{ratio:.2f} ({min(pairs):.2f}–{max(pairs):.2f}) | >= {aim}: {'met' if ratio >= aim else 'missed'} |"
        )
        results["variants"][base] = {"runs": runs[base], "median": med[base]}
        results["variants"][mine] = {"runs": runs[mine], "median": med[mine], "ratio": ratio, "aim": aim}
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))

    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        for name in ("publish_single", "publish_batched"):
            prof = cProfile.Profile()
            prof.enable()
            fns[name]()
            prof.disable()
            reset()
            prof.dump_stats(args.profile / f"{name}.prof")
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(35)
            (args.profile / f"{name}.txt").write_text(text.getvalue())
            print(f"\ncProfile of {name}: {args.profile / (name + '.txt')}")


if __name__ == "__main__":
    main()
