"""Query plans that cannot flip (issue 32): every statement that reads ``queue_messages``,
checked with ``EXPLAIN`` on a log of 1,000,000 messages loaded without ``ANALYZE``, then again
after one.

Right after a bulk load the optimizer has no statistics for the new rows (InnoDB's persistent
statistics said 0 distinct values for every secondary index), and MariaDB ran the "oldest
unsequenced message" report for more than 50 s, walking the topic's ``(topic, seq)`` entries per
head row. This module loads such a log (``bench/growth_fill.py``: one topic, 8 partitions,
sequenced, plus an unsequenced tail, dead letters, a group with delivery rows), runs the engine's,
the operator's, the metrics' and the Spark source's operations on it once each, captures every
statement that names ``queue_messages`` and runs it again under ``ANALYZE FORMAT=JSON`` (MariaDB)
or ``EXPLAIN (ANALYZE, FORMAT JSON)`` (PostgreSQL), in a transaction rolled back afterwards.

Each statement must match one entry of :data:`PLANS` (an unknown statement fails: new code gets
a plan of its own checked), read ``queue_messages`` only through the index the entry names, and
examine at most the entry's bound of rows -- a few times the statement's LIMIT or batch, never a
number that grows with the log.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from bench.growth_fill import PARTITIONS, SPAN_SECONDS, TOPIC, fill
from django_sqlqueue.db.store.seek_reads import TIME_SLACK, WALK
from tests.support.engine_helpers import not_on_sqlite, requires_vendor

pytestmark = [
    pytest.mark.slow,
    not_on_sqlite("SQLite has no optimizer statistics to lag behind a bulk load, and no ANALYZE FORMAT=JSON"),
]

N = 1_000_000
#: Messages published after the load and not numbered yet (the sequencer's backlog).
TAIL = 2_000
DLQ = TOPIC + "_dlq"
QUEUE_TABLES = (
    "queue_messages",
    "queue_partitions",
    "queue_topics",
    "queue_offsets",
    "queue_delivery_state",
    "queue_partition_leases",
    "queue_paused_topics",
    "queue_subscriber_heartbeats",
    "queue_topic_hours",
    "queue_history",
)


def _tail(cursor: Any, ids_from: int = 1_000_000_000) -> None:
    """TAIL unsequenced messages of TOPIC after the load (seq past every loaded row), their ids
    numbered from ``ids_from``."""
    mysql = connection.vendor == "mysql"
    q = (lambda n: f"`{n}`") if mysql else (lambda n: f'"{n}"')
    series = f"seq_1_to_{TAIL}" if mysql else f"generate_series(1, {TAIL}) AS g(seq)"
    now = "UTC_TIMESTAMP(6)" if mysql else "now()"
    hex_id = f"LPAD(HEX(seq + {ids_from}), 32, '0')" if mysql else f"LPAD(to_hex(seq + {ids_from}), 32, '0')"
    meta = "'{}'" if mysql else "CAST('{}' AS jsonb)"
    cursor.execute("SELECT MAX(seq) FROM queue_messages")
    (top,) = cursor.fetchone()
    cursor.execute(
        f"INSERT INTO queue_messages (seq, topic, {q('partition')}, {q('key')}, {q('offset')}, id, payload, "
        "metadata, deliver_at, failed_at, failure_count, last_error, original_topic, created_at, published_at) "
        f"SELECT seq + {top}, %s, MOD(seq, {PARTITIONS}), 'tail', NULL, {hex_id}, {meta}, {meta}, {now}, NULL, 0, "
        f"'', '', {now}, {now} FROM {series}",
        [TOPIC],
    )
    if not mysql:
        cursor.execute("SELECT setval(pg_get_serial_sequence('queue_messages', 'seq'), %s)", [top + TAIL + 1])


@pytest.fixture(scope="module")
def big_log(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """The 1,000,000-message log, right after its bulk load (no ANALYZE); emptied afterwards."""
    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            for table in QUEUE_TABLES:
                cursor.execute(f"DELETE FROM {table}")
            # No statistics until the test asks for them (the ``stats`` fixture): neither
            # InnoDB's background recalculation nor autovacuum's ANALYZE may land mid-test and
            # change the plans under it.
            cursor.execute(AUTO_STATS[connection.vendor][0])
        fill(N)
        with connection.cursor() as cursor:
            _tail(cursor)
        try:
            yield
        finally:
            with connection.cursor() as cursor:
                for table in QUEUE_TABLES:
                    mysql = connection.vendor == "mysql"
                    cursor.execute(f"TRUNCATE TABLE {table}" if mysql else f"DELETE FROM {table}")
                cursor.execute(AUTO_STATS[connection.vendor][1])


#: Turn the automatic statistics of queue_messages off, and back on (per vendor).
AUTO_STATS = {
    "mysql": (
        "ALTER TABLE queue_messages STATS_AUTO_RECALC = 0",
        "ALTER TABLE queue_messages STATS_AUTO_RECALC = DEFAULT",
    ),
    "postgresql": (
        "ALTER TABLE queue_messages SET (autovacuum_enabled = false)",
        "ALTER TABLE queue_messages RESET (autovacuum_enabled)",
    ),
}


@pytest.fixture(scope="module", params=["fresh", "analyzed"])
def stats(request: pytest.FixtureRequest, big_log: None, django_db_blocker: Any) -> str:
    """The log's statistics: none (right after the bulk load), then after an ``ANALYZE``.

    A pinned statement has its plan in both; a statement left to the optimizer would pass one
    and fail the other. pytest runs every operation fresh first, then every one analyzed.
    """
    if request.param == "analyzed":
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute("ANALYZE TABLE queue_messages" if connection.vendor == "mysql" else "ANALYZE queue_messages")
            if connection.vendor == "mysql":
                cursor.fetchall()
    return str(request.param)


@pytest.fixture
def db(stats: str, django_db_blocker: Any) -> Iterator[None]:
    """Database access on the module's log (no per-test flush: the log is built once)."""
    with django_db_blocker.unblock():
        yield


# -- the plans -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Access:
    """One read of ``queue_messages`` in a plan: the index used and the rows examined."""

    index: str | None  # None: a scan of the table
    rows: int


_ALIAS = re.compile(r"\bqueue_messages(?:\s+(?:AS\s+)?(?!FORCE|USE|WHERE|ON|JOIN|SET|LIMIT|ORDER|GROUP)(\w+))?", re.I)


def _aliases(sql: str) -> set[str]:
    return {m.group(1) or "queue_messages" for m in _ALIAS.finditer(sql)}


def _mysql_accesses(plan: Any, names: set[str]) -> Iterator[Access]:
    if isinstance(plan, dict):
        table = plan.get("table")
        if isinstance(table, dict) and table.get("table_name") in names:
            rows = float(table.get("r_rows") or 0) * float(table.get("r_loops") or 0)
            yield Access(table.get("key"), round(rows))
        for value in plan.values():
            yield from _mysql_accesses(value, names)
    elif isinstance(plan, list):
        for value in plan:
            yield from _mysql_accesses(value, names)


def _pg_accesses(node: Any) -> Iterator[Access]:
    if isinstance(node, dict):
        if node.get("Relation Name") == "queue_messages":
            loops = int(node.get("Actual Loops") or 0)
            seen = int(node.get("Actual Rows") or 0) + int(node.get("Rows Removed by Filter") or 0)
            seen += int(node.get("Rows Removed by Index Recheck") or 0)
            index = node.get("Index Name")
            if node.get("Node Type") == "Bitmap Heap Scan":  # its index is the child's
                index = next((c.get("Index Name") for c in node.get("Plans", ()) if c.get("Index Name")), None)
            if node.get("Node Type") != "ModifyTable":  # the write itself, not a read
                yield Access(index, seen * loops)
        for value in node.values():
            yield from _pg_accesses(value)
    elif isinstance(node, list):
        for value in node:
            yield from _pg_accesses(value)


def explain(sql: str, pinned: bool = False) -> list[Access]:
    """Run ``sql`` again under the vendor's analyzing EXPLAIN (rolled back); return its reads of the log."""
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("ANALYZE FORMAT=JSON " + sql)
            plan = json.loads(cursor.fetchone()[0])
            accesses = list(_mysql_accesses(plan, _aliases(sql)))
        else:
            if pinned:  # the product runs it after Dialect.no_table_scan_sql, in the same transaction
                cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
            raw = cursor.fetchone()[0]
            accesses = list(_pg_accesses(raw if isinstance(raw, list) else json.loads(raw)))
        transaction.set_rollback(True)
    return accesses


def captured(operation: Callable[[], object]) -> list[str]:
    """Run ``operation``; return the statements it sent that name ``queue_messages``."""
    with CaptureQueriesContext(connection) as ctx:
        operation()
    return [q["sql"] for q in ctx.captured_queries if "queue_messages" in q["sql"].lower()]


# -- the operations --------------------------------------------------------------------------


def _handled(message: Any) -> None:
    return None


def _ops() -> dict[str, Callable[[], object]]:
    import datetime as dt
    import io

    from django.core.management import call_command

    from django_sqlqueue import ops
    from django_sqlqueue.db.sequencer import sequence
    from django_sqlqueue.db.store import QueueStore
    from django_sqlqueue.db.store.log import LogFilter, LogStore
    from django_sqlqueue.metrics.gauges import read_snapshot
    from django_sqlqueue.testing.draining import drain_consumers
    from tests.support.engine_helpers import spec

    store, log = QueueStore("default"), LogStore("default")
    quiet = io.StringIO()
    an_hour_ago = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    return {
        # operator and metrics, before the sequencer numbers the tail
        "overview": lambda: ops.overview(),
        "health": lambda: ops.check_health(ops.Thresholds()),
        "queue_status": lambda: call_command("queue_status", stdout=quiet),
        "queue_health": lambda: call_command("queue_health", stdout=quiet, stderr=quiet),
        "metrics": lambda: read_snapshot(),
        "topics": lambda: ops.list_topics(),
        "messages": lambda: ops.browse(ops.MessageFilter(topic=TOPIC), preview=True),
        "messages_partition": lambda: ops.browse(ops.MessageFilter(topic=TOPIC, partition=3)),
        "messages_partition_older": lambda: ops.browse(ops.MessageFilter(topic=TOPIC, partition=3), cursor=N // 2),
        "messages_key": lambda: ops.browse(ops.MessageFilter(topic=TOPIC, key="tail"), preview=True),
        # A key no message has: the page reads its SCAN_SPAN and stops, whatever the log's size.
        "messages_absent_key": lambda: ops.browse(ops.MessageFilter(topic=TOPIC, key="nobody")),
        "dead_letters": lambda: ops.list_dead_letters(preview=True),
        "dead_letter_count": lambda: ops.count_dead_letters(),
        "seek_plan": lambda: ops.plan_seek("bench", TOPIC, position="earliest"),
        "seek_plan_time": lambda: ops.plan_seek("bench", TOPIC, time=an_hour_ago),
        # Spark
        "spark_ranges": lambda: log.offset_ranges(TOPIC, LogFilter()),
        "spark_read": lambda: list(log.read_range(TOPIC, 3, 1_000, 3_000, LogFilter(), fetch_rows=1_000)),
        "spark_heads": lambda: log.head_offsets(TOPIC),
        "spark_first_offset": lambda: store.first_offset(TOPIC, 3, an_hour_ago),
        # engine
        "sequencer": lambda: sequence(TOPIC),
        "drain": lambda: drain_consumers([spec(TOPIC, "bench", _handled)], max_messages=50),
    }


# -- what each statement may read ------------------------------------------------------------

#: Rows a bounded statement may examine: the sequencer's backlog (TAIL) and the dead letters
#: (1,000) with room to spare, three orders of magnitude below the log.
BOUNDED = 5_000
#: What a search by time may read forward (no index on published_at): twice the messages a
#: partition of the log gets in TIME_SLACK, plus the offsets the probes leave between them.
TIME_WALK = 2 * int(N // PARTITIONS * TIME_SLACK.total_seconds() / SPAN_SECONDS) + WALK
OFFSET, TOPIC_SEQ, UNIQUE_ID = "queue_msg_offset", "queue_msg_topic_seq", "queue_msg_unique_id"
#: PostgreSQL's and SQLite's partial index of the unsequenced rows (migration 0003).
UNSEQUENCED = "queue_msg_unsequenced"
PRIMARY = {"mysql": "PRIMARY", "postgresql": "queue_messages_pkey"}


@dataclass(frozen=True)
class Plan:
    """A statement of the product (``pattern``), the indexes it may read ``queue_messages``
    through per vendor, and the rows it may examine: a number, or ``"range"`` (the offsets the
    statement names, ``offset > a AND offset <= b``: a count an operator asked for)."""

    name: str
    pattern: str
    mysql: tuple[str, ...]
    postgresql: tuple[str, ...]
    rows: int | str = BOUNDED
    #: Run by the product after ``Dialect.no_table_scan_sql`` (PostgreSQL), so explained so too.
    pinned: bool = False

    def bound(self, sql: str) -> int:
        if self.rows == "limit":  # the LIMITs it names (a UNION's branches: their sum)
            return sum(int(n) for n in re.findall(r"LIMIT (\d+)", sql))
        if self.rows == "seqs":  # the seq window it names
            m = re.search(r"seq >= (\d+) AND seq < (\d+)", sql)
            assert m, f"{self.name}: no seq window in {sql[:300]}"
            return int(m.group(2)) - int(m.group(1))
        if self.rows == "range":
            m = re.search(r"offset\W* > (\d+) AND \S*offset\W* <= (\d+)", sql)
            assert m, f"{self.name}: no offset range in {sql[:300]}"
            # PostgreSQL's analyzed plan counts the first row past the range too (its stop).
            return int(m.group(2)) - int(m.group(1)) + 16
        assert isinstance(self.rows, int)
        return self.rows


O_ = r"\W?offset\W?"  # the quoted offset column, either vendor
P_ = r"\W?partition\W?"
PLANS = (
    # The sequencer's backlog. The first is the statement of issue 32 (the oldest unsequenced
    # message; console overview, queue_health, the metrics): on MySQL/MariaDB the head rows
    # drive the join and each reads one range of the offset index (its NULLs); the walk of the
    # topic's (topic, seq) entries per head row must never come back. PostgreSQL reads its
    # partial index of unsequenced rows, the only index that has them.
    Plan(
        "oldest unsequenced",
        r"^SELECT (h\.)?topic, MIN\((m\.)?published_at\) FROM (queue_partitions h )?",
        (OFFSET,),
        (UNSEQUENCED,),
    ),
    Plan("unsequenced per partition", rf"^SELECT (h\.)?topic, (h\.)?{P_}, COUNT\(\*\) FROM", (OFFSET,), (UNSEQUENCED,)),
    Plan(
        "unsequenced capped",
        rf"^SELECT COUNT\(\*\) FROM \(SELECT 1 FROM queue_messages .*{O_} IS NULL LIMIT",
        (OFFSET,),
        (UNSEQUENCED,),
    ),
    Plan(
        "sequencer: partitions with a backlog",
        rf"^SELECT DISTINCT {P_} FROM queue_messages WHERE topic = .* IS NULL$",
        (OFFSET,),
        (UNSEQUENCED,),
    ),
    Plan(
        "sequencer: next partition",
        rf"^SELECT {P_} FROM queue_messages FORCE INDEX \(queue_msg_offset\) WHERE topic = \S+ AND {P_} > ",
        (OFFSET,),
        (),
        5,
    ),
    Plan(
        "sequencer: partition's backlog probe",
        r"^SELECT 1 FROM queue_messages FORCE INDEX \(queue_msg_offset\) .* IS NULL LIMIT 1$",
        (OFFSET,),
        (),
        5,
    ),
    Plan(
        "sequencer: unsequenced read",
        rf"seq FROM queue_messages .*{O_} IS NULL( OFFSET 0\) AS u)? ORDER BY seq LIMIT",
        (OFFSET,),
        (UNSEQUENCED,),
    ),
    Plan(
        # PostgreSQL writes the offsets and counts them per hour in one statement.
        "sequencer: offsets written",
        r"^(UPDATE (JSON_TABLE|queue_messages m SET)|WITH numbered AS \(UPDATE queue_messages m SET)",
        ("PRIMARY",),
        # PostgreSQL: the primary key, or the partial index (the rows are still unsequenced).
        ("queue_messages_pkey", UNSEQUENCED),
    ),
    Plan("sequencer: per-hour counters", r"^INSERT INTO queue_topic_hours", (OFFSET,), (OFFSET,)),
    # The consumer: a new group's watermark, the poll's probes, the fetch, the ack's gap steps.
    Plan("watermark start", r"^INSERT INTO queue_offsets .* FROM queue_messages m WHERE", (OFFSET,), (OFFSET,), 50),
    # PostgreSQL: the poll state and the sequencing round in one statement (its function's
    # own statements: test_the_sequencing_function_reads_the_unsequenced_index...).
    Plan(
        "poll",
        r"^(WITH polled \([^)]*\) AS MATERIALIZED \()?SELECT l\.\W?partition\W?, p\.head_offset",
        (OFFSET,),
        (OFFSET, UNSEQUENCED),
        50,
    ),
    Plan(
        "fetch",
        r"-1 AS retry_count, -1 AS status FROM queue_messages m|d\.retry_count, d\.status FROM",
        (OFFSET,),
        (OFFSET,),
        "limit",
    ),
    Plan("ack: oldest retained", rf"^SELECT \(SELECT m\.{O_} FROM queue_messages m", (OFFSET,), (OFFSET,), 5),
    Plan("ack: offsets present", rf"^SELECT {O_} FROM queue_messages WHERE topic = .* IN \(", (OFFSET,), (OFFSET,)),
    # Operator and metrics.
    Plan(
        "oldest unacked per group", r"^SELECT w\.consumer_group, w\.topic, MIN\(m\.published_at\)", (OFFSET,), (OFFSET,)
    ),
    Plan("dead letters of a group", r"\Wid\W*(::text)? LIKE", (UNIQUE_ID,), (UNIQUE_ID, TOPIC_SEQ)),
    Plan(
        "dead letters capped",
        r"^SELECT COUNT\(\*\) FROM \(SELECT \W?queue_messages\W?\.\W?seq\W? AS \W?col1",
        (TOPIC_SEQ,),
        (TOPIC_SEQ, UNIQUE_ID),
    ),
    Plan("dead letters counted", r"original_topic\W* = ''\)\)$", (TOPIC_SEQ,), (TOPIC_SEQ, UNIQUE_ID)),
    Plan(
        "topic list (MySQL/MariaDB)",
        r"^SELECT topic FROM queue_messages FORCE INDEX \(queue_msg_topic_seq\) WHERE topic > ",
        (TOPIC_SEQ,),
        (),
        5,
    ),
    Plan("topic list", r"^WITH RECURSIVE t\(topic\)", (), (TOPIC_SEQ, UNIQUE_ID), 50),
    # A page filtered by partition or key (ops/messages.py): one window of the (topic, seq)
    # index read backwards, examining at most the window's width whatever the log's size; then
    # the page's rows by primary key, and the topic's first and last seq (two index ends, which
    # MySQL/MariaDB answer from the index alone, without a read in the plan).
    Plan(
        "messages page: a window of a partition or key",
        r"^SELECT seq FROM queue_messages +(FORCE INDEX \(queue_msg_topic_seq\) )?WHERE topic = .* ORDER BY seq DESC",
        (TOPIC_SEQ,),
        (TOPIC_SEQ, PRIMARY["postgresql"]),  # either: the seq window bounds both
        "seqs",
    ),
    Plan(
        "messages page: its rows",
        r"WHERE \W?queue_messages\W?\.\W?seq\W? IN \(",
        ("PRIMARY",),
        (PRIMARY["postgresql"],),
    ),
    Plan(
        "messages page: the topic's seqs",
        r"^SELECT MIN\(seq\), MAX\(seq\) FROM queue_messages WHERE topic",
        (),
        # With statistics, PostgreSQL reads a one-topic log along its primary key (every row
        # matches): as few rows either way.
        (TOPIC_SEQ, PRIMARY["postgresql"]),
        5,
    ),
    Plan(
        "messages page",
        r"^SELECT \W?queue_messages\W?\.\W?seq\W?, \W?queue_messages\W?\.\W?topic\W?",
        (TOPIC_SEQ,),
        (TOPIC_SEQ, PRIMARY["postgresql"]),
    ),
    # By time: probes of single entries, then a read forward over about TIME_SLACK of the
    # partition's messages (seek_reads.py), never the partition's whole retained log.
    Plan(
        "seek/Spark: a partition's first offset, or a probe by time",
        rf"^SELECT {O_}, published_at FROM queue_messages .* ORDER BY {O_} (DESC )?LIMIT 1$",
        (OFFSET,),
        (OFFSET,),
        5,
    ),
    Plan(
        "seek/Spark: a seq probe by time",
        r"^SELECT seq, published_at FROM queue_messages .* ORDER BY seq (DESC )?LIMIT 1$",
        (TOPIC_SEQ,),
        (TOPIC_SEQ, PRIMARY["postgresql"]),
    ),
    Plan(
        "seek/Spark: first offset by time",
        rf"^SELECT {O_} FROM queue_messages .* {O_} >= \S+ AND (seq > \S+ AND )?published_at >= .* LIMIT 1$",
        (OFFSET,),
        (OFFSET,),
        TIME_WALK,
        pinned=True,
    ),
    Plan(
        "seek: messages in the range moved",
        rf"^SELECT COUNT\(\*\) FROM queue_messages +(FORCE INDEX \(queue_msg_offset\) )?"
        rf"WHERE topic = \S+ AND {P_} = \d+ AND {O_} > ",
        (OFFSET,),
        (OFFSET,),
        "range",
        pinned=True,
    ),
    Plan("Spark: partition ranges", rf"^\(SELECT {P_}, {O_} FROM queue_messages", (OFFSET,), (OFFSET,), 50),
    Plan("Spark: read", r"original_topic FROM queue_messages WHERE topic = ", (OFFSET,), (OFFSET,), "limit"),
)


def plan_of(sql: str) -> Plan:
    """The entry of PLANS that ``sql`` is (the first match); fail on a statement nobody checked."""
    for entry in PLANS:
        if re.search(entry.pattern, sql, re.S):
            return entry
    pytest.fail(f"a statement on queue_messages that tests/db/test_plans.py does not know: add it to PLANS\n{sql}")


def problems(name: str, sql: str) -> list[str]:
    """What is wrong with the plan of ``sql`` (empty: pinned and bounded)."""
    entry = plan_of(sql)
    allowed = getattr(entry, connection.vendor)
    accesses = explain(sql, pinned=entry.pinned)
    out = [
        f"{entry.name}: reads queue_messages through {a.index!r}, not {allowed}"
        for a in accesses
        if a.index not in allowed
    ]
    examined, bound = sum(a.rows for a in accesses), entry.bound(sql)
    if examined > bound:
        out.append(f"{entry.name}: examined {examined:,} rows of queue_messages, more than {bound:,}")
    if allowed and not accesses:
        out.append(f"{entry.name}: no read of queue_messages in the plan")
    return [f"[{name}] {text}\n    {sql[:500]}" for text in out]


OPERATIONS = (
    "overview",
    "health",
    "queue_status",
    "queue_health",
    "metrics",
    "topics",
    "messages",
    "messages_partition",
    "messages_partition_older",
    "messages_key",
    "messages_absent_key",
    "dead_letters",
    "dead_letter_count",
    "seek_plan",
    "seek_plan_time",
    "spark_ranges",
    "spark_read",
    "spark_heads",
    "spark_first_offset",
    "sequencer",
    "drain",
)


@pytest.mark.parametrize("name", OPERATIONS)
def test_every_statement_reads_its_index_and_a_bounded_number_of_rows(db: None, name: str) -> None:
    statements = captured(_ops()[name])
    found = [p for sql in statements for p in problems(name, sql)]
    assert not found, "\n".join(found)


# -- PostgreSQL: the statements inside sqlqueue_sequence_round ------------------------------


def _nested_plans(call: Callable[[], object]) -> list[Any]:
    """The analyzed plans of the statements ``call`` runs, those inside functions included
    (``auto_explain`` with ``log_nested_statements``, its log lines sent to this client as
    notices); the caller's transaction rolls the settings back."""
    plans: list[Any] = []

    def on_notice(diagnostic: Any) -> None:
        text = diagnostic.message_primary or ""
        if "plan:" in text:
            plans.append(json.loads(text.split("plan:", 1)[1]))

    with connection.cursor() as cursor:
        cursor.execute("LOAD 'auto_explain'")
        for setting, value in (
            ("log_min_duration", "0"),
            ("log_analyze", "on"),
            ("log_nested_statements", "on"),
            ("log_format", "json"),
            ("log_level", "notice"),
        ):
            cursor.execute(f"SET LOCAL auto_explain.{setting} = '{value}'")
        cursor.execute("SET LOCAL client_min_messages = notice")
    raw = connection.connection
    raw.add_notice_handler(on_notice)
    try:
        call()
    finally:
        raw.remove_notice_handler(on_notice)
    return plans


@requires_vendor("postgresql")
def test_the_sequencing_function_reads_the_unsequenced_index_and_writes_by_primary_key(db: None) -> None:
    """A worker's round on PostgreSQL is one call of ``sqlqueue_sequence_round``: its
    statements run inside the server, where ``EXPLAIN`` of the call shows none of them. Their
    plans come from ``auto_explain``: the read must take the partial index of unsequenced rows
    (at most LIMIT rows per partition), the offsets' UPDATE the primary key, row by row."""
    from django_sqlqueue.db.sequencer import Sequencer

    limit = 100
    with transaction.atomic():
        with connection.cursor() as cursor:
            _tail(cursor, ids_from=2_000_000_000)  # a backlog in every partition, whatever was numbered
        sequencer = Sequencer("default")
        plans = _nested_plans(lambda: sequencer.sequence(TOPIC, list(range(PARTITIONS)), limit=limit))
        transaction.set_rollback(True)
    inner = [p for p in plans if "queue_messages" in json.dumps(p) and "Function Scan" not in json.dumps(p)[:400]]
    assert inner, "auto_explain reported no statement of the function on queue_messages"
    accesses = [a for plan in inner for a in _pg_accesses(plan)]
    indexes = {a.index for a in accesses}
    assert indexes == {UNSEQUENCED, PRIMARY["postgresql"]}, accesses
    bound = 2 * limit * PARTITIONS  # the read's LIMIT per partition, then one primary-key probe per row read
    assert sum(a.rows for a in accesses) <= bound, accesses
    assert sum(a.rows for a in accesses if a.index == UNSEQUENCED) == limit * PARTITIONS, accesses
