"""Publish throughput: publish()/publish_many() next to raw mysqlclient INSERTs.

Run: ``.venv/bin/python bench/publish.py [--single N] [--batched N] [--batch-size B]``.
Every variant runs in this one process against the same MariaDB, interleaved, three
times; the table shows the median and the ratio to the raw baseline of the same shape.

- raw single: ``INSERT`` of one row + ``COMMIT`` per message (plain auto-increment table,
  same columns, no ordering guarantee): the floor of a one-message transaction.
- publish single: ``publish()`` outside a transaction (it commits per message), which
  also locks the partition head row and records the new head.
- raw batched: multi-row ``INSERT`` of B rows (``executemany``) + ``COMMIT``.
- publish_many: batches of B messages over 16 partitions, one transaction each.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import best_rate, raw_connection, setup_django, truncate_queue  # noqa: E402

RAW_TABLE = """
CREATE TABLE IF NOT EXISTS bench_raw_messages (
  `offset` BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  topic VARCHAR(160) NOT NULL, partition_key VARCHAR(128) NOT NULL, id VARCHAR(128) NOT NULL,
  payload LONGTEXT NOT NULL, metadata LONGTEXT NOT NULL,
  created_at DATETIME(6) NOT NULL, published_at DATETIME(6) NOT NULL, deliver_at DATETIME(6) NOT NULL,
  UNIQUE KEY (topic, partition_key, id), KEY (topic, partition_key, `offset`)
) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
"""
RAW_INSERT = (
    "INSERT INTO bench_raw_messages (topic, partition_key, id, payload, metadata, created_at, published_at, deliver_at)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
)
PAYLOAD = {"order_id": 12345, "customer": "alice", "total": "19.90", "lines": [{"sku": "A-1", "qty": 2}]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--single", type=int, default=3000, help="messages per single-message run")
    parser.add_argument("--batched", type=int, default=50000, help="messages per batched run")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    setup_django()
    from django_sqlqueue import publish, publish_many

    raw = raw_connection()
    cur = raw.cursor()
    cur.execute(RAW_TABLE)
    body = json.dumps(PAYLOAD)

    def now() -> str:
        return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")

    def raw_single() -> int:
        for i in range(args.single):
            ts = now()
            cur.execute(RAW_INSERT, ("bench", f"p{i % 16}", uuid.uuid4().hex, body, "{}", ts, ts, ts))
            raw.commit()
        return args.single

    def publish_single() -> int:
        for i in range(args.single):
            publish("bench", PAYLOAD, partition_key=f"p{i % 16}")
        return args.single

    def raw_batched() -> int:
        for _ in range(0, args.batched, args.batch_size):
            ts = now()
            rows = [("bench", f"p{i % 16}", uuid.uuid4().hex, body, "{}", ts, ts, ts) for i in range(args.batch_size)]
            cur.executemany(RAW_INSERT, rows)
            raw.commit()
        return args.batched

    def publish_batched() -> int:
        for _ in range(0, args.batched, args.batch_size):
            publish_many("bench", [{"payload": PAYLOAD, "partition_key": f"p{i % 16}"} for i in range(args.batch_size)])
        return args.batched

    results = {}
    for name, fn in [
        ("raw INSERT+COMMIT, 1 row", raw_single),
        ("publish(), 1 message per transaction", publish_single),
        (f"raw multi-row INSERT, {args.batch_size} rows", raw_batched),
        (f"publish_many(), {args.batch_size} messages / 16 partitions", publish_batched),
    ]:
        rate, rates = best_rate(fn)
        results[name] = {"msgs_per_s": round(rate), "runs": [round(r) for r in rates]}
        cur.execute("TRUNCATE TABLE bench_raw_messages")
        raw.commit()
        truncate_queue()

    names = list(results)
    rows = [
        (names[0], results[names[0]]["msgs_per_s"], "1.00 (baseline)"),
        (
            names[1],
            results[names[1]]["msgs_per_s"],
            f"{results[names[1]]['msgs_per_s'] / results[names[0]]['msgs_per_s']:.2f}",
        ),
        (names[2], results[names[2]]["msgs_per_s"], "1.00 (baseline)"),
        (
            names[3],
            results[names[3]]["msgs_per_s"],
            f"{results[names[3]]['msgs_per_s'] / results[names[2]]['msgs_per_s']:.2f}",
        ),
    ]
    print("| variant | msgs/s (median of 3) | ratio to raw |")
    print("|---|---:|---:|")
    for name, rate, ratio in rows:
        print(f"| {name} | {rate:,} | {ratio} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
