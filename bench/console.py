"""Console pages against a log of 1,000,000 messages, 10,000 dead letters and 7 days of
per-minute history for 20 groups (MariaDB).

    .venv/bin/python bench/console.py          # loads once (about a minute), then times

Times the rendered admin pages (Django test client, a superuser, full template
rendering) and, side by side, the baseline a naive console would run on the same data:
``COUNT(*)`` for a paginator, ``OFFSET`` paging, ``SELECT DISTINCT topic`` without the
loose index scan. Loads rows with ``INSERT ... SELECT`` from MariaDB's sequence engine,
never the ORM. Uses its own database (``sqlqueue_adm_bench`` unless BENCH_DATABASE_URL).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("BENCH_DATABASE_URL", "mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue_adm_bench")

from bench.common import setup_django

MESSAGES = 1_000_000
DEAD_LETTERS = 10_000
TOPICS = 10
PARTITIONS = 8
GROUPS = ("billing", "shipping", "retired")
#: Groups with 7 days of history, a sample every minute, each on one topic; the first
#: three are GROUPS.
HISTORY_GROUPS = [*GROUPS, *(f"g{i:02d}" for i in range(3, 20))]
HISTORY_MINUTES = 7 * 24 * 60


def load_history(c) -> None:
    """7 days of minutes for each of HISTORY_GROUPS (on topic ``i % TOPICS``): one sample per
    minute of running totals that grow by about 45 a minute, and a lag (about 200,000 rows
    of ``queue_history``). The extra groups get watermark rows and heartbeats so that the
    overview lists all 20."""
    now = "TIMESTAMPDIFF(MINUTE, '1970-01-01 00:00:00', UTC_TIMESTAMP())"
    age = f"(CAST(seq AS SIGNED) - {HISTORY_MINUTES})"  # minutes before now, negative
    for i, g in enumerate(HISTORY_GROUPS):
        topic = f"topic{i % TOPICS}"
        c.execute(
            "INSERT INTO queue_history (consumer_group, topic, minute, published, handled, failed, retried, "
            f"dead_lettered, lag) SELECT %s, %s, {now} + {age}, 46 * seq, 45 * seq + MOD(seq, 7), seq DIV 3, "
            f"seq DIV 3, seq DIV 97, 500 + MOD(seq, 1440) FROM seq_0_to_{HISTORY_MINUTES}",
            [g, topic],
        )
        if g not in GROUPS:
            for p in range(PARTITIONS):
                c.execute(
                    "INSERT INTO queue_offsets (consumer_group, topic, `partition`, offset_acked, updated_at) "
                    "SELECT %s, topic, `partition`, head_offset - 5, NOW(6) FROM queue_partitions "
                    "WHERE topic = %s AND `partition` = %s",
                    [g, topic, p],
                )
            c.execute(
                "INSERT INTO queue_subscriber_heartbeats VALUES (%s, %s, %s, NOW(6), NULL)", [g, topic, f"{g}-w0"]
            )
    c.execute("ANALYZE TABLE queue_history")


def load() -> None:
    from django.db import connection

    cols = (
        "topic, `partition`, `key`, `offset`, id, payload, metadata, deliver_at, failed_at, failure_count, "
        "last_error, original_topic, created_at, published_at"
    )
    # Partitions as the publisher hashes keys (CRC-32 of the key); offsets increase within a
    # partition (they are not contiguous here, which no page depends on).
    with connection.cursor() as c:
        start = time.perf_counter()
        for low in range(1, MESSAGES + 1, 100_000):
            high = min(MESSAGES, low + 99_999)
            c.execute(
                f"INSERT INTO queue_messages ({cols}) SELECT CONCAT('topic', seq % {TOPICS}), "
                f"CRC32(CONCAT('key', seq % 1000)) % {PARTITIONS}, CONCAT('key', seq % 1000), seq, CONCAT('m', seq), "
                'CONCAT(\'{"order": \', seq, \', "lines": [1, 2, 3], "note": "benchmark payload"}\'), \'{}\', '
                "NOW(6) - INTERVAL (2000000 - seq) SECOND, NULL, 0, '', '', "
                "NOW(6) - INTERVAL (2000000 - seq) SECOND, NOW(6) - INTERVAL (2000000 - seq) SECOND "
                f"FROM seq_{low}_to_{high}"
            )
        c.execute(
            f"INSERT INTO queue_messages ({cols}) SELECT 'topic0_dlq', seq % {PARTITIONS}, CONCAT('key', seq % 1000), "
            "seq, CONCAT(ELT(seq % 3 + 1, 'billing', 'shipping', 'retired'), ':m', seq * 10), "
            'CONCAT(\'{"order": \', seq, \'}\'), CONCAT(\'{"dead_letter": {"consumer_group": "\', '
            "ELT(seq % 3 + 1, 'billing', 'shipping', 'retired'), '\", \"original_offset\": ', seq, '}}'), "
            "NOW(6), NOW(6) - INTERVAL seq SECOND, 5, "
            "CONCAT(ELT(seq % 4 + 1, 'builtins.ValueError', 'builtins.KeyError', 'app.errors.Timeout', "
            "'builtins.RuntimeError'), ': failed ', seq, '\\nTraceback (most recent call last):\\n  File \"h.py\"'), "
            f"'topic0', NOW(6), NOW(6) FROM seq_1_to_{DEAD_LETTERS}"
        )
        for t in range(TOPICS):
            for p in range(PARTITIONS):
                c.execute(
                    "SELECT MAX(`offset`) FROM queue_messages WHERE topic = %s AND `partition` = %s", [f"topic{t}", p]
                )
                head = c.fetchone()[0]
                c.execute(
                    "INSERT INTO queue_partitions (topic, `partition`, head_offset, created_at) "
                    "VALUES (%s, %s, %s, NOW(6))",
                    [f"topic{t}", p, head],
                )
                for i, g in enumerate(GROUPS):
                    c.execute(
                        "INSERT INTO queue_offsets (consumer_group, topic, `partition`, offset_acked, updated_at) "
                        "VALUES (%s, %s, %s, %s, NOW(6))",
                        [g, f"topic{t}", p, head - [10, 0, head][i]],
                    )
                    if g != "retired":
                        c.execute(
                            "INSERT INTO queue_partition_leases VALUES (%s, %s, %s, %s, NOW(6), NOW(6))",
                            [g, f"topic{t}", p, f"{g}-w{p % 2}"],
                        )
            for g in GROUPS[:2]:
                for w in range(2):
                    c.execute(
                        "INSERT INTO queue_subscriber_heartbeats VALUES (%s, %s, %s, NOW(6), NULL)",
                        [g, f"topic{t}", f"{g}-w{w}"],
                    )
        c.execute("ANALYZE TABLE queue_messages")
        load_history(c)
        print(
            f"loaded {MESSAGES:,} messages, {DEAD_LETTERS:,} dead letters and 7 days of history for "
            f"{len(HISTORY_GROUPS)} groups in {time.perf_counter() - start:.0f} s"
        )


def load_action_log(user_id: int) -> None:
    """100,000 console audit entries over the last 30 days (pauses, resumes, seeks and replays
    of the groups), as ``console.base.audit`` writes them."""
    from django.contrib.contenttypes.models import ContentType
    from django.db import connection

    from django_sqlqueue.models import QueueConsole

    ct = ContentType.objects.get_for_model(QueueConsole, for_concrete_model=False).id
    group = "ELT(MOD(seq, 3) + 1, 'billing', 'shipping', 'retired')"
    target = f"CONCAT('group ', {group}, ' on topic', MOD(seq, 10))"
    verb = "ELT(MOD(seq, 3) + 1, 'Paused ', 'Resumed ', 'Paused ')"
    with connection.cursor() as c:
        c.execute(
            "INSERT INTO django_admin_log (action_time, object_id, object_repr, action_flag, change_message, "
            f"content_type_id, user_id) SELECT NOW(6) - INTERVAL (100000 - seq) * 26 SECOND, {target}, {target}, 2, "
            f"CONCAT({verb}, {group}, ' on topic', MOD(seq, 10), ' (1 topic).'), {ct}, {int(user_id)} "
            "FROM seq_1_to_100000"
        )


def timed(fn: Callable[[], object], repeat: int = 10) -> float:
    fn()  # warm up
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs) * 1000


def main() -> None:
    setup_django()
    load()
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment

    from django_sqlqueue.db.dialects import get_dialect

    setup_test_environment()
    user = User.objects.create_superuser("bench", "b@example.com", "pw")
    load_action_log(user.pk)
    client = Client()
    client.login(username="bench", password="pw")
    base = "/admin/django_sqlqueue/queueconsole"

    def get(path: str) -> Callable[[], object]:
        def run() -> object:
            response = client.get(base + path)
            assert response.status_code == 200, (path, response.status_code)
            return response

        return run

    def sql(statement: str) -> Callable[[], object]:
        def run() -> object:
            with connection.cursor() as c:
                c.execute(statement)
                return c.fetchall()

        return run

    last = client.get(base + "/messages/?topic=topic3").context["page"].next_cursor
    # Message seq n was published 2,000,000 - n seconds before the load: the hour around 999993.
    import datetime as dt
    from urllib.parse import urlencode

    at = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(seconds=2_000_000 - 999_993)
    window = {"after": at - dt.timedelta(minutes=30), "before": at + dt.timedelta(minutes=30)}
    hour = urlencode({k: v.isoformat(timespec="seconds") for k, v in window.items()})
    pages = [
        (
            "overview",
            "/",
            "COUNT(*) of the log + DISTINCT topic (full index scan)",
            (
                "SELECT (SELECT COUNT(*) FROM queue_messages), (SELECT COUNT(DISTINCT topic) FROM queue_messages "
                "IGNORE INDEX (queue_msg_topic_seq))"
            ),
        ),
        (
            "messages, all topics",
            "/messages/",
            "COUNT(*) of the log (a paginator)",
            "SELECT COUNT(*) FROM queue_messages",
        ),
        (
            "messages, one topic",
            "/messages/?topic=topic3",
            "COUNT(*) of the topic",
            "SELECT COUNT(*) FROM queue_messages WHERE topic = 'topic3'",
        ),
        (
            "messages, next page",
            f"/messages/?topic=topic3&cursor={last}",
            "OFFSET 50000 paging",
            "SELECT seq FROM queue_messages WHERE topic = 'topic3' ORDER BY seq DESC LIMIT 50 OFFSET 50000",
        ),
        (
            "messages, by key",
            "/messages/?topic=topic3&key=key3",
            "key scan over the topic",
            "SELECT seq FROM queue_messages WHERE topic = 'topic3' AND `key` = 'key3' ORDER BY seq DESC LIMIT 50",
        ),
        ("messages, before a time", "/messages/?topic=topic3&before=2026-01-01T00:00:00", "-", ""),
        (
            "dead letters",
            "/deadletters/",
            "COUNT(*) of the DLQ",
            "SELECT COUNT(*) FROM queue_messages WHERE topic = 'topic0_dlq' AND original_topic <> ''",
        ),
        ("dead letters, group + error", "/deadletters/?group=billing&error=KeyError", "-", ""),
        (
            "dead letter detail",
            "/deadletters/" + str(client.get(base + "/deadletters/").context["page"].items[0].seq) + "/",
            "-",
            "",
        ),
        (
            "messages, payload field (1 h)",
            f"/messages/?topic=topic3&field=order&value=999993&{hour}",
            "-",
            "",
        ),
        ("dead letters, error text", "/deadletters/?text=failed+99", "-", ""),
        ("dead letters, payload field", "/deadletters/?field=order&value=42", "-", ""),
        ("dead letters, live JSON", "/deadletters/?format=json", "-", ""),
        ("groups", "/groups/", "-", ""),
        ("group, 1 h of history", "/groups/billing/topic0/", "-", ""),
        ("group, 24 h of history", "/groups/billing/topic0/?window=24h", "-", ""),
        ("group, 7 d of history", "/groups/billing/topic0/?window=7d", "-", ""),
        ("group, live JSON", "/groups/billing/topic0/?format=json", "-", ""),
        ("overview, live JSON", "/?format=json", "-", ""),
        ("leases", "/leases/", "-", ""),
        ("topics", "/topics/", "-", ""),
        ("action log", "/actionlog/", "-", ""),
        ("action log, one group", "/actionlog/?group=billing&topic=topic3", "-", ""),
    ]
    with connection.cursor() as c:
        d = get_dialect(connection)
        # One statement where the vendor has one; MySQL/MariaDB step by index dives (the first).
        if d.distinct_topics_sql is not None:
            c.execute("EXPLAIN " + d.distinct_topics_sql)
        else:
            c.execute("EXPLAIN " + d.next_topic_sql, [""])
        plan = c.fetchall()
    print(f"\nEXPLAIN of the topic list: {plan[0][-1]!r} ({plan[0][-2]} rows estimated)")
    print(f"\n{'page':32} {'console ms':>10}   {'baseline':52} {'ms':>8} {'ratio':>7}")
    for name, path, baseline, statement in pages:
        ms = timed(get(path))
        if statement:
            base_ms = timed(sql(statement), repeat=3)
            print(f"{name:32} {ms:10.1f}   {baseline:52} {base_ms:8.1f} {base_ms / ms:6.1f}x")
        else:
            print(f"{name:32} {ms:10.1f}")


if __name__ == "__main__":
    main()
