"""PostgreSQL's shorter path from a commit to a handler (issue 33), on the real server.

- A worker's sequencing round is one call of ``sqlqueue_sequence_round`` (migration 0011),
  with the separate statements' checks: a row gone between its read and its write rolls
  the whole round back (SQLSTATE SQ001, ``StaleReadAhead``), numbering and counting nothing.
  A worker's poll reads its state and runs that round in the same statement.
- The worker's hot statements are server-side prepared (``SQLQUEUE["PREPARED_STATEMENTS"]``),
  and are not with the setting off.
- The one-statement delivery record and ack commit without waiting for the WAL flush, for
  their own transaction only, unless ``SQLQUEUE["SYNCHRONOUS_ACKS"]``. (Whether a commit
  waited is not observable from a client without a race against the WAL writer; the peer
  harness counts the server's flushes per message: docs/benchmarks.md.)
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext, override_settings

from django_sqlqueue import publish, publish_many
from django_sqlqueue.db.sequencer import Sequencer, StaleReadAhead, sequence
from django_sqlqueue.db.store import PartitionState, QueueStore
from django_sqlqueue.models import Message, Partition, TopicHour

from ..support.engine_helpers import key_for_partition, leased

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's function and prepared statements"),
]

TRIGGER = """
CREATE FUNCTION test_vanish() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF OLD.payload = '"vanish"'::jsonb THEN RETURN NULL; END IF;
    RETURN NEW;
END $fn$;
CREATE TRIGGER test_vanish BEFORE UPDATE ON queue_messages FOR EACH ROW EXECUTE FUNCTION test_vanish();
"""


@pytest.fixture
def vanishing_rows():
    """A trigger that makes the UPDATE skip the rows whose payload is "vanish", as a row
    deleted by a purge between the round's read and its write would be skipped."""
    with connection.cursor() as cursor:
        cursor.execute(TRIGGER)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "DROP TRIGGER IF EXISTS test_vanish ON queue_messages; DROP FUNCTION IF EXISTS test_vanish()"
            )


def counted(topic: str) -> int:
    return sum(TopicHour.objects.filter(topic=topic).values_list("messages", flat=True))


def head(topic: str, partition: int) -> int:
    return Partition.objects.get(topic=topic, partition=partition).head_offset


def test_a_worker_round_is_one_statement_that_numbers_moves_the_head_and_counts():
    k = key_for_partition(0)
    sequence("pg.round", [0])  # the head row
    publish_many("pg.round", [{"payload": i, "key": k} for i in range(4)])
    with CaptureQueriesContext(connection) as queries:
        assert Sequencer("default").sequence("pg.round", [0], limit=3) == {0: 3}
    assert len(queries.captured_queries) == 1
    assert "sqlqueue_sequence_round" in queries.captured_queries[0]["sql"]
    assert head("pg.round", 0) == 3 and counted("pg.round") == 3
    assert Sequencer("default").sequence("pg.round", [0]) == {0: 4}
    offsets = list(Message.objects.filter(topic="pg.round").order_by("seq").values_list("payload", "offset"))
    assert offsets == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert counted("pg.round") == 4
    assert Sequencer("default").sequence("pg.round", [0]) == {}


def poll_and_sequence(topic: str, name: str = "w1") -> tuple[list[PartitionState], dict[int, int]]:
    """A worker's poll of ``topic`` in group g as ``name``, its state and round in one statement."""
    sequencer = Sequencer("default")
    fragment = sequencer.round_fragment(topic, "todo.parts")
    assert fragment is not None
    with sequencer.stale_read_ahead(topic):
        return QueueStore("default").poll_and_sequence("g", topic, name, 30.0, fragment)


def test_a_poll_reads_its_state_and_numbers_in_one_statement():
    k0, k1 = key_for_partition(0), key_for_partition(1)
    sequence("pg.poll", [0, 1, 2])  # the head rows
    store = QueueStore("default")
    for partition in (0, 1, 2):
        leased("g", "pg.poll", partition)
    store.ensure_offsets("g", "pg.poll", [0, 1, 2])
    publish_many("pg.poll", [{"payload": i, "key": k0} for i in range(3)] + [{"payload": 9, "key": k1}])
    with CaptureQueriesContext(connection) as queries:
        states, heads = poll_and_sequence("pg.poll")
    assert len(queries.captured_queries) == 1
    # Partition 2 has nothing: not in the state. The others, with their heads before and after.
    assert [(st.partition, st.head, st.unsequenced) for st in states] == [(0, 0, True), (1, 0, True)]
    assert heads == {0: 3, 1: 1}
    assert (head("pg.poll", 0), head("pg.poll", 1), head("pg.poll", 2)) == (3, 1, 0)
    assert counted("pg.poll") == 4
    # The next poll finds the numbered messages, and nothing to number: the round is not run.
    states, heads = poll_and_sequence("pg.poll")
    assert [(st.partition, st.head, st.unsequenced) for st in states] == [(0, 3, False), (1, 1, False)]
    assert heads == {}
    assert counted("pg.poll") == 4
    # Another worker's poll sees none of them, and numbers nothing.
    publish_many("pg.poll", [{"payload": 10, "key": k0}])
    assert poll_and_sequence("pg.poll", name="w2") == ([], {})
    assert head("pg.poll", 0) == 3
    # Inside a transaction the round could not be its own: no fragment, the worker polls apart.
    with transaction.atomic():
        assert Sequencer("default").round_fragment("pg.poll", "todo.parts") is None


def test_a_row_gone_before_a_polls_round_numbers_nothing(vanishing_rows):
    k = key_for_partition(0)
    sequence("pg.pollgone", [0])
    leased("g", "pg.pollgone", 0)
    QueueStore("default").ensure_offsets("g", "pg.pollgone", [0])
    publish_many("pg.pollgone", [{"payload": p, "key": k} for p in ("a", "vanish", "b")])
    with pytest.raises(StaleReadAhead):
        poll_and_sequence("pg.pollgone")
    assert set(Message.objects.filter(topic="pg.pollgone").values_list("offset", flat=True)) == {None}
    assert head("pg.pollgone", 0) == 0 and counted("pg.pollgone") == 0


def test_a_row_gone_between_read_and_write_rolls_the_whole_round_back(vanishing_rows):
    k = key_for_partition(0)
    sequence("pg.gone", [0])
    publish_many("pg.gone", [{"payload": p, "key": k} for p in ("a", "vanish", "b")])
    with pytest.raises(StaleReadAhead):
        Sequencer("default").sequence("pg.gone", [0])
    # Nothing numbered, counted or moved: not even the rows before the one that vanished.
    assert set(Message.objects.filter(topic="pg.gone").values_list("offset", flat=True)) == {None}
    assert head("pg.gone", 0) == 0 and counted("pg.gone") == 0


def test_a_stale_round_inside_a_callers_transaction_rolls_back_alone(vanishing_rows):
    k = key_for_partition(0)
    sequence("pg.nested", [0])
    publish_many("pg.nested", [{"payload": "vanish", "key": k}])
    with transaction.atomic():
        with pytest.raises(StaleReadAhead):
            Sequencer("default").sequence("pg.nested", [0])
        # The caller's transaction is still usable: only the round's savepoint rolled back.
        assert Message.objects.filter(topic="pg.nested").count() == 1


def prepared(pattern: str) -> int:
    """How many statements like ``pattern`` this session has prepared."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", [pattern])
        return int(cursor.fetchone()[0])


def prepared_poll_states() -> int:
    return prepared("%FROM queue_partition_leases l%")


def test_the_hot_statements_are_prepared_once_per_connection():
    connection.close()  # a fresh session: no prepared statement yet
    store = QueueStore("default")
    for _ in range(3):
        store.poll_state("g", "pg.prep", "w1", 30.0)
    assert prepared_poll_states() == 1  # prepared at its first call, reused after


def test_with_prepared_statements_off_nothing_is_prepared():
    connection.close()
    with override_settings(SQLQUEUE={**getattr(settings, "SQLQUEUE", {}), "PREPARED_STATEMENTS": False}):
        QueueStore("default").poll_state("g", "pg.prep", "w1", 30.0)
        assert prepared_poll_states() == 0


def prepared_inserts() -> int:
    return prepared("%INSERT INTO queue_messages%")


def test_a_single_publish_is_prepared_and_a_batch_is_not():
    connection.close()
    for n in range(3):
        publish("pg.prep", {"n": n})
    assert prepared_inserts() == 1  # one statement text, planned once
    with transaction.atomic():  # inside the caller's transaction (the outbox) as well
        publish("pg.prep", {"n": 3})
        publish("pg.prep", {"n": 4}, id="explicit-4")  # its id looked up first; ON CONFLICT
    assert prepared_inserts() == 2
    publish_many("pg.prep", [{"payload": n} for n in range(5, 8)])  # a batch's length varies
    assert prepared_inserts() == 2
    assert Message.objects.filter(topic="pg.prep").count() == 8
    with override_settings(SQLQUEUE={**getattr(settings, "SQLQUEUE", {}), "PREPARED_STATEMENTS": False}):
        connection.close()
        publish("pg.prep", {"n": 8})
        assert prepared_inserts() == 0


RELAXED = "set_config('synchronous_commit', 'off', true)"


def drained_statements(topic: str, **conf: object) -> list[str]:
    """Publish two messages of ``topic`` and drain them; the statements the drain sent."""
    from django_sqlqueue.testing.draining import drain_consumers

    from ..support.engine_helpers import spec

    publish_many(topic, [{"payload": n, "key": key_for_partition(0)} for n in (1, 2)])
    handled: list[object] = []
    with override_settings(SQLQUEUE={**getattr(settings, "SQLQUEUE", {}), **conf}):
        with CaptureQueriesContext(connection) as ctx:
            drain_consumers([spec(topic, "g", handled.append)])
    assert len(handled) == 2
    return [q["sql"] for q in ctx.captured_queries]


def test_the_delivery_record_and_the_ack_commit_without_waiting_for_the_flush():
    statements = drained_statements("pg.relaxed")
    relaxed = [sql for sql in statements if RELAXED in sql]
    assert any("INSERT INTO queue_delivery_state" in sql for sql in relaxed), statements
    assert any("UPDATE queue_offsets" in sql for sql in relaxed), statements
    # Nothing else: publishing and sequencing keep waiting for their flush.
    assert all(sql.startswith("WITH held AS") for sql in relaxed), relaxed
    with connection.cursor() as cursor:  # for their own transaction only
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"
    assert Message.objects.filter(topic="pg.relaxed").count() == 2


def test_with_synchronous_acks_every_commit_waits_for_the_flush():
    statements = drained_statements("pg.strict", SYNCHRONOUS_ACKS=True)
    assert not [sql for sql in statements if "synchronous_commit" in sql]
    assert any(sql.startswith("WITH held AS") for sql in statements)  # the same one-statement forms
