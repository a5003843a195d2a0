"""The "hand-written SQL" drain: the limit the queue's consumer is compared with.

One process, raw mysqlclient, READ COMMITTED, no Django, no leases: it owns the partitions
given on the command line (static assignment) and, for each of them in turn, does what
``docs/benchmarks.md`` calls a batch:

0. if messages of its partitions wait for an offset (published append-only, ``offset IS
   NULL``): number them as the engine's sequencer does, in one transaction: lock the head rows
   (``FOR UPDATE``), read up to 2,000 unsequenced ``seq`` per partition, ``UPDATE`` their
   offsets with one ``CASE``, ``UPDATE`` the heads, ``COMMIT``;
1. ``SELECT`` up to ``--batch-size`` messages above the watermark (a range read of the log's
   clustered primary key) and decode their JSON payloads;
2. ``INSERT`` their delivery-state rows (in flight, visible again in 30 s) as one multi-row
   upsert, ``COMMIT`` -- the delivery is recorded before the handler runs, as in the queue;
3. run the handler (a no-op);
4. ``DELETE`` the delivery rows up to the new watermark, ``UPDATE queue_offsets`` to it,
   ``COMMIT``.

Every round it reads the heads of its partitions (one query), does one batch per partition
with work, and then polls again at once if a batch was full, or after ``--poll-interval``
(10 ms) otherwise -- the queue's policy while busy, so that the latency comparison measures
the cost of a poll, not a different polling policy. It runs until SIGTERM/SIGINT (or, with
``--exit-when-drained``, until its partitions are drained), then prints a JSON line with its
counts.

With ``--latency-dir`` the handler is the latency benchmark's: it writes
``"<payload run> <time.time() - payload t>"`` per message to a file in that directory.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import MySQLdb


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3306)
    parser.add_argument("--user", default="sqlqueue")
    parser.add_argument("--password", default="sqlqueue")
    parser.add_argument("--database", default="sqlqueue_bench7")
    parser.add_argument("--topic", default="bench.drain")
    parser.add_argument("--group", default="bench")
    parser.add_argument(
        "--partitions", required=True, help="comma-separated partitions (integers) owned by this process"
    )
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--poll-interval", type=float, default=0.01)
    parser.add_argument("--latency-dir", help="record end-to-end latency of every message in this directory")
    parser.add_argument("--exit-when-drained", action="store_true")
    args = parser.parse_args()

    stop = False

    def on_signal(signum, frame):  # type: ignore[no-untyped-def]
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    conn = MySQLdb.connect(
        host=args.host,
        port=args.port,
        user=args.user,
        password=args.password,
        database=args.database,
        charset="utf8mb4",
    )
    cur = conn.cursor()
    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    conn.autocommit(False)

    topic, group, limit = args.topic, args.group, args.batch_size
    keys = sorted(int(k) for k in args.partitions.split(",") if k)
    in_keys = ", ".join(["%s"] * len(keys))
    # Watermark and head rows: created at 0 if missing (the partition may not exist yet).
    for key in keys:
        cur.execute(
            "INSERT IGNORE INTO queue_offsets (consumer_group, topic, `partition`, offset_acked, updated_at) "
            "VALUES (%s, %s, %s, 0, UTC_TIMESTAMP(6))",
            (group, topic, key),
        )
        cur.execute(
            "INSERT IGNORE INTO queue_partitions (topic, `partition`, head_offset, created_at) "
            "VALUES (%s, %s, 0, UTC_TIMESTAMP(6))",
            (topic, key),
        )
    conn.commit()
    marks = {}
    cur.execute(
        "SELECT `partition`, offset_acked FROM queue_offsets WHERE consumer_group = %s AND topic = %s "
        f"AND `partition` IN ({in_keys})",
        (group, topic, *keys),
    )
    for key, acked in cur.fetchall():
        marks[key] = int(acked)
    conn.commit()

    heads_sql = f"SELECT `partition`, head_offset FROM queue_partitions WHERE topic = %s AND `partition` IN ({in_keys})"
    fetch_sql = (
        "SELECT `offset`, id, payload, metadata FROM queue_messages WHERE topic = %s AND `partition` = %s "
        f"AND `offset` > %s ORDER BY `offset` LIMIT {int(limit)}"
    )
    # NULL offsets sort first in the (topic, partition, offset) index: a short range read each.
    waiting_sql = (
        "SELECT DISTINCT `partition` FROM queue_messages WHERE topic = %s "
        f"AND `partition` IN ({in_keys}) AND `offset` IS NULL"
    )

    def sequence() -> None:
        """Number committed unsequenced messages of our partitions (one short transaction)."""
        cur.execute(waiting_sql, (topic, *keys))
        waiting = sorted(int(r[0]) for r in cur.fetchall())
        if not waiting:
            conn.commit()
            return
        in_waiting = ", ".join(["%s"] * len(waiting))
        cur.execute(
            f"SELECT `partition`, head_offset FROM queue_partitions WHERE topic = %s AND `partition` IN ({in_waiting}) "
            "ORDER BY `partition` FOR UPDATE",
            (topic, *waiting),
        )
        heads = {int(p): int(h) for p, h in cur.fetchall()}
        cases: list = []
        seqs: list = []
        new_heads = {}
        for part in waiting:
            cur.execute(
                "SELECT seq FROM queue_messages WHERE topic = %s AND `partition` = %s AND `offset` IS NULL "
                "ORDER BY seq LIMIT 2000",
                (topic, part),
            )
            offset = heads[part]
            for (seq,) in cur.fetchall():
                offset += 1
                cases += [seq, offset]
                seqs.append(seq)
            new_heads[part] = offset
        if seqs:
            cur.execute(
                f"UPDATE queue_messages SET `offset` = CASE seq {' '.join(['WHEN %s THEN %s'] * len(seqs))} END "
                f"WHERE seq IN ({', '.join(['%s'] * len(seqs))})",
                (*cases, *seqs),
            )
            for part, head in new_heads.items():
                cur.execute(
                    "UPDATE queue_partitions SET head_offset = %s WHERE topic = %s AND `partition` = %s",
                    (head, topic, part),
                )
        conn.commit()

    out = None
    if args.latency_dir:
        os.makedirs(args.latency_dir, exist_ok=True)
        out = open(os.path.join(args.latency_dir, f"latency-baseline-{os.getpid()}.txt"), "a", buffering=1)  # noqa: SIM115

    handled = batches = 0
    started = time.monotonic()
    while not stop:
        sequence()
        cur.execute(heads_sql, (topic, *keys))
        heads = {k: int(h) for k, h in cur.fetchall()}
        conn.commit()
        worked = full = False
        for key in keys:
            if stop:
                break
            if heads.get(key, 0) <= marks[key]:
                continue
            worked = True
            cur.execute(fetch_sql, (topic, key, marks[key]))
            rows = cur.fetchall()
            if not rows:
                continue
            messages = [(int(off), mid, json.loads(payload), json.loads(meta)) for off, mid, payload, meta in rows]
            values = ", ".join(["(%s, %s, %s, %s, FALSE, UTC_TIMESTAMP(6) + INTERVAL 30 SECOND, 0, 1)"] * len(messages))
            params = [v for m in messages for v in (group, topic, key, m[0])]
            cur.execute(
                "INSERT INTO queue_delivery_state (consumer_group, topic, `partition`, message_offset, acked, "
                f"invisible_until, retry_count, status) VALUES {values} ON DUPLICATE KEY UPDATE "
                "invisible_until = VALUES(invisible_until), status = VALUES(status)",
                params,
            )
            conn.commit()
            if out is None:
                for _message in messages:
                    handled += 1  # the handler: a no-op
            else:
                for message in messages:
                    out.write(f"{message[2].get('run', '-')} {time.time() - message[2]['t']:.6f}\n")
                    out.flush()
                    handled += 1
            full = full or len(messages) >= limit
            new = messages[-1][0]
            cur.execute(
                "DELETE FROM queue_delivery_state WHERE consumer_group = %s AND topic = %s AND `partition` = %s "
                "AND message_offset <= %s",
                (group, topic, key, new),
            )
            cur.execute(
                "UPDATE queue_offsets SET offset_acked = %s, updated_at = UTC_TIMESTAMP(6) "
                "WHERE consumer_group = %s AND topic = %s AND `partition` = %s",
                (new, group, topic, key),
            )
            conn.commit()
            marks[key] = new
            batches += 1
        if not worked and args.exit_when_drained and heads:
            break
        if not full:
            time.sleep(args.poll_interval)
    conn.close()
    print(json.dumps({"handled": handled, "batches": batches, "seconds": round(time.monotonic() - started, 3)}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
