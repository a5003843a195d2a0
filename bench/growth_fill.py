"""Bulk fill of ``bench/growth.py``: N retained messages in one topic, sequenced, acked.

Rows are written with ``INSERT ... SELECT`` from MariaDB's sequence engine (``seq_1_to_N``) or
PostgreSQL's ``generate_series``, in chunks of :data:`CHUNK` rows (one autocommit statement
each), never through ``publish_many``. What the sequencer would have written is written in
the same statements: message ``n`` (1-based) is in partition ``(n - 1) % 8`` (its key hashes
there, CRC-32, as ``publish`` does) at offset ``(n - 1) // 8 + 1``, so offsets are contiguous
per partition; the heads in ``queue_partitions``, the per-hour counters in
``queue_topic_hours`` and every group's watermark in ``queue_offsets`` follow. Message ids
grow with ``seq`` (as the engine's time-ordered ids do). No ``ANALYZE`` runs afterwards.
"""

from __future__ import annotations

import time
from typing import Any

from bench.common import partition_keys

TOPIC = "bench.growth"
SIDE_TOPIC = "orders"
PARTITIONS = 8
CHUNK = 250_000
#: The fill's messages were published over the day before the last hour.
SPAN_SECONDS = 24 * 3600
DEAD_LETTERS = 1_000
SIDE_MESSAGES = 10_000
HISTORY_MINUTES = 24 * 60
ACTION_LOG = 1_000
#: (group, topic, how far behind the head per partition, paused)
GROUPS = (
    ("bench", TOPIC, 0, False),  # the running group (drain and latency)
    ("audit", TOPIC, 0, True),  # paused at the fill's head: holds the GC floor there
    ("billing", SIDE_TOPIC, 0, False),
    ("shipping", SIDE_TOPIC, 100, False),
)
COLS = (
    "seq, topic, {P}, {K}, {O}, id, payload, metadata, deliver_at, failed_at, failure_count, last_error, "
    "original_topic, created_at, published_at"
)


class Dialect:
    """The few vendor differences of the fill."""

    def __init__(self, vendor: str) -> None:
        self.mysql = vendor == "mysql"
        q = (lambda n: f"`{n}`") if self.mysql else (lambda n: f'"{n}"')
        self.q = q
        self.P, self.K, self.O = q("partition"), q("key"), q("offset")
        self.div = "DIV" if self.mysql else "/"  # integer division
        self.cols = COLS.format(P=self.P, K=self.K, O=self.O)

    def series(self, low: int, high: int) -> str:
        return f"seq_{low}_to_{high}" if self.mysql else f"generate_series({low}, {high}) AS g(seq)"

    def ago(self, seconds: str) -> str:
        """The SQL of the UTC time ``seconds`` (an SQL number) ago."""
        if self.mysql:
            return f"(UTC_TIMESTAMP(6) - INTERVAL ({seconds}) * 1000000 MICROSECOND)"
        return f"(now() - make_interval(secs => ({seconds})))"

    def text(self, expr: str) -> str:
        return f"CAST({expr} AS CHAR)" if self.mysql else f"CAST({expr} AS TEXT)"

    def hex_id(self, expr: str) -> str:
        if self.mysql:
            return f"LPAD(HEX({expr}), 32, '0')"
        return f"LPAD(to_hex({expr}), 32, '0')"

    def json(self, expr: str) -> str:
        return expr if self.mysql else f"CAST({expr} AS jsonb)"

    def hour(self, column: str) -> str:
        if self.mysql:
            return f"DATE_FORMAT({column}, '%%Y-%%m-%%d %%H:00:00')"
        return f"(date_trunc('hour', {column} AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')"

    @property
    def now(self) -> str:
        return "UTC_TIMESTAMP(6)" if self.mysql else "now()"


def fill(n: int) -> dict[str, Any]:
    """Fill the (freshly migrated) queue tables; return what was written and how long it took."""
    from django.db import connection

    d = Dialect(connection.vendor)
    started = time.perf_counter()
    with connection.cursor() as c:
        _messages(c, d, TOPIC, n, first_seq=1)
        _messages(c, d, SIDE_TOPIC, SIDE_MESSAGES, first_seq=n + 1)
        if not d.mysql:
            c.execute("SELECT setval(pg_get_serial_sequence('queue_messages', 'seq'), %s)", [n + SIDE_MESSAGES + 1])
        _dead_letters(c, d, n + SIDE_MESSAGES + 1)
        messages_seconds = time.perf_counter() - started
        for topic, count in ((TOPIC, n), (SIDE_TOPIC, SIDE_MESSAGES)):
            _heads(c, d, topic, count)
        _state(c, d)
    return {
        "messages": n,
        "seconds": round(time.perf_counter() - started, 1),
        "messages_seconds": round(messages_seconds, 1),
    }


def _messages(c: Any, d: Dialect, topic: str, n: int, first_seq: int) -> None:
    """Messages 1..n of ``topic`` at seq ``first_seq``.., sequenced as the sequencer numbers them."""
    keys = partition_keys(PARTITIONS)
    key = f"CASE MOD(seq - 1, {PARTITIONS}) " + " ".join(f"WHEN {p} THEN '{k}'" for p, k in enumerate(keys)) + " END"
    age = f"{SPAN_SECONDS + 3600} - (seq - 1) * {SPAN_SECONDS / max(n, 1):.9f}"
    at = d.ago(age)
    payload = d.json(
        'CONCAT(\'{"customer": "alice", "total": "19.90", "lines": [{"sku": "A-1", "qty": 2}], '
        f"\"i\": ', {d.text('seq')}, '}}')"
    )
    for low in range(1, n + 1, CHUNK):
        high = min(n, low + CHUNK - 1)
        c.execute(
            f"INSERT INTO queue_messages ({d.cols}) SELECT seq + {first_seq - 1}, %s, MOD(seq - 1, {PARTITIONS}), "
            f"{key}, (seq - 1) {d.div} {PARTITIONS} + 1, {d.hex_id(f'seq + {first_seq - 1}')}, {payload}, "
            f"{d.json(chr(39) + '{}' + chr(39))}, {at}, NULL, 0, '', '', {at}, {at} FROM {d.series(low, high)}",
            [topic],
        )
    if n:
        # The sequencer's per-hour counters of what it numbered (queue_topic_hours).
        c.execute(
            f"INSERT INTO queue_topic_hours (topic, {d.q('hour')}, slot, messages) "
            f"SELECT topic, {d.hour('published_at')} AS h, MOD({d.P}, 16) AS s, COUNT(*) FROM queue_messages "
            f"WHERE topic = %s GROUP BY topic, h, s",
            [topic],
        )


def _dead_letters(c: Any, d: Dialect, first_seq: int) -> None:
    """DEAD_LETTERS dead letters of group ``bench`` in ``bench.growth_dlq`` (as the worker writes them)."""
    meta = d.json(
        f'CONCAT(\'{{"dead_letter": {{"consumer_group": "bench", "original_offset": \', {d.text("seq")}, \'}}}}\')'
    )
    error = "CONCAT('builtins.ValueError: failed ', " + d.text("seq") + ", '\nTraceback (most recent call last):')"
    c.execute(
        f"INSERT INTO queue_messages ({d.cols}) SELECT seq + {first_seq - 1}, %s, MOD(seq, {PARTITIONS}), 'k', seq, "
        f"CONCAT('bench:', {d.hex_id('seq')}), {d.json(chr(39) + '{}' + chr(39))}, {meta}, {d.now}, "
        f"{d.ago('seq')}, 5, {error}, %s, {d.now}, {d.now} FROM {d.series(1, DEAD_LETTERS)}",
        [TOPIC + "_dlq", TOPIC],
    )
    if not d.mysql:
        c.execute("SELECT setval(pg_get_serial_sequence('queue_messages', 'seq'), %s)", [first_seq + DEAD_LETTERS])


def _heads(c: Any, d: Dialect, topic: str, n: int) -> None:
    """The topic (as a worker registers it), its heads, and its groups' watermarks."""
    c.execute(
        f"INSERT INTO queue_topics (topic, partitions, created_at, updated_at) VALUES (%s, %s, {d.now}, {d.now})",
        [topic, PARTITIONS],
    )
    for p in range(PARTITIONS):
        head = n // PARTITIONS + (1 if p < n % PARTITIONS else 0)
        c.execute(
            f"INSERT INTO queue_partitions (topic, {d.P}, head_offset, created_at) VALUES (%s, %s, %s, {d.now})",
            [topic, p, head],
        )
        for group, group_topic, behind, _ in GROUPS:
            if group_topic == topic:
                c.execute(
                    f"INSERT INTO queue_offsets (consumer_group, topic, {d.P}, offset_acked, updated_at, "
                    f"handled_total, failed_total, retried_total, dead_lettered_total) "
                    f"VALUES (%s, %s, %s, %s, {d.now}, %s, 0, 0, 0)",
                    [group, topic, p, max(0, head - behind), max(0, head - behind)],
                )


def _state(c: Any, d: Dialect) -> None:
    """The console's usual state: a paused group, a day of per-minute history per group,
    heartbeats of the side topic's workers and an action log."""
    for group, topic, _, paused in GROUPS:
        if paused:
            c.execute(
                f"INSERT INTO queue_paused_topics (consumer_group, topic, paused_at, paused_by, reason) "
                f"VALUES (%s, %s, {d.now}, 'bench', 'growth benchmark')",
                [group, topic],
            )
        minute = (
            "TIMESTAMPDIFF(MINUTE, '1970-01-01 00:00:00', UTC_TIMESTAMP())"
            if d.mysql
            else "CAST(floor(extract(epoch FROM now()) / 60) AS BIGINT)"
        )
        c.execute(
            "INSERT INTO queue_history (consumer_group, topic, minute, published, handled, failed, retried, "
            f"dead_lettered, lag) SELECT %s, %s, {minute} - {HISTORY_MINUTES} + seq, 46 * seq, 45 * seq, 0, 0, 0, "
            f"MOD(seq, 100) FROM {d.series(0, HISTORY_MINUTES)}",
            [group, topic],
        )
        if topic == SIDE_TOPIC:
            c.execute(
                f"INSERT INTO queue_subscriber_heartbeats (consumer_group, topic, subscriber_name, heartbeat_at, "
                f"deregistered_at) VALUES (%s, %s, %s, {d.now}, NULL)",
                [group, topic, f"{group}-w0"],
            )


def load_action_log(user_id: int) -> None:
    """ACTION_LOG console audit entries (pauses and resumes), as ``console.base.audit`` writes them."""
    from django.contrib.contenttypes.models import ContentType
    from django.db import connection

    from django_sqlqueue.models import QueueConsole

    d = Dialect(connection.vendor)
    ct = ContentType.objects.get_for_model(QueueConsole, for_concrete_model=False).id
    target = f"CONCAT('group audit on topic {TOPIC} #', {d.text('seq')})"
    with connection.cursor() as c:
        c.execute(
            "INSERT INTO django_admin_log (action_time, object_id, object_repr, action_flag, change_message, "
            f"content_type_id, user_id) SELECT {d.ago('seq * 60')}, {target}, {target}, 2, "
            f"'Paused audit on {TOPIC} (1 topic).', {ct}, {int(user_id)} FROM {d.series(1, ACTION_LOG)}"
        )
