"""The dialect's insert path (``db/dialects/inserts.py``): per-call insert plans, the id look-up, errors."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import IntegrityError, OperationalError, connection

from django_sqlqueue.db.dialects import get_dialect
from django_sqlqueue.db.dialects.inserts import InsertPlan, Inserts, MessageRow, in_list
from django_sqlqueue.models import Message
from django_sqlqueue.publisher import publish

pytestmark = pytest.mark.django_db(transaction=True)


def plain(id: str) -> MessageRow:
    return MessageRow(partition=0, key="", id=id, payload_json='{"n": 1}', metadata_json="{}")


def dead(id: str) -> MessageRow:
    return MessageRow(
        partition=0,
        key="k",
        id=id,
        payload_json='{"n": 2}',
        metadata_json='{"m": 1}',
        failed=True,
        failure_count=3,
        last_error="boom",
        original_topic="dia.orig",
        created_at=dt.datetime(2020, 1, 2, tzinfo=dt.UTC),
    )


def test_an_insert_plan_belongs_to_its_call_not_to_the_cached_dialect():
    """Two interleaved inserts on one connection (one cached dialect) keep their own shapes."""
    d = get_dialect(connection)
    assert get_dialect(connection) is d
    dead_plan = d.insert_plan([dead("a")])
    plain_plan = d.insert_plan([plain("b")])  # planned in between: must not change dead_plan
    assert isinstance(dead_plan, InsertPlan) and dead_plan.dead_letters and not dead_plan.no_metadata
    assert not plain_plan.dead_letters and not plain_plan.scheduled and plain_plan.no_metadata
    with connection.cursor() as cursor:
        assert d.insert_chunk(cursor, "dia.dlq", [dead("a")], dead_plan, False) == set()
        assert d.insert_chunk(cursor, "dia.plain", [plain("b")], plain_plan, False) == set()
    stored = Message.objects.get(topic="dia.dlq", id="a")
    assert (stored.failure_count, stored.last_error, stored.original_topic) == (3, "boom", "dia.orig")
    assert stored.failed_at is not None and stored.metadata == {"m": 1}
    assert stored.created_at == dt.datetime(2020, 1, 2, tzinfo=dt.UTC)
    assert Message.objects.get(topic="dia.plain", id="b").failed_at is None
    assert not {"_row_sql", "_no_metadata", "_scheduled", "_dead_letters"} & set(vars(d))


def test_existing_messages_reads_key_partition_and_payload_of_stored_ids():
    publish("dia.e", {"x": 1}, key="k1", id="one")
    publish("dia.e", [1, 2], id="two")
    d = get_dialect(connection)
    d.lookup_chunk = 1  # one statement per id: the chunks' results add up
    try:
        with connection.cursor() as cursor:
            found = d.existing_messages(cursor, "dia.e", ["one", "two", "three"])
    finally:
        del d.lookup_chunk
    assert found["one"][0] == "k1" and found["one"][2] == {"x": 1}
    assert found["two"][2] == [1, 2] and isinstance(found["two"][1], int)
    assert set(found) == {"one", "two"}


def test_vendor_error_codes_are_the_dialects():
    d = get_dialect(connection)
    mysql = connection.vendor == "mysql"
    assert d.is_too_large(OperationalError(1153, "Got a packet bigger than 'max_allowed_packet' bytes")) is mysql
    assert d.is_duplicate_key(IntegrityError(1062, "Duplicate entry")) is mysql
    assert not d.is_duplicate_key(IntegrityError(1452, "foreign key"))
    assert not d.is_too_large(OperationalError(1213, "Deadlock"))


def test_every_vendor_dialect_inserts_through_the_mixin_and_in_list_matches_its_values():
    d = get_dialect(connection)
    assert isinstance(d, Inserts)
    params = ["a", "b", "c"]
    sql = f"({in_list(params)})"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM queue_messages WHERE id IN {sql}", params)
        assert cursor.fetchone()[0] == 0
    publish("dia.in", {"n": 1}, id="b")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM queue_messages WHERE id IN {sql}", params)
        assert [r[0] for r in cursor.fetchall()] == ["b"]
